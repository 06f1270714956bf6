"""A checkpoint changed after it was written is refused with one line: torch's zip reader checks no CRC."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from tests.conftest import translate_cli
from utils.run.checkpoint import CheckpointError, fit_state_dict, load_checkpoint, save_checkpoint
from utils.run.store import create_run_dir
from utils.training.loop import train


def overwrite_middle(path: Path, n: int = 4096) -> None:
    """``n`` random bytes (seeded) over the middle of ``path``, its size unchanged."""
    data = bytearray(path.read_bytes())
    start = len(data) // 2 - n // 2
    data[start:start + n] = random.Random(0).randbytes(n)
    path.write_bytes(bytes(data))


@pytest.fixture
def tiny_checkpoint(tmp_path: Path) -> tuple[Path, dict]:
    """A ~200 KB checkpoint written by the toolkit: its middle lies inside a tensor's bytes."""
    g = torch.Generator().manual_seed(0)
    state = {"model": {f"layer{i}.weight": torch.randn(128, 128, generator=g) for i in range(3)},
             "meta": {"model_fingerprint": "0123456789abcdef"}, "trainer": {"iteration": 7}}
    path = tmp_path / "best.pt"
    save_checkpoint(path, state)
    return path, state


def test_an_intact_checkpoint_loads_identically(tiny_checkpoint: tuple[Path, dict]) -> None:
    path, state = tiny_checkpoint
    loaded = load_checkpoint(path)
    assert loaded["meta"] == state["meta"] and loaded["trainer"] == state["trainer"]
    assert loaded["model"].keys() == state["model"].keys()
    assert all(torch.equal(loaded["model"][k], v) for k, v in state["model"].items())


def test_4_kib_overwritten_in_the_middle_is_damaged(tiny_checkpoint: tuple[Path, dict]) -> None:
    path, _ = tiny_checkpoint
    overwrite_middle(path)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(path)
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith(f"{path} is damaged: member '")
    assert message.endswith("' fails its CRC check (the file was changed or truncated after it was written)")


def test_a_truncated_checkpoint_is_damaged(tiny_checkpoint: tuple[Path, dict]) -> None:
    path, _ = tiny_checkpoint
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(CheckpointError, match=r"is damaged: its zip archive has no end \(the file was truncated"):
        load_checkpoint(path)


def test_a_wrong_shape_names_the_weight_and_both_shapes() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    weights["0.weight"] = torch.zeros(3, 5)
    weights["1.bias"] = torch.zeros(7)
    with pytest.raises(CheckpointError) as e:
        fit_state_dict(model, weights, "run/checkpoints/best.pt")
    assert str(e.value) == ("run/checkpoints/best.pt does not fit the model in its config: 0.weight has shape "
                            "[3, 5] in the checkpoint, [3, 4] in the model (1 more weight(s) differ in shape)")
    del weights["0.weight"], weights["1.bias"]
    with pytest.raises(CheckpointError, match=r"config: 0\.weight is missing \(2 missing, 0 unexpected weight"):
        fit_state_dict(model, weights, "run/checkpoints/best.pt")
    fit_state_dict(model, {k: v.clone() for k, v in model.state_dict().items()}, "best.pt")  # a fit loads


def test_inference_refuses_a_damaged_checkpoint_in_one_line(tmp_path: Path, tiny_config) -> None:
    cfg = tiny_config(tmp_path, max_steps=2, eval_every=2)
    run = create_run_dir(cfg, tmp_path / "runs")
    train(cfg, run)
    best = run / "checkpoints" / "best.pt"
    ok = translate_cli(run, ["Bonjour."])
    assert ok.returncode == 0, ok.stderr
    overwrite_middle(best)
    res = translate_cli(run, ["Bonjour."])
    assert res.returncode != 0
    assert "Traceback" not in res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert f"{best} is damaged: member '" in lines[0] and "fails its CRC check" in lines[0]
