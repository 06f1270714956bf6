"""Data-parallel training with ignite.distributed: 2 gloo CPU processes under torchrun."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import ROOT, make_tiny_config

from utils.run.layout import read_summary

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]


def write_config(tmp: Path, valid_max_tokens: int | None = None, **train_kw) -> Path:
    cfg = make_tiny_config(tmp, **{"device": "cpu", **train_kw})  # gloo CPU processes, GPUs or not
    cfg.data.valid_max_tokens = valid_max_tokens
    path = tmp / "tiny.yaml"
    path.write_text(yaml.safe_dump(cfg.to_dict()))
    return path


def run(cmd: list[str], **env_vars: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", **env_vars}
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    return res


def test_two_ranks_see_disjoint_batches_and_keep_identical_weights(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    # ddp_worker.py starts gloo itself; ignite would still bind rank r to GPU r where there are GPUs
    run([*TORCHRUN, "tests/ddp_worker.py", str(tmp_path), str(config)], CUDA_VISIBLE_DEVICES="")
    r0 = torch.load(tmp_path / "rank0.pt", weights_only=True)
    r1 = torch.load(tmp_path / "rank1.pt", weights_only=True)
    assert r0["world"] == r1["world"] == 2
    seen0 = {i for batch in r0["epoch"] for i in batch}
    seen1 = {i for batch in r1["epoch"] for i in batch}
    assert seen0 and seen1 and not seen0 & seen1  # disjoint shards
    assert len(r0["epoch"]) == len(r1["epoch"])  # same number of steps per rank
    changed = 0
    for name, weight in r0["after"].items():
        assert torch.equal(r0["before"][name], r1["before"][name]), name  # DDP broadcast rank 0's init
        assert torch.equal(weight, r1["after"][name]), name  # gradients were averaged
        changed += not torch.equal(weight, r0["before"][name])
    assert changed > 0


def test_torchrun_train_writes_one_run_from_rank_zero(tmp_path: Path) -> None:
    # One validation batch for two ranks: each rank must still evaluate (none may be left without data).
    config = write_config(tmp_path, valid_max_tokens=4000, max_steps=3, eval_every=3, valid_bleu_sentences=5)
    res = run([*TORCHRUN, "train.py", "--config", str(config), "--runs", str(tmp_path / "runs")])
    runs = [p for p in (tmp_path / "runs").iterdir() if not p.is_symlink() and not p.name.startswith(".")]
    assert len(runs) == 1, runs  # rank 1 used rank 0's directory
    run_dir = runs[0]
    assert (run_dir / "checkpoints" / "last.pt").is_file() and (run_dir / "checkpoints" / "best.pt").is_file()
    assert len(list((run_dir / "tb").glob("events.out.tfevents.*"))) == 1
    assert "world size 2" in (run_dir / "train.log").read_text()
    assert res.stdout.count("run directory:") == 1
    state = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert state["trainer"]["iteration"] == 3
    # The summary's tokens (and tokens/s) are the run's, both ranks together, not rank 0's share; the checkpoint
    # keeps that count, so a resumed run goes on from it (max_target_tokens, run_target_tokens).
    summary = read_summary((run_dir / "train.log").read_text())
    assert summary["target_tokens"] > 0
    assert state["tokens_seen"] == {"tokens": summary["target_tokens"], "ranks": "all"}
    # summary.json is rank 0's, the one its log line shows (rank 1's would differ in its own memory and seconds).
    assert json.loads((run_dir / "summary.json").read_text()) == summary
    assert not list(run_dir.glob(".*.tmp"))
    # Resumed under torchrun as train.py --resume does (train.run), then what it left: left to the garbage collector
    # at interpreter exit, the DDP model's gloo work aborted rank 1 ("terminate called without an active exception",
    # SIGABRT) after a finished torchrun training.
    run([*TORCHRUN, "tests/ddp_train_worker.py", str(tmp_path), "--resume", str(run_dir), "train.max_steps=5"],
        CUDA_VISIBLE_DEVICES="")
    assert [(tmp_path / f"alive{r}.txt").read_text() for r in (0, 1)] == ["0", "0"]
    resumed = read_summary((run_dir / "train.log").read_text().split("resumed from", 1)[1])
    assert (resumed["resumed_from_step"], resumed["run_steps"], resumed["steps"]) == (3, 5, 2)
    assert resumed["run_target_tokens"] == summary["target_tokens"] + resumed["target_tokens"]
    assert torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["tokens_seen"]["tokens"] == \
        resumed["run_target_tokens"]
    shutil.rmtree(tmp_path / "runs")


def test_a_token_count_of_an_older_checkpoint_counts_its_rank_for_each() -> None:
    from utils.training.state import TokenCount

    old, new = TokenCount(world=2), TokenCount(world=2)
    old.load_state_dict({"tokens": 700})  # an older version's checkpoint: rank 0's own count
    new.load_state_dict({"tokens": 700, "ranks": "all"})
    assert (old.tokens, new.tokens) == (1400, 700)
    assert new.state_dict() == {"tokens": 700, "ranks": "all"}


def test_the_backend_follows_torchrun_the_device_and_the_gpus(monkeypatch) -> None:
    """A plain start has no process group; under torchrun (one process too) NCCL with a GPU per process, gloo on
    CPU (train.device=cpu hides the GPUs), one line where GPUs are fewer than the processes."""
    import train
    from utils.config import ConfigError

    for var in ("TORCHELASTIC_RUN_ID", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert train.distributed_backend() is None
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert train.distributed_backend() is None
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "abc")
    assert train.distributed_backend() == "nccl"
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="2 processes on this machine, which has 1 GPU"):
        train.distributed_backend()
    assert train.distributed_backend("cpu") == "gloo" and os.environ["CUDA_VISIBLE_DEVICES"] == ""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert train.distributed_backend("auto") == "gloo"
    with pytest.raises(ConfigError):
        train.distributed_backend("cuda")
