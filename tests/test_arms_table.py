"""bench/arms_table.py: the natural-length arm beside the short-trained arm, each system's length ratio and chrF at
x1 to x8, from the two looks' results.json; the published extrapolation study as the short arm."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from conftest import ROOT, run_script

from utils.io import with_sha256

PUBLISHED = ROOT / "bench" / "studies" / "extrapolation" / "results.json"


def test_each_system_of_both_arms_gets_a_row_per_arm_at_every_length(tmp_path: Path) -> None:
    short = json.loads(PUBLISHED.read_text(encoding="utf-8"))
    natural = copy.deepcopy(short)
    natural["seeds"] = [1, 2, 3]
    natural["spec"]["variants"] = [v for v in natural["spec"]["variants"] if v["label"] in ("sinusoidal", "rope")]
    row = natural["systems"]["rope"]["splits"]["test.tatoeba.x4"]["beam5"]
    row["length_ratio"], row["chrf"] = [0.9, 1.0, 1.1], [40.0, 41.0, 42.0]
    for name, doc in (("short", short), ("natural", natural)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps(with_sha256({k: v for k, v in doc.items()
                                                                              if k != "sha256"})))
    res = run_script("bench/arms_table.py", str(tmp_path / "short"), str(tmp_path / "natural"))
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    splits = [f"test.{f}{x}" for f in ("tatoeba", "multi30k-2016") for x in ("", ".x2", ".x4", ".x8")]
    assert lines[2] == "| system | arm | " + " | ".join(splits) + " |"  # test.iwslt-tst2010: no x2, x4, x8; left out
    assert [line.split(" | ")[:2] for line in lines[4:]] == [
        ["| sinusoidal", "short"], ["| sinusoidal", "natural"], ["| rope", "short"], ["| rope", "natural"]]
    published = short["systems"]["rope"]["splits"]["test.tatoeba.x4"]["beam5"]
    mean = sum(published["length_ratio"]) / 3
    assert lines[6].split(" | ")[4] == f"{mean:.2f} · {sum(published['chrf']) / 3:.1f}"  # the short arm's rope x4
    assert lines[7].split(" | ")[4] == "1.00 · 41.0"
    assert "short-trained: pairs of at most 16 tokens, seeds 1, 2, 3" in lines[0]
    missing = run_script("bench/arms_table.py", str(tmp_path / "short"), str(tmp_path / "none"))
    assert missing.returncode == 2 and missing.stderr.strip().splitlines()[-1].endswith(
        "none: no results.json (score the arm first)")
