"""The layer rule (README's design section), enforced by import-linter's contracts in pyproject.toml:
bench/ on everything, utils/ on models/, data/ and tokenizer/, which import nothing above them nor each
other (utils/io.py and utils/schema.py are their shared leaves); inside utils/ the sub-packages stack as training |
serve, figures, translation, run; and no package whose modules import each other in a circle."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from conftest import ROOT


def test_import_contracts_are_kept() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    res = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert "Contracts: 4 kept, 0 broken." in res.stdout


def test_the_lower_packages_load_without_anything_above_them() -> None:
    code = ("import sys, models.transformer, models.decoding, data.cache, data.sources, tokenizer.factory; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('utils', 'bench')))")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert set(ast.literal_eval(res.stdout.strip())) <= {"utils", "utils.io", "utils.schema"}, res.stdout  # leaves only
