"""ruff, as configured in pyproject.toml ([tool.ruff]), is clean over the repository: the contributing page's
linters run in CI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import ROOT


def test_ruff_finds_nothing() -> None:
    ruff = Path(sys.executable).with_name("ruff")
    res = subprocess.run([str(ruff), "check", "--no-cache", "--output-format", "concise", "."], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert "All checks passed" in res.stdout
