"""The command line of bench/gpu_bench.sh's parts, one prepared GPU measurement: each part writes
``OUT/parts/<part>.json`` as it goes (a part stopped by its time cap keeps what it measured), and ``report`` joins
them into ``OUT/gpu_bench.json`` and ``OUT/gpu_bench.md``. The parts live in bench/gpu_bench_base.py (base, profile),
bench/gpu_bench_runs.py (study), bench/gpu_bench_eole.py and bench/gpu_bench_report.py.

    python bench/gpu_bench.py base|profile|study|eole|report --out OUT [--budget SECONDS] [--dry-run]

- ``base``: configs/gpu_base.yaml on the bench corpus (BPE 8000, as Eole's), trained in this process by the real
  training loop (``utils.training.loop.Recipe``, what train.py runs) for every precision (fp32; bf16 autocast),
  batch (``--batches``: real target tokens per optimizer step; ``data.max_tokens`` is chosen from the corpus's
  lengths to hold them on average) and mode (``--modes``: ``eager`` is ``train.compile=false``,
  ``train.static_shapes=false``; ``compile`` is ``train.compile=true`` and ``reduce-overhead`` (CUDA graphs) is
  ``train.compile=reduce-overhead``, both with ``train.static_shapes=true``). Each setting trains until it has
  logged ``--windows`` windows of ``train.log_every`` steps or its share of the budget is spent (no validation, no
  checkpoint); the goal's settings (bf16 at the largest batch) go first, its compiled ones with most of the time,
  then every eager one, then the other compiled ones (``time_share``): what the budget does not reach is a row
  saying so.
- ``profile``: the fastest setting of ``base`` again with ``train.profile_steps`` (utils/training/profile.py):
  milliseconds per step by phase.
- ``study``: configs/gpu_study.yaml with the ``train-short-test-long`` preset's keys (what bench/study.py trains
  on a GPU), ``--counts`` train.py processes at once on the one GPU (``OMP_NUM_THREADS`` shared as a study does),
  stopped together once each has logged 20 windows or their share of the budget is spent; with
  ``nvidia-cuda-mps-control`` on the PATH, the largest count again under CUDA MPS if time is left.
- ``eole``: Eole 0.6.4 (its wheel and those of its dependencies in ``$EOLE_WHEELS``, default ``.whl/eole``),
  the base model's sizes at the largest batch in bf16 on the same GPU, through bench/eole_runner.py; without its
  wheel, one line says so and the part is skipped.

Tokens/s count real target tokens (padding never counts). "Steady" rates are the median over the windows of the
second half of a setting's run (past its compilation); MFU is model FLOPs (bench/hardware.py, on the corpus's real
lengths) per second over the device's bf16 peak, for every precision. ``--dry-run``: the same path on the CPU with
the demo corpus and a d 32 model, a few steps: it tests the script and measures nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as bench/gpu_bench.py: the repository root first

from bench.common import ROOT  # noqa: E402
from bench.gpu_bench_plan import MODES, PRECISIONS, Plan  # noqa: E402

PARTS = ("base", "profile", "study", "eole", "report")


def numbers(text: str) -> list[int]:
    """``--batches`` / ``--counts``: positive whole numbers, comma-separated."""
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items or not all(x.isdigit() and int(x) > 0 for x in items):
        raise argparse.ArgumentTypeError(f"expected positive whole numbers, comma-separated, got {text!r}")
    return [int(x) for x in items]


def names(known: dict) -> object:
    """``--modes`` / ``--precisions``: some of ``known``, comma-separated."""
    def parse(text: str) -> list[str]:
        items = [x.strip() for x in text.split(",") if x.strip()]
        if not items or any(x not in known for x in items):
            raise argparse.ArgumentTypeError(f"expected some of {', '.join(known)}, comma-separated, got {text!r}")
        return items
    return parse


def arguments() -> argparse.ArgumentParser:
    """The options of a part (bench/gpu_bench.sh passes them; its own header documents them for users)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("part", choices=PARTS, help="what to measure, or report: join the parts' files")
    parser.add_argument("--out", required=True, help="folder of the results (parts/*.json, gpu_bench.json/.md)")
    parser.add_argument("--work", help="folder for runs, caches and Eole (default: a temporary one, removed after)")
    parser.add_argument("--budget", type=float, default=120.0, help="seconds this part may take (default 120)")
    parser.add_argument("--dry-run", action="store_true", help="the CPU, the demo corpus, a d 32 model, a few steps")
    parser.add_argument("--batches", type=numbers, help="base: real target tokens per step, comma-separated "
                                                        "(default 4096,16384,32768)")
    parser.add_argument("--modes", type=names(MODES), help=f"base: of {', '.join(MODES)} (default "
                                                           "eager,reduce-overhead)")
    parser.add_argument("--precisions", type=names(PRECISIONS), help="base: of fp32, bf16 (default both)")
    parser.add_argument("--windows", type=int, default=40, help="base: windows of train.log_every steps a setting "
                                                                "trains at most (default 40)")
    parser.add_argument("--counts", type=numbers, help="study: runs at once on the GPU, comma-separated "
                                                       "(default 16,1,8: the first pays for compiling)")
    parser.add_argument("--peak-tflops", type=float, help="the GPU's dense bf16 peak, where bench/hardware.py does not "
                                                          "know it")
    parser.add_argument("--command", default="", help="report: the command that ran the parts, for the header")
    return parser


def main() -> int:
    parser = arguments()
    args = parser.parse_args()
    if not args.budget > 0 or args.windows < 1:
        parser.error("--budget and --windows must be positive")
    out = Path(args.out)
    (out / "parts").mkdir(parents=True, exist_ok=True)
    if args.part == "report":
        from bench.gpu_bench_report import write_report

        print(write_report(out, args.command))
        return 0
    if not args.dry_run:
        import torch

        if not torch.cuda.is_available():
            print("gpu_bench: CUDA is not available here: run it on a GPU machine, or with --dry-run",
                  file=sys.stderr)
            return 2
    os.chdir(ROOT)  # the configs' relative paths are the repository's
    with tempfile.TemporaryDirectory(prefix="fr2en-gpu-bench-") as tmp:
        work = Path(args.work) if args.work else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        plan = Plan(args.dry_run, out.resolve(), work.resolve(), args.budget)
        if args.part in ("base", "profile"):
            from bench.gpu_bench_base import base_part, profile_part

            (base_part if args.part == "base" else profile_part)(plan, args)
        elif args.part == "study":
            from bench.gpu_bench_runs import study_part

            study_part(plan, args)
        else:
            from bench.gpu_bench_eole import eole_part

            eole_part(plan, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
