"""bench/gpu_bench.sh, the one prepared GPU call: its dry run on the CPU writes every file and field the GPU run
writes; the rates it reads from logged windows; the GPU presets, and bench/study.py taking the study's preset on a
machine with a CUDA GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import ROOT

from bench.gpu_bench_base import order, time_share
from bench.gpu_bench_plan import steady, together
from utils.config import load_config
from utils.study import stages
from utils.study.cli import main
from utils.study.gpu import GPU_BASE, GPU_STUDY, STUDY_RUNS_PER_GPU, own_sets, study_defaults
from utils.study.lock import unlock_study
from utils.training.profile import PHASES
from utils.training.setup import schedule_for_batch

GPU_KEYS = ["train.static_shapes=true", "train.compile=reduce-overhead"]


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    tmp = tmp_path_factory.mktemp("gpu_bench")
    env = {**os.environ, "OUT": str(tmp / "out"), "PYTHON": sys.executable, "EOLE_WHEELS": str(tmp / "no-wheels"),
           "HF_HOME": str(tmp / "hf"), "HF_HUB_OFFLINE": "1"}
    env.pop("WORK", None)
    res = subprocess.run(["bash", "bench/gpu_bench.sh", "--dry-run"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=900)
    return res, tmp / "out"


@pytest.mark.slow
def test_the_dry_run_writes_the_json_and_the_tables_of_every_part(dry_run: tuple[Any, Path]) -> None:
    res, out = dry_run
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == ["gpu_bench.json", "gpu_bench.md", "log.txt", "parts"]
    assert sorted(p.name for p in (out / "parts").iterdir()) == ["base.json", "eole.json", "profile.json",
                                                                 "study.json"]
    doc = json.loads((out / "gpu_bench.json").read_text())
    meta = doc["meta"]
    assert meta["dry_run"] is True and meta["command"].endswith("bash bench/gpu_bench.sh --dry-run")
    assert meta["machine"]["device"] == "cpu" and meta["machine"]["torch"] == torch.__version__
    assert meta["date"].endswith(" UTC") and meta["commit"]

    rows = doc["base"]["rows"]
    grid = {(r["precision"], r["target_tokens_per_step"], r["mode"]) for r in rows}
    assert grid == {(p, b, m) for p in ("fp32", "bf16") for b in (64, 128, 256) for m in ("eager", "reduce-overhead")}
    assert [(r["precision"], r["target_tokens_per_step"], r["mode"]) for r in rows[:2]] == [
        ("bf16", 256, "eager"), ("bf16", 256, "reduce-overhead")]  # the goal's settings first
    for r in rows:
        if r["mode"] == "eager":
            assert r["status"] == "ok" and r["steps"] == 5 and r["windows"] == 3, r
            assert r["tokens_per_s"] > 0 and r["steps_per_s"] > 0 and 0 < r["mfu"] < 1, r
            assert r["peak_memory_mib"] > 0 and 0 <= r["padding_share"] < 1 and r["max_tokens"] > 0, r
            assert abs(r["corpus_mean_target_tokens_per_step"] - r["target_tokens_per_step"]) < \
                0.25 * r["target_tokens_per_step"], r
        else:
            assert r["status"] == "skipped" and r["reason"].startswith("--dry-run: no compiling"), r
    assert doc["base"]["flops_per_target_token"] > 0 and doc["base"]["peak_flops"] > 0

    prof = doc["profile"]
    assert prof["status"] == "ok" and prof["setting"]["mode"] == "eager" and prof["phases"] == list(PHASES)
    assert set(prof["ms_per_step"]) == set(PHASES) and sum(prof["ms_per_step"].values()) > 0

    (row,) = doc["study"]["rows"]
    assert row["runs"] == 2 and row["status"] == "ok" and row["steps_per_s"] > 0, row
    assert row["steps_per_s_per_run"] == pytest.approx(row["steps_per_s"] / 2)

    assert doc["eole"]["status"] == "skipped"
    line = f"no eole-0.6.4 wheel in {out.parent / 'no-wheels'} (put it there with the wheels of its dependencies, " \
           "for this machine's Python)"
    assert doc["eole"]["reason"] == line
    assert f"eole: {line}: not measured" in (out / "log.txt").read_text().splitlines()

    md = (out / "gpu_bench.md").read_text()
    for heading in ("## The base model: target tokens/s, MFU and memory", "## Where the best setting's step goes",
                    "## Runs of the study's small model per GPU", "## Eole 0.6.4 on the same GPU"):
        assert heading in md
    assert "**--dry-run**" in md and f"Not measured: {line}." in md
    assert sum(ln.startswith(("| fp32 |", "| bf16 |")) for ln in md.splitlines()) == 12
    assert md in res.stdout  # printed as well


def test_the_steady_rate_is_the_median_of_the_second_half_of_the_windows() -> None:
    # 10 steps and 1,000 tokens a window, the first one slow (compiling): 4 s, then 1 s each
    points = [(4.0, 10, 1000), (5.0, 20, 2000), (6.0, 30, 3000), (7.0, 40, 4000), (9.0, 50, 5000)]
    assert steady(points) == {"tokens_per_s": 1000.0, "steps_per_s": 10.0, "windows": 3}
    assert steady(points[:3]) is None


def test_runs_at_once_count_the_steps_all_made_in_their_common_window() -> None:
    a = [(0.0, 0), (1.0, 10), (2.0, 20), (3.0, 30), (4.0, 40), (5.0, 50)]  # 10 steps/s from t=0
    b = [(1.0, 0), (2.0, 5), (3.0, 10), (4.0, 15), (5.0, 20), (6.0, 25)]  # 5 steps/s from t=1
    got = together([a, b])
    assert got is not None and got["how"] == "common window" and got["window_s"] == 2.0  # from 3 s (b's half) to 5 s
    assert got["steps_per_s"] == pytest.approx(15.0) and got["steps_per_s_per_run"] == pytest.approx(7.5)
    late = [(t + 100, s) for t, s in b]  # never at once: each run's own rate, summed, and said so
    apart = together([a, late])
    assert apart is not None and apart["steps_per_s"] == pytest.approx(15.0) and apart["window_s"] == 0.0
    assert apart["how"].startswith("sum of each run's own rate")
    assert together([a, b[:3]]) is None and together([]) is None


def test_the_goal_settings_run_first_then_every_eager_one_then_the_other_compiled_ones() -> None:
    got = order(["fp32", "bf16"], [4096, 32768], ["eager", "reduce-overhead"])
    assert got == [("bf16", 32768, "eager"), ("bf16", 32768, "reduce-overhead"), ("bf16", 4096, "eager"),
                   ("fp32", 32768, "eager"), ("fp32", 4096, "eager"), ("bf16", 4096, "reduce-overhead"),
                   ("fp32", 32768, "reduce-overhead"), ("fp32", 4096, "reduce-overhead")]


def test_the_goal_compiled_setting_gets_most_of_the_time_the_other_eager_ones_leave() -> None:
    settings = order(["fp32", "bf16"], [4096, 16384, 32768], ["eager", "reduce-overhead"])
    shares = [time_share(settings, i, 230.0) for i in range(len(settings))]
    assert shares[0] == 15.0 and shares[1] == pytest.approx((230 - 5 * 15) * 0.6)  # bf16 32k: eager, compiled
    assert shares[2:7] == [15.0] * 5 and shares[7] == 46.0  # the other eager ones; 230 s among 5 compiled left
    assert time_share(settings, 7, 200.0) == 45.0  # never less than a compiled setting needs to start


def test_the_gpu_presets_load_and_scale_the_schedule_with_the_batch() -> None:
    base = load_config(GPU_BASE)
    m = base.model
    assert (m.d_model, m.n_heads, m.encoder_layers, m.decoder_layers, m.d_ff) == (512, 8, 6, 6, 2048)
    assert base.data.max_tokens == 45056 and base.train.amp == "bf16"
    sched = schedule_for_batch(base.train, 32500)  # the target tokens per step of its batches on the bench corpus
    assert sched.peak_lr == pytest.approx(7e-4 * (32500 / 3500) ** 0.5) and sched.warmup_steps == 431
    assert schedule_for_batch(base.train, 3500).peak_lr == pytest.approx(7e-4)  # iwslt2017.yaml's at its batch
    assert schedule_for_batch(base.train, 3500).warmup_steps == 4000
    small = load_config(GPU_STUDY)
    assert (small.model.d_model, small.model.encoder_layers, small.data.max_train_len) == (256, 3, 16)
    assert own_sets(GPU_STUDY) == GPU_KEYS
    assert study_defaults("slurm") == (1, [])


def test_several_gpus_share_the_runs_at_a_time_evenly_16_on_each_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """With several GPUs, N runs at a time (``--jobs N``) spread evenly over them, each run seeing one GPU, and a
    study given no ``--jobs`` runs 16 on each (it ran one per GPU whatever ``--jobs`` said, and said 16)."""
    from utils.study.plan import slot_envs

    assert slot_envs(2, 5) == [{"CUDA_VISIBLE_DEVICES": d} for d in "01010"]
    assert slot_envs(4, 2) == [{"CUDA_VISIBLE_DEVICES": "0"}, {"CUDA_VISIBLE_DEVICES": "1"}]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in slot_envs(3, 48)] == [str(i % 3) for i in range(48)]
    threads = str(max(1, (os.cpu_count() or 1) // 2))
    assert slot_envs(1, 2) == slot_envs(0, 2) == [{"OMP_NUM_THREADS": threads}] * 2  # one GPU, or the CPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    assert study_defaults("local") == (3 * STUDY_RUNS_PER_GPU, GPU_KEYS)
    assert study_defaults("slurm") == (1, [])


def test_a_study_on_a_cuda_machine_without_jobs_trains_16_at_once_with_the_gpu_keys(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """bench/study.py in this process, its commands captured, not run: with CUDA, 16 runs at a time and every
    train.py with configs/gpu_study.yaml's train keys; --jobs given, or no CUDA: the runs' config as it was."""
    calls: list[tuple[int, list[list[str]]]] = []

    def capture(commands: list, devices: int, poll: float = 2.0, jobs: int = 1, progress: Any = None,
                launcher: Any = None) -> None:
        calls.append((jobs, [cmd for _, cmd, _ in commands]))
        if progress is not None:
            progress.close()

    monkeypatch.setattr(stages, "run_commands", capture)

    def run(name: str, *flags: str) -> tuple[int, list[list[str]]]:
        monkeypatch.setattr(sys, "argv", ["bench/study.py", "--config", "configs/demo.yaml", "--grid",
                                          "model.attention_pe=none,rope", "--seeds", "1", "--steps", "8", "--name",
                                          name, "--runs", str(tmp_path), "--train-only", *flags])
        try:
            main()
        finally:
            unlock_study(tmp_path / f"study_{name}")
        return calls[-1]

    jobs, cmds = run("cpu")
    assert jobs == 1 and all(not set(GPU_KEYS) & set(cmd) for cmd in cmds)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties",  # the memory check's GPU
                        lambda i: types.SimpleNamespace(total_memory=80 * 2**30, name="NVIDIA H100"))
    jobs, cmds = run("gpu")
    assert jobs == STUDY_RUNS_PER_GPU and len(cmds) == 2
    for cmd in cmds:
        sets = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--set"]
        assert set(GPU_KEYS) <= set(sets) and sets.index(GPU_KEYS[0]) < sets.index("seed=1")  # before seed, budget
    jobs, cmds = run("given", "--jobs", "3")
    assert jobs == 3 and all(not set(GPU_KEYS) & set(cmd) for cmd in cmds)
    _, cmds = run("eager", "--set", "train.compile=false")  # a --set of the user's wins over the preset's
    sets = [cmds[0][i + 1] for i, a in enumerate(cmds[0]) if a == "--set"]
    assert sets.index(GPU_KEYS[1]) < sets.index("train.compile=false")
