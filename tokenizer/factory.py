"""Train, load or build the tokenizer named by a ``TokenizerConfig``."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path

from tokenizer.config import TokenizerConfig

from .base import META_FILE, Tokenizer, TokenizerError
from .joint import JOINT_TYPES, JointSubwordTokenizer
from .marian import MarianTokenizerWrapper

TYPES = (*JOINT_TYPES, "marian")


def train_tokenizer(
    cfg: TokenizerConfig, src_texts: Iterable[str], tgt_texts: Iterable[str], seed: int = 0
) -> Tokenizer:
    """Train a joint bpe/unigram vocabulary on source and target sentences."""
    return JointSubwordTokenizer.train(cfg, src_texts, tgt_texts, seed=seed)


def load_tokenizer(directory: Path) -> Tokenizer:
    """Reload a tokenizer written by ``Tokenizer.save``; meta.json picks the class."""
    directory = Path(directory)
    meta_path = directory / META_FILE
    if not meta_path.is_file():
        raise TokenizerError(f"no saved tokenizer in {directory}: {META_FILE} is missing")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TokenizerError(f"{meta_path} is corrupt: {e}") from e
    kind = meta.get("type") if isinstance(meta, dict) else None
    if kind not in TYPES:
        raise TokenizerError(f"{meta_path}: type {kind!r} is not one of: {', '.join(TYPES)}")
    if kind == "marian":
        return MarianTokenizerWrapper.from_path(str(directory))
    return JointSubwordTokenizer.load(directory, kind)


def build_tokenizer(
    cfg: TokenizerConfig, train_texts: Callable[[], tuple[Iterable[str], Iterable[str]]], seed: int = 0
) -> Tokenizer:
    """marian: load the pretrained tokenizer (``train_texts`` is never called); bpe/unigram: train on it."""
    if cfg.type == "marian":
        return MarianTokenizerWrapper.from_path(cfg.path)
    if cfg.type not in JOINT_TYPES:
        raise TokenizerError(f"tokenizer.type {cfg.type!r} is not one of: {', '.join(TYPES)}")
    src, tgt = train_texts()
    return train_tokenizer(cfg, src, tgt, seed=seed)
