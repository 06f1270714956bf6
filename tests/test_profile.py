"""train.profile_steps: torch.profiler over real training steps, summed into the phases of a step."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from utils.run.layout import RunDir
from utils.run.store import create_run_dir
from utils.training.loop import train
from utils.training.profile import PHASES, phase_table, phase_times


def event(name: str, total: float, self_us: float | None = None, parent: SimpleNamespace | None = None,
          thread: int = 1, start: float = 0.0):
    return SimpleNamespace(name=name, cpu_time_total=total,
                           self_cpu_time_total=total if self_us is None else self_us, cpu_parent=parent,
                           thread=thread, time_range=SimpleNamespace(start=start, end=start + total))


def test_the_backward_run_on_the_autograd_thread_counts_in_the_backward_split() -> None:
    """On CUDA the autograd engine runs the backward on a device thread: its operators have no phase mark above
    them, and count by time in the step's ``phase:backward``; that thread's events outside it count nowhere."""
    step = event("ProfilerStep*", 100_000)
    bwd = event("phase:backward", 25_000, 25_000, parent=step, start=60_000)
    node = event("autograd::engine::evaluate_function: MmBackward0", 15_000, 1_000, thread=2, start=61_000)
    mm_grad = event("aten::mm", 14_000, parent=node, thread=2, start=61_500)
    sdpa_grad = event("aten::_scaled_dot_product_efficient_attention_backward", 5_000, thread=2, start=77_000)
    later = event("aten::mm", 3_000, thread=2, start=95_000)  # after the backward: not the step's backward
    ms = phase_times([step, bwd, node, mm_grad, sdpa_grad, later], steps=1)
    assert ms["backward: matmuls"] == pytest.approx(14.0)
    assert ms["backward: attention"] == pytest.approx(5.0)
    assert ms["backward: elementwise, autograd"] == pytest.approx(25.0 - 14.0 - 5.0)  # the node's own, the wait
    assert sum(ms.values()) == pytest.approx(100.0)


def test_phase_times_assigns_operators_to_their_phase_and_kind() -> None:
    """One fake step of 100 ms: each operator goes to its phase (forward split by kind); the rest is "other"."""
    step = event("ProfilerStep*", 100_000)
    data = event("phase:data", 5_000, parent=step)
    fwd = event("phase:forward", 50_000, 4_000, parent=step)
    linear = event("aten::linear", 20_000, 1_000, parent=fwd)
    mm = event("aten::addmm", 19_000, parent=linear)
    sdpa = event("aten::scaled_dot_product_attention", 12_000, 2_000, parent=fwd)
    inner = event("aten::_scaled_dot_product_flash_attention_for_cpu", 10_000, 7_000, parent=sdpa)
    softmax_in_attention = event("aten::_softmax", 3_000, parent=inner)
    norm = event("aten::layer_norm", 14_000, parent=fwd)
    loss = event("phase:loss", 6_000, parent=step)
    xent = event("aten::cross_entropy_loss", 5_000, parent=loss)  # inside loss: counted in the phase's total
    bwd = event("phase:backward", 25_000, 500, parent=step)
    node = event("autograd::engine::evaluate_function: MmBackward0", 15_000, 1_000, parent=bwd)
    mm_grad = event("aten::mm", 14_000, parent=node)
    sdpa_grad = event("autograd::engine::evaluate_function: ScaledDotProductFlashAttentionForCpuBackward0", 6_000,
                      1_000, parent=bwd)
    sdpa_grad_op = event("aten::_scaled_dot_product_flash_attention_for_cpu_backward", 5_000, parent=sdpa_grad)
    add = event("aten::add_", 3_500, parent=bwd)
    opt = event("phase:optimizer", 9_000, parent=step)
    events = [step, data, fwd, linear, mm, sdpa, inner, softmax_in_attention, norm, loss, xent, bwd, node, mm_grad,
              sdpa_grad, sdpa_grad_op, add, opt]
    ms = phase_times(events, steps=2)
    assert set(ms) == set(PHASES)
    assert ms["forward: matmuls"] == pytest.approx((1_000 + 19_000) / 2e3)
    assert ms["forward: attention"] == pytest.approx((2_000 + 7_000 + 3_000) / 2e3)
    assert ms["forward: softmax, LayerNorm, elementwise"] == pytest.approx(14_000 / 2e3)
    assert ms["forward: Python and dispatch"] == pytest.approx(4_000 / 2e3)
    assert (ms["data"], ms["loss"], ms["optimizer"]) == pytest.approx((2.5, 3.0, 4.5))
    assert ms["backward: matmuls"] == pytest.approx(14_000 / 2e3)
    assert ms["backward: attention"] == pytest.approx(6_000 / 2e3)  # the autograd node and its operator
    assert ms["backward: elementwise, autograd"] == pytest.approx((1_000 + 3_500 + 500) / 2e3)  # engine, add_, own
    assert ms["other"] == pytest.approx((100_000 - 5_000 - 50_000 - 6_000 - 25_000 - 9_000) / 2e3)
    assert sum(ms.values()) == pytest.approx(50.0)  # the rows add up to the step
    table = phase_table(ms)
    assert "| forward: attention | 6.0 | 12.0 % |" in table and table.endswith("| step | 50.0 | 100 % |")


def test_training_writes_the_phase_breakdown_of_its_profiled_steps(tmp_path: Path, tiny_config, caplog) -> None:
    cfg = tiny_config(tmp_path, max_steps=6, eval_every=6, profile_steps=3, profile_after=2)
    run = create_run_dir(cfg, tmp_path / "runs")
    with caplog.at_level("INFO", logger="train"):
        train(cfg, run)
    got = RunDir(run).phases()
    assert got["steps"] == 3 and got["phases"] == list(PHASES)
    ms = got["ms_per_step"]
    for phase in ("forward: matmuls", "forward: attention", "forward: softmax, LayerNorm, elementwise", "loss",
                  "backward: matmuls", "backward: attention", "backward: elementwise, autograd", "optimizer", "data"):
        assert ms[phase] > 0, phase
    assert ms["other"] >= 0  # the marks lie inside the recorded steps
    assert ms["backward: matmuls"] > ms["backward: elementwise, autograd"] * 0.05  # the engine's operators are found
    assert list((run / "profile").glob("*.pt.trace.json")), "the Chrome trace is written beside phases.json"
    trace = json.loads(next((run / "profile").glob("*.pt.trace.json")).read_text())
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {"phase:forward", "phase:backward", "phase:optimizer"} <= names
    assert sum(1 for n in names if str(n).startswith("ProfilerStep#")) == 3  # steps 3, 4 and 5 only
    assert "profile of 3 steps" in caplog.text and "| step |" in caplog.text


def test_a_run_ending_inside_the_window_writes_no_profile_and_unprofiled_runs_are_unchanged(
        tmp_path: Path, tiny_config) -> None:
    cfg = tiny_config(tmp_path, max_steps=3, eval_every=3, profile_steps=5, profile_after=1)
    run = create_run_dir(cfg, tmp_path / "a")
    train(cfg, run)
    with pytest.raises(ValueError, match="train.profile_steps"):
        RunDir(run).phases()
    # marks only while recording: a profiled run trains the same weights as an unprofiled one
    plain = create_run_dir(tiny_config(tmp_path, max_steps=3, eval_every=3), tmp_path / "b")
    train(tiny_config(tmp_path, max_steps=3, eval_every=3), plain)
    a = torch.load(run / "checkpoints" / "last.pt", weights_only=True)["model"]
    b = torch.load(plain / "checkpoints" / "last.pt", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_speed_real_part_reports_the_phase_table_of_a_profiled_train_py(tmp_path: Path) -> None:
    """bench/speed.py --parts real: the timed train.py, then a profiled one whose phases become the report's table."""
    from bench.speed import real_sections
    from bench.speed_runs import time_real_loop

    sets = ["model.d_model=32", "model.d_ff=64", f"data.cache_dir={tmp_path / 'c'}"]
    r = time_real_loop(Path("configs/demo.yaml"), sets, 3, "fp32", "cpu", tmp_path, profile_steps=2, profile_after=1)
    assert r["steps"] == 3 and set(r["phases"]) == set(PHASES) and r["phases"]["backward: matmuls"] > 0
    assert Path(r["profile_trace"], "phases.json").is_file()
    assert r["tok_per_s_last"] > 0  # the rate over the last logged window (train.log_every = steps // 3)
    lines = "\n".join(real_sections({"real.fp32": r}, {}))
    assert "| phase | fp32 |" in lines and "| forward: matmuls |" in lines
    assert f"| fp32 | 3 | {r['tok_per_s']:,.0f} | {r['tok_per_s_last']:,.0f} |" in lines
    step = sum(r["phases"].values())
    assert f"| step | {step:.1f} |" in lines
