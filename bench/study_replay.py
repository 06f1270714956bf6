"""Do retrained runs repeat a published study's? (a seed repeats a CPU run exactly).

    python bench/study_replay.py bench/studies/extrapolation ../study-runs/study_extrapolation-candidates

The command line and its code are in ``utils.study.replay`` (``build_parser``, ``main``); this file is its entry point.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as bench/study_replay.py: the repository root first

from utils.study.replay import build_parser, main  # noqa: E402

__all__ = ["build_parser", "main"]

if __name__ == "__main__":
    from utils.cli import run_main

    run_main(main)
