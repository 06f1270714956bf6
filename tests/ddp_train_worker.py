"""Run by test_distributed.py under torchrun: train.py's per-rank function, then what it left alive.

    torchrun --standalone --nproc_per_node=2 tests/ddp_train_worker.py OUT_DIR CONFIG
    torchrun --standalone --nproc_per_node=2 tests/ddp_train_worker.py OUT_DIR --resume RUN_DIR [KEY=VALUE ...]

Trains as ``train.py --config CONFIG --runs OUT_DIR/runs`` does, or resumes as ``train.py --resume RUN_DIR --set
KEY=VALUE ...`` does. Each rank writes OUT_DIR/alive<r>.txt: how many DistributedDataParallel models still exist once
train.py's run() has returned, counted without collecting garbage (one left for exit-time collection aborted the
process).
"""

from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path

import ignite.distributed as idist
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import train  # noqa: E402


def worker(local_rank: int, out: Path, config: str, *resume: str) -> None:
    if config == "--resume":
        args = argparse.Namespace(config=None, resume=resume[0], runs=str(out / "runs"), overrides=list(resume[1:]))
    else:
        args = argparse.Namespace(config=config, resume=None, runs=str(out / "runs"), overrides=[])
    train.run(local_rank, args)
    alive = sum(isinstance(o, DistributedDataParallel) for o in gc.get_objects())
    (out / f"alive{idist.get_rank()}.txt").write_text(str(alive))


if __name__ == "__main__":
    with idist.Parallel(backend="gloo") as parallel:
        parallel.run(worker, Path(sys.argv[1]), *sys.argv[2:])
