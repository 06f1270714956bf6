"""One process per study folder: ``<study>/study.lock``, an exclusive ``flock`` held while bench/study.py runs.

The same study started twice at once would train every run twice and write the same files from two processes; the
second start is refused in one line naming the holder (pid, host, start time, which the lock file records). The
kernel releases a ``flock`` when its process dies, ``kill -9`` included, so a lock never outlives its study: a
killed study resumes at once. The lock file itself stays (a stale one holds nothing).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path

from utils.schema import ConfigError

LOCK_NAME = "study.lock"
_held: dict[Path, int] = {}  # study folder -> descriptor of its lock file, held by this process


class StudyLockedError(ConfigError):
    """Another process runs this study."""


def lock_file(study: Path) -> Path:
    return Path(study) / LOCK_NAME


def _holder(study: Path) -> str:
    """``pid 123, host h, started 2026-01-01 12:00:00`` from the lock file (what its holder wrote)."""
    try:
        who = json.loads(lock_file(study).read_text(encoding="utf-8"))
        return f"pid {who['pid']}, host {who['host']}, started {who['started']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "its pid, host and start time unreadable"


def _refusal(study: Path) -> StudyLockedError:
    return StudyLockedError(f"{study} is in use: another bench/study.py runs this study ({_holder(study)}); nothing "
                            "was trained or written: wait for it to end (or stop it), then run the command again")


def study_locked_by(study: Path) -> str | None:
    """The holder of ``study``'s lock (``pid ..., host ..., started ...``) if another process holds it, else None.
    Reads only: creates nothing."""
    study = Path(study).resolve()
    if study in _held:
        return None
    try:
        fd = os.open(lock_file(study), os.O_RDONLY)
    except OSError:  # no lock file (or no folder): nobody holds it
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _holder(study)
    finally:
        os.close(fd)
    return None


def check_free(study: Path) -> None:
    """StudyLockedError, one line naming the holder, if another process runs ``study``; creates nothing."""
    if study_locked_by(study) is not None:
        raise _refusal(Path(study))


def lock_study(study: Path) -> None:
    """Hold ``study``'s lock (the folder must exist) until this process ends or ``unlock_study``, recording this
    process's pid, host and start time in it; StudyLockedError, one line naming the holder, if another holds it.
    The descriptor is not inherited: the study's train.py and test.py children never hold it."""
    key = Path(study).resolve()
    if key in _held:
        return
    fd = os.open(lock_file(key), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise _refusal(Path(study)) from None
    who = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S %z")}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(who) + "\n").encode("utf-8"), 0)
    _held[key] = fd


def unlock_study(study: Path) -> None:
    """Release a lock taken by ``lock_study`` (it is released at exit anyway)."""
    fd = _held.pop(Path(study).resolve(), None)
    if fd is not None:
        os.close(fd)


def unlock_all() -> None:
    """Release every lock this process took with ``lock_study``."""
    for study in list(_held):
        unlock_study(study)
