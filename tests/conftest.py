"""Shared test fixtures: isolate Hugging Face caches and locate the shared data folder."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from utils.config import Config, from_dict

ROOT = Path(__file__).resolve().parents[1]

SHARED_DATA = Path(os.environ.get("FR2EN_SHARED_DATA", Path(__file__).resolve().parents[1] / ".." / "shared" / "data"))


@pytest.fixture(autouse=True)
def _isolated_hf_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """`datasets` writes to ~/.cache/huggingface even for local files: point it at a temp dir."""
    home = tmp_path_factory.getbasetemp() / "hf_home"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(home / "datasets"))
    monkeypatch.setenv("HF_HUB_OFFLINE", os.environ.get("HF_HUB_OFFLINE", "1"))


@pytest.fixture
def shared_data() -> Path:
    """The real data folder (../shared/data); tests needing it skip only where it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA} (set FR2EN_SHARED_DATA)")
    return SHARED_DATA.resolve()


def make_tiny_config(tmp: Path, **train_kw) -> Config:
    """The demo config shrunk to a model that trains in seconds; cache under ``tmp``."""
    raw = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    raw["name"] = "tiny"
    raw["data"].update(cache_dir=str(tmp / "cache"), max_tokens=300)
    raw["tokenizer"]["vocab_size"] = 400
    raw["model"].update(d_model=32, n_heads=2, encoder_layers=1, decoder_layers=1, d_ff=64, attention_pe="rope")
    raw["train"].update({"epochs": 3, "log_every": 2, "valid_bleu_sentences": 8, "warmup_steps": 10, **train_kw})
    raw["decode"].update(beam=2, batch_size=16)
    return from_dict(raw)


@pytest.fixture
def tiny_config() -> Callable[..., Config]:
    return make_tiny_config
