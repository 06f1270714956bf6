"""Checkpoints: plain dicts of tensors and numbers, written atomically, read with ``weights_only=True``.

The model's configuration is not inside the checkpoint: it lives in the run directory
(``config.yaml``), and a checkpoint records a fingerprint of the model section and of the tokenizer
so that pairing it with the wrong settings is caught with a clear error.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

import torch

from utils.config import ModelConfig
from utils.io import atomic_path

#: Model keys (dotted) that shape no parameter and may differ between training and inference.
INFERENCE_ONLY_KEYS = (
    "dropout", "attention_dropout", "activation_dropout",
    "rope.scaling", "rope.factor", "rope.original_max_len", "rope.beta_fast", "rope.beta_slow",
)


def model_shape_items(cfg: ModelConfig) -> dict[str, object]:
    """Flattened model config (``rope.theta``, ...) without the inference-only keys."""
    flat: dict[str, object] = {}
    for key, value in dataclasses.asdict(cfg).items():
        items = {f"{key}.{k}": v for k, v in value.items()} if isinstance(value, dict) else {key: value}
        flat.update({k: v for k, v in items.items() if k not in INFERENCE_ONLY_KEYS})
    return flat


class CheckpointError(ValueError):
    """Missing, unreadable or mismatched checkpoint."""


def model_fingerprint(cfg: ModelConfig, vocab_size: int) -> str:
    """Hash of the model settings that differ from the defaults (inference-only keys excluded).

    Hashing only non-default values keeps checkpoints valid when a new key is added whose default
    preserves the old behaviour, while any real change of architecture or encoding changes the hash.
    """
    defaults = model_shape_items(ModelConfig())
    shape = {k: v for k, v in model_shape_items(cfg).items() if defaults.get(k, object()) != v}
    shape["vocab_size"] = vocab_size
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:16]


def save_checkpoint(path: Path | str, state: dict[str, Any]) -> None:
    """Write ``state`` (tensors, numbers, strings, nested dicts/lists) atomically."""
    with atomic_path(path, suffix=".pt") as tmp:
        torch.save(state, tmp)


def load_checkpoint(path: Path | str, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unreadable file is reported the same way
        raise CheckpointError(f"cannot read checkpoint {path}: {str(e).splitlines()[0]}") from None
