"""Recompute a study's report (results.json, report.md, figures, TensorBoard) from its folder alone.

    python bench/study_report.py bench/studies/all-encodings

The command line and its code are in ``utils.study.report`` (``build_parser``, ``main``); this file is its entry point.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as bench/study_report.py: the repository root first

from utils.study.report import build_parser, main  # noqa: E402

__all__ = ["build_parser", "main"]

if __name__ == "__main__":
    from utils.cli import run_main

    run_main(main)
