"""Each decoding mode of inference.py against plain beam search, through the real command, on one machine in one run;
prints a table of sentences/s, BLEU and chrF (and the ratio of each mode's speed to beam 5's).

    python bench/decoding_modes.py --model_path RUN1 RUN2 RUN3 --src test.fr --ref test.en [--sentences 500]
        [--threads 1] [--modes beam5,greedy,...] [--out runs/decoding_modes]

Every row is ``inference.py --model_path ... --input SRC --threads T FLAGS``; the speed is the command's own closing
line (reading, tokenizing, decoding and writing; model loading excluded). The modes:

- ``beam5``: each model alone, beam 5 (the baseline rows; the first model's row is what the others compare to);
- ``greedy``: the first model, ``--beam 1``;
- ``ensemble``: every ``--model_path`` as one ensemble, beam 5;
- ``sample``, ``sample-eps``: one ancestral sample, and one with ``--epsilon 0.02`` (seed 1);
- ``mbr16``, ``mbr32``, ``mbr32-eps``: MBR with chrF over 16 or 32 samples (plain or epsilon 0.02, seed 1);
- ``mbr-nbest``: MBR with chrF over the 16-best of beam 16;
- ``no-repeat3``: beam 5 where no 3-gram of tokens repeats in a translation (``--no_repeat_ngram_size 3``);
- ``prefix``: beam 5 continuing from each reference's first word (``--prefix_file``: interactive translation);
- ``constraints``: beam 5 with one term per sentence (``--constraints``), the longest word of 5 letters or more of
  its reference (an oracle terminology set: it measures how constraints are kept and what they cost, not what a
  real glossary gains). Its row, and beam 5's, give the share of sentences whose output holds the term.

Results: OUT/decoding_modes.json (every row) and OUT/report.md (the table), OUT/<mode>.en the outputs. Run it alone
on the machine: speeds are comparable only within one run."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: mode -> (label, inference.py flags; "{prefix}" and "{terms}" stand for the files this script writes).
MODES: dict[str, tuple[str, list[str]]] = {
    "greedy": ("greedy", ["--beam", "1"]),
    "ensemble": ("ensemble of every model, beam 5", []),
    "sample": ("one sample", ["--sample", "--seed", "1"]),
    "sample-eps": ("one epsilon sample (0.02)", ["--sample", "--epsilon", "0.02", "--seed", "1"]),
    "mbr16": ("MBR, chrF, over 16 samples", ["--sample", "--mbr", "16", "--seed", "1"]),
    "mbr32": ("MBR, chrF, over 32 samples", ["--sample", "--mbr", "32", "--seed", "1"]),
    "mbr32-eps": ("MBR, chrF, over 32 epsilon samples", ["--sample", "--epsilon", "0.02", "--mbr", "32",
                                                         "--seed", "1"]),
    "mbr-nbest": ("MBR, chrF, over beam 16's 16-best", ["--beam", "16", "--mbr", "16"]),
    "no-repeat3": ("beam 5, no repeated 3-grams", ["--no_repeat_ngram_size", "3"]),
    "prefix": ("beam 5 after the reference's first word", ["--prefix_file", "{prefix}"]),
    "constraints": ("beam 5, one reference term per sentence", ["--constraints", "{terms}"]),
}
SPEED = re.compile(r"\(([0-9.]+) sentences/s")
WORD = re.compile(r"[^\W\d_]{5,}")


def terms(refs: list[str]) -> list[list[str]]:
    """Each reference's longest word of at least 5 letters (the first of equal length), or none."""
    out = []
    for ref in refs:
        words = WORD.findall(ref)
        out.append([max(words, key=len)] if words else [])
    return out


def coverage(hyps: list[str], wanted: list[list[str]]) -> float:
    """The share (%) of sentences with a term whose output holds it (as a substring, case-sensitive)."""
    pairs = [(h, t[0]) for h, t in zip(hyps, wanted, strict=True) if t]
    return 100.0 * sum(t in h for h, t in pairs) / max(len(pairs), 1)


def decode(models: list[str], src: Path, flags: list[str], threads: int, out: Path) -> float:
    """Run inference.py; its outputs into ``out``; the sentences/s of its closing line."""
    cmd = [sys.executable, "inference.py", "--model_path", *models, "--input", str(src), "--threads", str(threads),
           *flags]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"decoding_modes: {' '.join(cmd[1:])} failed: {res.stderr.strip().splitlines()[-1:]}")
    out.write_text(res.stdout, encoding="utf-8")
    speeds = SPEED.findall(res.stderr)
    if not speeds:
        raise SystemExit(f"decoding_modes: no sentences/s line from {' '.join(cmd[1:])}")
    return float(speeds[-1])


