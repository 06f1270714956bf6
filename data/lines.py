"""Lines of parallel text as every source reads them: UTF-8 lines split on ``\\n`` only, whitespace runs made
one space (``clean_text``), and a split of aligned pairs as ``Pairs`` (empty train pairs dropped, evaluation
splits kept aligned). The sources (:mod:`data.sources`, :mod:`data.wit3`) build on these."""

from __future__ import annotations

import gzip
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

logger = logging.getLogger("data")

TRAIN_SPLIT = "train"


class DataError(ValueError):
    """Bad or missing corpus input, reported as one line."""


@dataclass(frozen=True)
class Pairs:
    """One split of a parallel corpus: ``src[i]`` translates as ``tgt[i]``; ``len`` counts the pairs.

    Its columns read as ``pairs["src"]`` and ``pairs["tgt"]`` too. A corpus is a ``dict`` of split name -> ``Pairs``.
    """

    src: list[str]
    tgt: list[str]

    def __post_init__(self) -> None:
        if len(self.src) != len(self.tgt):
            raise DataError(f"a split's two sides must align: {len(self.src)} source lines but {len(self.tgt)} target "
                            "lines")

    def __len__(self) -> int:
        return len(self.src)

    def __getitem__(self, column: Literal["src", "tgt"]) -> list[str]:
        if column not in ("src", "tgt"):
            raise KeyError(f"a split's columns are 'src' and 'tgt', not {column!r}")
        return self.src if column == "src" else self.tgt


def decode_lines(data: bytes, name: str) -> list[str]:
    """Split UTF-8 ``data`` into lines on ``\\n`` only (``\\r`` and other breaks stay inside a line).

    A final newline does not add an empty line. Lines are returned unstripped.
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{name}: not valid UTF-8 at byte {e.start}") from None
    if text.startswith("\ufeff"):
        text = text[1:]
    if not text:
        return []
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines


def clean_text(text: str) -> str:
    """One line of text as every part of the toolkit reads it: each run of whitespace of any kind
    (spaces, tabs, ``\r``, no-break and other Unicode spaces) becomes one space; none at either end."""
    return " ".join(text.split())


def read_lines(path: Path) -> list[str]:
    """Lines of a UTF-8 text file, plain or gzip (by a ``.gz`` suffix), unstripped."""
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                data = f.read()
        else:
            data = path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"file not found: {path}") from None
    except (OSError, EOFError) as e:
        raise DataError(f"cannot read {path}: {e}") from None
    return decode_lines(data, str(path))


def make_split(name: str, src: Sequence[str], tgt: Sequence[str], origin: str) -> Pairs:
    """One split as ``Pairs``, each side through ``clean_text``; ``origin`` names it in messages.

    The train split drops pairs with an empty side; other splits keep them (a warning counts them).
    """
    if len(src) != len(tgt):
        raise DataError(f"{origin}: {len(src)} source lines but {len(tgt)} target lines")
    src = [clean_text(s) for s in src]
    tgt = [clean_text(t) for t in tgt]
    empty = [i for i, (s, t) in enumerate(zip(src, tgt, strict=True)) if not s or not t]
    if empty and name == TRAIN_SPLIT:
        keep = set(range(len(src))).difference(empty)
        src = [s for i, s in enumerate(src) if i in keep]
        tgt = [t for i, t in enumerate(tgt) if i in keep]
        logger.info("%s: dropped %d training pairs with an empty side", origin, len(empty))
    elif empty:
        logger.warning("%s: %d of %d pairs have an empty side (kept, split %s stays aligned; first at row %d)",
                       origin, len(empty), len(src), name, empty[0])
    return Pairs(src, tgt)
