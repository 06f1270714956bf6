"""Shared test fixtures: isolate Hugging Face caches and locate the shared data folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

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
