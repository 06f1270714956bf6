"""A quick look at length: one run per encoding, each trained for a fixed wall time, scored by source length.

Not a controlled comparison (one seed, no significance tests, and the encodings reach different step counts in
the same time): for that, use bench/study.py.

    python bench/length_study.py --minutes 8 --encodings sinusoidal learnable rope alibi t5

For each encoding it trains ``configs/bench_short_<encoding>.yaml`` (training pairs capped at 16
tokens) for ``--minutes`` of wall time, scores ``--split`` (default ``test.iwslt-tst2010``: long TED
sentences) with test.py, and prints one Markdown table of BLEU per source-length bucket, also saved
as ``runs/length_study.{md,json}``. Extra ``--set`` options go to every training run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as bench/length_study.py: the repository root first

from bench.common import ROOT, project_command  # noqa: E402
from utils.run.layout import BEST, RunDir, latest_link_path  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    """The command line of bench/length_study.py."""
    from utils.cli import add_set_arg

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--encodings", nargs="+", default=["sinusoidal", "learnable", "rope", "alibi", "t5"],
                        help="encodings trained, each from configs/bench_short_<encoding>.yaml "
                             "(default sinusoidal learnable rope alibi t5)")
    parser.add_argument("--minutes", type=float, default=8.0, help="training wall time per encoding")
    parser.add_argument("--split", default="test.iwslt-tst2010",
                        help="split scored (default test.iwslt-tst2010: long TED sentences)")
    parser.add_argument("--beam", type=int, default=5, help="beam size of the scoring (default 5)")
    add_set_arg(parser, help="a config value applied to every run (repeatable)")
    return parser


def main() -> int:
    parser = build_parser()
    args = parser.parse_args()

    results = {}
    for enc in args.encodings:
        config = ROOT / "configs" / f"bench_short_{enc}.yaml"
        cmd = project_command("train.py", "--config", config, overrides=[f"train.max_minutes={args.minutes}",
                                                                          *args.overrides])
        print("$", " ".join(cmd), flush=True)
        subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        run = latest_link_path(ROOT / "runs", f"bench_short_{enc}").resolve()
        cmd = project_command("test.py", "--model_path", run, "--split", args.split, "--beam", str(args.beam))
        print("$", " ".join(cmd), flush=True)
        subprocess.run(cmd, cwd=ROOT, check=True)
        results[enc] = json.loads(RunDir(run).eval_file(args.split, BEST, args.beam).read_text())

    buckets = [row["bucket"] for row in next(iter(results.values()))["by_source_length"]]
    counts = [row["n"] for row in next(iter(results.values()))["by_source_length"]]
    lines = [
        f"BLEU on {args.split} by source length (subword tokens), beam {args.beam}, "
        f"{args.minutes:g} min of training each, training pairs <= 16 tokens",
        "",
        "| encoding | all | " + " | ".join(f"{b} (n={n})" for b, n in zip(buckets, counts, strict=True)) + " |",
        "|---|---|" + "---|" * len(buckets),
    ]
    for enc, r in results.items():
        cells = [f"{row['bleu']:.1f}" if row["n"] else "-" for row in r["by_source_length"]]
        lines.append(f"| {enc} | {r['bleu']:.1f} | " + " | ".join(cells) + " |")
    table = "\n".join(lines)
    print(table)
    (ROOT / "runs" / "length_study.md").write_text(table + "\n")
    (ROOT / "runs" / "length_study.json").write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    from utils.cli import run_main

    run_main(main)
