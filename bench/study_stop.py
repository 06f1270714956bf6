"""Has a group-sequential study reached its declared stopping rule? Reads each look's ``results.json`` in order.

    python bench/study_stop.py LOOK1 LOOK2 ...       # folders holding each look's results.json, the first first

A test is settled once it was resolved at some look (it stays resolved) or has crossed its futility boundary at the
latest look; the study stops when every test of its family is settled, or at its last planned look
(``utils.study.looks.settled``). Prints ``stop: WHY`` or ``continue: WHY`` on its first line, then the tests
resolved, futile and still open, what the runs of the latest look cost so far (CPU core-hours and GPU minutes, and
per test resolved at any look), and, where the study continues, what its next look and its last still need at that
cost per run (``utils.study.cost``). ``--also FOLDER`` (repeatable): other studies whose runs served this one (its
pilot's arms, a secondary arm), counted in an all-in cost beside the study's own: from their results.json's compute
figures, or, where it has none (scored by an older commit) or there is no results.json (kept runs unpacked), from
their runs' own records (``utils.study.cost.known_cost``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as bench/study_stop.py: the repository root first


def build_parser() -> argparse.ArgumentParser:
    """The command line of bench/study_stop.py."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("looks", type=Path, nargs="+", metavar="LOOK_DIR",
                        help="a folder holding a look's results.json (a scored study, or a copy of it), the first "
                             "look first")
    parser.add_argument("--also", type=Path, action="append", default=[], metavar="FOLDER",
                        help="a study whose runs served this one (e.g. its pilot's arms): counted in an all-in "
                             "cost beside the study's own, from its results.json's compute figures or, without "
                             "them, from its runs' records (repeatable)")
    return parser


def main() -> int:
    parser = build_parser()
    args = parser.parse_args()
    from utils.config import ConfigError
    from utils.study.files import read_results
    from utils.study.looks import settled

    primaries, latest = [], {}
    for folder in args.looks:
        if not (folder / "results.json").is_file():
            parser.error(f"{folder}: no results.json")
    for folder in args.looks:
        latest = read_results(folder, need=("primary",))
        primaries.append(latest["primary"])
    try:
        verdict = settled(primaries)
    except ConfigError as e:
        parser.error(str(e))
    print(f"{'stop' if verdict['stop'] else 'continue'}: {verdict['why']}")
    for kind in ("resolved", "futile", "open"):
        print(f"{kind} ({len(verdict[kind])}): {'; '.join(verdict[kind]) or '-'}")
    total = (latest.get("compute") or {}).get("total")
    if total:  # every run of the study so far: the latest look holds them all
        from utils.study.cost import needed_text, spent, still_needed

        resolved = len(verdict["resolved"])

        def line(what: str, runs: int, cpu: float, gpu: float) -> str:
            return (f"{what}: {runs} runs, {cpu:.1f} CPU core-hours, {gpu:.1f} GPU minutes; "
                    + (f"per test resolved so far: {cpu / resolved:.1f} CPU core-hours, {gpu / resolved:.1f} GPU "
                       "minutes" if resolved else "no test resolved so far"))

        cpu, gpu = spent(total)
        print(line("compute so far", total["runs"], cpu, gpu))
        if args.also:
            from utils.study.cost import known_cost
            others = []
            for f in args.also:
                if (other := known_cost(f)) is None:
                    parser.error(f"--also {f}: neither compute figures (results.json) nor runs (runs/SYSTEM/seedN/)")
                others.append(other)
            extra = [spent(o) for o in others]
            print(line(f"all-in, with {', '.join(f.resolve().name for f in args.also)}",
                       total["runs"] + sum(o["runs"] for o in others), cpu + sum(c for c, _ in extra),
                       gpu + sum(g for _, g in extra)))
        if not verdict["stop"] and (need := still_needed(latest)):
            print(f"still needed: {needed_text(need)}")
    return 0


if __name__ == "__main__":
    from utils.cli import run_main

    run_main(main)
