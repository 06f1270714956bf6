"""A study's commands run as jobs of a launcher: SLURM through submitit, or submitit's local executor.

A command is ``(label, argv, log)``: ``argv`` run in the repository root, its output appended to ``log``. With
``--launcher slurm`` each command is one SLURM job (one job array for all of them, at most
``--slurm-array-parallelism`` running at a time), with ``--launcher submitit-local`` one local process of
submitit's (the same code path, on this machine: a study checked before it goes to a cluster). Either way the
study waits for its jobs, says what starts and ends, stops in one line naming the job, its id and its log when
one fails, and cancels the jobs still queued or running when one fails or on Ctrl-C. submitit keeps its own files
(the pickled command, the job's own log, its result) in the folder given, ``<study>/submitit/``.

A job runs a :class:`Command`, which submitit pickles by reference: the job's Python imports this module from the
repository root (put on its ``PYTHONPATH``). submitit is imported only here, and only for these launchers.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from utils.cli import StopError, one_line

LAUNCHERS = ("local", "submitit-local", "slurm")  # local: the study's own processes (no submitit)
INSTALL = "pip install '.[cluster]'"
LOCAL_TIMEOUT_MIN = 60 * 24 * 365  # submitit's local executor stops a job past its timeout: a study sets none


class LaunchError(StopError):
    """The launcher cannot run here (submitit missing, no SLURM, a parameter SLURM refuses): one line."""


class JobFailed(LaunchError):
    """A job ended without its command succeeding: one line naming the command, the job, its id and its log."""


class Reporter(Protocol):
    """What the study shows of its commands (utils/study/runs.py's ``Progress``)."""

    def say(self, line: str) -> None: ...

    def started(self, label: str, log: Path, resumed: bool = False) -> None: ...

    def poll(self) -> None: ...

    def ended(self, label: str, ok: bool = True) -> None: ...


@dataclass(frozen=True)
class Resources:
    """What each SLURM job asks for: a partition (None: the cluster's default), a time limit in minutes, GPUs,
    CPUs (None: the cluster's default; else also the command's ``OMP_NUM_THREADS``), memory in GB (None: the
    cluster's default), and how many jobs of the study's array run at a time (None: submitit's default, 256)."""

    partition: str | None = None
    time_min: int = 24 * 60
    gpus: int = 1
    cpus: int | None = None
    mem_gb: float | None = None
    array_parallelism: int | None = None

    def parameters(self, name: str) -> dict[str, Any]:
        """The keywords of submitit's ``AutoExecutor.update_parameters`` for these resources, jobs named
        ``name``."""
        optional = {"cpus_per_task": self.cpus, "mem_gb": self.mem_gb, "slurm_partition": self.partition,
                    "slurm_array_parallelism": self.array_parallelism}
        return {"name": name, "timeout_min": self.time_min, "gpus_per_node": self.gpus, "nodes": 1,
                "tasks_per_node": 1, **{k: v for k, v in optional.items() if v is not None}}


def die_with_parent(parent: int, job: bool = False) -> Any:
    """A ``preexec_fn`` giving the command SIGTERM when ``parent`` (the study, or a job's process) dies, however
    (``kill -9`` included; Linux ``PR_SET_PDEATHSIG``): train.py then saves last.pt and exits, and no orphan writes
    on under a rerun. ``job``: the command of a submitit job, which also ignores the signal SLURM sends before its
    time limit (submitit's USR2, whose default action would kill train.py without saving; the job's process asks
    it to stop instead) and gets SIGINT's default back (a local job's process ignores it, see Launcher.run)."""

    def preexec() -> None:
        import ctypes

        if job:
            with contextlib.suppress(OSError, ValueError):
                signal.signal(signal.SIGUSR2, signal.SIG_IGN)
                signal.signal(signal.SIGINT, signal.SIG_DFL)
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):  # not Linux: the run lock still keeps a rerun off its directory
            return
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


class _Stopped(Exception):
    """The local job was cancelled (SIGTERM from its controller)."""


def _stopped(signum: int, frame: Any) -> None:
    raise _Stopped(f"cancelled ({signal.Signals(signum).name})")


