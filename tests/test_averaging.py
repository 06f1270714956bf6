"""Checkpoint averaging (fairseq's average_checkpoints): exact on copies, a mean otherwise, and from the CLI."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import run_script

from utils.run.checkpoint import (
    CheckpointError,
    average_checkpoints,
    load_checkpoint,
    periodic_checkpoints,
    save_checkpoint,
)


def state(seed: int, fingerprint: str = "abc") -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"model": {"w": torch.randn(3, 4, generator=g), "h": torch.randn(5, generator=g).to(torch.bfloat16),
                      "ids": torch.arange(4)},
            "meta": {"model_fingerprint": fingerprint}, "trainer": {"iteration": seed}}


def test_averaging_n_copies_of_one_checkpoint_gives_that_checkpoint(tmp_path: Path) -> None:
    save_checkpoint(tmp_path / "a.pt", state(1))
    avg = average_checkpoints([tmp_path / "a.pt"] * 5)
    for name, tensor in state(1)["model"].items():
        assert torch.equal(avg["model"][name], tensor) and avg["model"][name].dtype == tensor.dtype, name


def test_averaging_is_the_parameter_mean_and_keeps_the_last_metadata(tmp_path: Path) -> None:
    paths = []
    for seed in (1, 2, 3):
        paths.append(tmp_path / f"step_{seed * 10}.pt")
        save_checkpoint(paths[-1], state(seed))
    avg = average_checkpoints(paths)
    expected = sum(state(s)["model"]["w"].double() for s in (1, 2, 3)) / 3
    torch.testing.assert_close(avg["model"]["w"], expected.float())
    assert avg["trainer"]["iteration"] == 3 and avg["averaged_from"] == [str(p) for p in paths]
    (tmp_path / "step_x.pt").write_bytes(b"")  # not a step number: ignored
    assert periodic_checkpoints(tmp_path) == paths


def test_averaging_refuses_checkpoints_of_different_models(tmp_path: Path) -> None:
    save_checkpoint(tmp_path / "a.pt", state(1))
    save_checkpoint(tmp_path / "b.pt", state(2, fingerprint="other"))
    with pytest.raises(CheckpointError, match="another model configuration"):
        average_checkpoints([tmp_path / "a.pt", tmp_path / "b.pt"])
    bad = state(3)
    bad["model"]["ids"] = torch.arange(4) + 1
    save_checkpoint(tmp_path / "c.pt", bad)
    with pytest.raises(CheckpointError, match="integer tensor that differs"):
        average_checkpoints([tmp_path / "a.pt", tmp_path / "c.pt"])


def test_training_keeps_the_last_k_checkpoints_and_the_cli_averages_them(tmp_path: Path, tiny_config) -> None:
    from utils.run.load import load_run
    from utils.run.store import create_run_dir
    from utils.training.loop import train

    cfg = tiny_config(tmp_path, max_steps=10, eval_every=2, keep_checkpoints=3)
    run = create_run_dir(cfg, tmp_path / "runs")
    train(cfg, run)
    kept = periodic_checkpoints(run / "checkpoints")
    assert [p.name for p in kept] == ["step_6.pt", "step_8.pt", "step_10.pt"]  # older ones removed
    averaged = load_run(run, average=3)
    expected = average_checkpoints(kept)["model"]
    for name, tensor in averaged.model.state_dict().items():
        assert torch.equal(tensor.cpu(), expected[name]), name
    assert averaged.checkpoint.name == "average3_step_6-step_10.pt"
    every = tiny_config(tmp_path, max_steps=7, eval_every=100, keep_checkpoints=2, checkpoint_every=3)
    other = create_run_dir(every, tmp_path / "runs2")
    train(every, other)
    assert [p.name for p in periodic_checkpoints(other / "checkpoints")] == ["step_3.pt", "step_6.pt"]
    res = run_script("test.py", "--model_path", str(run), "--average", "3", "--save_average", "--tag", "../x")
    assert res.returncode == 2 and "--tag '../x'" in res.stderr.strip().splitlines()[-1]
    assert not list((run / "checkpoints").glob("average*"))  # refused before the average is saved
    res = run_script("test.py", "--model_path", str(run), "--average", "3", "--save_average", "--beam", "1", "--split",
                     "validation")
    assert res.returncode == 0, res.stderr
    saved = run / "checkpoints" / "average3_step_6-step_10.pt"
    assert (run / "eval" / "validation.average3_step_6-step_10.beam1.json").is_file()
    for name, tensor in load_checkpoint(saved)["model"].items():
        assert torch.equal(tensor, expected[name]), name
    res = run_script("inference.py", "--model_path", str(run), "--average", "5", "--src_text", "Oui.")
    assert res.returncode == 2 and res.stderr.strip().splitlines()[-1].endswith(
        "holds 3 periodic checkpoint(s) (step_*.pt): the run kept train.keep_checkpoints=3; average at most 3, "
        "or train with train.keep_checkpoints >= 5")


def test_averaging_more_checkpoints_than_a_run_wrote_says_why(tmp_path: Path, tiny_config) -> None:
    """README's example once asked for 5 of a run that kept 5 but wrote 4: the error blamed keep_checkpoints."""
    from utils.run.load import load_run
    from utils.run.store import create_run_dir
    from utils.training.loop import train

    cfg = tiny_config(tmp_path, max_steps=7, eval_every=100, keep_checkpoints=5, checkpoint_every=3)
    run = create_run_dir(cfg, tmp_path / "runs")
    train(cfg, run)
    with pytest.raises(CheckpointError, match=r"holds 2 periodic checkpoint\(s\) \(step_\*.pt\): the run wrote only 2 "
                       r"\(one every train.checkpoint_every=3 iterations\) although it keeps 5; average at most 2, "
                       r"or checkpoint more often$"):
        load_run(run, average=5)
