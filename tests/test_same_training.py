"""bench/same_training.py: two checkouts of the code train a preset's systems, and their checkpoints are compared
bit for bit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
from conftest import ROOT

from bench.same_training import differences


def test_differences_names_each_tensor_value_and_key_that_is_not_the_same() -> None:
    a = {"model": {"w": torch.ones(2, 3), "b": torch.zeros(3)}, "trainer": {"iteration": 12}, "lr": [0.1, 0.2]}
    same = {"model": {"w": torch.ones(2, 3), "b": torch.zeros(3)}, "trainer": {"iteration": 12}, "lr": [0.1, 0.2]}
    assert differences(a, same) == []
    other = {"model": {"w": torch.ones(2, 3) + torch.tensor([[0, 0, 2**-20], [0, 0, 0]]), "b": torch.zeros(4)},
             "trainer": {"iteration": 13}, "lr": [0.1, 0.3], "ema": {}}
    assert differences(a, other, "last.pt") == [
        "last.pt/ema: in one only", "last.pt/lr[1]: 0.2 against 0.3", "last.pt/model/b: (3,) torch.float32 against "
        "(4,) torch.float32", "last.pt/model/w: differs (largest difference 9.54e-07)",
        "last.pt/trainer/iteration: 12 against 13"]


def test_one_checkout_against_itself_trains_identical_weights(tmp_path: Path) -> None:
    """A system trained twice by train.py, side by side: the same config and the same tensors, bit for bit."""
    out = tmp_path / "same.json"
    res = subprocess.run([sys.executable, "bench/same_training.py", ".", ".", "--preset", "seed-table", "--config",
                          "configs/demo.yaml", "--variants", "rope", "--steps", "2", "--eval-every", "2",
                          "--set", "model.d_model=32", "--set", "model.d_ff=64", "--set", "model.encoder_layers=1",
                          "--set", "model.decoder_layers=1", "--set", "train.valid_bleu_sentences=4",
                          "--set", f"data.cache_dir={tmp_path / 'c'}", "--out", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip().splitlines()[-1].startswith("identical: 1 of 1 systems train the same weights with ")
    doc = json.loads(out.read_text())
    assert [(r["system"], r["identical"], r["differences"], r["keys_in_one_only"]) for r in doc["rows"]] == [
        ("rope", True, [], [])]
    assert doc["rows"][0]["tensors"] > 10 and doc["steps"] == 2
    bad = subprocess.run([sys.executable, "bench/same_training.py", ".", str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].endswith(
        f"{tmp_path}: not a checkout with its .venv (train.py and .venv/bin/python)")
