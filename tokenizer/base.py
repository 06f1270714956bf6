"""Abstract tokenizer interface shared by the trained joint vocabularies and the pretrained Marian one."""

from __future__ import annotations

import hashlib
import json
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from utils.io import atomic_write_text

META_FILE = "meta.json"
FORMAT_VERSION = 1


class TokenizerError(ValueError):
    """A tokenizer problem (bad config, missing/corrupt files, unreachable Hub), reported as one line."""


def sha256_hex(*parts: bytes | str) -> str:
    """sha256 of length-prefixed parts, so that part boundaries matter."""
    h = hashlib.sha256()
    for part in parts:
        data = part.encode("utf-8") if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


def _round_floats(obj: Any, digits: int) -> Any:
    if isinstance(obj, float):
        return float(f"{obj:.{digits}g}")
    if isinstance(obj, dict):
        return {k: _round_floats(v, digits) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_round_floats(v, digits) for v in obj]
    return obj


def canonical_json(obj: Any, float_digits: int | None = None) -> str:
    """A stable serialisation (sorted keys, no whitespace) used for fingerprints.

    ``float_digits`` rounds floats to that many significant digits: Unigram scores differ in the last bit between
    (multi-threaded) training runs and across a JSON save/load, which must not change the fingerprint.
    """
    if float_digits is not None:
        obj = _round_floats(obj, float_digits)
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


class Tokenizer(ABC):
    """Maps sentences to subword ids and back.

    ``encode_*`` add no bos/eos; the model code adds them. ``fingerprint`` identifies the vocabulary
    (sha256 over the model/vocabulary content and the tokenizer type) and is identical after save+load.
    """

    kind: str  # "bpe", "unigram" or "marian" (meta.json "type")
    pad_id: int
    bos_id: int
    eos_id: int
    unk_id: int
    vocab_size: int
    fingerprint: str

    @abstractmethod
    def encode_src(self, texts: list[str]) -> list[list[int]]:
        """Tokenize source (French) sentences; no bos/eos."""

    @abstractmethod
    def encode_tgt(self, texts: list[str]) -> list[list[int]]:
        """Tokenize target (English) sentences; no bos/eos."""

    @abstractmethod
    def _detokenize(self, batch: list[list[int]]) -> list[str]:
        """Detokenize already-cleaned id lists (no special ids left)."""

    @abstractmethod
    def id_to_token(self, ids: Sequence[int]) -> list[str]:
        """Subword strings of ``ids`` (for attention-map axis labels)."""

    @abstractmethod
    def _save_files(self, directory: Path) -> None:
        """Write the vocabulary/model files into ``directory``."""

    def _clean(self, ids: Sequence[int]) -> list[int]:
        """Cut at the first eos and drop pad/bos/unk ids."""
        out: list[int] = []
        drop = {self.pad_id, self.bos_id, self.unk_id}
        for i in ids:
            i = int(i)
            if i == self.eos_id:
                break
            if i not in drop:
                out.append(i)
        return out

    def decode(self, ids: Sequence[int]) -> str:
        """Detokenized text of ``ids`` as one line: stops at the first eos, drops pad/bos/unk; whitespace runs
        (also newlines or tabs a byte-fallback model may emit as byte tokens) become one space."""
        return self.decode_batch([ids])[0]

    def decode_batch(self, batch: Sequence[Sequence[int]]) -> list[str]:
        """``decode`` over a batch."""
        cleaned = [self._clean(ids) for ids in batch]
        # Whitespace runs of any kind become one space: the rule data.lines.clean_text applies to the corpus.
        return [" ".join(text.split()) for text in self._detokenize(cleaned)] if cleaned else []

    def meta(self) -> dict[str, Any]:
        """What meta.json records (``type`` picks the class on load)."""
        return {
            "type": self.kind,
            "format_version": FORMAT_VERSION,
            "fingerprint": self.fingerprint,
            "vocab_size": self.vocab_size,
            "special_ids": {"pad": self.pad_id, "bos": self.bos_id, "eos": self.eos_id, "unk": self.unk_id},
        }

    def save(self, directory: Path) -> None:
        """Write everything needed to reload into ``directory``; meta.json is written last."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self._save_files(directory)
        atomic_write_text(directory / META_FILE, json.dumps(self.meta(), indent=2) + "\n")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(type={self.kind!r}, vocab_size={self.vocab_size}, fp={self.fingerprint[:12]})"
