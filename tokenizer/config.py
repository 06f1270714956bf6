"""The ``tokenizer`` section of the config."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from utils.schema import Section

__all__ = ["TokenizerConfig"]


class TokenizerConfig(Section):
    """Joint vocabulary trained on the training split (subwords, characters or words; see tokenizer/joint.py),
    or a pretrained Marian tokenizer."""

    type: Literal["bpe", "unigram", "char", "word", "marian"] = Field(
        "bpe", description="The vocabulary, one for both languages, trained on the training split: `bpe` or "
        "`unigram` subwords, `char` characters, `word` whole words; or `marian`, a pretrained Marian tokenizer "
        "(`tokenizer.path`).")
    vocab_size: int = Field(8000, ge=1, le=1_000_000, description="Tokens in the trained vocabulary, special tokens "
                            "(and the 256 byte tokens of `tokenizer.byte_fallback`) included.")
    min_frequency: int = Field(2, ge=0, description="Keep only tokens (merges, characters, words) seen at least this "
                               "many times in the training data.")
    lowercase: bool = Field(False, description="Lowercase all text before tokenizing; test.py then scores "
                            "case-insensitively.")
    path: str | None = Field(None, description="`marian`: the Hugging Face Hub id or local folder of the tokenizer "
                             "(required); unused by the other types.")
    train_max_sentences: int | None = Field(None, ge=1, description="Train the vocabulary on a deterministic sample "
                                            "of this many sentences (faster); null: the whole training split.")
    byte_fallback: bool = Field(True, description="`bpe`, `unigram`, `char`: a character outside the vocabulary "
                                "becomes its UTF-8 bytes, never `<unk>`.")
