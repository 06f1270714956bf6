"""Checkpoints: plain dicts of tensors and numbers, written atomically, read with ``weights_only=True``.

The model's configuration is not inside the checkpoint: it lives in the run directory
(``config.yaml``), and a checkpoint records a fingerprint of the model section and of the tokenizer
so that pairing it with the wrong settings is caught with a clear error.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
import zlib
from pathlib import Path
from typing import Any

import torch

from models.config import inference_only_keys
from utils.config import ModelConfig
from utils.io import atomic_path
from utils.run.layout import CHECKPOINT_EXT, PERIODIC_PREFIX

#: Model keys (dotted) that shape no parameter and may differ between training and inference (the encodings
#: declare theirs: ``Settings.inference_only``).
INFERENCE_ONLY_KEYS = inference_only_keys()


def model_shape_items(cfg: ModelConfig) -> dict[str, object]:
    """Flattened model config (``rope.theta``, ...) without the inference-only keys."""
    flat: dict[str, object] = {}
    for key, value in cfg.to_dict().items():
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
    """Write ``state`` (tensors, numbers, strings, nested dicts/lists) atomically. A write that fails (a full
    disk, a file size limit) is CheckpointError, one line; the checkpoint it would have replaced is untouched."""
    try:
        with atomic_path(path, suffix=".pt") as tmp:
            torch.save(state, tmp)
    except (OSError, RuntimeError) as e:  # torch.save reports a failed write as a RuntimeError
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e).strip().splitlines()[0] \
            if str(e).strip() else type(e).__name__
        raise CheckpointError(f"cannot write checkpoint {path} ({why}; {_free_space(Path(path).parent)}); "
                              "the checkpoints already there are intact") from None


def _free_space(folder: Path) -> str:
    import shutil

    try:
        return f"{shutil.disk_usage(folder).free / 2**20:,.0f} MB free there"
    except OSError:
        return "free space unknown"


def load_checkpoint(path: Path | str, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """A checkpoint's dict, read with ``weights_only=True`` (never unpickled); CheckpointError, one line, if
    the file is missing, empty, not a checkpoint, damaged, or holds Python objects beyond tensors."""
    path = check_checkpoint_file(path)
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # noqa: BLE001 - a damaged archive raises many kinds
        if type(e).__name__ == "UnpicklingError":  # weights_only refused a Python object
            raise CheckpointError(f"{path} holds Python objects beyond tensors and numbers: refused, "
                                  "this toolkit never unpickles checkpoints") from None
        raise CheckpointError(f"checkpoint {path} is damaged ({type(e).__name__})") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} is not a checkpoint of this toolkit (it holds a {type(state).__name__})")
    return state


def check_checkpoint_file(path: Path | str) -> Path:
    """``path``, a file that ``torch.save`` wrote whole: CheckpointError, one line, if it is missing, a folder,
    empty, not a zip archive, or one whose members fail their CRC check (what ``load_checkpoint`` checks before
    reading; ``train.py --resume`` checks it before it writes anything)."""
    path = Path(path)
    if path.is_dir():
        raise CheckpointError(f"{path} is a folder, not a checkpoint file")
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    if path.stat().st_size == 0:
        raise CheckpointError(f"checkpoint {path} is empty (0 bytes)")
    if not zipfile.is_zipfile(path):
        if path.open("rb").read(4) == b"PK\x03\x04":  # a zip's start without its end: cut short
            raise CheckpointError(f"{path} is damaged: its zip archive has no end (the file was truncated after "
                                  "it was written)")
        raise CheckpointError(f"{path} is not a PyTorch checkpoint (torch.save writes a zip archive)")
    _check_crc(path)
    return path


def _check_crc(path: Path) -> None:
    """CheckpointError, one line, if a member of the zip archive fails its CRC-32 check: torch's own reader does
    not check it, so bytes changed after saving would load as other weights. Reads the file once."""
    after = "(the file was changed or truncated after it was written)"
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, EOFError, zlib.error, NotImplementedError, ValueError) as e:
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{path} is damaged: its zip archive cannot be read ({why}) {after}") from None
    except OSError as e:
        raise CheckpointError(f"cannot read checkpoint {path}: {e.strerror or type(e).__name__}") from None
    if bad is not None:
        raise CheckpointError(f"{path} is damaged: member {bad!r} fails its CRC check {after}")


def fit_state_dict(model: torch.nn.Module, weights: dict[str, Any], source: Path | str) -> None:
    """``model.load_state_dict(weights)``; CheckpointError, one complete line, if they do not fit: the first
    weight whose shape differs (with both shapes), else the first missing or unexpected key."""
    expected = model.state_dict()
    for name, tensor in weights.items():
        if name in expected and torch.is_tensor(tensor) and tuple(tensor.shape) != tuple(expected[name].shape):
            raise CheckpointError(f"{source} does not fit the model in its config: {name} has shape "
                                  f"{list(tensor.shape)} in the checkpoint, {list(expected[name].shape)} in the "
                                  f"model{_more(weights, expected, name)}")
    missing = [k for k in expected if k not in weights]
    extra = [k for k in weights if k not in expected]
    if missing or extra:
        what = f"{missing[0]} is missing" if missing else f"{extra[0]} is not a weight of the model"
        raise CheckpointError(f"{source} does not fit the model in its config: {what} "
                              f"({len(missing)} missing, {len(extra)} unexpected weight(s))")
    try:
        model.load_state_dict(weights)
    except RuntimeError as e:
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        raise CheckpointError(f"{source} does not fit the model in its config: "
                              f"{lines[-1] if lines else type(e).__name__}") from None


def _more(weights: dict[str, Any], expected: dict[str, Any], first: str) -> str:
    n = sum(1 for k, t in weights.items() if k in expected and torch.is_tensor(t)
            and tuple(t.shape) != tuple(expected[k].shape))
    return f" ({n - 1} more weight(s) differ in shape)" if n > 1 else ""


def periodic_checkpoints(checkpoint_dir: Path | str) -> list[Path]:
    """The ``step_<iteration>.pt`` files of a run (``train.keep_checkpoints``), oldest first."""
    found = []
    for path in Path(checkpoint_dir).glob(f"{PERIODIC_PREFIX}*.{CHECKPOINT_EXT}"):
        try:
            found.append((int(path.stem[len(PERIODIC_PREFIX):]), path))
        except ValueError:
            continue
    return [p for _, p in sorted(found)]


def average_checkpoints(paths: list[Path]) -> dict[str, Any]:
    """Parameters averaged over ``paths`` (fairseq's ``average_checkpoints``): floating tensors are summed in
    float64 and divided, then cast back; other tensors must agree. Returns the last checkpoint's dict with
    the averaged ``model``, and ``averaged_from`` naming the inputs."""
    if not paths:
        raise CheckpointError("no checkpoints to average")
    states = [load_checkpoint(p) for p in paths]
    for path, state in zip(paths, states, strict=True):
        if "model" not in state:
            raise CheckpointError(f"{path} holds no model weights")
        if state.get("meta", {}).get("model_fingerprint") != states[-1].get("meta", {}).get("model_fingerprint"):
            raise CheckpointError(f"{path} was saved for another model configuration than {paths[-1]}")
        if state["model"].keys() != states[-1]["model"].keys():
            raise CheckpointError(f"{path} has other parameters than {paths[-1]}")
    averaged = {}
    for name, last in states[-1]["model"].items():
        if torch.is_floating_point(last):
            total = torch.zeros_like(last, dtype=torch.float64)
            for state in states:
                total += state["model"][name].to(torch.float64)
            averaged[name] = (total / len(states)).to(last.dtype)
        else:
            if any(not torch.equal(state["model"][name], last) for state in states):
                raise CheckpointError(f"{name} is an integer tensor that differs between the checkpoints")
            averaged[name] = last
    return {**states[-1], "model": averaged, "averaged_from": [str(p) for p in paths]}
