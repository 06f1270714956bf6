"""bench/pilot_design.py: the second extrapolation study's rule, from the noise pilot's two scored arms to its arm,
seeds, looks and family file; each branch of the rule, the caps, and a family file bench/study.py accepts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_script

from bench.pilot_design import design, family
from utils.study.files import RESULTS_KEYS
from utils.study.presets import EXTRAPOLATION_FAMILY
from utils.study.spec import read_family

SYSTEMS = ("sinusoidal", "rope")


def _arm(sd: float, chrf: float, df: int = 15) -> dict:
    """A scored pilot arm: pooled residual ``sd``; every trained system scores ``chrf`` at x1 on both sets, 6 seeds
    spread around it."""
    splits = {s: {"beam5": {"chrf": [chrf + d for d in (-0.5, 0.5, -0.25, 0.25, -1.0, 1.0)]}}
              for s in ("test.tatoeba", "test.multi30k-2016", "test.tatoeba.x4")}
    return {"spec": {"variants": [{"label": s} for s in SYSTEMS]},
            "systems": {**{s: {"splits": splits} for s in SYSTEMS},
                        "rope+ntk": {"splits": {"test.tatoeba": {"beam5": {"chrf": [0.0] * 6}}}}},
            "primary": {"power": {"pooled_residual_sd": sd, "df": df, "seeds": 6}}}


def test_a_quieter_arm_of_the_same_quality_is_chosen_and_sets_the_seeds() -> None:
    """Cool at half plain's residual SD (0.65 against 1.30), 0.3 chrF lower at x1: the cool arm, and the seeds the
    sequential design's table gives for 0.65 (bench/sequential_design.py --looks 4,8,12 --family 24 --residual-sd
    0.65 --effect 1.0: 14 seeds, looks scaled to 5, 10, 14)."""
    d = design(_arm(0.65, 55.7), _arm(1.30, 56.0))
    assert d["arm"] == "cool" and d["overrides"] == ["train.cooldown=0.2", "train.ema_decay=0.99"]
    assert d["ratio"] == pytest.approx(0.5) and d["x1_chrf_gap"] == pytest.approx(-0.3)
    assert d["pilot"]["cool"]["x1_chrf"] == pytest.approx(55.7)  # test variants (rope+ntk) are not trained systems
    assert (d["seeds"], d["looks"], d["capped"], d["planning_sd"]) == (14, [5, 10, 14], False, 0.65)
    assert 0.8 <= d["power"] < 0.9
    f = family(d)
    assert {k: f[k] for k in EXTRAPOLATION_FAMILY if k != "declared"} == {
        k: v for k, v in EXTRAPOLATION_FAMILY.items() if k != "declared"}  # the first study's 24 tests
    assert f["sequential"] == {"looks": [5, 10, 14], "spending": "obf", "futility": True, "beta": 0.2,
                               "residual_sd": 0.65}
    assert f["declared"].startswith("pre-registered on 2026-11-29")


@pytest.mark.parametrize(("cool", "why"), [((1.20, 56.0), "noise: ratio 0.92 > 0.9"),
                                          ((0.65, 55.4), "quality: x1 chrF 0.6 lower")])
def test_plain_stays_unless_cool_is_quieter_and_as_good(cool: tuple[float, float], why: str) -> None:
    d = design(_arm(*cool), _arm(1.30, 56.0))
    assert d["arm"] == "plain" and d["overrides"] == [] and d["planning_sd"] == 1.30, why
    assert (d["seeds_needed"], d["seeds"], d["capped"], d["looks"]) == (53, 30, True, [10, 20, 30])
    assert 0.4 < d["power"] < 0.8  # stated, not reached


def test_at_least_the_pilots_six_seeds() -> None:
    d = design(_arm(0.30, 56.0), _arm(0.9, 56.0))
    assert d["seeds_needed"] == 3 and (d["seeds"], d["looks"]) == (6, [2, 4, 6]) and d["power"] > 0.99


def test_the_command_writes_a_family_file_the_study_reads(tmp_path: Path) -> None:
    for name, arm in (("cool", _arm(0.65, 55.7)), ("plain", _arm(1.30, 56.0))):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps(arm | {k: arm.get(k, {}) for k in RESULTS_KEYS}))
    res = run_script("bench/pilot_design.py", str(tmp_path / "cool"), str(tmp_path / "plain"), "--out",
                     str(tmp_path / "d"))
    assert res.returncode == 0, res.stderr
    assert "arm: cool (--set train.cooldown=0.2 --set train.ema_decay=0.99)" in res.stdout
    assert "seeds per system: 14 (power 0.8 needs 14), looks at 5, 10, 14" in res.stdout
    assert json.loads((tmp_path / "d" / "design.json").read_text())["seeds"] == 14
    declared = read_family(tmp_path / "d" / "family.json")
    assert declared["sequential"]["looks"] == [5, 10, 14] and len(declared["systems"]) == 6
    missing = run_script("bench/pilot_design.py", str(tmp_path / "cool"), str(tmp_path / "none"), "--out",
                         str(tmp_path / "e"))
    assert missing.returncode == 2 and missing.stderr.strip().splitlines()[-1].endswith(
        "none: no results.json (score the pilot's arm first)") and not (tmp_path / "e").exists()


@pytest.mark.parametrize(("text", "said"), [
    ("{", "cannot read it as JSON"), ("[]", "a JSON object of the family's keys, not list"),
    ('{"declared": "x", "alpha": 1.5}', "alpha: 1.5 is not a number within (0, 1)"),
    ('{"declared": "x", "metric": "TER"}', 'metric: "TER" is not one of chrF, BLEU'),
    ('{"declared": "x", "drops": ["a"]}', "drops: [\"a\"] is not an object"),
    ('{"declared": "x", "sequential": {"looks": [4, 2]}}', "family.sequential.looks: [4, 2]: increasing seed counts"),
    ('{"declared": "x", "sequential": {"looks": [2, 4], "futility": true}}', "futility needs residual_sd > 0")])
def test_a_family_file_is_checked_in_one_line(tmp_path: Path, text: str, said: str) -> None:
    from utils.config import ConfigError

    path = tmp_path / "family.json"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        read_family(path)
    assert said in str(e.value) and "\n" not in str(e.value)
