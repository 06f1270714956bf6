"""train.compile: the compiled training forward trains the same model as eager (same seed, same dropout)."""

from __future__ import annotations

from pathlib import Path

import torch

from utils.run.checkpoint import load_checkpoint
from utils.run.store import create_run_dir
from utils.training.loop import train


def test_compiled_and_eager_training_agree(tmp_path: Path, tiny_config) -> None:
    """Three real steps (dropout, label smoothing, Adam) each way, batches of changing shapes: the same weights
    up to float rounding (inductor fuses and reorders sums)."""
    from torch._dynamo.utils import counters

    counters.clear()
    final = {}
    for compiled in (False, True):
        cfg = tiny_config(tmp_path, max_steps=3, eval_every=3, compile=compiled)
        run = create_run_dir(cfg, tmp_path / f"runs_{compiled}")
        train(cfg, run)
        final[compiled] = load_checkpoint(run / "checkpoints" / "last.pt")["model"]
    assert counters["stats"]["unique_graphs"] > 0  # the second run really went through inductor
    for name, tensor in final[False].items():
        compiled = final[True][name]
        if name.endswith("kv_proj.bias"):  # keys' bias: zero gradient in exact arithmetic, Adam scales the noise
            compiled, tensor = compiled.chunk(2)[1], tensor.chunk(2)[1]
        torch.testing.assert_close(compiled, tensor, rtol=1e-4, atol=1e-5, msg=name)
