"""Score a trained model on test sets: sacreBLEU (with signature), chrF and nltk BLEU-4 on word tokens.

    python test.py --config configs/bench_small_rope.yaml --model_path runs/bench_small_rope_latest \
        [--split test] [--beam 5 [1 ...]]

Without --split every split listed in data.test is scored; --split NAME (repeatable) names splits of the
corpus (e.g. validation, test.tatoeba, tst2010; "test" where the corpus has no split of that name means
data.test). Beam 5 by default; --beam 1 is greedy; --beam 5 1 scores both with the model loaded once.
--min_len_a A --min_len_b B: a length floor (EOS blocked until a hypothesis has A * source length + B tokens).
--sample (with --temperature, --top_k, --top_p, --epsilon, --seed) scores sampled translations; --mbr N scores
MBR decoding over N samples or the beam's N-best. Several --model_path values score their ensemble: the files go
to the first run's eval folder, tagged ensemble<N>-<hash of the members>, and the score file lists the members.
--prefix TEXT or --prefix_file FILE starts each translation with a target prefix; --constraints FILE makes each
contain its line's phrases (a coverage line is printed). A file lines up with one split (--split NAME): one line
per sentence of it (or of the first --max_sentences); the tag then names it (prefix-, prefixes-, constraints-HASH).
Hypotheses and a JSON of the scores go to
RUN_DIR/eval/<split>.<checkpoint>.beam<N>[.<tag>].{hyp,json}; without --tag, <tag> names the settings that
differ from the run's own (e.g. model.rope.scaling-ntk, n100 for --max_sentences 100), so scores under
other settings never overwrite each other.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
from pathlib import Path
from typing import Any

from utils.cli import (
    add_alias_args,
    add_run_args,
    apply_average_args,
    apply_threads,
    decode_overrides,
    run_main,
    setup_logging,
    threads_note,
)
from utils.translation.flags import add_mode_args, check_mode_flags, mode_overrides, model_paths
from utils.translation.guides import add_guide_args, check_guide_args


def build_parser() -> argparse.ArgumentParser:
    """The command line of test.py."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_args(parser)
    parser.add_argument("--split", action="append", help="split to score, repeatable (default: every split in "
                        "data.test)")
    parser.add_argument("--beam", type=int, nargs="+", default=[5], metavar="N",
                        help="beam size; 1 = greedy (default 5); several (--beam 5 1) score each in turn")
    add_alias_args(parser, "max_sentences", type=int, help="score only the first N sentences of each split")
    parser.add_argument("--buckets", help="source-length bucket edges in tokens, e.g. 10,20,40 (eval.length_buckets)")
    parser.add_argument("--tag", help="added to the eval file names (e.g. yarn): keeps variants of a checkpoint apart")
    add_mode_args(parser)
    add_guide_args(parser)
    return parser


