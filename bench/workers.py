"""One bench/speed.py measurement in a fresh process, so that peak memory is per model and per measurement.

The parent writes the measurement's spec (task, model, device, threads, config, paths of the inputs and of the
result) to ``SPEC.json`` and runs ``python bench/workers.py SPEC.json`` (``run_worker``); the child loads the
config, runs the measurement of bench/speed_runs.py and writes its numbers as JSON to the spec's ``result``
(``worker``). A child that fails leaves no result: the parent records the last line it printed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as bench/workers.py: the repository root first

from bench.common import ROOT  # noqa: E402
from bench.speed_runs import data_worker, model_worker  # noqa: E402


def worker(spec_path: Path) -> int:
    """The child: run the measurement ``spec_path`` describes and write its numbers to the spec's ``result``."""
    import warnings

    spec = json.loads(spec_path.read_text())
    warnings.filterwarnings("ignore", message=".*enable_nested_tensor.*")
    import torch

    from utils.config import load_config

    if spec["device"] == "cpu":
        torch.set_num_threads(spec["threads"])
    cfg = load_config(spec["config"], spec["overrides"])
    result = data_worker(spec, cfg) if spec["task"].startswith("data") else model_worker(spec, cfg)
    Path(spec["result"]).write_text(json.dumps(result))
    return 0


def run_worker(spec: dict, work: Path, label: str) -> dict[str, Any]:
    """The parent: one measurement in a fresh process; its numbers, or ``{"error": its last line}``."""
    key = label.replace(" ", "_").replace("/", "_")
    spec = {**spec, "result": str(work / f"{key}.result.json")}
    spec_path = work / f"{key}.spec.json"
    spec_path.write_text(json.dumps(spec))
    print(f"  {label} ...", end="", flush=True)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), str(spec_path)],
                          cwd=ROOT, capture_output=True, text=True)
    took = time.perf_counter() - start
    if proc.returncode != 0 or not Path(spec["result"]).is_file():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-12:]
        print(f" FAILED (exit {proc.returncode}, {took:.0f}s)\n    " + "\n    ".join(tail), flush=True)
        return {"error": tail[-1] if tail else f"exit {proc.returncode}"}
    result = json.loads(Path(spec["result"]).read_text())
    summary = []
    for k, unit in (("tok_per_s", "tgt tok/s"), ("sent_per_s", "sent/s")):
        if k in result:
            summary.append(f"{result[k]:.1f} {unit}")
    if "peak_mib" in result:
        summary.append(f"peak {result['peak_mib']:.0f} MiB")
    if "seconds" in result and not summary:
        summary.append(f"{result['seconds']:.2f} s, {result['pairs']} pairs")
    print(f" {', '.join(summary)} ({took:.0f}s)", flush=True)
    return result


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: python bench/workers.py SPEC.json (written by bench/speed.py)", file=sys.stderr)
        return 2
    return worker(Path(sys.argv[1]))


if __name__ == "__main__":
    from utils.cli import run_main

    run_main(main)
