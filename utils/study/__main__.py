"""``python -m utils.study``: the study command line, the same as ``python bench/study.py`` (``utils.study.cli``)."""

from __future__ import annotations

import sys

from utils.cli import run_main
from utils.study.cli import main

if __name__ == "__main__":
    sys.argv[0] = "python -m utils.study"  # argparse's prog in usage and error lines (else "__main__.py")
    run_main(main)