def main() -> int:
    parser = build_parser()
    args = parser.parse_args()
    setup_logging()
    threads = apply_threads(parser, args)
    paths = model_paths(parser, args)
    check_guide_args(parser, args)

    from utils.run.ensemble import LoadedEnsemble, load_ensemble
    from utils.translation.export import is_export
    from utils.translation.guides import check_guides, guide_tag, load_guides

    for path in paths:  # before any model loads
        if is_export(path):
            from utils.config import ConfigError

            raise ConfigError(f"--model_path {path} is a CTranslate2 export: test.py scores PyTorch runs (translate a "
                              "split with inference.py --model_path EXPORT --input FILE and score it with sacrebleu)")

    if args.max_sentences is not None and args.max_sentences < 1:
        parser.error(f"--max_sentences must be >= 1, got {args.max_sentences}")
    beams = list(dict.fromkeys(args.beam))
    if min(beams) < 1:
        parser.error(f"--beam must be >= 1, got {min(beams)}")
    if args.sample and len(beams) > 1:
        parser.error("--sample decodes once: give no --beam, or one")
    args.beam = None  # each beam is set below, on the loaded config
    overrides = decode_overrides(args) + mode_overrides(args) + [f"decode.beam={beams[0]}", "decode.nbest=1"]
    if args.buckets:
        overrides.append(f"eval.length_buckets=[{args.buckets}]")
    if args.tag is not None and not re.fullmatch(r"[A-Za-z0-9_.+-]+", args.tag):
        parser.error(f"--tag {args.tag!r}: use letters, digits and _ . + - only")
    guides = load_guides(args)  # bad files fail before the model loads
    average = apply_average_args(parser, args)  # --save_average writes: after every check that reads no model
    run = load_ensemble(paths, args.config, overrides, args.device, average=average)
    cfg = run.cfg
    check_mode_flags(args, cfg.decode)
    from utils.config import check_decode

    for beam in beams[1:]:  # the first was checked with the config
        check_decode(cfg.decode.model_copy(update={"beam": beam}))
    for beam in beams:
        check_guides(guides, cfg.decode.model_copy(update={"beam": beam}), run)

    from data.sources import DataError, load_corpus  # nltk: only once the run has loaded
    from utils.io import ensure_dir

    corpus = load_corpus(cfg.data)
    names = splits_to_score(args.split, cfg.data.test, corpus)
    for name in names:  # every split asked for is scored, or none is
        if len(corpus[name]) == 0:
            raise DataError(f"split {name} has no sentence pairs: nothing to score")
    if guides.lines is not None:  # files line up with the sentences of one split (or its first --max_sentences)
        if len(names) > 1:
            raise DataError(f"--prefix_file and --constraints line up with one split, not {len(names)}: name it "
                            "with --split")
        size = len(corpus[names[0]])
        if guides.lines != min(size, args.max_sentences or size):
            guides.check_count(size, f"split {names[0]}")

    from utils.config import load_config
    from utils.run.layout import RunDir

    rd = RunDir(run.run_dir)
    out_dir = ensure_dir(rd.eval_dir, "the run's eval folder")
    tag = args.tag if args.tag is not None else settings_tag(load_config(rd.config).to_dict(),
                                                             cfg.to_dict(), args.max_sentences)
    if isinstance(run, LoadedEnsemble) and args.tag is None:
        members = hashlib.sha256(json.dumps(run.describe()).encode()).hexdigest()[:8]
        tag = "+".join(t for t in (f"ensemble{len(run.members)}-{members}", tag) if t)
    if args.tag is None:
        tag = "+".join(t for t in (tag, *guide_tag(guides)) if t)
    args.threads = threads if run.model.device.type == "cpu" else None  # recorded with each score
    for beam in beams:
        score_splits(run, corpus, names, cfg.decode.model_copy(update={"beam": beam}), tag, args, guides)
    print(f"hypotheses and scores written to {out_dir}")
    return 0


def score_splits(run: Any, corpus: Any, names: list[str], decode: Any, tag: str, args: argparse.Namespace,
                 guides: Any = None) -> None:
    """Decode and score each split of ``names`` under ``decode``; write its hypotheses and scores (and, for
    several splits, all of them in one file) to the run's eval folder; print a summary of each. ``guides``: the
    target prefixes and constraints of the command line (``utils.translation.guides.Guides``), if any."""
    from utils.io import atomic_write_text
    from utils.run.layout import RunDir
    from utils.translation.flags import describe_decoding
    from utils.translation.guides import guide_report
    from utils.translation.scoring import decode_and_score, scores_by_length

    cfg, rd = run.cfg, RunDir(run.run_dir)
    ckpt, beam = run.checkpoint.stem, decode.beam
    report = {}
    for name in names:
        split = corpus[name]
        n = min(len(split), args.max_sentences or len(split))
        sources, refs = list(split["src"][:n]), list(split["tgt"][:n])
        guided = guides is not None and guides.given
        scored = decode_and_score(run.model, run.tokenizer, sources, refs, decode, cfg.tokenizer.lowercase,
                                  guides=guides.take(n) if guided else None)
        hyps, scores, elapsed = scored.texts, scored.scores, scored.seconds
        by_length = scores_by_length(hyps, refs, scored.source_lengths, cfg.eval.length_buckets,
                                     cfg.tokenizer.lowercase)
        entry = {
            **scores.to_dict(), "split": name, "checkpoint": str(run.checkpoint), "step": run.step, "beam": beam,
            "lenpen": decode.lenpen, "seconds": elapsed, "sentences_per_s": n / max(elapsed, 1e-9),
            "threads": args.threads, "max_sentences": args.max_sentences, "overrides": list(args.overrides),
            "by_source_length": by_length,
        }
        if decode.min_len_a or decode.min_len_b:  # a length floor (no keys without one: files as they were)
            entry |= {"min_len_a": decode.min_len_a, "min_len_b": decode.min_len_b}
        if decode.no_repeat_ngram_size:  # likewise
            entry["no_repeat_ngram_size"] = decode.no_repeat_ngram_size
        if decode.sample:  # sampling and MBR settings, likewise only when used
            entry |= {k: getattr(decode, k) for k in ("sample", "temperature", "top_k", "top_p", "epsilon",
                                                      "num_samples", "seed")}
        if decode.mbr:
            entry |= {"mbr": decode.mbr, "mbr_utility": decode.mbr_utility}
        if getattr(run, "members", None):  # an ensemble: its members
            entry["ensemble"] = run.describe()
        coverage = None
        if guided:  # the prefixes and constraints, and how far the translations meet them
            guide_entry, coverage = guide_report(guides, hyps, [h.constraints_met for h in scored.best],
                                                 cfg.tokenizer.lowercase)
            entry |= guide_entry
        entry = write_scores(rd.eval_file(name, ckpt, beam, tag), entry, hyps)
        report[name] = entry
        decoder = describe_decoding(decode)
        if getattr(run, "members", None):
            decoder = f"ensemble of {len(run.members)}, {decoder}"
        if decode.min_len_a or decode.min_len_b:
            decoder += f", length floor {decode.min_len_a:g} * source + {decode.min_len_b}"
        print(f"{name}: {n} sentences, {decoder}, {entry['sentences_per_s']:.1f} sentences/s"
              f"{threads_note(args.threads)}")
        print(f"  sacreBLEU {scores.bleu:.2f}   chrF {scores.chrf:.2f}   nltk BLEU-4 {scores.nltk_bleu4:.2f}")
        print(f"  {scores.bleu_detail}")
        print(f"  sacreBLEU signature: {scores.bleu_signature}")
        print(f"  chrF signature:      {scores.chrf_signature}")
        print("  by source length (tokens):  " + "  ".join(
            f"{r['bucket']}: {r['bleu']:.1f} (n={r['n']})" if r["n"] else f"{r['bucket']}: - (n=0)" for r in by_length
        ))
        if coverage:
            print(coverage)
    if len(report) > 1:
        atomic_write_text(rd.eval_file("all", ckpt, beam, tag), json.dumps(report, indent=2, ensure_ascii=False) + "\n")