def score(hyps: list[str], refs: list[str]) -> tuple[float, float]:
    """sacreBLEU's BLEU and chrF (default settings)."""
    from sacrebleu.metrics import BLEU, CHRF

    return BLEU().corpus_score(hyps, [refs]).score, CHRF().corpus_score(hyps, [refs]).score


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model_path", nargs="+", required=True, help="runs (the first: every single-model mode)")
    parser.add_argument("--src", type=Path, required=True, help="source sentences, one per line")
    parser.add_argument("--ref", type=Path, required=True, help="references, aligned with --src")
    parser.add_argument("--sentences", type=int, default=0, help="the first N lines only (0: all)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--modes", default=",".join(["beam5", *MODES]),
                        help=f"comma-separated, of: beam5, {', '.join(MODES)} (default: all)")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "decoding_modes")
    return parser


def main() -> int:
    parser = build_parser()
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    if unknown := [m for m in modes if m != "beam5" and m not in MODES]:
        parser.error(f"--modes: unknown {', '.join(unknown)} (of: beam5, {', '.join(MODES)})")
    if "beam5" not in modes:
        modes.insert(0, "beam5")  # the baseline of every ratio
    src_lines = args.src.read_text(encoding="utf-8").splitlines()
    refs = args.ref.read_text(encoding="utf-8").splitlines()
    if len(src_lines) != len(refs):
        parser.error(f"--src has {len(src_lines)} lines, --ref {len(refs)}")
    if args.sentences:
        src_lines, refs = src_lines[: args.sentences], refs[: args.sentences]
    args.out.mkdir(parents=True, exist_ok=True)
    src = args.out / "src.txt"
    src.write_text("".join(f"{s}\n" for s in src_lines), encoding="utf-8")
    wanted = terms(refs)
    files = {"{prefix}": args.out / "prefix.txt", "{terms}": args.out / "terms.jsonl"}
    files["{prefix}"].write_text("".join(f"{(r.split() or [''])[0]}\n" for r in refs), encoding="utf-8")
    files["{terms}"].write_text("".join(json.dumps(t, ensure_ascii=False) + "\n" for t in wanted), encoding="utf-8")
    rows = []
    jobs = [(f"beam5-{k + 1}", f"model {k + 1}, beam 5", [m], []) for k, m in enumerate(args.model_path)]
    jobs += [(mode, MODES[mode][0], args.model_path if mode == "ensemble" else args.model_path[:1],
              [str(files.get(f, f)) for f in MODES[mode][1]]) for mode in modes if mode != "beam5"]
    for name, label, models, flags in jobs:
        hyp = args.out / f"{name}.en"
        speed = decode(models, src, flags, args.threads, hyp)
        hyps = hyp.read_text(encoding="utf-8").splitlines()
        bleu, chrf = score(hyps, refs)
        row = {"mode": name, "label": label, "models": models, "flags": flags, "sentences_per_s": speed,
               "bleu": bleu, "chrf": chrf}
        if name in ("beam5-1", "constraints"):
            row["term_coverage"] = coverage(hyps, wanted)
        rows.append(row)
        print(f"{name}: {speed:.1f} sentences/s, BLEU {bleu:.2f}, chrF {chrf:.2f}", flush=True)
    base = rows[0]["sentences_per_s"]
    for row in rows:
        row["speed_vs_beam5"] = row["sentences_per_s"] / base
    singles = [r for r in rows if r["mode"].startswith("beam5-")]
    report = [f"{len(refs)} sentences of {args.src}, --threads {args.threads}; speed ratio: to model 1's beam 5.", "",
              "| decoding | flags | sentences/s | x beam 5 | BLEU | chrF | term coverage % |",
              "|---|---|---|---|---|---|---|"]
    for r in rows:
        flags = " ".join(Path(f).name if f.startswith(str(args.out)) else f for f in r["flags"])
        report.append(f"| {r['label']} | `{flags}` | {r['sentences_per_s']:.1f} | {r['speed_vs_beam5']:.2f} | "
                      f"{r['bleu']:.2f} | {r['chrf']:.2f} | {r.get('term_coverage', float('nan')):.1f} |"
                      .replace("| `` |", "| |").replace("| nan |", "| |"))
    if len(singles) > 1:
        report += ["", f"Single models' mean: BLEU {sum(r['bleu'] for r in singles) / len(singles):.2f}, chrF "
                       f"{sum(r['chrf'] for r in singles) / len(singles):.2f}."]
    from utils.io import atomic_write_text

    atomic_write_text(args.out / "decoding_modes.json", json.dumps({"sentences": len(refs), "src": str(args.src),
                                                                    "threads": args.threads, "rows": rows}, indent=1))
    atomic_write_text(args.out / "report.md", "\n".join(report) + "\n")
    print("\n".join(report))
    return 0


if __name__ == "__main__":
    from utils.cli import run_main

    run_main(main)
