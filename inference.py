"""Translate French sentences with a trained model.

    python inference.py --model_path runs/demo_latest --src_text "Bonjour le monde."
    python inference.py --config configs/demo.yaml --model_path runs/demo_latest/checkpoints/best.pt --input fr.txt
    cat fr.txt | python inference.py --model_path RUN_DIR > en.txt
    python inference.py --model_path runs/demo_latest --input fr.txt --beam 5 --nbest 3 > en.nbest

With --src_text: prints the greedy translation and the beam n-best list with scores. With --input FILE
or standard input: the translations to standard output in input order (the best beam hypothesis: one line
per input line; with --nbest N above 1: N lines per input line, numbered; see "Output formats" below),
streamed in chunks of 2,000 lines (any size of input, bounded memory, progress on standard error). Lines
are read as the training data is: UTF-8, split at line feeds (\\n) only, whitespace runs made one space. A
line that cannot be read gives an empty translation and a warning without stopping the others.
--model_path takes a checkpoint file or a run directory (its best.pt); --config defaults to the run's.

    python inference.py --model_path RUN_A RUN_B RUN_C --input fr.txt > en.txt
    python inference.py --model_path runs/demo_latest --input fr.txt --sample --epsilon 0.02 --seed 1
    python inference.py --model_path runs/demo_latest --input fr.txt --sample --mbr 16 --seed 1
    python inference.py --model_path runs/demo_latest --input fr.txt --format jsonl > en.jsonl

Several --model_path values decode as one ensemble (the mean of the models' next-token probabilities; they must
share one tokenizer). --sample draws translations at random (--temperature, --top_k, --top_p, --epsilon,
--num_samples, --seed); --mbr N picks, of N samples or of the beam's N-best, the one that agrees most with the
others (chrF or BLEU, --mbr_utility); --format jsonl writes scores, tokens, per-token log-probabilities and
alignments as JSON lines.

    python inference.py --model_path runs/demo_latest --src_text "Le chat dort." --prefix "The cat"
    python inference.py --model_path runs/demo_latest --input fr.txt --constraints terms.jsonl > en.txt

--prefix TEXT (or --prefix_file FILE, one per input line) starts each translation with TEXT, and the search goes
on after it; --constraints FILE (one line per input line: a JSON list of phrases, or the phrases separated by tabs)
makes each translation contain its line's phrases (beam search with dynamic beam allocation).

    python inference.py --model_path runs/demo_latest --export-ctranslate2 runs/demo_ct2 [--quantization int8]
    python inference.py --model_path runs/demo_ct2 --input fr.txt [--compute_type int8]

--export-ctranslate2 writes a CTranslate2 model directory (weights, vocabulary, the run's tokenizer and
config); --model_path on such a directory translates with ctranslate2.Translator, same flags and output, but
for what CTranslate2 lacks (ensembles, --constraints, --epsilon, --top_k with --top_p: refused in one line).

    python inference.py --serve --model_path runs/demo_latest [--host 127.0.0.1] [--port 8000]

--serve answers HTTP requests (pip install '.[serve]'): POST /translate, POST /attention, GET /model, GET /health
and a demo page at /, with the decoding flags above as defaults (see utils/serve/app.py).
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from utils.translation.engines import Engine

from utils.cli import (
    add_alias_args,
    add_run_args,
    apply_average_args,
    apply_threads,
    decode_overrides,
    finite_float,
    run_main,
    setup_logging,
    threads_note,
)
from utils.translation.flags import add_mode_args, check_mode_flags, mode_overrides, model_paths
from utils.translation.guides import add_guide_args, check_guide_args

OUTPUT_FORMATS = """\
Output formats (standard output; progress, warnings and the speed line go to standard error):

--src_text TEXT, for reading (TAB: a tab character; the beam lines only with a beam above 1; N = --nbest,
else the whole beam; SCORE: the log-probability divided by the GNMT length penalty, higher is better):

    source: TEXT
    greedy: TRANSLATION<TAB>(logprob LOGPROB)
    beam BEAM (lenpen ALPHA), N-best:
      1. TRANSLATION<TAB>(score SCORE, logprob LOGPROB)
      2. ...

--input FILE or standard input, nbest 1 (--nbest, else decode.nbest of the config: 1 by default): one line
per input line, in input order, the best translation; an empty or unreadable input line gives an empty line.

