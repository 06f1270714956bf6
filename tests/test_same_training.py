"""bench/same_training.py: two checkouts of the code train a preset's systems, and their checkpoints are compared
bit for bit."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from conftest import ROOT, run_script

from bench.same_training import differences


def test_differences_names_each_tensor_value_and_key_that_is_not_the_same() -> None:
    a = {"model": {"w": torch.ones(2, 3), "b": torch.zeros(3), "z": torch.zeros(2)}, "trainer": {"iteration": 12},
         "lr": [0.1, 0.2], "old": 1}
    same = {"model": {"w": torch.ones(2, 3), "b": torch.zeros(3), "z": torch.zeros(2)}, "trainer": {"iteration": 12},
            "lr": [0.1, 0.2], "old": 1}
    assert differences(a, same) == []
    other = {"model": {"w": torch.ones(2, 3) + torch.tensor([[0, 0, 2**-20], [0, 0, 0]]), "b": torch.zeros(4),
                       "z": torch.tensor([0.0, -0.0])},  # equal as numbers, not as bits
             "trainer": {"iteration": 13}, "lr": [0.1, 0.3], "ema": {}}
    assert differences(a, other, "last.pt") == [
        "last.pt/ema: in the second only", "last.pt/old: in the first only", "last.pt/lr[1]: 0.2 against 0.3",
        "last.pt/model/b: (3,) torch.float32 against (4,) torch.float32",
        "last.pt/model/w: differs (largest difference 9.54e-07)", "last.pt/model/z: differs (largest difference 0)",
        "last.pt/trainer/iteration: 12 against 13"]


def test_two_checkouts_each_system_identical_or_not_and_a_newer_key_listed_apart(tmp_path: Path) -> None:
    """This checkout against one whose train.py is this one's, plus a config key it writes (as a newer version adds
    one) and, for RoPE, another learning rate: each system trained by both side by side; sinusoidal identical bit
    for bit, the key listed apart, not a difference; RoPE different, its first differing values said; exit 3 (1
    is a crash). The --config given is every system's."""
    newer = tmp_path / "newer"
    (newer / ".venv" / "bin").mkdir(parents=True)
    (newer / ".venv" / "bin" / "python").write_text(f'#!/usr/bin/env bash\nexec {sys.executable} "$@"\n')
    (newer / ".venv" / "bin" / "python").chmod(0o755)
    (newer / "train.py").write_text(
        "import subprocess, sys\nfrom pathlib import Path\n"
        "lr = ['--set', 'train.lr=0.003'] if 'model.attention_pe=rope' in sys.argv else []\n"
        f"code = subprocess.call([sys.executable, 'train.py', *sys.argv[1:], *lr], cwd={str(ROOT)!r})\n"
        "runs = Path(sys.argv[sys.argv.index('--runs') + 1])\n"
        "for run in (p for p in runs.iterdir() if p.is_dir() and not p.is_symlink() and p.name[0] != '.'):\n"
        "    config = run / 'config.yaml'\n"
        "    config.write_text(config.read_text() + 'newer_key: 1\\n')\n"
        "sys.exit(code)\n")
    out = tmp_path / "same.json"
    res = run_script("bench/same_training.py", ".", str(newer), "--preset", "seed-table", "--config",
                     "configs/demo.yaml", "--variants", "sinusoidal,rope", "--steps", "2", "--eval-every", "2",
                     "--set", "model.d_model=32", "--set", "model.d_ff=64", "--set", "model.encoder_layers=1",
                     "--set", "model.decoder_layers=1", "--set", "train.valid_bleu_sentences=4", "--set",
                     f"data.cache_dir={tmp_path / 'c'}", "--out", str(out))
    assert res.returncode == 3, res.stdout + res.stderr
    assert res.stdout.strip().splitlines()[-1].startswith("NOT identical: 1 of 2 systems train the same weights with ")
    doc = json.loads(out.read_text())
    [sinusoidal, rope] = doc["rows"]
    assert (sinusoidal["system"], sinusoidal["identical"], sinusoidal["differences"],
            sinusoidal["keys_in_second_only"]) == ("sinusoidal", True, [], ["config/newer_key"])
    assert sinusoidal["tensors"] > 10 and doc["steps"] == 2
    assert rope["system"] == "rope" and not rope["identical"] and rope["differences"][0] == (
        "config/train/lr: 0.002 against 0.003") and rope["differences"][1].startswith("last.pt/")
    bad = run_script("bench/same_training.py", ".", str(tmp_path))
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].endswith(
        f"{tmp_path}: not a checkout with its .venv (train.py and .venv/bin/python)")
