"""Run by test_distributed.py under torchrun: one data-parallel training step per rank.

    torchrun --standalone --nproc_per_node=2 tests/ddp_worker.py OUT_DIR CONFIG

Each rank writes OUT_DIR/rank<r>.pt with the batch indices it would see in epoch 1, its weights
before and after one optimizer step, and the world size.
"""

from __future__ import annotations

import sys
from pathlib import Path

import ignite.distributed as idist
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from utils.config import load_config  # noqa: E402
from utils.training.evaluation import token_loss  # noqa: E402
from utils.training.setup import build_setup  # noqa: E402


def worker(local_rank: int, out: Path, config: str) -> None:
    cfg = load_config(config)
    run_dir = out / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    s = build_setup(cfg, run_dir)
    s.train_data.set_epoch(1)
    epoch = [batch.index.tolist() for batch in s.train_data]
    s.train_data.set_epoch(1)
    batch = next(iter(s.train_data)).to(s.device)
    before = {k: v.clone() for k, v in s.core.state_dict().items()}
    s.model.train()
    loss = token_loss(s.model(batch.src, batch.tgt_in), batch.tgt_out, s.tokenizer.pad_id) / batch.n_tgt_tokens
    loss.backward()
    s.optimizer.step()
    torch.save(
        {"world": idist.get_world_size(), "epoch": epoch, "before": before, "after": s.core.state_dict()},
        out / f"rank{idist.get_rank()}.pt",
    )


if __name__ == "__main__":
    with idist.Parallel(backend="gloo") as parallel:
        parallel.run(worker, Path(sys.argv[1]), sys.argv[2])
