"""What the bench scripts share: the repository root, the project's own commands, table cells and host facts.

A script run directly (``python bench/x.py``) first puts the repository root on ``sys.path`` with its one
preamble line, then imports ``bench.common``; modules only ever imported need no preamble.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def set_flags(overrides: Iterable[str]) -> list[str]:
    """``["a=1", "b=2"]`` -> ``["--set", "a=1", "--set", "b=2"]``: overrides as the project's scripts take them."""
    return [x for o in overrides for x in ("--set", o)]


def project_command(script: str, *args: str | Path, overrides: Iterable[str] = (), python: str | None = None
                    ) -> list[str]:
    """``python SCRIPT ARGS --set O ...`` for one of the project's own scripts (train.py, test.py, inference.py),
    named relative to ROOT: run it with ``cwd=ROOT``."""
    return [python or sys.executable, script, *map(str, args), *set_flags(overrides)]


def fmt(x: float | None, digits: int = 1) -> str:
    """A table cell: ``x`` with thousands separators and ``digits`` decimals; "-" where it is missing."""
    if x is None:
        return "-"
    return f"{x:,.{digits}f}"


def fmt_mean_std(ms: tuple[float, float] | list[float] | None) -> str:
    """A table cell: ``mean ± std`` to two decimals; "-" where it is missing."""
    return "-" if ms is None else f"{ms[0]:.2f} ± {ms[1]:.2f}"


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


def mean_std(values: list[float]) -> tuple[float, float]:
    """The mean and the sample standard deviation (0 for one value)."""
    import statistics

    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0
