"""bench/study.py: grids and presets, and a whole small study on the demo corpus (train, score, compare,
report), run twice to show it is idempotent and once more after a killed run to show it resumes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))

import study  # noqa: E402

from utils.checkpoint import load_checkpoint  # noqa: E402
from utils.config import ConfigError, load_config  # noqa: E402


def test_grid_is_the_cross_product_of_its_axes() -> None:
    variants = study.grid_variants(["model.attention_pe=none,rope", "model.input_pe=sinusoidal,none"])
    assert [v.label for v in variants] == ["attention_pe=none,input_pe=sinusoidal", "attention_pe=none,input_pe=none",
                                           "attention_pe=rope,input_pe=sinusoidal", "attention_pe=rope,input_pe=none"]
    assert variants[2].overrides == ["model.attention_pe=rope", "model.input_pe=sinusoidal"]
    with pytest.raises(ConfigError, match="expected KEY=V1,V2"):
        study.grid_variants(["model.attention_pe"])


def test_every_preset_variant_is_a_valid_config() -> None:
    presets = study.presets()
    assert set(presets) == {"seed-table", "all-encodings", "train-short-test-long", "tokenization"}
    assert [v.label for v in presets["seed-table"].variants] == ["sinusoidal", "learnable", "rope"]
    assert len(presets["all-encodings"].variants) == 11  # none + 6 input-level + 4 attention-level
    for name, preset in presets.items():
        labels = [v.label for v in preset.variants]
        assert preset.baseline in labels, name
        for v in preset.variants:
            cfg = load_config(ROOT / preset.config, v.overrides)
            for extra in v.tests.values():
                load_config(ROOT / preset.config, [*v.overrides, *extra])
            if name == "train-short-test-long":
                assert cfg.data.max_train_len == 16
    rope = next(v for v in presets["train-short-test-long"].variants if v.label == "rope")
    assert set(rope.tests) == {"linear", "ntk", "yarn"}


def test_budget_never_uses_wall_time_or_early_stopping() -> None:
    sets = dict(s.split("=", 1) for s in study.budget_overrides(1500, None, 300))
    assert sets["train.max_minutes"] == "null" and sets["train.max_steps"] == "1500"
    assert sets["train.max_target_tokens"] == "null" and int(sets["train.patience"]) >= 10**6
    assert dict(s.split("=", 1) for s in study.budget_overrides(None, 10**6, 300))["train.max_target_tokens"] == \
        "1000000"


def run_study(tmp: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "bench/study.py", "--config", "configs/demo.yaml", "--grid",
           "model.attention_pe=none,rope", "--set", "model.input_pe=none", "--set", "data.cache_dir=" + str(tmp / "c"),
           "--set", "model.d_model=32", "--set", "model.d_ff=64", "--set", "model.encoder_layers=1",
           "--set", "model.decoder_layers=1", "--seeds", "2", "--steps", "8", "--eval-every", "4", "--name", "t",
           "--runs", str(tmp), "--max-sentences", "12", "--attention-sentences", "6", "--bootstrap", "100", *extra]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)


def test_a_small_study_end_to_end_idempotent_and_resumable(tmp_path: Path) -> None:
    root = tmp_path / "study_t"
    # A run killed after its first checkpoint: 4 of the 8 steps done (what a study killed mid-run leaves).
    killed = root / "runs" / study.slug("attention_pe=rope") / "seed2"
    pre = subprocess.run([sys.executable, "train.py", "--config", "configs/demo.yaml", "--runs", str(killed),
                          "--set", "model.attention_pe=rope", "--set", "model.input_pe=none", "--set", "seed=2",
                          "--set", f"data.cache_dir={tmp_path / 'c'}", "--set", "model.d_model=32",
                          "--set", "model.d_ff=64", "--set", "model.encoder_layers=1",
                          "--set", "model.decoder_layers=1", "--set", "train.max_steps=4",
                          "--set", "train.eval_every=4"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert pre.returncode == 0, pre.stderr
    res = run_study(tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "4 runs, 0 trained, 4 to train" in res.stdout
    runs = sorted(p for p in root.glob("runs/*/seed*/demo_2*"))
    assert len(runs) == 4  # the killed run was resumed in place, not started again
    for run in runs:
        assert load_checkpoint(run / "checkpoints" / "last.pt")["trainer"]["iteration"] == 8
        assert (run / "eval" / "test.best.beam5.json").is_file() and (run / "eval" / "test.best.beam1.json").is_file()

    results = json.loads((root / "results.json").read_text())
    assert results["baseline"] == "attention_pe=none" and results["seeds"] == [1, 2]
    rope = results["systems"]["attention_pe=rope"]["splits"]["test"]["beam5"]
    assert len(rope["bleu"]) == 2 and rope["bleu_mean_std"][0] == pytest.approx(sum(rope["bleu"]) / 2)
    one = json.loads(next(p for p in runs if "rope" in str(p) and "seed1" in str(p)).joinpath(
        "eval", "test.best.beam5.json").read_text())
    assert rope["bleu"][0] == pytest.approx(one["bleu"])  # the report's numbers are test.py's
    comp = results["comparisons"]["attention_pe=rope"]["test"]["beam5"]["BLEU"]
    assert 0.0 <= comp["p_value"] <= 1.0 and comp["system"]["ci"] >= 0.0 and "bs:100" in comp["signature"]
    att = results["systems"]["attention_pe=rope"]["attention"][0]
    assert att["sentences"] == 6 and len(att["stats"]["cross"]["diagonal"]) == 1  # 1 decoder layer

    report = (root / "report.md").read_text()
    assert "## BLEU, beam 5" in report and "## What the intervals resolve" in report
    assert "attention_pe=rope vs attention_pe=none on test:" in report
    for fig in ("bleu_by_length_test.png", "valid_bleu.png", "attention_encoder.png", "attention_cross.png"):
        assert (root / "figures" / fig).stat().st_size > 1000, fig
    assert len({p.parent for p in (root / "tb").glob("*/events.out.tfevents.*")}) == 4  # HParams, one per run

    again = run_study(tmp_path)
    assert again.returncode == 0 and "4 runs, 4 trained, 0 to train" in again.stdout
    assert "  test " not in again.stdout  # every evaluation was already there
    assert sorted(p for p in root.glob("runs/*/seed*/demo_2*")) == runs
