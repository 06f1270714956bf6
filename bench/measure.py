"""Running the real commands as a user would, with what the kernel counts for them (used by peers.py, speed.py)."""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from bench.common import ROOT


class CommandFailed(SystemExit):
    """A measured command exited non-zero; the message names it, its log and the log's last lines."""


@dataclass
class Measured:
    """Wall seconds, CPU user/system seconds, minor page faults and peak resident MiB of a process tree.

    ``peak_rss_mib`` is the largest peak of the process or any one of its descendants (``ru_maxrss``).
    """

    wall_s: float
    user_s: float
    sys_s: float
    minor_faults: int
    peak_rss_mib: float


def run_measured(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> Measured:
    """Run ``cmd`` from the repository root with stdout and stderr to ``log``; raise CommandFailed on failure."""
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, **(env or {})})
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-5:]
        raise CommandFailed(f"{Path(cmd[0]).name} {Path(cmd[1]).name if len(cmd) > 1 else ''} failed "
                            f"(exit {code}), see {log}: {' | '.join(tail)}")
    return Measured(wall, usage.ru_utime, usage.ru_stime, usage.ru_minflt, usage.ru_maxrss / 1024)
