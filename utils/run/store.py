"""Run directories: create one per training run, lock it while it trains, point ``<name>_latest`` at it (through
its view ``<runs>/.latest/<run>/``, see ``utils.run.layout``).

The layout of a run directory (which file is where) is ``utils.run.layout.RunDir``; a start that fails leaves no run
directory behind, and ``runs/<name>_latest`` moves to a run once it has a checkpoint.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import shutil
import time
from pathlib import Path

import torch

from utils.config import Config, ConfigError, load_config, save_config
from utils.run.layout import RunDir, check_run_name

_held_locks: dict[Path, int] = {}  # run directory -> descriptor of its lock file, held by this process


class RunLockedError(ConfigError):
    """Another process trains in this run directory."""


def lock_run(run_dir: Path | str) -> None:
    """Hold ``run_dir/train.lock`` (an exclusive ``flock``) until this process ends: one process trains in a run
    directory at a time, and nobody removes a directory being written. The kernel releases the lock when the
    process dies, ``kill -9`` included, so a stale lock cannot exist. RunLockedError, one line, if held."""
    run_dir = Path(run_dir).resolve()
    if run_dir in _held_locks:
        return
    fd = os.open(RunDir(run_dir).lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RunLockedError(f"{run_dir} is being trained by another process (pid {_lock_owner(run_dir)}); "
                             "wait for it to end") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    _held_locks[run_dir] = fd


def unlock_run(run_dir: Path | str) -> None:
    """Release a lock taken by ``lock_run`` (it is released at exit anyway)."""
    fd = _held_locks.pop(Path(run_dir).resolve(), None)
    if fd is not None:
        os.close(fd)


def run_locked_by(run_dir: Path | str) -> int | None:
    """The pid training in ``run_dir`` if another process holds its lock, else None."""
    run_dir = Path(run_dir).resolve()
    if run_dir in _held_locks or not (RunDir(run_dir).lock).is_file():
        return None
    try:
        fd = os.open(RunDir(run_dir).lock, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _lock_owner(run_dir) or -1
    finally:
        os.close(fd)
    return None


def _lock_owner(run_dir: Path) -> int | None:
    try:
        return int((RunDir(run_dir).lock).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def check_runs_root(root: Path | str) -> Path:
    """The folder run directories go in; ConfigError, one line, if it cannot hold them. Creates nothing."""
    root = Path(root)
    existing = root
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"--runs {root}: {existing} exists and is not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"--runs {root}: no permission to write in {existing}")
    return root


def create_run_dir(cfg: Config, root: Path | str = "runs", lock: bool = False) -> Path:
    """Make ``root/<name>_<timestamp>/`` holding ``config.yaml``, atomically: a run started at the same
    moment gets its own folder (``_2``, ``_3``... suffixes; ``mkdir`` decides). ``<name>_latest`` is not
    touched here: it moves to a run once that run has a checkpoint (``point_latest``). ``lock``: this process
    will train in it, and holds its lock (``lock_run``) from the start."""
    check_run_name(cfg.name)
    root = check_runs_root(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"--runs {root}: cannot create it ({e.strerror or type(e).__name__})") from None
    stamp = time.strftime("%Y%m%d_%H%M%S")
    for n in itertools.count(1):
        run = root / (f"{cfg.name}_{stamp}" if n == 1 else f"{cfg.name}_{stamp}_{n}")
        try:
            run.mkdir()
            break
        except FileExistsError:
            continue
    if lock:
        lock_run(run)  # before anything is written: no other process removes or trains in it
    RunDir(run).checkpoints.mkdir()
    save_config(cfg, RunDir(run).config)
    return run


def latest_link(run_dir: Path) -> Path:
    """``<root>/<name>_latest`` for a run directory ``<root>/<name>_<timestamp>[_n]``."""
    return RunDir(run_dir).latest_link(load_config(RunDir(run_dir).config).name)


def make_view(run_dir: Path, create: bool = True) -> Path | None:
    """The run's view ``<runs>/.latest/<run>/`` (``RunDir.view``): a relative link to each of its folders and files
    but ``tb/``, made where missing. Folders the run has not written yet (``eval/``, ``visualize/``) are made
    first, so that results written later are seen through the view; a file the run does not have yet (``summary.json``
    before training ends) gets its link on a later call. ``create=False``: only a view that exists is completed
    (None otherwise). Never a link to nothing; safe to call concurrently."""
    rd = RunDir(run_dir)
    if not create and not rd.view.is_dir():
        return None
    folders, files = rd.view_entries()
    rd.view.mkdir(parents=True, exist_ok=True)
    for entry in folders + files:
        if entry in folders and entry != rd.profile:
            entry.mkdir(exist_ok=True)
        link = rd.view / entry.name
        if entry.exists() and not link.is_symlink():
            with contextlib.suppress(FileExistsError):
                link.symlink_to(Path("..") / ".." / rd.root.name / entry.name)
    return rd.view


def point_latest(run_dir: Path) -> None:
    """Point ``<name>_latest`` at ``run_dir``'s view (``make_view``) atomically (a uniquely named link renamed over
    it): paths through the link reach the run's files, and TensorBoard, walking the runs folder, does not find the
    run's event files a second time through it."""
    run_dir = Path(run_dir)
    link = latest_link(run_dir)
    view = make_view(run_dir)
    assert view is not None
    tmp = link.parent / f".{link.name}.{os.getpid()}.{time.monotonic_ns()}.tmp"
    tmp.symlink_to(view.relative_to(run_dir.parent))
    try:
        os.replace(tmp, link)
    finally:
        if tmp.is_symlink():
            tmp.unlink()


def has_results(run_dir: Path) -> bool:
    """Whether a run holds test scores or the closing summary of a finished training: what a study reports from
    when its checkpoints were deleted to save disk, or the run fetched from another machine without them."""
    rd = RunDir(run_dir)
    return rd.summary_json.is_file() or any(rd.eval_dir.glob("*.json"))


def discard_if_untrained(run_dir: Path) -> bool:
    """Remove a run directory that never got a checkpoint (a start that failed); True if removed. A directory
    another process trains in (its lock is held) is never removed, nor one that ``has_results``."""
    if (any(RunDir(run_dir).checkpoints.glob("*.pt")) or has_results(run_dir)
            or run_locked_by(run_dir) is not None):
        return False
    shutil.rmtree(run_dir, ignore_errors=True)
    unlock_run(run_dir)
    return True


def select_device(name: str = "auto") -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("train.device: cuda was asked for but no CUDA device is available")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)
