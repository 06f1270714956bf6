"""Atomic file writes: write to a temporary file in the same folder, then rename over the target."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


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


def json_sha256(doc: dict[str, Any]) -> str:
    """The checksum a JSON document records of itself under ``sha256``: the sha256 of the compact, key-sorted JSON
    of its other keys (as read back from JSON: the same for the document written and the file read)."""
    rest = json.loads(json.dumps({k: v for k, v in doc.items() if k != "sha256"}))
    text = json.dumps(rest, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def with_sha256(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with its own checksum (``json_sha256``) as its last key ``sha256``."""
    return {**{k: v for k, v in doc.items() if k != "sha256"}, "sha256": json_sha256(doc)}
