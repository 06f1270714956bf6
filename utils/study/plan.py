"""How a study's runs are carried out: the budget every run gets, one job per (variant, seed), the train.py command
that starts or resumes it, and the slots (GPUs, or shares of the CPU cores) or the launcher its commands run in."""

from __future__ import annotations

import contextlib
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from utils.cli import ROOT, project_command
from utils.study.launch import JobFailed, Launcher, die_with_parent
from utils.study.runs import Progress, find_run
from utils.study.spec import Variant

STUDY_KEYS = {"seed": "--seeds", "train.max_steps": "--steps", "train.max_target_tokens": "--tokens",
              "train.max_minutes": "never wall time", "train.epochs": "the budget", "train.patience": "the budget",
              "train.eval_every": "--eval-every"}


def budget_overrides(steps: int | None, tokens: int | None, eval_every: int) -> list[str]:
    """The budget decides when a run ends: no wall-clock limit, no early stopping, epochs never run out."""
    out = ["train.max_minutes=null", "train.epochs=100000", "train.patience=1000000",
           f"train.eval_every={eval_every}"]
    out.append(f"train.max_steps={steps}" if steps else "train.max_steps=null")
    out.append(f"train.max_target_tokens={tokens}" if tokens else "train.max_target_tokens=null")
    return out


@dataclass
class Job:
    variant: Variant
    seed: int
    root: Path  # runs/study_<name>/runs/<variant>/seed<k>

    @property
    def key(self) -> str:
        return f"{self.variant.label} seed {self.seed}"


def train_command(job: Job, config: str, overrides: list[str], budget: list[str]) -> list[str]:
    """train.py for a job: the study's ``--set`` first, the variant's keys over them, then the seed and budget."""
    run = find_run(job.root)
    if run is None:
        return project_command("train.py", "--config", config, "--runs", job.root,
                               overrides=[*overrides, *job.variant.overrides, f"seed={job.seed}", *budget])
    # a killed run continues from its last checkpoint; only the budget keys are set again
    return project_command("train.py", "--resume", run, overrides=budget)


def slot_envs(devices: int, jobs: int) -> list[dict[str, str]]:
    """The environment of each of the ``jobs`` slots commands run in: with several GPUs, slot i on GPU i mod
    ``devices`` (the runs spread evenly, each seeing one GPU); else each limited to its share of the cores
    (``OMP_NUM_THREADS``: two runs of one thread each keep both cores busy without the stalls two threads suffer
    when anything else wants a core)."""
    if devices > 1:
        return [{"CUDA_VISIBLE_DEVICES": str(slot % devices)} for slot in range(max(1, jobs))]
    threads = {"OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // jobs))} if jobs > 1 else {}
    return [dict(threads) for _ in range(max(1, jobs))]


def run_commands(commands: list[tuple[str, list[str], Path]], devices: int, poll: float = 2.0,
                 jobs: int = 1, progress: Progress | None = None, launcher: Launcher | None = None) -> None:
    """Run (label, argv, log) commands in the slots of ``slot_envs``, a slot taking the next command as soon as
    its own ends; with a ``launcher`` (``--launcher slurm`` or ``submitit-local``) each command is one of its jobs
    instead (submitit-local: in the same slots; SLURM: all submitted, the cluster runs them). ``progress``
    (default: one made of the labels) says on the terminal what starts, validates and ends, every ``poll``
    seconds at most."""
    progress = progress or Progress([label for label, _, _ in commands])
    try:
        if launcher is None:
            _run_commands(commands, devices, poll, jobs, progress)
            return
        try:
            launcher.run(commands, ROOT, progress, None if launcher.kind == "slurm" else slot_envs(devices, jobs),
                         poll)
        except JobFailed as e:
            raise SystemExit(f"study: {e}") from None
    finally:
        progress.close()


def _run_commands(commands: list[tuple[str, list[str], Path]], devices: int, poll: float, jobs: int,
                  progress: Progress) -> None:
    import time

    pending = list(commands)
    active: list[tuple[str, subprocess.Popen, Path]] = []
    slots = slot_envs(devices, jobs)
    free = list(range(len(slots)))
    while pending or active:
        while pending and free:
            label, cmd, log = pending.pop(0)
            slot = free.pop(0)
            env = {**os.environ, **slots[slot]}
            log.parent.mkdir(parents=True, exist_ok=True)
            progress.say(f"  {label}: {' '.join(cmd[1:])}")
            progress.started(label, log, resumed="--resume" in cmd)
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=open(log, "a"), stderr=subprocess.STDOUT,
                                    preexec_fn=die_with_parent(os.getpid()))
            proc.slot = slot  # type: ignore[attr-defined]
            active.append((label, proc, log))
        while not (done := [a for a in active if a[1].poll() is not None]):
            progress.poll()
            if len(active) == 1:  # back as soon as it ends
                with contextlib.suppress(subprocess.TimeoutExpired):
                    active[0][1].wait(timeout=poll)
            else:
                time.sleep(poll)
        label, proc, log = done[0]
        active.remove(done[0])
        progress.ended(label, ok=proc.returncode == 0)
        if proc.returncode != 0:
            for _, other, _ in active:  # stop the others (a signal makes train.py save last.pt): rerun resumes
                other.terminate()
            for _, other, _ in active:
                other.wait()
            raise SystemExit(f"study: {label} failed (exit {proc.returncode}); see {log}")
        free.append(proc.slot)  # type: ignore[attr-defined]
