"""The ``data`` section of the config: where the parallel corpus comes from and how it is filtered and batched."""

from __future__ import annotations

from typing import Any, Literal, Protocol

from pydantic import Field

from utils.schema import Section

__all__ = ["DataConfig", "Experiment"]


class DataConfig(Section):
    """Where the parallel corpus comes from and how it is filtered and batched."""

    source: Literal["demo", "iwslt2017", "wit3", "text"] = Field(
        "demo", description="Where the corpus comes from: `demo` (the 420/40/40 pairs in `data/demo/`), `iwslt2017` "
        "(IWSLT2017 fr-en TED talks, downloaded from the Hugging Face Hub), `wit3` (the same corpus from a local WIT3 "
        "archive or folder, `data.path`) or `text` (parallel text files in the folder `data.path`).")
    path: str | None = Field(None, description="`wit3`: the archive (`.tgz`/`.zip`) or its unpacked folder; `text`: "
                             "the folder of `{split}.{lang}` files, plain or `.gz`. Required by those two sources.")
    src_lang: str = Field("fr", description="Source language code, the suffix of source files (`train.fr`).")
    tgt_lang: str = Field("en", description="Target language code, the suffix of target files (`train.en`).")
    train: str = Field("train", description="`text` source: file prefix of the training split (`train.fr`, "
                       "`train.en`).")
    validation: str = Field("valid", description="`text` source: file prefix of the validation split.")
    test: list[str] = Field(default_factory=lambda: ["test"], description="The test splits test.py scores when "
                            "given no `--split` (`text` source: their file prefixes).")
    min_len: int = Field(1, ge=0, description="Drop training pairs with a side shorter than this many subword tokens "
                         "(bos/eos not counted).")
    max_len: int = Field(128, ge=1, le=100_000, description="Drop training and validation pairs with a side longer "
                         "than this many subword tokens (bos/eos not counted); test sets are never filtered.")
    max_train_len: int | None = Field(None, ge=1, le=100_000, description="A stricter cap for training pairs only "
                                      "(train short, test long); null: `data.max_len`.")
    max_len_ratio: float | None = Field(None, ge=1, description="Drop training pairs whose longer side has more than "
                                        "this many times the tokens of the shorter; null: no ratio filter.")
    max_tokens: int = Field(4096, ge=1, le=10_000_000, description="Training batch size in tokens: pairs per batch "
                            "times the longer padded side (source or target), per process.")
    valid_max_tokens: int | None = Field(None, ge=1, le=10_000_000, description="Validation batch size in tokens; "
                                         "null: `data.max_tokens`.")
    cache_dir: str = Field("data/cache", description="Folder of the tokenized, filtered splits (NumPy arrays with "
                           "checksums), rebuilt whenever the corpus, tokenizer or length limits change.")
    num_proc: int = Field(1, ge=1, le=1024, description="Processes that tokenize the corpus when its cache is first "
                          "built.")

class Experiment(Protocol):
    """What the cache reads of a whole config (``utils.config.Config`` is one)."""

    @property
    def data(self) -> DataConfig: ...

    @property
    def tokenizer(self) -> Any: ...
