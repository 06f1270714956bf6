"""bench/noise_ratio.py, the noise pilot's endpoint: the ratio of two studies' residual standard deviations with its
F interval, per quantity and pooled, against the F table; two studies whose families differ are refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import kept_run, pilot_arm, results_doc, run_script

from bench.noise_ratio import sd_ratio, table


def _study(folder: Path, sds: list[float], pooled: float, df: int = 12, seeds: int = 3) -> Path:
    folder.mkdir(parents=True)
    labels = [f"chrF q{i}" for i in range(len(sds))]
    power = {"pooled_residual_sd": pooled, "df": df, "seeds": seeds, "power_at_smallest_effect": 0.02,
             "seeds_for_80_at_smallest_effect": 40,
             "per_quantity": [{"label": label, "residual_sd": sd} for label, sd in zip(labels, sds, strict=True)]}
    results = results_doc(primary={"power": power, "tests": []}, seeds=list(range(1, seeds + 1)))
    (folder / "results.json").write_text(json.dumps(results))
    return folder


def test_the_interval_is_the_f_tables():
    """F(0.975; 12, 12) = 3.277 and F(0.975; 5, 5) = 7.146 (the F table): a ratio of SDs r has the interval
    r / sqrt(F) to r * sqrt(F) when both arms have the same degrees of freedom."""
    ratio, low, high = sd_ratio(0.5, 1.0, 12, 12)
    assert ratio == 0.5
    assert low == pytest.approx(0.5 / 3.277 ** 0.5, rel=1e-3) and high == pytest.approx(0.5 * 3.277 ** 0.5, rel=1e-3)
    _, low, high = sd_ratio(1.0, 1.0, 5, 5, level=0.95)
    assert (low, high) == (pytest.approx(1 / 7.146 ** 0.5, rel=1e-3), pytest.approx(7.146 ** 0.5, rel=1e-3))
    _, narrow_low, narrow_high = sd_ratio(1.0, 1.0, 5, 5, level=0.5)
    assert low < narrow_low < 1 < narrow_high < high


def test_the_table_holds_every_quantity_and_the_pooled_ratio(tmp_path: Path):
    cool = _study(tmp_path / "study_cool", [0.5, 1.2], 0.9, df=5, seeds=6)
    plain = _study(tmp_path / "study_plain", [1.0, 1.2], 1.1, df=5, seeds=6)
    out = table(cool, plain).splitlines()
    assert out[0].startswith("Residual SD of study_cool (first) against study_plain (second), 95% interval")
    assert out[4] == "| chrF q0 | 0.500 | 1.000 | 0.50 | 0.19-1.34 |"  # F(0.975; 5, 5) = 7.146
    assert out[5] == "| chrF q1 | 1.200 | 1.200 | 1.00 | 0.37-2.67 |"
    assert out[6].startswith("| pooled (the family) | 0.900 | 1.100 | 0.82 |")
    assert out[-2:] == ["| study_cool | 6 | 0.020 | 40 |", "| study_plain | 6 | 0.020 | 40 |"]


def test_studies_of_other_quantities_or_unscored_are_refused_in_one_line(tmp_path: Path):
    three = _study(tmp_path / "a", [1.0, 1.0, 1.0], 1.0)
    two = _study(tmp_path / "b", [1.0, 1.0], 1.0)
    res = run_script("bench/noise_ratio.py", str(three), str(two))
    assert res.returncode == 2 and res.stderr.strip().splitlines()[-1] == (
        "noise_ratio.py: error: the two studies' families test different quantities (chrF q2)")
    fewer = _study(tmp_path / "c", [1.0, 1.0, 1.0], 1.0, seeds=2)  # an arm whose scoring stopped at 2 seeds
    res = run_script("bench/noise_ratio.py", str(three), str(fewer))
    assert res.returncode == 2 and res.stderr.strip().splitlines()[-1] == (
        "noise_ratio.py: error: the two studies are scored at different seeds ([1, 2, 3] and [1, 2]): score both "
        "at the same seeds")
    res = run_script("bench/noise_ratio.py", str(three), str(tmp_path / "none"))
    assert res.returncode == 2 and res.stderr.strip().splitlines()[-1].endswith(
        "none: no results.json (score the study first)")


def test_each_arms_quality_is_printed_beside_its_noise(tmp_path: Path):
    """The pilot's declared secondary: the x1 chrF of the trained systems (not the test variants) and the validation
    BLEU at each run's last evaluation, so that an arm that is quieter because it is worse shows it."""
    folders = []
    for name, chrf, bleu in (("study_cool", 50.0, (38.0, 40.0)), ("study_plain", 52.0, (35.0, 41.0))):
        folder = _study(tmp_path / name, [1.0, 1.0], 1.0)
        results = json.loads((folder / "results.json").read_text())
        splits = {s: {"beam5": {"chrf": [chrf - 1, chrf + 1]}} for s in ("test.tatoeba", "test.multi30k-2016")}
        results["spec"] = {"variants": [{"label": "sinusoidal"}, {"label": "rope"}]}
        results["systems"] = {s: {"splits": splits, "valid_bleu": [[[300, 9.0], [900, b]] for b in bleu]}
                              for s in ("sinusoidal", "rope")}
        results["systems"]["rope+ntk"] = {"splits": {"test.tatoeba": {"beam5": {"chrf": [0.0, 0.0]}}}}
        (folder / "results.json").write_text(json.dumps(results))
        folders.append(folder)
    out = table(*folders).splitlines()
    assert out[-2:] == ["| study_cool | 50.00 | 50.00 | 39.00 ± 1.15 (4 runs) |",
                        "| study_plain | 52.00 | 52.00 | 38.00 ± 3.46 (4 runs) |"]
    assert out[-4].startswith("| arm | chrF test.tatoeba (beam 5) | chrF test.multi30k-2016 (beam 5) | validation BLEU")
    assert "Quality beside the noise" not in table(*[_study(tmp_path / f"bare{i}", [1.0], 1.0) for i in (1, 2)])
    # The study folders hold their runs, kept without TensorBoard events: each run's last validation is read from
    # its train.log (a resumed run's repeated line counted once), not from results.json.
    import yaml
    from conftest import make_tiny_config

    config = yaml.safe_dump(make_tiny_config(tmp_path).to_dict())
    for system in ("sinusoidal", "rope"):
        for seed, bleu in ((1, 30.0), (2, 32.5), (3, 35.0)):  # the study's seeds 1-3
            run = folders[0] / "runs" / system / f"seed{seed}" / "bench_short_1"
            run.mkdir(parents=True)
            (run / "config.yaml").write_text(config)
            line = "10:00:00 train: epoch {} step {} | valid loss 2.8 ppl 16.4 acc 0.5 BLEU {:.2f} chrF 50.0 | 'y'\n"
            (run / "train.log").write_text(line.format(1, 300, 11.04) + line.format(2, 900, bleu - 9)
                                           + line.format(2, 900, bleu))
    assert table(*folders).splitlines()[-2] == "| study_cool | 50.00 | 50.00 | 32.50 ± 2.24 (6 runs) |"


