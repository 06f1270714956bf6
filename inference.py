"""Translate French sentences with a trained model.

    python inference.py --model_path runs/demo_latest --src_text "Bonjour le monde."
    python inference.py --config configs/demo.yaml --model_path runs/demo_latest/checkpoints/best.pt --input fr.txt
    cat fr.txt | python inference.py --model_path RUN_DIR > en.txt

With --src_text: prints the greedy translation and the beam n-best list with scores. With --input FILE
or standard input: one translation per line to standard output (best beam hypothesis), in batches.
--model_path takes a checkpoint file or a run directory (its best.pt); --config defaults to the run's.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace

from utils.cli import add_alias_args, add_set_arg, run_main, setup_logging


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="YAML config (default: the run directory's config.yaml)")
    add_alias_args(parser, "model_path", required=True, help="checkpoint .pt or run directory")
    add_alias_args(parser, "src_text", help="one sentence to translate")
    parser.add_argument("--input", help="file with one sentence per line ('-' = standard input)")
    parser.add_argument("--beam", type=int, help="beam size (default: decode.beam of the config)")
    parser.add_argument(
        "--nbest", type=int, help="hypotheses per sentence (default: decode.nbest; with --src_text the whole beam)"
    )
    parser.add_argument("--lenpen", type=float, help="GNMT length penalty alpha (default: decode.lenpen)")
    add_alias_args(parser, "batch_size", type=int, help="sentences per batch")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    add_set_arg(parser)
    args = parser.parse_args()
    setup_logging()

    from utils.config import ConfigError
    from utils.runs import load_run
    from utils.translate import translate

    overrides = list(args.overrides)
    for key, value in (("beam", args.beam), ("lenpen", args.lenpen), ("batch_size", args.batch_size)):
        if value is not None:
            overrides.append(f"decode.{key}={value}")
    if args.nbest is not None:
        overrides.append(f"decode.nbest={args.nbest}")
    run = load_run(args.model_path, args.config, overrides, args.device)
    cfg = run.cfg

    if args.src_text is not None:
        if not args.src_text.strip():
            raise ConfigError("--src_text is empty: give a sentence to translate")
        beam_cfg = replace(cfg.decode, nbest=cfg.decode.beam if args.nbest is None else cfg.decode.nbest)
        greedy_cfg = replace(cfg.decode, beam=1, nbest=1)
        greedy = translate(run.model, run.tokenizer, [args.src_text], greedy_cfg)[0][0]
        print(f"source: {args.src_text}")
        print(f"greedy: {greedy.text}\t(logprob {greedy.logprob:.3f})")
        if beam_cfg.beam > 1:
            nbest = translate(run.model, run.tokenizer, [args.src_text], beam_cfg)[0]
            print(f"beam {beam_cfg.beam} (lenpen {beam_cfg.lenpen}), {len(nbest)}-best:")
            for i, hyp in enumerate(nbest, 1):
                print(f"  {i}. {hyp.text}\t(score {hyp.score:.3f}, logprob {hyp.logprob:.3f})")
        return 0

    stream = sys.stdin if args.input in (None, "-") else open(args.input, encoding="utf-8")
    with stream:
        lines = [line.rstrip("\n") for line in stream]
    empty = sum(1 for line in lines if not line.strip())
    if empty:
        print(f"warning: {empty} empty input line(s) give empty output lines", file=sys.stderr)
    start = time.perf_counter()
    results = translate(run.model, run.tokenizer, lines, cfg.decode, strict=False)
    elapsed = time.perf_counter() - start
    for i, nbest in enumerate(results):
        if cfg.decode.nbest == 1:
            print(nbest[0].text)
        else:
            for hyp in nbest:
                print(f"{i}\t{hyp.score:.4f}\t{hyp.text}")
    sys.stdout.flush()
    print(f"translated {len(lines)} sentences in {elapsed:.1f}s ({len(lines) / max(elapsed, 1e-9):.1f} sentences/s)",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    run_main(main)
