"""A training step that does not log never waits for the device: the loss, the gradient norm and the non-finite guard
stay there until the next read (every ``train.log_every`` iterations, validation, checkpoints, the end), and the
guard still names the first bad step and skips bad steps on the device."""

from __future__ import annotations

import logging
import math
import traceback
from pathlib import Path

import pytest
import torch
from conftest import ROOT, make_tiny_config
from ignite.engine import Events

from utils.cli import StopError
from utils.run.store import create_run_dir
from utils.training.loop import Recipe

#: The ways Python code makes torch copy a value to the host (waiting for the device, on a GPU).
HOST_READS = ["item", "__float__", "__int__", "__bool__", "__index__", "cpu", "tolist", "numpy"]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sync")  # the tokenized data, built by the first run, reused by the others


def recipe(base: Path, tmp: Path, **train_kw) -> Recipe:
    cfg = make_tiny_config(base, log_attention_every=0, num_threads=1, **train_kw)
    return Recipe(cfg, create_run_dir(cfg, tmp / "runs"), resume=False)


def nan_at(r: Recipe, iterations: set[int]) -> None:
    """The model's output is NaN in the training steps ``iterations`` (so are their loss and gradients)."""
    r.s.core.register_forward_hook(
        lambda module, args, out: out * math.nan if r.s.model.training and r.trainer.state.iteration in iterations
        else None)


def count_host_reads(r: Recipe, monkeypatch: pytest.MonkeyPatch, last: int) -> tuple[list[str], list[int]]:
    """Record every host read (``HOST_READS``) from the start of iterations 1..last-1 to the fetch of the next
    batch (the step and all its ITERATION_COMPLETED handlers); on a GPU, make any synchronization there an error."""
    reads: list[str] = []
    watched: list[int] = []
    active = [False]
    for name in HOST_READS:
        original = getattr(torch.Tensor, name)

        def counted(self: torch.Tensor, *args, __original=original, __name=name, **kwargs):  # noqa: ANN202
            if active[0]:  # where: the innermost frame of this project's code
                ours = [f for f in traceback.extract_stack()[:-1]
                        if f.filename.startswith(f"{ROOT}/") and "/.venv/" not in f.filename]
                reads.append(f"{__name} at {Path(ours[-1].filename).relative_to(ROOT)}:{ours[-1].lineno}")
            return __original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)

    def start(engine) -> None:  # noqa: ANN001
        active[0] = engine.state.iteration < last
        if active[0]:
            watched.append(engine.state.iteration)
            if r.s.device.type == "cuda":
                torch.cuda.set_sync_debug_mode("error")

    def stop(engine) -> None:  # noqa: ANN001
        active[0] = False
        if r.s.device.type == "cuda":
            torch.cuda.set_sync_debug_mode("default")

    r.trainer.add_event_handler(Events.ITERATION_STARTED, start)
    r.trainer.add_event_handler(Events.GET_BATCH_STARTED, stop)
    r.trainer.add_event_handler(Events.COMPLETED, stop)
    return reads, watched


def test_steps_that_do_not_log_never_wait_for_the_device(cache_dir: Path, tmp_path: Path, monkeypatch) -> None:
    """Six optimizer steps (two batches each) of the demo's model shrunk, with the log line, validation and
    checkpoints at the last only: the iterations before copy nothing to the host (loss, gradient norm, the skipping
    guard and the weight average included); where there is a GPU, the same on it, where they must not synchronize
    either (``torch.cuda.set_sync_debug_mode("error")``)."""
    for device in ["cpu"] + (["cuda"] if torch.cuda.is_available() else []):
        with monkeypatch.context() as patch:
            r = recipe(cache_dir, tmp_path / device, device=device, max_steps=6, accumulate=2, log_every=12,
                       eval_every=12, nonfinite="skip", ema_decay=0.9)
            reads, watched = count_host_reads(r, patch, last=12)
            r.run()
        assert watched == list(range(1, 12)) and r.trainer.state.iteration == 12
        assert reads == [], device
        m = r.trainer.state.metrics
        assert math.isfinite(m["loss"]) and m["grad_norm"] > 0  # read at the last iteration


def test_stop_names_the_first_bad_step_at_the_next_read(cache_dir: Path, tmp_path: Path) -> None:
    """NaN at steps 2 and 3, read at step 5 (``train.log_every``): training stops there, naming step 2, before any
    checkpoint."""
    r = recipe(cache_dir, tmp_path, max_steps=10, log_every=5, eval_every=10)
    nan_at(r, {2, 3})
    with pytest.raises(StopError) as err:
        r.run()
    assert str(err.value) == ("training diverged at step 2: non-finite loss nan; nothing of this step was saved "
                              "(lower train.lr, or set train.nonfinite=skip to skip such steps)")
    assert r.trainer.state.iteration == 5
    assert not list((r.run_dir / "checkpoints").glob("*.pt"))


def test_skip_leaves_the_weights_unchanged_on_the_bad_step_and_training_goes_on(cache_dir: Path, tmp_path: Path,
                                                                               caplog) -> None:
    """``skip``, NaN at step 3: weights, their moving average and Adam's step count are those of step 2 after it,
    step 4 trains on, the run ends at its step budget with finite weights, and step 3 is logged as skipped."""
    r = recipe(cache_dir, tmp_path, max_steps=6, log_every=5, eval_every=6, nonfinite="skip", ema_decay=0.9)
    nan_at(r, {3})
    after: dict[int, tuple[dict, dict, float]] = {}

    @r.trainer.on(Events.ITERATION_COMPLETED)
    def _snapshot(engine) -> None:  # noqa: ANN001
        adam = r.s.optimizer.state[next(r.s.core.parameters())]
        after[engine.state.iteration] = ({k: v.clone() for k, v in r.s.core.state_dict().items()},
                                         {k: v.clone() for k, v in r.s.ema.module.state_dict().items()},
                                         float(adam["step"]))

    with caplog.at_level(logging.WARNING, logger="train"):
        r.run()
    weights2, average2, steps2 = after[2]
    weights3, average3, steps3 = after[3]
    assert all(torch.equal(weights2[k], weights3[k]) for k in weights2)
    assert all(torch.equal(average2[k], average3[k]) for k in average2)
    assert steps2 == steps3 == 2.0 and after[4][2] == 3.0
    assert any(not torch.equal(weights3[k], after[4][0][k]) for k in weights3)
    assert r.trainer.state.iteration == 6
    assert all(torch.isfinite(w).all() for w in after[6][0].values() if torch.is_floating_point(w))
    skipped = [rec.getMessage() for rec in caplog.records if "update skipped" in rec.getMessage()]
    assert skipped == ["step 3: non-finite loss nan, update skipped (train.nonfinite=skip)"]
