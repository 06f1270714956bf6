"""The ``data`` section of the config: where the parallel corpus comes from and how it is filtered and batched."""

from __future__ import annotations

from typing import Any, Literal, Protocol

from pydantic import Field

from utils.schema import Section

__all__ = ["DataConfig", "Experiment"]


class DataConfig(Section):
    """Where the parallel corpus comes from and how it is filtered and batched."""

    source: Literal["demo", "iwslt2017", "wit3", "text"] = "demo"
    path: str | None = None  # wit3: archive (.tgz/.zip) or folder; text: folder of {split}.{lang}[.gz]
    src_lang: str = "fr"
    tgt_lang: str = "en"
    train: str = "train"  # text source: file prefix of each split
    validation: str = "valid"
    test: list[str] = Field(default_factory=lambda: ["test"])
    min_len: int = Field(1, ge=0)  # tokens, after subword tokenization (bos/eos not counted)
    max_len: int = Field(128, ge=1)  # training pairs longer than this on either side are dropped
    max_train_len: int | None = Field(None, ge=1)  # stricter training-only cap (train short, test long)
    max_len_ratio: float | None = Field(None, ge=1)  # drop training pairs with len ratio above this
    max_tokens: int = Field(4096, ge=1)  # batch size in tokens (max of source and target, padding included)
    valid_max_tokens: int | None = Field(None, ge=1)  # defaults to max_tokens
    cache_dir: str = "data/cache"
    num_proc: int = Field(1, ge=1)  # processes used to tokenize the corpus the first time


class Experiment(Protocol):
    """What the cache reads of a whole config (``utils.config.Config`` is one)."""

    @property
    def data(self) -> DataConfig: ...

    @property
    def tokenizer(self) -> Any: ...