def test_the_trained_systems_residual_is_printed_beside_the_pooled_one(tmp_path: Path):
    """Beside the declared endpoint (the pooled ANOVA, whose systems include RoPE's test-time decodings: the same
    trained models), each arm's residual SD of sinusoidal against RoPE alone, the one the design's rule reads, and
    its ratio with the F interval on (6 - 1) x 2 = 10 degrees of freedom each: F(0.975; 10, 10) = 3.717."""

    folders = []
    for name, sd in (("study_cool", 0.65), ("study_plain", 1.30)):
        folder = _study(tmp_path / name, [1.0, 1.0], 0.3, df=15, seeds=6)
        results, arm = json.loads((folder / "results.json").read_text()), pilot_arm(sd, 55.0, pooled=0.3)
        results.update(spec=arm["spec"], systems=arm["systems"])
        results["primary"]["tests"] = arm["primary"]["tests"]
        (folder / "results.json").write_text(json.dumps(results))
        folders.append(folder)
    out = table(*folders).splitlines()
    at = next(i for i, line in enumerate(out) if line.startswith("Residual SD of the trained systems alone"))
    assert "(F on 10 and 10 degrees of freedom)" in out[at]
    low, high = 0.5 / 3.717 ** 0.5, 0.5 * 3.717 ** 0.5
    assert out[at + 4] == f"| 0.650 | 1.300 | 0.50 | {low:.2f}-{high:.2f} |"
    assert out[4].startswith("| chrF q0 | 1.000 | 1.000 |")  # the declared endpoint first, unchanged


def test_each_arms_compute_is_counted_from_its_runs_records_when_its_results_have_none(tmp_path: Path):
    """The pilot's arms were scored before results recorded their compute: what each cost is read from its runs'
    train.log summaries and score files (one thread each: 3,240 s of training and 360 s of decoding a run)."""
    folders = [_study(tmp_path / name, [1.0, 1.0], 1.0) for name in ("study_cool", "study_plain")]
    for folder in folders:
        for system in ("sinusoidal", "rope"):
            for seed in (1, 2, 3):
                kept_run(folder / "runs" / system / f"seed{seed}", 3240.0, 360.0)
    res = run_script("bench/noise_ratio.py", *map(str, folders))
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[-3:] == ["| study_cool | 6 | 5.4 | 0.6 | 0.0 |",
                                            "| study_plain | 6 | 5.4 | 0.6 | 0.0 |", "| both | 12 | 10.8 | 1.2 | 0.0 |"]
    bare = run_script("bench/noise_ratio.py", *map(str, [_study(tmp_path / f"bare{i}", [1.0], 1.0) for i in (1, 2)]))
    assert bare.returncode == 0 and "Compute" not in bare.stdout
