"""Pretrained Marian (OPUS-MT) tokenizer: separate source/target SentencePiece models over a shared vocabulary."""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .base import Tokenizer, TokenizerError, canonical_json, sha256_hex

LOCAL_EXAMPLE = "../shared/data/opus-mt-tc-big-fr-en"
REQUIRED_FILES = ("source.spm", "target.spm", "vocab.json")


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _hub_offline() -> bool:
    """HF_HUB_OFFLINE as set now (huggingface_hub reads it only once, at import)."""
    from huggingface_hub import constants

    env = os.environ.get("HF_HUB_OFFLINE", "").strip().upper()
    return env in {"1", "ON", "YES", "TRUE"} or bool(constants.HF_HUB_OFFLINE)


def _hub_reachable(timeout: float = 10.0) -> bool:
    """One quick request to the Hub endpoint, without the Hub client's minutes of retries."""
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session

    try:
        get_session().head(constants.ENDPOINT, timeout=timeout)
    except Exception:
        return False
    return True


def _looks_local(path: str) -> bool:
    """A path meant as a folder rather than a Hub id ("org/name")."""
    return path.startswith(("/", ".", "~")) or path.count("/") > 1 or "\\" in path or Path(path).exists()


def _from_pretrained(path: str) -> Any:
    """``MarianTokenizer.from_pretrained`` with one-line errors for missing folders and an unreachable Hub."""
    from transformers import MarianTokenizer

    def load(**kwargs: Any) -> Any:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Recommended: pip install sacremoses")
            return MarianTokenizer.from_pretrained(path, **kwargs)

    local = Path(path).expanduser()
    if local.is_dir():
        missing = [f for f in REQUIRED_FILES if not (local / f).is_file()]
        if missing:
            raise TokenizerError(f"{local} is not a Marian tokenizer folder: missing {', '.join(missing)}")
        try:
            return load()
        except Exception as e:
            raise TokenizerError(f"cannot load the Marian tokenizer from {local}: {_first_line(e)}") from e
    if _looks_local(path):
        raise TokenizerError(f"tokenizer.path {path!r}: no such folder")
    try:  # Hub id: the local HF cache first, without any network request
        return load(local_files_only=True)
    except Exception:
        pass
    unreachable = (
        f"tokenizer.path {path!r}: the Hugging Face Hub is unreachable (offline); pass a local folder as "
        f"tokenizer.path instead (e.g. {LOCAL_EXAMPLE})"
    )
    if _hub_offline() or not _hub_reachable():
        raise TokenizerError(unreachable)
    try:
        return load()
    except Exception as e:
        raise TokenizerError(f"cannot download the Marian tokenizer {path!r} from the Hub: {_first_line(e)}") from e


class MarianTokenizerWrapper(Tokenizer):
    """``transformers.MarianTokenizer``: sources use source.spm, targets target.spm (same id space).

    Marian has no bos: ``bos_id == pad_id`` (Marian's decoder_start_token_id is the pad id).
    """

    kind = "marian"

    def __init__(self, tok: Any) -> None:
        self._tok = tok
        self.pad_id = int(tok.pad_token_id)
        self.bos_id = self.pad_id
        self.eos_id = int(tok.eos_token_id)
        self.unk_id = int(tok.unk_token_id)
        self.vocab_size = len(tok)
        self.fingerprint = sha256_hex(
            self.kind,
            tok.spm_source.serialized_model_proto(),
            tok.spm_target.serialized_model_proto(),
            canonical_json(tok.get_vocab()),
            canonical_json({"separate_vocabs": bool(getattr(tok, "separate_vocabs", False))}),
        )

    @classmethod
    def from_path(cls, path: str | None) -> MarianTokenizerWrapper:
        """Load from a Hub id (e.g. Helsinki-NLP/opus-mt-fr-en) or a local folder."""
        if not path:
            raise TokenizerError(
                f"tokenizer.path is required for type 'marian' (a Hub id or a folder such as {LOCAL_EXAMPLE})"
            )
        return cls(_from_pretrained(str(path)))

    def encode_src(self, texts: list[str]) -> list[list[int]]:
        if not texts:
            return []
        return [list(x) for x in self._tok(list(texts), add_special_tokens=False)["input_ids"]]

    def encode_tgt(self, texts: list[str]) -> list[list[int]]:
        if not texts:
            return []
        return [list(x) for x in self._tok(text_target=list(texts), add_special_tokens=False)["input_ids"]]

    def _detokenize(self, batch: list[list[int]]) -> list[str]:
        return [self._tok.decode(ids, skip_special_tokens=True) for ids in batch]

    def id_to_token(self, ids: Sequence[int]) -> list[str]:
        out = []
        for i in ids:
            i = int(i)
            if not 0 <= i < self.vocab_size:
                raise TokenizerError(f"id {i} is outside the vocabulary (size {self.vocab_size})")
            out.append(self._tok.convert_ids_to_tokens(i))
        return out

    def _save_files(self, directory: Path) -> None:
        self._tok.save_pretrained(str(directory))
