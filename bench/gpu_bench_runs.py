"""The study part of bench/gpu_bench.sh: the study's small model (configs/gpu_study.yaml with the
``train-short-test-long`` preset's keys) as several train.py processes sharing one GPU, as bench/study.py trains a
study there; optimizer steps/s together, with and without CUDA MPS."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.common import ROOT, project_command
from bench.gpu_bench_plan import RUN_KEYS, TINY, Plan, nvidia_smi, say, together
from utils.study.gpu import GPU_STUDY


def study_sets(plan: Plan) -> list[str]:
    """What every run of the study part trains with: the study's preset keys and the bench's stop keys."""
    from utils.study.presets import presets

    sets = [*presets()["train-short-test-long"].overrides, *RUN_KEYS, "seed=1", f"train.log_every={plan.log_every}",
            f"train.device={plan.device}", f"data.cache_dir={plan.work / 'cache'}"]
    if plan.dry:  # the demo corpus, the tiny model, 6 steps; eager (no compiling on the CPU)
        sets += [*TINY, f"data.cache_dir={plan.work / 'cache'}", "train.max_steps=6", "train.compile=false"]
    return sets


def logged_steps(run: Path) -> list[tuple[float, int]]:
    """(wall time, iteration) of every logged window of a run: the TensorBoard scalar logged every ``log_every``
    iterations that has the most points."""
    import logging

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from utils.run.layout import RunDir

    tb = RunDir(run).tb
    if not tb.is_dir():
        return []
    quiet = logging.getLogger("tensorboard")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        ea = EventAccumulator(str(tb), size_guidance={"scalars": 0})
        ea.Reload()
        tags = [t for t in ea.Tags().get("scalars", []) if t.startswith("train/")]
        if not tags:
            return []
        events = max((ea.Scalars(t) for t in tags), key=len)
    finally:
        quiet.setLevel(level)
    return [(e.wall_time, e.step) for e in events]


def windows_in_log(log: Path) -> int:
    """The loop's throughput lines a run's log holds so far (0 if it cannot be read)."""
    try:
        return len(re.findall(r"target tokens/s", log.read_text(encoding="utf-8", errors="replace")))
    except OSError:
        return 0


def train_together(plan: Plan, n: int, seconds: float, sets: list[str], env: dict[str, str],
                   label: str, windows: int | None) -> dict[str, Any]:
    """``n`` train.py processes of configs/gpu_study.yaml at once, stopped together (SIGTERM: each ends its step,
    saves last.pt and exits) once every one has logged ``windows`` windows, or after ``seconds``, or ended by
    themselves (``windows`` None: a step budget in ``sets``); their steps/s together."""
    from utils.study.launch import die_with_parent
    from utils.study.plan import slot_envs

    folder = plan.work / f"study_{label}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    procs = []
    began = time.monotonic()
    # inductor compiles with a pool of cores-many worker processes per process: its share of the cores, as OpenMP's
    compile_threads = {"TORCHINDUCTOR_COMPILE_THREADS": str(max(1, (os.cpu_count() or 1) // n))}
    for i, slot in enumerate(slot_envs(1, n)):
        cmd = project_command("train.py", "--config", GPU_STUDY, "--runs", folder / f"r{i}", overrides=sets)
        with open(folder / f"r{i}.log", "w") as log:
            procs.append(subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, **compile_threads, **slot, **env},
                                          stdout=log, stderr=subprocess.STDOUT,
                                          preexec_fn=die_with_parent(os.getpid())))
    memory = None
    while any(p.poll() is None for p in procs) and time.monotonic() - began < seconds:
        logs = [next((folder / f"r{i}").glob("*/train.log"), None) for i in range(n)]
        if windows is not None and all(log is not None and windows_in_log(log) >= windows for log in logs):
            break
        time.sleep(0.5)
    if plan.device == "cuda":
        memory = nvidia_smi("memory.used")
    stopped = set()
    for i, p in enumerate(procs):
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            stopped.add(i)
    for p in procs:
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    # a process this stopped before its training began (still starting: no handler for the signal yet) is no failure
    failed = [i for i, p in enumerate(procs) if p.returncode != 0 and not (i in stopped and p.returncode < 0)]
    runs = [next((p for p in (folder / f"r{i}").iterdir() if p.is_dir() and not p.is_symlink()
                  and not p.name.startswith(".")), None) if (folder / f"r{i}").is_dir() else None for i in range(n)]
    points = [logged_steps(r) if r is not None else [] for r in runs]
    row: dict[str, Any] = {"runs": n, "label": label, "seconds": time.monotonic() - began,
                           "gpu_memory_used_mib": float(memory) if memory else None}
    rate = together(points)
    if failed:
        tail = (folder / f"r{failed[0]}.log").read_text(errors="replace").strip().splitlines()[-1:]
        row.update(status="failed", reason=f"{len(failed)} of {n} processes failed; r{failed[0]}: "
                   f"{tail[0][:200] if tail else 'no output'}")
    elif rate is None:
        row.update(status="too short", reason="a run logged fewer than 4 windows before the time cap")
    else:
        row.update(rate, status="ok")
    shutil.rmtree(folder, ignore_errors=True)
    return row


def study_part(plan: Plan, args: argparse.Namespace) -> dict[str, Any]:
    counts = args.counts or ([2] if plan.dry else [16, 1, 8])  # the first compiles cold, the others find its cache
    sets = study_sets(plan)
    doc: dict[str, Any] = {"machine": None, "config": "configs/gpu_study.yaml", "dry_run": plan.dry,
                           "preset": "train-short-test-long", "rows": []}  # no CUDA context here: the runs' GPU
    windows = None if plan.dry else 20  # the dry run's runs end at train.max_steps
    shares = [3.0 if i == 0 else 1.0 for i in range(len(counts))]  # the first compiles from a cold cache
    for i, n in enumerate(counts):
        seconds = plan.left() * shares[i] / sum(shares[i:])
        if not plan.dry and seconds < 25:
            doc["rows"].append({"runs": n, "label": str(n), "status": "not run",
                                "reason": f"the part's time cap ({plan.budget:.0f} s) was spent"})
            plan.write("study", doc)
            continue
        say(f"study: {n} run(s) at once, up to {seconds:.0f} s")
        doc["rows"].append(train_together(plan, n, seconds, sets, {}, str(n), windows))
        say(f"study: {n} run(s): {doc['rows'][-1]['status']}")
        plan.write("study", doc)
    mps = shutil.which("nvidia-cuda-mps-control")
    if plan.device == "cuda" and mps is None:
        doc["mps"] = "nvidia-cuda-mps-control is not on the PATH: not measured"
    elif plan.device == "cuda" and plan.left() < 45:
        doc["mps"] = "no time left to measure it"
    elif plan.device == "cuda":
        doc["mps"] = with_mps(plan, mps, max(counts), sets, windows, doc)
    plan.write("study", doc)
    return doc


def with_mps(plan: Plan, control: str, n: int, sets: list[str], windows: int | None, doc: dict[str, Any]) -> str:
    """``n`` runs at once again under a CUDA MPS daemon of this process's own (its pipe and log folders under the
    work folder), stopped after. Returns what happened, in words."""
    pipe, logs = plan.work / "mps" / "pipe", plan.work / "mps" / "log"
    pipe.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(logs)}
    started = subprocess.run([control, "-d"], env={**os.environ, **env}, capture_output=True, text=True, timeout=30)
    if started.returncode != 0:
        return f"the MPS daemon did not start: {(started.stderr or started.stdout).strip()[:200]}"
    try:
        say(f"study: {n} runs at once under MPS, up to {plan.left() - 10:.0f} s")
        doc["rows"].append(train_together(plan, n, plan.left() - 10, sets, env, f"{n} (MPS)", windows))
    finally:
        subprocess.run([control], input="quit\n", env={**os.environ, **env}, capture_output=True, text=True,
                       timeout=30)
    return "measured"
