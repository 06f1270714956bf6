"""Refresh tests/durations.json from a test log with every duration (``pytest --durations=0 > LOG``):

    python tests/durations.py LOG

Each test's seconds, its setup, call and teardown summed, rounded to 0.1 s; what tests/conftest.py queues the
work by (longest first)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

LINE = re.compile(r"^(\d+(?:\.\d+)?)s (setup|call|teardown)\s+(\S+)$")


def durations(log: str) -> dict[str, float]:
    """``{nodeid: seconds}`` from pytest's ``--durations`` lines in ``log``."""
    out: dict[str, float] = {}
    for line in log.splitlines():
        m = LINE.match(line.strip())
        if m:
            nodeid = m[3].split("@tests/", 1)[0]  # without pytest-xdist's @<group>
            out[nodeid] = out.get(nodeid, 0.0) + float(m[1])
    return {k: round(v, 1) for k, v in sorted(out.items())}


if __name__ == "__main__":
    found = durations(Path(sys.argv[1]).read_text(encoding="utf-8"))
    if not found:
        sys.exit(f"error: no --durations lines in {sys.argv[1]}")
    target = Path(__file__).with_name("durations.json")
    target.write_text(json.dumps(found, indent=0) + "\n", encoding="utf-8")
    print(f"{len(found)} tests, {sum(found.values()):.0f} s in all -> {target}")
