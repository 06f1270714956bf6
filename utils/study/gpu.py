"""The GPU presets: ``configs/gpu_base.yaml`` (the base model at a GPU's batch) and ``configs/gpu_study.yaml`` (the
study's small model, several runs sharing one GPU), and what a study takes from the latter on a CUDA machine.

A study (bench/study.py) given no ``--jobs``, on a machine where CUDA is available and its commands run locally,
trains ``STUDY_RUNS_PER_GPU`` runs at a time on each GPU, one process each, every run with the ``train`` keys that
``configs/gpu_study.yaml`` sets itself (not those of its base): how the runs train, not what they learn (static
shapes give the loss of unpadded batches; a GPU run is not bit-reproducible anyway).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from utils.cli import ROOT

GPU_BASE = ROOT / "configs" / "gpu_base.yaml"
GPU_STUDY = ROOT / "configs" / "gpu_study.yaml"
#: Runs a study trains at once on one GPU when no --jobs is given: the H200 study kept its GPU busy 99-100 % of
#: the time with 15 processes (docs/pages/benchmarks/gpu.md); bench/gpu_bench.sh measures 1, 8 and 16.
STUDY_RUNS_PER_GPU = 16


def own_sets(path: Path) -> list[str]:
    """The ``--set`` lines of the ``train`` keys a config file sets itself (its ``base:`` left out)."""
    import yaml

    raw = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    train: dict[str, Any] = raw.get("train") or {}
    return [f"train.{key}={value if isinstance(value, str) else json.dumps(value)}" for key, value in train.items()]


def study_defaults(launcher: str) -> tuple[int, list[str]]:
    """(runs at a time, ``--set`` lines for every run) of a study given no ``--jobs``: ``STUDY_RUNS_PER_GPU`` on
    each GPU and the GPU preset's train keys where CUDA is available and ``launcher`` runs the commands on this
    machine, else (1, [])."""
    if launcher == "slurm":
        return 1, []
    import torch

    if not torch.cuda.is_available():
        return 1, []
    return STUDY_RUNS_PER_GPU * max(1, torch.cuda.device_count()), own_sets(GPU_STUDY)
