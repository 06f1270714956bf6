"""Train one Transformer per config.

    python train.py --config configs/demo.yaml [--set key=value ...] [--resume RUN_DIR]
    torchrun --nproc_per_node=N train.py --config ...      # data-parallel on N GPUs (or N CPU processes)

Reads the corpus and trains the tokenizer first, then creates runs/<name>_<YYYYmmdd_HHMMSS>/ (config.yaml,
tokenizer/, checkpoints/{best,last}.pt, tb/, train.log) and points runs/<name>_latest at it once it has a
checkpoint; a start that fails leaves nothing behind. <name> is --name, else the config's name (by default its
file name). --resume continues a run from its checkpoints/last.pt.
Under torchrun each process trains on a disjoint shard of the batches (NCCL on GPUs, gloo on CPU) and only rank 0
writes logs and checkpoints.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from utils.cli import add_set_arg, attach_log_file, run_main, setup_logging

if TYPE_CHECKING:
    from utils.config import Config


def distributed_backend(device: str = "auto") -> str | None:
    """The process group's backend for ``train.device``: None for a plain process; under torchrun (one process
    too: the process group and rank-0 paths users get with more) NCCL with one GPU per process, else gloo on CPU.
    ``device="cpu"`` hides the GPUs from this process (ignite would still bind rank r to GPU r). ConfigError, one
    line, where the machine has GPUs but fewer than torchrun's processes on it, or none and cuda was asked for."""
    import os

    if "TORCHELASTIC_RUN_ID" not in os.environ and int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return None
    if device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before anything initialises CUDA in this process
        return "gloo"
    import torch

    from utils.config import ConfigError

    gpus = torch.cuda.device_count()
    local = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    if gpus >= local:
        return "nccl"
    if gpus or device == "cuda":
        raise ConfigError(f"torchrun starts {local} processes on this machine, which has {gpus} GPU(s): one "
                          f"process per GPU (--nproc_per_node={gpus}), or train.device=cpu for CPU processes")
    return "gloo"


def resolve_config(args: argparse.Namespace, warn: bool = True) -> Config:
    """The config this process trains: ``--config`` with ``--set``, or the resumed run's own with ``--set`` (which
    must not change the model, nor may ``--config``). ConfigError, one line, for anything wrong with them or a
    training that would not fit the machine's memory (``models.memory.check``);
    ``warn=False``: no warning about ``--set`` values without effect (the check before the real load)."""
    from models.memory import check as check_memory
    from utils.config import ConfigError, load_config
    from utils.run.layout import RunDir
    from utils.run.load import check_compatible

    if not args.resume:
        cfg = load_config(args.config, args.overrides, warn)
        if getattr(args, "name", None) is not None:
            cfg = cfg.model_copy(update={"name": args.name})
        check_memory(cfg)  # what training will take, before anything is allocated (decoding a run never checks it)
        return cfg
    run = RunDir(Path(args.resume))
    if not run.last.is_file():
        raise ConfigError(f"--resume {run.root}: no {run.last.relative_to(run.root)} to resume from")
    run_cfg = load_config(run.config)
    cfg = load_config(run.config, args.overrides, warn)
    check_compatible(run_cfg, cfg, "--set")
    if args.config:
        check_compatible(run_cfg, load_config(args.config), args.config)
    check_memory(cfg)
    return cfg


def build_parser() -> argparse.ArgumentParser:
    """The command line of train.py."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="YAML config (not needed with --resume)")
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from checkpoints/last.pt")
    parser.add_argument("--runs", default="runs", help="folder for run directories (default: runs)")
    parser.add_argument("--name", help="name of the new run: RUNS/NAME_<date>_<time>/ and the link RUNS/NAME_latest "
                        "(default: the config's name, itself by default the config file's name without .yaml)")
    add_set_arg(parser)
    return parser


def main() -> int:
    parser = build_parser()
    args = parser.parse_args()
    if not args.config and not args.resume:
        parser.error("give --config (a new run) or --resume RUN_DIR")
    if args.resume and args.name is not None:
        parser.error("--name names a new run; --resume continues RUN_DIR under its own name")
    cfg = resolve_config(args, warn=False)  # bad input: one line here, before the training stack (ignite) is imported
    if not args.resume:
        from data.sources import check_hub
        from utils.run.layout import check_run_name

        check_run_name(cfg.name)
        check_hub(cfg.data)  # an IWSLT2017 start without the Hub: the error in seconds, not after its retries

    import logging

    import ignite.distributed as idist

    backend = distributed_backend(cfg.train.device)
    if backend is None:  # a plain process: the launcher has nothing worth saying
        logging.getLogger("ignite.distributed.launcher.Parallel").setLevel(logging.WARNING)
    with idist.Parallel(backend=backend) as parallel:
        parallel.run(run, args)
    return 0


def run(local_rank: int, args: argparse.Namespace) -> None:
    """One training process (rank ``idist.get_rank()``)."""
    import gc
    import logging

    import ignite.distributed as idist

    from utils.run.layout import RunDir
    from utils.run.store import check_runs_root, create_run_dir, discard_if_untrained, lock_run
    from utils.training.loop import train
    from utils.training.setup import prepare

    rank = idist.get_rank()
    cfg = resolve_config(args)
    if args.resume:
        from utils.run.checkpoint import check_checkpoint_file

        run_dir = RunDir(args.resume).root  # through a <name>_latest link: the run itself
        if rank == 0:
            check_checkpoint_file(RunDir(run_dir).last)  # a damaged last.pt: one line, nothing written
            lock_run(run_dir)  # before anything is written: a second --resume of this run stops here
    else:
        corpus = None
        if rank == 0:  # everything that can fail on bad input happens before the run directory exists
            setup_logging(buffer=True)
            check_runs_root(args.runs)
            corpus, tokenizer = prepare(cfg)
            run_dir = create_run_dir(cfg, args.runs, lock=True)
            tokenizer.save(RunDir(run_dir).tokenizer)
        if idist.get_world_size() > 1:  # every rank trains in rank 0's run directory
            run_dir = Path(idist.broadcast(str(run_dir) if rank == 0 else "", src=0, safe_mode=True))
    if rank == 0:
        if args.resume:
            setup_logging(str(RunDir(run_dir).log))
        else:
            attach_log_file(str(RunDir(run_dir).log))
        logging.getLogger("train").info("run directory: %s", run_dir)
    else:
        setup_logging()
        logging.getLogger().setLevel(logging.WARNING)
    def save_changed_config() -> None:  # validated first, written last: only once the run is sure to train
        if args.resume and args.overrides and rank == 0:
            from utils.config import save_config

            save_config(cfg, RunDir(run_dir).config)

    try:
        metrics = train(cfg, run_dir, resume=bool(args.resume), corpus=None if args.resume else corpus,
                        before_training=save_changed_config)
    except BaseException:
        if not args.resume and rank == 0 and discard_if_untrained(run_dir):
            print(f"removed {run_dir}: training stopped before its first checkpoint", file=sys.stderr)
        raise
    # The trainer's handlers hold the (DistributedDataParallel) model in reference cycles. Free it now, while
    # the process group and the interpreter are whole: collected at exit, its gloo work aborts the process.
    gc.collect()
    if idist.get_world_size() > 1:
        idist.barrier()  # no rank tears the group down while another still uses it
    if rank == 0:
        print(f"run directory: {run_dir}")
        if metrics:
            print("final validation: " + ", ".join(f"{k} {v:.3f}" for k, v in sorted(metrics.items())))


if __name__ == "__main__":
    run_main(main)
