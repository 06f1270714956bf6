"""The ``tokenizer`` section of the config."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from utils.schema import Section

__all__ = ["TokenizerConfig"]


class TokenizerConfig(Section):
    """Joint vocabulary trained on the training split (subwords, characters or words; see tokenizer/joint.py),
    or a pretrained Marian tokenizer."""

    type: Literal["bpe", "unigram", "char", "word", "marian"] = "bpe"
    vocab_size: int = Field(8000, ge=1)
    min_frequency: int = Field(2, ge=0)
    lowercase: bool = False
    path: str | None = None  # marian: Hub id or local folder
    train_max_sentences: int | None = Field(None, ge=1)  # subsample (deterministically) for faster training
    byte_fallback: bool = True  # bpe/unigram/char: unseen characters become their UTF-8 bytes, never <unk>
