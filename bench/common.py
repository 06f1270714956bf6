"""What the bench scripts share: the repository root, the project's own commands, table cells and host facts.

A script run directly (``python bench/x.py``) first puts the repository root on ``sys.path`` with its one
preamble line, then imports ``bench.common``; modules only ever imported need no preamble.
"""

from __future__ import annotations

import os
from pathlib import Path

from utils.cli import ROOT, project_command  # noqa: F401  (the bench scripts take them from here)


def fmt(x: float | None, digits: int = 1) -> str:
    """A table cell: ``x`` with thousands separators and ``digits`` decimals; "-" where it is missing."""
    if x is None:
        return "-"
    return f"{x:,.{digits}f}"


def ratio(a: float | None, b: float | None) -> str:
    """A table cell: ``a / b`` as ``1.23x``; "-" where either is missing (or ``b`` is 0)."""
    return f"{a / b:.2f}x" if a is not None and b else "-"


def cpu_model() -> str | None:
    """The processor's model name from /proc/cpuinfo; None where it cannot be read."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask; every core where the OS cannot say)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