@dataclass(frozen=True)
class Command:
    """One of the study's commands as its job runs it: ``argv`` in ``cwd``, its output appended to ``log``, in
    the job's environment with ``env`` over it (a None value removes the variable). Called in the job; returns
    the command's exit status. The command runs in a session of its own and is asked to stop once, by the job's
    process, when the job is (cancelled, out of time, preempted: SLURM's own signals reach it too), so train.py
    saves ``last.pt`` before it exits; ``local``: SIGTERM cancels the job (SLURM sends the command its own)."""

    argv: tuple[str, ...]
    log: Path
    cwd: Path
    env: tuple[tuple[str, str | None], ...] = ()
    local: bool = False

    def __call__(self) -> int:
        env = dict(os.environ)
        for key, value in self.env:
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        if self.local:
            signal.signal(signal.SIGTERM, _stopped)
        with open(self.log, "a") as out:
            child = subprocess.Popen(list(self.argv), cwd=self.cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True, preexec_fn=die_with_parent(os.getpid(), job=True))
        try:
            return child.wait()
        except BaseException:  # the job is stopped: so is its command, once (a second signal aborts train.py)
            child.terminate()
            child.wait()
            raise

    def checkpoint(self, *args: Any, **kwargs: Any) -> None:
        """What submitit calls when SLURM preempts the job or its time runs out: nothing to requeue (run again,
        a fresh run's command would start a second run directory); the job fails, and a rerun of the study
        resumes the run from its last.pt."""
        return None


def import_submitit(kind: str) -> Any:
    """The submitit module; LaunchError, one line saying how to install it, where it is missing."""
    try:
        import submitit
    except ImportError:
        raise LaunchError(f"--launcher {kind} needs submitit, which is not installed: {INSTALL}") from None
    return submitit


@contextlib.contextmanager
def _environ(**values: str) -> Iterator[None]:
    """``os.environ`` with ``values`` set, while submitting: a job inherits the environment it is submitted in."""
    before = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _reason(error: BaseException) -> str:
    """Why a job gave no exit status, in a few words: the last line of the error its process raised, or the
    state SLURM (or the local executor) left it in."""
    text = str(error)
    parts = text.split("-" * 22)
    if len(parts) >= 3 and parts[1].strip():  # submitit's FailedJobError: the traceback between two rules
        last = parts[1].strip().splitlines()[-1]
        return "stopped by SLURM: out of its time, or preempted" if "not requeued" in last else last
    state = re.search(r"\(state: ([^)]*)\)", text)
    return f"no result, state {state.group(1)}" if state else one_line(text) or type(error).__name__


@contextlib.contextmanager
def _sigint_ignored(ignore: bool) -> Iterator[None]:
    """SIGINT ignored while local jobs start, so that their processes (submitit's controller, the job's Python)
    inherit it ignored: Ctrl-C then stops the study, which cancels its jobs, rather than each of submitit's
    processes, each with a traceback."""
    if not ignore or threading.current_thread() is not threading.main_thread():  # only it sets handlers
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)


@dataclass
class _Active:
    job: Any
    log: Path
    slot: int | None