def write_scores(path: Path, entry: dict[str, Any], hyps: list[str]) -> dict[str, Any]:
    """Write a split's hypotheses (``path`` with ``.hyp``, one line each) and its score file ``path``, which records
    the sha256 of the hypotheses (``hyp_sha256``) and its own (``sha256``): a file changed after scoring is
    refused by the study that reads it. The entry written, checksums included."""
    from utils.io import atomic_write_text, with_sha256

    text = "\n".join(hyps) + "\n"
    entry = with_sha256({**entry, "hyp_sha256": hashlib.sha256(text.encode("utf-8")).hexdigest()})
    atomic_write_text(path.with_suffix(".hyp"), text)
    atomic_write_text(path, json.dumps(entry, indent=2, ensure_ascii=False) + "\n")
    return entry


def splits_to_score(asked: list[str] | None, listed: list[str], corpus: Any) -> list[str]:
    """The splits ``--split`` names (each a corpus split; ``test`` where the corpus has none of that name means
    ``data.test``), or ``data.test``'s without it; DataError, one line, for a split the corpus lacks."""
    from data.sources import DataError

    names: list[str] = []
    for name in asked or ["test"]:
        if asked and name in corpus:
            names.append(name)
            continue
        if name != "test":
            raise DataError(f"--split {name}: no such split; available: {', '.join(corpus)}")
        for listed_name in listed:
            if listed_name not in corpus:
                raise DataError(f"data.test: no split {listed_name!r} in the corpus; available: {', '.join(corpus)}")
            names.append(listed_name)
    if not names:
        raise DataError("data.test is empty: no split to score (name one with --split)")
    return list(dict.fromkeys(names))


#: Keys that change neither the hypotheses nor their scores (or are in the file name already).
NEUTRAL_KEYS = ("name", "decode.beam", "decode.nbest", "decode.batch_size", "data.test", "data.cache_dir",
                "data.num_proc", "train.", "eval.")  # eval: how the same hypotheses are broken down


def settings_tag(run: dict[str, Any], used: dict[str, Any], max_sentences: int | None) -> str:
    """A file-name tag for the settings under which a run is scored that differ from the run's own (``--set``,
    ``--config``, ``--lenpen``, ``--buckets``, ``--max_sentences``): "" when none do."""

    def flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
        return out

    before, after = flat(run), flat(used)
    changed = [f"{k}-{after[k]}" for k in after if after[k] != before.get(k) and not k.startswith(NEUTRAL_KEYS)]
    parts = ([f"n{max_sentences}"] if max_sentences else []) + changed
    tag = re.sub(r"[^A-Za-z0-9_.+-]+", "_", "+".join(str(p) for p in parts))
    if len(tag) > 80:
        tag = "settings-" + hashlib.sha256(tag.encode()).hexdigest()[:12]
    return tag


if __name__ == "__main__":
    run_main(main)
