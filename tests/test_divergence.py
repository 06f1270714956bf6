"""A diverged model: training stops (or skips) at the first non-finite step, and a NaN model is refused in one line."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

from utils.cli import StopError
from utils.run.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from utils.run.load import load_run
from utils.run.store import create_run_dir
from utils.training.loop import train


def test_a_diverging_run_stops_with_one_line_naming_the_step(tmp_path: Path, tiny_config) -> None:
    cfg = tiny_config(tmp_path, lr=1e30, scheduler="constant", max_steps=6, eval_every=3)
    run = create_run_dir(cfg, tmp_path / "runs")
    with pytest.raises(StopError) as err:
        train(cfg, run)
    message = str(err.value)
    assert "\n" not in message and re.match(r"training diverged at step 2: non-finite (loss|gradient norm) ", message)
    assert not list((run / "checkpoints").glob("*.pt"))  # it stopped before its first validation wrote one


def test_skipping_non_finite_steps_keeps_the_weights_finite(tmp_path: Path, tiny_config, caplog) -> None:
    cfg = tiny_config(tmp_path, lr=1e30, scheduler="constant", max_steps=4, eval_every=4, nonfinite="skip")
    run = create_run_dir(cfg, tmp_path / "runs")
    with caplog.at_level("WARNING", logger="train"):
        train(cfg, run)
    skipped = [int(m.group(1)) for r in caplog.records if (m := re.match(r"step (\d+): non-finite", r.getMessage()))]
    assert skipped == [2, 3, 4]
    state = load_checkpoint(run / "checkpoints" / "last.pt")
    assert state["trainer"]["iteration"] == 4
    assert all(bool(torch.isfinite(w).all()) for w in state["model"].values() if torch.is_floating_point(w))


def test_a_model_with_non_finite_weights_is_refused_for_translation(tmp_path: Path, tiny_config) -> None:
    cfg = tiny_config(tmp_path, max_steps=2, eval_every=2)
    run = create_run_dir(cfg, tmp_path / "runs")
    train(cfg, run)
    state = load_checkpoint(run / "checkpoints" / "best.pt")
    name = next(iter(state["model"]))
    state["model"][name] = torch.full_like(state["model"][name], math.nan)
    save_checkpoint(run / "checkpoints" / "best.pt", state)
    with pytest.raises(CheckpointError, match=rf"best.pt has non-finite weights \({re.escape(name)} holds NaN"):
        load_run(run)
    assert load_run(run / "checkpoints" / "last.pt").step == 2  # the run's other checkpoint still loads

