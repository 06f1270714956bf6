"""bench/pilot_design.py: the second extrapolation study's rule, from the noise pilot's two scored arms to its arm,
seeds, looks and family file; each branch of the rule, the caps, and a family file bench/study.py accepts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import pilot_arm, results_doc, run_script

from bench.pilot_design import design, family, paired_residual, upper_limit
from utils.study.presets import EXTRAPOLATION_FAMILY
from utils.study.spec import read_family


def test_the_trained_systems_residual_and_its_upper_limit() -> None:
    """The residual of the trained systems alone (RoPE+NTK, the same models, left out), on (6 - 1) x 2 test sets =
    10 degrees of freedom; its 80 % upper limit is sd * sqrt(10 / chi2_0.2(10)) = sd * sqrt(10 / 6.179) (the
    chi-square table)."""
    assert paired_residual(pilot_arm(0.65, 55.0)) == (pytest.approx(0.65), 10)
    assert upper_limit(0.65, 10) == pytest.approx(0.65 * (10 / 6.179) ** 0.5, rel=1e-3)


def test_a_quieter_arm_of_the_same_quality_is_chosen_and_sets_the_seeds() -> None:
    """Cool at half plain's residual (0.65 against 1.30), 0.3 chrF lower at x1: the cool arm, planned at 0.827 (its
    upper limit), and the seeds the sequential design's table gives for it (bench/sequential_design.py --looks
    4,8,12 --family 24 --residual-sd 0.8269 --effect 1.0: 22 seeds, looks scaled to 8, 15, 22)."""
    d = design(pilot_arm(0.65, 55.7, pooled=0.3), pilot_arm(1.30, 56.0, pooled=0.3))
    assert d["arm"] == "cool" and d["overrides"] == ["train.cooldown=0.2", "train.ema_decay=0.99"]
    assert d["ratio"] == pytest.approx(0.5) and d["x1_chrf_gap"] == pytest.approx(-0.3)
    assert d["pilot"]["cool"]["x1_chrf"] == pytest.approx(55.7)  # test variants (rope+ntk) are not trained systems
    assert d["pilot"]["cool"]["pooled_residual_sd"] == 0.3  # recorded, not what plans the study
    assert (d["seeds"], d["looks"], d["capped"]) == (22, [8, 15, 22], False)
    assert d["planning_sd"] == pytest.approx(0.8269, abs=1e-4) and 0.8 <= d["power"] < 0.9
    assert 0.78 <= d["power_seed_test"] < d["power"]  # the t-test's degrees of freedom cost a little power
    f = family(d)
    assert {k: f[k] for k in EXTRAPOLATION_FAMILY if k != "declared"} == {
        k: v for k, v in EXTRAPOLATION_FAMILY.items() if k != "declared"}  # the first study's 24 tests
    assert f["sequential"] == {"looks": [8, 15, 22], "spending": "obf", "futility": True, "beta": 0.2,
                               "residual_sd": d["planning_sd"]}
    assert f["declared"].startswith("pre-registered on 2026-11-29")
    assert f["decodings"] == {"rope+ntk": "rope", "rope+yarn": "rope"}  # tested in RoPE's place, not beside it


@pytest.mark.parametrize(("cool", "why"), [((1.20, 56.0), "noise: ratio 0.92 > 0.9"),
                                          ((0.65, 55.4), "quality: x1 chrF 0.6 lower")])
def test_plain_stays_unless_cool_is_quieter_and_as_good(cool: tuple[float, float], why: str) -> None:
    d = design(pilot_arm(*cool), pilot_arm(1.30, 56.0))
    assert d["arm"] == "plain" and d["overrides"] == [] and d["planning_sd"] == pytest.approx(1.654, abs=1e-3), why
    assert (d["seeds_needed"], d["seeds"], d["capped"], d["looks"]) == (85, 30, True, [10, 20, 30])
    assert 0.2 < d["power"] < 0.8  # stated, not reached


def test_at_least_the_pilots_six_seeds() -> None:
    d = design(pilot_arm(0.20, 56.0), pilot_arm(0.9, 56.0))
    assert d["seeds_needed"] == 2 and (d["seeds"], d["looks"]) == (6, [2, 4, 6]) and d["power"] > 0.99


COOL = ("train.cooldown=0.2", "train.ema_decay=0.99")


def _write(folder: Path, arm: dict) -> None:
    folder.mkdir()
    (folder / "results.json").write_text(json.dumps(results_doc(**arm)))


def test_the_command_writes_a_family_file_the_study_reads(tmp_path: Path) -> None:
    for name, arm in (("cool", pilot_arm(0.65, 55.7, overrides=COOL)), ("plain", pilot_arm(1.30, 56.0))):
        _write(tmp_path / name, arm)
    res = run_script("bench/pilot_design.py", str(tmp_path / "cool"), str(tmp_path / "plain"), "--out",
                     str(tmp_path / "d"))
    assert res.returncode == 0, res.stderr
    assert "arm: cool (--set train.cooldown=0.2 --set train.ema_decay=0.99)" in res.stdout
    assert "seeds per system: 22 (power 0.8 needs 22), looks at 8, 15, 22" in res.stdout
    assert json.loads((tmp_path / "d" / "design.json").read_text())["seeds"] == 22
    declared = read_family(tmp_path / "d" / "family.json")
    assert declared["sequential"]["looks"] == [8, 15, 22] and len(declared["systems"]) == 6
    assert declared["decodings"] == {"rope+ntk": "rope", "rope+yarn": "rope"}
    missing = run_script("bench/pilot_design.py", str(tmp_path / "cool"), str(tmp_path / "none"), "--out",
                         str(tmp_path / "e"))
    assert missing.returncode == 2 and missing.stderr.strip().splitlines()[-1].endswith(
        "none: no results.json (score the pilot's arm first)") and not (tmp_path / "e").exists()


def test_only_the_two_arms_scored_at_all_six_seeds_are_read(tmp_path: Path) -> None:
    """An arm whose last scoring was cut short (its results.json at fewer seeds) or the arms given the wrong way
    round decide nothing: one line, no file written."""
    short = pilot_arm(0.65, 55.7, overrides=COOL) | {"seeds": [1, 2, 3, 4]}
    for name, arm in (("cool", pilot_arm(0.65, 55.7, overrides=COOL)), ("plain", pilot_arm(1.30, 56.0)),
                      ("short", short)):
        _write(tmp_path / name, arm)
    for first, second, said in (
            ("short", "plain", "short: scored at seeds [1, 2, 3, 4], not the pilot's 1-6 (bench/pilot_noise.sh "
                               "scores all six last: run it to its end)"),
            ("plain", "cool", "plain: not the cool arm (its overrides: train.num_threads=1; the arm's: "
                              "train.cooldown=0.2, train.ema_decay=0.99)"),
            ("cool", "cool", "cool: not the plain arm (its overrides: train.cooldown=0.2, train.ema_decay=0.99, "
                             "train.num_threads=1; the arm's: no train.cooldown or train.ema_decay)")):
        res = run_script("bench/pilot_design.py", str(tmp_path / first), str(tmp_path / second), "--out",
                         str(tmp_path / "d"))
        assert res.returncode == 2 and res.stderr.strip().splitlines()[-1].endswith(said), res.stderr
        assert not (tmp_path / "d").exists()


@pytest.mark.parametrize(("text", "said"), [
    ("{", "cannot read it as JSON"), ("[]", "a JSON object of the family's keys, not list"),
    ('{"declared": "x", "alpha": 1.5}', "alpha: 1.5 is not a number within (0, 1)"),
    ('{"declared": "x", "smallest_effect": NaN}', "smallest_effect: NaN is not a number > 0"),
    ('{"declared": "x", "metric": "TER"}', 'metric: "TER" is not one of chrF, BLEU'),
    ('{"declared": "x", "drops": ["a"]}', "drops: [\"a\"] is not an object"),
    ('{"declared": "x", "sequential": {"looks": [4, 2]}}', "family.sequential.looks: [4, 2]: increasing seed counts"),
    ('{"declared": "x", "sequential": {"looks": [2, 4], "futility": true}}', "futility needs residual_sd > 0"),
    ('{"declared": "x", "decodings": ["rope+ntk"]}', 'decodings: ["rope+ntk"] is not an object: a test-time decoding')])
def test_a_family_file_is_checked_in_one_line(tmp_path: Path, text: str, said: str) -> None:
    from utils.config import ConfigError

    path = tmp_path / "family.json"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        read_family(path)
    assert said in str(e.value) and "\n" not in str(e.value)
