"""Record what a study's runs not (yet) kept cost, before the machine that holds them may be replaced.

    python bench/study_unkept.py FOLDER [FOLDER ...] [--records DIR]

Each FOLDER is a study folder (``RUNS/study_NAME``, with ``runs/SYSTEM/seedN/RUN``; the second study has two, one
per arm: ``RUNS/study_extrapolation-sequential*``); DIR (by default the second study's
``bench/studies/extrapolation-sequential/records``) holds their kept runs' archives. Each run directory of a FOLDER
that no archive in DIR holds has its cost so far (training segments and score files, ``utils.study.cost.run_cost``),
last step and CPU merged into DIR/unkept.json (``utils.study.unkept``); so has each training killed without a closing
line (SIGKILL, a machine shut down), from its start to its last logged line, and each run removed since for want of a
first checkpoint, from its seed folder's study.log. Run it after stopping the study (SIGTERM: each training closes
its segment), then commit unkept.json: the study's page counts the runs it names that no archive keeps, the compute
lost with a replaced machine, killed, or in flight at the last record. Prints one line per run recorded and the
ledger's total.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as bench/study_unkept.py: the repository root first

RECORDS = Path(__file__).resolve().parent / "studies" / "extrapolation-sequential" / "records"


def build_parser() -> argparse.ArgumentParser:
    """The command line of bench/study_unkept.py."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", type=Path, nargs="+", metavar="FOLDER",
                        help="a study folder, RUNS/study_NAME (several: each is recorded)")
    parser.add_argument("--records", type=Path, default=RECORDS, metavar="DIR",
                        help="the folder of the study's kept archives, where unkept.json is written "
                             "(default: %(default)s)")
    return parser


def main() -> int:
    args = build_parser().parse_args()
    from utils.study.unkept import LEDGER, record_unkept, unkept_cost

    if not args.records.is_dir():
        print(f"error: {args.records}: no such folder of kept archives", file=sys.stderr)
        return 2
    try:
        recorded = record_unkept(args.folders, args.records)  # every folder's, or (one refused) nothing
        total = unkept_cost(args.records)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for key, entry in recorded.items():
        hours = (entry["train_cpu_s"] + entry["decode_cpu_s"]) / 3600
        killed = f" ({entry['killed_segments']} killed)" if entry["killed_segments"] else ""
        print(f"{key}: step {entry['steps']}, {_n(entry['segments'] + entry['killed_segments'], 'training segment')}"
              f"{killed}, {_n(entry['score_files'], 'score file')}, {hours:.2f} CPU core-hours ({entry['cpu']})")
    where = args.records / LEDGER
    if total is None:
        print(f"{where}: no run outside the kept archives")
    else:
        print(f"{where}: {_n(total['runs'], 'run')} outside the kept archives, "
              f"{total['train_cpu_hours'] + total['decode_cpu_hours']:.2f} CPU core-hours "
              f"({total['train_cpu_hours']:.2f} training, {total['decode_cpu_hours']:.2f} decoding)")
    return 0


def _n(count: int, what: str) -> str:
    """``1 run``, ``2 runs``."""
    return f"{count} {what}{'s' * (count != 1)}"


if __name__ == "__main__":
    raise SystemExit(main())
