"""What the parts of bench/gpu_bench.sh share: where they run and write (``Plan``), the settings they train with,
how a rate is read from a run's logged windows, and the machine they ran on."""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import ROOT, cpu_model
from utils.io import atomic_write_text

#: The modes of the base model's grid: their train keys.
MODES = {"eager": ["train.compile=false", "train.static_shapes=false"],
         "compile": ["train.compile=true", "train.static_shapes=true"],
         "reduce-overhead": ["train.compile=reduce-overhead", "train.static_shapes=true"]}
PRECISIONS = {"fp32": ["train.amp=none"], "bf16": ["train.amp=bf16", "train.amp_cpu=true"]}
#: configs/demo.yaml's corpus and a d 32 model: what --dry-run trains.
TINY = ["data.source=demo", "data.test=[test]", "data.max_len=64", "data.num_proc=1", "tokenizer.vocab_size=400",
        "tokenizer.min_frequency=1", "model.d_model=32", "model.n_heads=2", "model.encoder_layers=1",
        "model.decoder_layers=1", "model.d_ff=64", "train.num_threads=1"]
#: Whatever stops a run here is the bench, not the config: no validation, checkpoint or early stop on the way.
RUN_KEYS = ["train.eval_every=100000000", "train.log_attention_every=0", "train.valid_bleu_sentences=2",
            "train.keep_checkpoints=0", "train.epochs=100000", "train.patience=100000"]


@dataclass
class Plan:
    """What a part measures and where: the GPU defaults, or the tiny CPU ones of ``--dry-run``."""

    dry: bool
    out: Path
    work: Path
    budget: float
    started: float = field(default_factory=time.monotonic)

    @property
    def device(self) -> str:
        return "cpu" if self.dry else "cuda"

    @property
    def log_every(self) -> int:
        return 1 if self.dry else 10

    def left(self) -> float:
        """Seconds left of this part's budget."""
        return self.budget - (time.monotonic() - self.started)

    def corpus_sets(self) -> list[str]:
        """The corpus and (dry run) the tiny model, with this part's data cache."""
        cache = f"data.cache_dir={self.work / 'cache'}"
        if self.dry:
            return [*TINY, cache]
        bench = shared_data() / "bench" / "fr-en"
        return ["data.source=text", f"data.path={bench}", "data.train=train", "data.validation=valid",
                "data.test=[test.tatoeba]", "data.max_len=128", "tokenizer.vocab_size=8000", cache]

    def write(self, part: str, doc: dict[str, Any]) -> None:
        atomic_write_text(self.out / "parts" / f"{part}.json", json.dumps(doc, indent=1) + "\n")


def shared_data() -> Path:
    return Path(os.environ.get("FR2EN_SHARED_DATA", ROOT.parent / "shared" / "data")).resolve()


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


# ---------------------------------------------------------------------------------------------- rates


def steady(points: list[tuple[float, int, int]]) -> dict[str, float] | None:
    """Median rates over the windows of the second half of a run, from its (seconds, iteration, real target tokens
    so far) points, one per window; None with fewer than 4 points (the first window holds the start-up)."""
    if len(points) < 4:
        return None
    half = len(points) // 2
    tok, steps = [], []
    for (t0, i0, k0), (t1, i1, k1) in zip(points[half - 1:], points[half:], strict=False):
        if t1 > t0:
            tok.append((k1 - k0) / (t1 - t0))
            steps.append((i1 - i0) / (t1 - t0))
    if not tok:
        return None
    return {"tokens_per_s": statistics.median(tok), "steps_per_s": statistics.median(steps), "windows": len(tok)}


def together(runs: list[list[tuple[float, int]]]) -> dict[str, Any] | None:
    """Optimizer steps per second of runs trained at once, from each run's (wall time, step) points: the steps all of
    them made in the window where every one was past the first half of its points (its warm-up) and none had
    stopped, over that window's length; where the runs never overlapped so, the sum of each run's own rate over
    the second half of its points. None when a run has fewer than 4 points."""
    import numpy as np

    if not runs or any(len(r) < 4 for r in runs):
        return None
    starts = [r[len(r) // 2 - 1] for r in runs]
    begin, end = max(s[0] for s in starts), min(r[-1][0] for r in runs)
    if end > begin:
        steps = sum(float(np.interp(end, [p[0] for p in r], [p[1] for p in r]))
                    - float(np.interp(begin, [p[0] for p in r], [p[1] for p in r])) for r in runs)
        total, how, window = steps / (end - begin), "common window", end - begin
    else:
        total = sum((r[-1][1] - s[1]) / (r[-1][0] - s[0]) for r, s in zip(runs, starts, strict=True)
                    if r[-1][0] > s[0])
        how, window = "sum of each run's own rate (the runs never trained at once past their warm-up)", 0.0
    return {"steps_per_s": total, "steps_per_s_per_run": total / len(runs), "window_s": window, "how": how}


# ---------------------------------------------------------------------------------------------- machine


def machine(device: str) -> dict[str, Any]:
    """The machine a part ran on, for the report's header."""
    import torch

    info: dict[str, Any] = {"cpu": cpu_model() or platform.machine(), "cores": os.cpu_count(),
                            "torch": torch.__version__, "python": platform.python_version(), "device": device}
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=torch.cuda.get_device_name(), gpu_memory_mib=props.total_memory // 2**20,
                    cuda=torch.version.cuda, driver=nvidia_smi("driver_version"))
    return info


def nvidia_smi(field_name: str) -> str | None:
    """One ``nvidia-smi --query-gpu`` field of the first GPU; None without nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={field_name}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def bf16_peak(device: str, given_tflops: float | None) -> Any:
    """The device's dense bf16 peak (bench/hardware.py)."""
    from bench.hardware import cpu_peak, cuda_peak

    if device == "cuda":
        import torch

        return cuda_peak("bf16", torch.cuda.get_device_name(), given_tflops)
    return cpu_peak("bf16")
