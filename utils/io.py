"""Atomic file writes: write to a temporary file in the same folder, then rename over the target."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


class PathError(ValueError):
    """An output path that cannot be used (exists as a file, cannot be created), as one line."""


def ensure_dir(path: Path | str, label: str) -> Path:
    """Create folder ``path`` (and parents) if needed; PathError naming ``label`` (e.g. ``--out``) if it cannot be."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise PathError(f"{label} {path} exists and is not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise PathError(f"{label} {path}: cannot create it ({e.strerror or type(e).__name__})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise PathError(f"{label} {path}: no permission to write there")
    return path


@contextlib.contextmanager
def atomic_path(target: Path | str, suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path next to ``target``; on success rename it over ``target``.

    On an exception the temporary file is removed and ``target`` is left untouched.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=suffix + ".tmp", dir=target.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp_path, 0o666 & ~umask)  # mkstemp creates 0600; give the file the usual permissions
    try:
        yield tmp_path
        with open(tmp_path, "rb") as f:  # on disk before the rename: a crash leaves the old file or the new one
            os.fsync(f.fileno())
        os.replace(tmp_path, target)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def atomic_write_text(target: Path | str, text: str) -> None:
    with atomic_path(target) as tmp:
        tmp.write_text(text, encoding="utf-8")


def atomic_write_bytes(target: Path | str, data: bytes) -> None:
    with atomic_path(target) as tmp:
        tmp.write_bytes(data)
