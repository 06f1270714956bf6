"""The natural-length arm beside the short-trained arm: each system's length ratio and chrF at x1, x2, x4 and x8.

    python bench/arms_table.py SHORT_LOOK NATURAL_LOOK      # folders holding each arm's results.json

The second extrapolation study's pre-registration sets each system's x4 length ratio of the natural-length arm
(trained on pairs of every length, ``--preset train-natural-test-long``) beside the short-trained arm's: whether the
short arm's models stop early because they never saw long targets. Prints a Markdown table (``utils.study.arms``'s
``beside``): one row per system and arm, a description, no test.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as bench/arms_table.py: the repository root first


def build_parser() -> argparse.ArgumentParser:
    """The command line of bench/arms_table.py."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("short", type=Path, help="the short-trained arm's look (a folder holding its results.json)")
    parser.add_argument("natural", type=Path, help="the natural-length arm's look")
    parser.add_argument("--decoder", default="beam5", help="the decoder whose scores are shown (default beam5)")
    return parser


def main() -> int:
    parser = build_parser()
    args = parser.parse_args()
    from utils.study.arms import beside
    from utils.study.files import read_results

    for folder in (args.short, args.natural):
        if not (folder / "results.json").is_file():
            parser.error(f"{folder}: no results.json (score the arm first)")
    short, natural = (read_results(f) for f in (args.short, args.natural))
    try:
        print("\n".join(beside(short, natural, args.decoder)))
    except KeyError as e:
        parser.error(f"{args.short} and {args.natural}: not two arms scored on the same test sets with "
                     f"{args.decoder} (no {e})")
    return 0


if __name__ == "__main__":
    from utils.cli import run_main

    run_main(main)
