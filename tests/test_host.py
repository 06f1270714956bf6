"""Host settings: malloc tuning for training, and the CPU bf16 check behind train.amp_cpu's warning."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from utils.host import KERNEL_CACHES, cpu_has_native_bf16, keep_freed_memory, limit_kernel_caches


@pytest.mark.parametrize(
    ("flags", "native"),
    [
        ("fpu sse2 avx2 avx512f avx512bw", False),
        ("fpu avx512f avx512_bf16 avx512_vnni", True),
        ("fpu avx512f amx_bf16 amx_tile", True),
    ],
)
def test_cpu_bf16_is_read_from_cpu_flags(tmp_path: Path, flags: str, native: bool) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text(f"processor\t: 0\nmodel name\t: test\nflags\t\t: {flags}\n\nprocessor\t: 1\nflags\t\t: {flags}\n")
    assert cpu_has_native_bf16(str(info)) is native


def test_arm_bf16_feature_and_missing_cpuinfo(tmp_path: Path) -> None:
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n")
    assert cpu_has_native_bf16(str(arm)) is True
    assert cpu_has_native_bf16(str(tmp_path / "absent")) is False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt")
def test_malloc_keeps_freed_memory_on_linux() -> None:
    assert keep_freed_memory() is True


def test_kernel_caches_are_limited_unless_the_user_sized_them(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in KERNEL_CACHES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LRU_CACHE_CAPACITY", "1024")  # the user's choice stands
    assert limit_kernel_caches() == {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "8", "LRU_CACHE_CAPACITY": "1024"}


def test_training_limits_the_kernel_caches(tmp_path: Path, tiny_config, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from utils.run.store import create_run_dir
    from utils.training.loop import train

    for name in KERNEL_CACHES:
        monkeypatch.delenv(name, raising=False)
    cfg = tiny_config(tmp_path, max_steps=1, eval_every=1)
    train(cfg, create_run_dir(cfg, tmp_path / "runs"))
    assert {name: os.environ.get(name) for name in KERNEL_CACHES} == KERNEL_CACHES


def test_torchrun_processes_share_the_cores_instead_of_each_taking_them_all() -> None:
    from utils.training.setup import threads_per_process

    assert threads_per_process(2, 1, 2) == 2 and threads_per_process(None, 1, 2) is None  # one process: as before
    assert threads_per_process(2, 1, 1) == 1 and threads_per_process(8, 1, 4) == 4  # never more than its cores
    assert threads_per_process(16, 2, 4) == 2  # two processes share the 4 cores, not the 16 threads asked
    assert threads_per_process(2, 2, 2) == 1 and threads_per_process(None, 2, 16) == 8
    assert threads_per_process(3, 4, 2) == 1  # never zero


@pytest.mark.parametrize(("amp", "amp_cpu", "native", "expected"), [
    ("bf16", "auto", True, True), ("bf16", "auto", False, False), ("bf16", False, True, False),
    ("bf16", True, False, True), ("none", "auto", True, False), ("none", True, True, False)])
def test_cpu_precision_follows_amp_cpu_and_the_instruction_set(monkeypatch: pytest.MonkeyPatch, amp: str,
                                                               amp_cpu, native: bool, expected: bool) -> None:
    """train.amp_cpu=auto (the default): bf16 autocast on CPU exactly where the CPU computes bf16 natively."""
    import torch

    import utils.training.setup as setup
    from utils.config import TrainConfig

    monkeypatch.setattr(setup, "cpu_has_native_bf16", lambda: native)
    assert TrainConfig().amp_cpu == "auto"
    t = TrainConfig(amp=amp, amp_cpu=amp_cpu)
    *_, autocast = setup.optimization(t, torch.nn.Linear(2, 2), torch.device("cpu"), 1000.0)
    with autocast():
        assert torch.is_autocast_enabled("cpu") is expected