@dataclass(frozen=True)
class Launcher:
    """Runs a study's commands as submitit jobs: ``kind`` ``slurm`` (each command a SLURM job asking for
    ``resources``) or ``submitit-local`` (each a local process); submitit's files in ``folder``. Made before the
    study writes anything: LaunchError, one line, if submitit is missing or (slurm) this machine has no SLURM or
    SLURM would refuse the resources."""

    kind: str
    folder: Path
    resources: Resources = field(default_factory=Resources)

    def __post_init__(self) -> None:
        if self.kind not in LAUNCHERS[1:]:
            raise LaunchError(f"--launcher {self.kind}: not a submitit launcher; give one of {', '.join(LAUNCHERS)}")
        import_submitit(self.kind)
        if self.kind == "slurm":  # submitit checks SLURM and the parameters here, writing nothing
            self._executor()

    @property
    def name(self) -> str:
        """The jobs' name (SLURM's ``--job-name``): the study folder's, e.g. ``study_pe``."""
        return self.folder.resolve().parent.name

    def _executor(self) -> Any:
        submitit = import_submitit(self.kind)
        try:
            if self.kind == "slurm":
                executor = submitit.AutoExecutor(folder=self.folder, cluster="slurm")
                root = shlex.quote(str(Path(__file__).resolve().parents[2]))
                executor.update_parameters(**self.resources.parameters(self.name), slurm_setup=[
                    f"export PYTHONPATH={root}${{PYTHONPATH:+:$PYTHONPATH}}"])
            else:
                executor = submitit.AutoExecutor(folder=self.folder, cluster="local")
                executor.update_parameters(name=self.name, timeout_min=LOCAL_TIMEOUT_MIN)
        except (RuntimeError, ValueError, NameError, TypeError, AssertionError) as e:
            hint = ("; start the study where SLURM is (srun and sbatch on PATH), or try its jobs here with "
                    "--launcher submitit-local") if self.kind == "slurm" and shutil.which("srun") is None else ""
            raise LaunchError(f"--launcher {self.kind}: {one_line(str(e))}{hint}") from None
        return executor

    def _job_name(self, job: Any) -> str:
        return f"{'SLURM' if self.kind == 'slurm' else 'local'} job {job.job_id}"

    def run(self, commands: Sequence[tuple[str, Sequence[str], Path]], cwd: Path, reporter: Reporter,
            slots: Sequence[dict[str, str]] | None = None, poll: float = 2.0) -> None:
        """Run (label, argv, log) ``commands`` as jobs, each in ``cwd`` appending to its log, and wait for them.
        ``slots``: at most one job per slot at a time, each run with its slot's environment variables over the
        job's (a GPU's ``CUDA_VISIBLE_DEVICES``, a CPU share's ``OMP_NUM_THREADS``), a slot taking the next
        command as soon as its job ends; None: every command submitted at once (SLURM queues them). ``reporter``
        hears of each job started and ended, and is polled every ``poll`` seconds while they run. JobFailed, one
        line, when a job fails; the others are cancelled then, and on any interruption (Ctrl-C)."""
        if not commands:
            return
        executor = self._executor()
        base: dict[str, str | None] = {}
        if self.kind == "submitit-local":  # submitit hides the GPUs from a local job that asks for none
            base["CUDA_VISIBLE_DEVICES"] = os.environ.get("CUDA_VISIBLE_DEVICES")
        elif self.resources.cpus:
            base["OMP_NUM_THREADS"] = str(self.resources.cpus)
        root = str(Path(__file__).resolve().parents[2])
        path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
        pending = list(commands)
        active: dict[str, _Active] = {}
        free = list(range(len(slots))) if slots is not None else None
        try:
            while pending or active:
                batch: list[tuple[str, Sequence[str], Path, int | None]] = []
                while pending and (free is None or free):
                    label, argv, log = pending.pop(0)
                    batch.append((label, argv, log, free.pop(0) if free is not None else None))
                if batch:
                    with _environ(PYTHONPATH=path), _sigint_ignored(self.kind == "submitit-local"):
                        jobs = self._submit(executor, batch, base, slots, cwd)
                    for (label, argv, log, slot), job in zip(batch, jobs, strict=True):
                        active[label] = _Active(job, log, slot)
                        reporter.say(f"  {label}: {self._job_name(job)}: {' '.join(map(str, argv[1:]))}")
                        reporter.started(label, log, resumed="--resume" in argv)
                ended = [label for label, a in active.items() if a.job.done()]
                if not ended:
                    reporter.poll()
                    time.sleep(poll)
                for label in ended:
                    a = active.pop(label)
                    failure = self._failure(label, a)
                    reporter.ended(label, ok=failure is None)
                    if failure is not None:
                        raise JobFailed(failure)
                    if free is not None and a.slot is not None:
                        free.append(a.slot)
        except BaseException:
            self._cancel([a.job for a in active.values()])
            raise

    def _submit(self, executor: Any, batch: list[tuple[str, Sequence[str], Path, int | None]],
                base: dict[str, str | None], slots: Sequence[dict[str, str]] | None, cwd: Path) -> list[Any]:
        calls = []
        for _, argv, log, slot in batch:
            log.parent.mkdir(parents=True, exist_ok=True)
            env = {**base, **(slots[slot] if slots is not None and slot is not None else {})}
            calls.append(Command(tuple(map(str, argv)), log.resolve(), Path(cwd).resolve(), tuple(env.items()),
                                 local=self.kind == "submitit-local"))
        try:
            if len(calls) == 1:
                return [executor.submit(calls[0])]
            with executor.batch():  # on SLURM one job array
                jobs = [executor.submit(call) for call in calls]
            return jobs
        except Exception as e:  # sbatch refused the job(s), or this machine could not start them
            raise LaunchError(f"--launcher {self.kind}: submitting {', '.join(b[0] for b in batch)} failed: "
                              f"{one_line(str(e))}") from None

    def _failure(self, label: str, active: _Active) -> str | None:
        """None when the job's command succeeded, else the line saying how it failed."""
        try:
            status = active.job.result()
        except Exception as e:  # no exit status: killed (time, memory, scancel), or its process could not start
            return (f"{label} failed: {self._job_name(active.job)} ended without finishing its command "
                    f"({_reason(e)}); see {active.log} and {active.job.paths.stderr}")
        if status == 0:
            return None
        return f"{label} failed (exit {status}, {self._job_name(active.job)}); see {active.log}"

    def _cancel(self, jobs: list[Any], wait: float = 30.0) -> None:
        """Cancel ``jobs`` (their commands are asked to stop: train.py saves last.pt, a rerun resumes it); local
        ones are waited for, ``wait`` seconds at most."""
        for job in jobs:
            with contextlib.suppress(Exception):
                if self.kind == "submitit-local":  # its id is its controller's pid, which passes SIGTERM on
                    os.kill(int(job.job_id), signal.SIGTERM)
                else:
                    job.cancel(check=False)  # scancel
        if self.kind == "submitit-local":
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and not all(job.done() for job in jobs):
                time.sleep(0.1)
