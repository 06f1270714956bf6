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
    """Every module of models/, data/ and tokenizer/ (subpackages included), imported in a fresh interpreter,
    brings in nothing of utils/ but its two leaves, and nothing of bench/."""
    code = ("import importlib, pkgutil, sys\n"
            "for name in ('models', 'data', 'tokenizer'):\n"
            "    package = importlib.import_module(name)\n"
            "    for info in pkgutil.walk_packages(package.__path__, name + '.'):\n"
            "        importlib.import_module(info.name)\n"
            "assert 'models.positional.rotary' in sys.modules and 'models.memory' in sys.modules\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('utils', 'bench')))")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert set(ast.literal_eval(res.stdout.strip())) <= {"utils", "utils.io", "utils.schema"}, res.stdout  # leaves only


def test_the_design_pages_code_layout_names_every_module_of_the_product() -> None:
    """docs/pages/design.md, "Code layout": the row of each product package (data, tokenizer, models, utils and its
    subpackages) names every module in it, so that a module added is a module described."""
    import re

    text = (ROOT / "docs" / "pages" / "design.md").read_text(encoding="utf-8")
    layout = text[text.index("## Code layout"):]
    rows = dict(re.findall(r"^\| `([\w/]+/)` \| (.*) \|$", layout[:layout.index("\n## ", 3)], re.M))
    packages = ["data/", "tokenizer/", "models/", "utils/", *(f"utils/{p.name}/" for p in sorted(
        (ROOT / "utils").iterdir()) if (p / "__init__.py").is_file())]
    for package in packages:
        assert package in rows, f"design.md's code layout has no row for {package}"
        modules = sorted(p.name for p in (ROOT / package).glob("*.py") if p.name != "__init__.py")
        missing = [m for m in modules if f"`{m}`" not in rows[package]]
        assert not missing, f"design.md's row for {package} does not name {missing}"