--input FILE or standard input, nbest N above 1: N lines per input line, best first, in input order, each
INDEX<TAB>SCORE<TAB>TRANSLATION: INDEX is the input line's number counted from 0, SCORE as above with 4
decimals; an empty or unreadable input line gives one line, INDEX<TAB>0.0000<TAB> (an empty translation).
Translations never hold a tab or a line break. Two input lines with --beam 3 --nbest 3:

    0<TAB>-4.1573<TAB>Hello world.
    0<TAB>-4.9021<TAB>Hello, world.
    0<TAB>-5.3318<TAB>Hi world.
    1<TAB>-2.0442<TAB>The cat is sleeping.
    1<TAB>-2.6120<TAB>The cat sleeps.
    1<TAB>-3.0007<TAB>The cat is asleep.

The scores above are made up. The best translation of each input line, from such a file:

    awk -F'\\t' '!seen[$1]++ {print $3}' en.nbest

--sample with --num_samples N above 1: N lines per input line as above, the samples ranked by SCORE. --mbr: one
line per input line (the candidate of highest expected utility); with --nbest K, K lines as above, ranked by
expected utility (SCORE stays the model's score).

--format jsonl: one JSON object per input line (with --src_text too), e.g. (wrapped here; one line each):

    {"index": 0, "text": "Hello.", "score": -0.61, "logprob": -0.61, "tokens": ["Hello", ".", "</s>"],
     "token_logprobs": [-0.4, -0.2, -0.01], "alignment": [0, 1, 2], "source_tokens": ["Bonjour", ".", "</s>"]}

score as above; logprob the summed log-probability (the float32 running sum of token_logprobs, one per token,
end-of-sentence included); alignment: for each token, the index in source_tokens of the highest cross-attention
weight of the last decoder layer, averaged over its heads (and the models of an ensemble); with MBR, utility (the
expected utility, 0-100); with several outputs per line (--nbest, --num_samples), nbest: the list of every
translation's fields, best first.

--prefix, --prefix_file, --constraints: the same formats, the prefix part of each translation and of its score.
With --constraints, --src_text prints no greedy line (greedy search takes no constraints), and a hypothesis that
reached the length cap without all its phrases says "constraints unmet" (it ranks below those that meet them);
--input warns on standard error of the lines whose best translation lacks a phrase.

A CTranslate2 export (--model_path EXPORT_DIR) writes the same formats, --prefix, --sample and --mbr included;
with --format jsonl and --sample, logprob and token_logprobs are the model's own, scored again by teacher forcing,
and alignment is from the attention CTranslate2 returns while decoding. Ensembles, --constraints, --epsilon and
--top_k with --top_p are refused in one line. --export-ctranslate2 prints one line:
wrote a CTranslate2 model of CHECKPOINT to OUT_DIR.
"""


def build_parser() -> argparse.ArgumentParser:
    """The command line of inference.py."""
    parser = argparse.ArgumentParser(description=__doc__, epilog=OUTPUT_FORMATS,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_args(parser)
    add_alias_args(parser, "src_text", help="one sentence to translate")
    parser.add_argument("--input", help="file with one sentence per line ('-' = standard input)")
    parser.add_argument("--beam", type=int, help="beam size (default: decode.beam of the config)")
    parser.add_argument("--nbest", type=int, metavar="N",
                        help="hypotheses per sentence (default: decode.nbest; with --src_text the whole beam); above "
                             "1, --input writes N lines INDEX<TAB>SCORE<TAB>TRANSLATION per line (see Output formats)")
    parser.add_argument("--format", choices=["text", "jsonl"], default="text",
                        help="text: the translations (default); jsonl: one JSON object per input line with the "
                             "score, the tokens, each token's log-probability and its alignment (see Output formats)")
    add_mode_args(parser)
    add_guide_args(parser)
    parser.add_argument("--export-ctranslate2", "--export_ctranslate2", dest="export_ct2", metavar="OUT_DIR",
                        help="write the model as a CTranslate2 model directory and exit (pip install '.[export]')")
    parser.add_argument("--quantization", choices=["int8", "int8_float32", "float16"],
                        help="with --export-ctranslate2: store the weights quantized (default: float32)")
    parser.add_argument("--compute_type", "--compute-type", default="default",
                        help="CTranslate2 model: compute type, e.g. int8, float32 (default: as stored)")
    serving = parser.add_argument_group("serving (--serve; pip install '.[serve]')")
    serving.add_argument("--serve", action="store_true",
                         help="serve the model over HTTP (POST /translate, POST /attention, GET /model, a page at /)")
    serving.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine)")
    serving.add_argument("--port", type=int, default=8000, help="port (default 8000; 0: any free port)")
    serving.add_argument("--decode-in-server", "--decode_in_server", action="store_true",
                         help="a PyTorch run decodes in the server's process (default: in a process of its own, "
                              "so that decoding and the HTTP work do not share one GIL; twice the model's memory)")
    serving.add_argument("--batching", choices=["continuous", "static"],
                         help="continuous: a request joins the decoding in flight between two decoder steps "
                              "(iteration-level batching; the default for a PyTorch run in its decoding process); "
                              "static: requests waiting together are decoded as one batch (the only choice for a "
                              "CTranslate2 export or --decode-in-server)")
    serving.add_argument("--join", type=finite_float(0.0), default=0.5,
                         help="continuous batching: waiting sentences start together once they number this share "
                              "of those decoding, nothing decodes, or the oldest has waited 8 steps (default 0.5)")
    serving.add_argument("--allow-host", "--allow_host", action="append", default=[], metavar="NAME",
                         help="answer requests naming this host too (repeatable; '*': any). By default only this "
                              "machine's names (localhost) and IP addresses are answered, so that no web page can "
                              "reach the server through a name of its own (DNS rebinding); 403 otherwise")
    serving.add_argument("--allow-origin", "--allow_origin", action="append", default=[], metavar="ORIGIN",
                         help="answer requests from web pages of this origin too, e.g. https://example.org "
                              "(repeatable; '*': any), with the CORS headers a browser needs. By default only the "
                              "server's own page and pages on this machine are answered; 403 otherwise")
    from utils.serve.limits import Limits

    for name, value in vars(Limits()).items():
        flag = name.replace("_", "-")
        kind = finite_float(*Limits.RANGES[name]) if name in Limits.RANGES else type(value)  # Limits.check's range
        serving.add_argument(f"--{flag}", f"--{name}", dest=name, type=kind, default=value,
                             help=f"{Limits.HELP[name]} (default {value})")
    return parser


def main() -> int:
    parser = build_parser()
    args = parser.parse_args()
    setup_logging()
    threads = apply_threads(parser, args)
    paths = model_paths(parser, args)
    check_guide_args(parser, args)
    overrides = decode_overrides(args) + mode_overrides(args)
    if len(paths) > 1 and args.export_ct2:
        parser.error("--export-ctranslate2 takes one --model_path (an ensemble decodes with inference.py --input, "
                     "--src_text or --serve, and test.py)")
    guided = args.prefix is not None or args.prefix_file is not None or args.constraints is not None
    if guided and (args.export_ct2 or args.serve):
        parser.error("--prefix, --prefix_file and --constraints go with --src_text or --input, not with "
                     f"{'--export-ctranslate2' if args.export_ct2 else '--serve'}")
    if args.export_ct2:
        return export_ctranslate2(parser, args, overrides)
    if args.serve:
        return serve(parser, args, overrides, paths)
    return translate(parser, args, overrides, paths, threads)


def translate(parser: argparse.ArgumentParser, args: argparse.Namespace, overrides: list[str], paths: list[str],
              threads: int | None) -> int:
    """--src_text, --input or standard input: every input checked before the (slow) model load, then translated."""
    from utils.cli import require_stdout
    from utils.translation.guides import line_up, load_guides
    from utils.translation.translate import open_source

    require_stdout("the translations" if args.src_text is None else "the translation")
    if args.src_text is not None and not args.src_text.strip():
        from utils.config import ConfigError

        raise ConfigError("--src_text is empty: give a sentence to translate")
    name = "standard input" if args.input in (None, "-") else args.input
    stream = open_source(args.input) if args.src_text is None else None
    guides = load_guides(args)  # bad files, and a line count other than the input's, fail before the model loads
    if stream is not None:
        stream = line_up(guides, stream, name)
    elif guides.lines is not None:
        guides.check_count(1, "--src_text")
    engine = load_engine(parser, args, overrides, paths)  # a bad --input has failed before this (slow) step
    check_mode_flags(args, engine.cfg.decode)
    write, translate_fn = output_writer(engine, args, guides)
    if args.src_text is not None:
        return one_sentence(engine, args, guides, write, translate_fn)
    interactive = args.input in (None, "-") and sys.stdin.isatty() and guides.lines is None
    from utils.translation.translate import translate_stream

    with stream:
        report = translate_stream(translate_fn, stream, sys.stdout, engine.cfg.decode, name,
                                  chunk_lines=1 if interactive else 2000, progress=sys.stderr, write=write,
                                  guides=guides if guides.given else None)
    for warning in stream_warnings(report, name):
        print(warning, file=sys.stderr)
    speed = report.lines / max(report.seconds, 1e-9)
    if engine.run is not None:  # a PyTorch run (CTranslate2's threads are its own unless --threads)
        threads = threads if engine.run.model.device.type == "cpu" else None
    else:
        threads = args.threads if engine.device == "cpu" else None
    print(f"translated {report.lines} sentences in {report.seconds:.1f}s ({speed:.1f} sentences/s"
          f"{threads_note(threads)})", file=sys.stderr)
    return 0


def output_writer(engine: Engine, args: argparse.Namespace, guides: Any) -> tuple[Any, Any]:
    """(write, translate): the output lines' writer (text, or JSON lines with ``--format jsonl``) and the engine's
    translate function; what a CTranslate2 export lacks, and guides a model cannot take, are refused in one line."""
    from utils.config import ConfigError
    from utils.translation.guides import check_guides
    from utils.translation.translate import text_lines

    cfg, run = engine.cfg, engine.run
    if run is not None:
        check_guides(guides, cfg.decode, run)
        if args.format != "jsonl":
            return text_lines, engine.translate
        from utils.translation.jsonl import jsonl_writer

        return jsonl_writer(run.model, run.tokenizer, cfg.decode.batch_size), engine.translate
    from utils.translation.engines import CT2Model, ct2_jsonl_writer
    from utils.translation.translate import encode_guides

    assert isinstance(engine, CT2Model)
    why = engine.problem(cfg.decode, guides.has_prefix, guides.constraints is not None, args.format == "jsonl")
    if why is not None:
        raise ConfigError(why)
    if guides.has_prefix:  # a prefix over the position table: InputError before anything is translated
        encode_guides(engine.tokenizer, guides.take(guides.lines or 1), engine.max_length)
    if args.format != "jsonl":
        return text_lines, engine.translate
    from functools import partial  # token log-probabilities and alignments

    return ct2_jsonl_writer(engine), partial(engine.translate, details=True)


def one_sentence(engine: Engine, args: argparse.Namespace, guides: Any, write: Any, translate_fn: Any) -> int:
    """--src_text: the greedy translation and the beam's n-best with their scores; with sampling, MBR or
    ``--format jsonl``, what --input writes for a one-line input."""
    decode = engine.cfg.decode
    guide = {"guides": guides.take(1)} if guides.given else {}
    if decode.sample or decode.mbr or args.format == "jsonl":
        sys.stdout.writelines(write(0, [args.src_text], translate_fn([args.src_text], decode, **guide), decode))
        return 0
    beam_cfg = decode.model_copy(update=dict(nbest=decode.beam if args.nbest is None else decode.nbest))
    print(f"source: {args.src_text}")
    if not guides.has_constraints:  # greedy search takes no constraints
        greedy = engine.translate([args.src_text], decode.model_copy(update=dict(beam=1, nbest=1)), **guide)[0][0]
        print(f"greedy: {greedy.text}\t(logprob {greedy.logprob:.3f})")
    if beam_cfg.beam > 1:
        nbest = engine.translate([args.src_text], beam_cfg, **guide)[0]
        print(f"beam {beam_cfg.beam} (lenpen {beam_cfg.lenpen}), {len(nbest)}-best:")
        for i, hyp in enumerate(nbest, 1):
            unmet = "" if hyp.constraints_met else ", constraints unmet"
            print(f"  {i}. {hyp.text}\t(score {hyp.score:.3f}, logprob {hyp.logprob:.3f}{unmet})")
    return 0


def stream_warnings(report: Any, name: str) -> list[str]:
    """The warnings that close a streamed translation: lines that missed constraints, empty and unreadable lines."""
    out = []
    if report.unmet:
        lines = ", ".join(map(str, report.unmet[:10])) + (", ..." if len(report.unmet) > 10 else "")
        out.append(f"warning: {len(report.unmet)} line(s) reached the length cap without all their constraints "
                   f"(lines {lines}): each one's best translation is written; a larger beam or --set "
                   "decode.max_len_b may help")
    if report.empty:
        out.append(f"warning: {report.empty} empty input line(s) give empty output lines")
    out += [f"warning: {name} line {n}: {why}; its output line is empty" for n, why in report.bad[:5]]
    if len(report.bad) > 5:
        out.append(f"warning: {len(report.bad) - 5} more line(s) could not be read; their output lines are empty")
    return out


def load_engine(parser: argparse.ArgumentParser, args: argparse.Namespace,
                overrides: list[str], paths: list[str] | None = None) -> Engine:
    """The PyTorch run (several ``paths``: an ensemble), or an exported CTranslate2 model when --model_path is one."""
    from utils.run.ensemble import load_ensemble
    from utils.translation.engines import TorchEngine
    from utils.translation.export import is_export

    paths = paths or [args.model_path]
    if len(paths) > 1:
        from utils.config import ConfigError

        for path in paths:
            if is_export(path):
                raise ConfigError(f"--model_path {path} is a CTranslate2 export: an ensemble takes PyTorch runs")
    elif is_export(args.model_path):
        if args.average or args.config:
            parser.error("--average and --config apply to runs, not to an exported CTranslate2 model")
        from utils.config import ConfigError, load_config
        from utils.run.layout import RunDir
        from utils.translation.engines import CT2Model

        try:
            engine = CT2Model(args.model_path, device=args.device, compute_type=args.compute_type,
                              threads=args.threads or 0)
        except ImportError:
            parser.error("this is a CTranslate2 model: pip install '.[export]' to run it")
        except (ValueError, RuntimeError, OSError) as err:  # a compute type or device it lacks, a damaged model
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ConfigError(f"cannot load the CTranslate2 model {args.model_path}: {first}") from None

        engine.cfg = load_config(RunDir(args.model_path).config, overrides)
        return engine
    average = apply_average_args(parser, args)
    return TorchEngine(load_ensemble(paths, args.config, overrides, args.device, average=average))


def serve(parser: argparse.ArgumentParser, args: argparse.Namespace, overrides: list[str], paths: list[str]) -> int:
    """--serve: the model (several ``paths``: an ensemble) behind an HTTP server until Ctrl-C."""
    from dataclasses import fields

    from utils.config import ConfigError
    from utils.serve.limits import Limits

    if args.src_text is not None or args.input is not None:
        parser.error("--serve takes no --src_text or --input: sentences come in HTTP requests")
    if not 0 <= args.port <= 65535:
        parser.error(f"--port must be in 0..65535, got {args.port}")
    limits = Limits(**{f.name: getattr(args, f.name) for f in fields(Limits)})
    try:
        limits.check()
    except ValueError as err:
        raise ConfigError(str(err)) from None
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        parser.error("--serve needs FastAPI and uvicorn: pip install '.[serve]'")
    from utils.serve.access import Access
    from utils.serve.app import bind
    from utils.serve.app import serve as serve_http
    from utils.translation.export import is_export

    exported = len(paths) == 1 and is_export(paths[0])
    if args.batching == "continuous" and (exported or args.decode_in_server):  # before the (slow) model loading
        raise ConfigError("--batching continuous needs a PyTorch run decoding in its own process "
                          f"({'not a CTranslate2 export' if exported else 'not --decode-in-server'})")
    sock = bind(args.host, args.port)  # a taken port fails before the (slow) model loading
    engine = load_engine(parser, args, overrides, paths)
    run = engine.run
    if run is not None and not args.decode_in_server:  # a PyTorch run: decoding in a process of its own
        from utils.serve.worker import DecoderError, ProcessDecoder

        try:
            members = [(m.checkpoint, m.step, m.run_dir) for m in getattr(run, "members", None) or [run]]
            engine.decoder = ProcessDecoder(run.checkpoint, run.step, args.config, overrides, str(run.model.device),
                                            args.average, run.run_dir, join=args.join, members=members)
        except DecoderError as err:
            raise ConfigError(str(err)) from None
        engine.continuous = args.batching != "static"
    serve_http(engine, " ".join(paths), sock, limits, Access(tuple(args.allow_host), tuple(args.allow_origin)))
    return 0


def export_ctranslate2(parser: argparse.ArgumentParser, args: argparse.Namespace, overrides: list[str]) -> int:
    from pathlib import Path

    from utils.run.load import load_run

    try:
        from utils.translation.export import export
    except ImportError:
        parser.error("--export-ctranslate2 needs CTranslate2: pip install '.[export]'")
    average = apply_average_args(parser, args)
    run = load_run(args.model_path, args.config, overrides, "cpu", average=average)
    out = export(run.run_dir, run.checkpoint, run.model, run.cfg, run.tokenizer, Path(args.export_ct2),
                 args.quantization)
    print(f"wrote a CTranslate2 model of {run.checkpoint} to {out}")
    return 0


if __name__ == "__main__":
    run_main(main)
