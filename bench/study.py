"""Train a grid of configurations x seeds at an equal budget, score every run, and report which differences
are significant (see ``python bench/study.py --help``).

    python bench/study.py --preset train-short-test-long --seeds 3 --steps 1500

The command line and its code are in ``utils.study.cli`` (``build_parser``, ``main``); this file is its entry point.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as bench/study.py: the repository root first

from utils.study.cli import build_parser, main  # noqa: E402

__all__ = ["build_parser", "main"]

if __name__ == "__main__":
    from utils.cli import run_main

    run_main(main)
