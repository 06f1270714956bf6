"""Run directories: create one per training run, and load one back (config + tokenizer + weights).

Layout of ``runs/<name>_<YYYYmmdd_HHMMSS>/``::

    config.yaml        the resolved config (every default filled in)
    tokenizer/         everything needed to rebuild the tokenizer
    checkpoints/       best.pt (best validation BLEU) and last.pt (resume point)
    tb/                TensorBoard event files
    eval/              test.py hypotheses and score JSON

``runs/<name>_latest`` is a symbolic link to the newest run of that config.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from models.transformer import Seq2SeqTransformer
from tokenizer import Tokenizer, load_tokenizer
from utils.checkpoint import CheckpointError, load_checkpoint, model_fingerprint, model_shape_items
from utils.config import Config, ConfigError, load_config, save_config

CONFIG_FILE = "config.yaml"
TOKENIZER_DIR = "tokenizer"
CHECKPOINT_DIR = "checkpoints"


def create_run_dir(cfg: Config, root: Path | str = "runs") -> Path:
    """Make ``root/<name>_<timestamp>/`` (a suffix avoids collisions) and point ``<name>_latest`` at it."""
    root = Path(root)
    stamp = time.strftime("%Y%m%d_%H%M%S")
    run = root / f"{cfg.name}_{stamp}"
    n = 1
    while run.exists():
        n += 1
        run = root / f"{cfg.name}_{stamp}_{n}"
    (run / CHECKPOINT_DIR).mkdir(parents=True)
    save_config(cfg, run / CONFIG_FILE)
    link = root / f"{cfg.name}_latest"
    tmp = root / f".{cfg.name}_latest.tmp"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    tmp.symlink_to(run.name)
    os.replace(tmp, link)
    return run


def resolve_checkpoint(model_path: Path | str) -> tuple[Path, Path]:
    """A checkpoint file or a run directory -> (run_dir, checkpoint). A run dir means its best.pt (else last.pt)."""
    path = Path(model_path)
    if path.is_dir():
        run = path.resolve()
        for name in ("best.pt", "last.pt"):
            if (run / CHECKPOINT_DIR / name).is_file():
                return run, run / CHECKPOINT_DIR / name
        raise CheckpointError(f"no checkpoints/best.pt or checkpoints/last.pt in run directory {path}")
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    path = path.resolve()
    run = path.parent.parent if path.parent.name == CHECKPOINT_DIR else path.parent
    if not (run / CONFIG_FILE).is_file():
        raise CheckpointError(f"{path} is not inside a run directory (no {CONFIG_FILE} next to {CHECKPOINT_DIR}/)")
    return run, path


def check_compatible(run_cfg: Config, cfg: Config, source: str) -> None:
    """The user's config must describe the same model and tokenizer as the run's."""
    run_model = model_shape_items(run_cfg.model)
    user_model = model_shape_items(cfg.model)
    for key, value in run_model.items():
        if user_model[key] != value:
            raise ConfigError(
                f"{source} has model.{key}={user_model[key]!r} but the checkpoint was trained with {value!r}"
            )
    if dataclasses.asdict(run_cfg.tokenizer) != dataclasses.asdict(cfg.tokenizer):
        raise ConfigError(f"{source} describes a different tokenizer than the one the checkpoint was trained with")


@dataclass
class LoadedRun:
    cfg: Config
    tokenizer: Tokenizer
    model: Seq2SeqTransformer
    run_dir: Path
    checkpoint: Path
    step: int = 0  # training iteration recorded in the checkpoint (0 if none)


def select_device(name: str = "auto") -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("train.device: cuda was asked for but no CUDA device is available")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def load_run(
    model_path: Path | str,
    config_path: Path | str | None = None,
    overrides: list[str] | None = None,
    device: str = "auto",
) -> LoadedRun:
    """Load a trained model for inference.

    The run directory's resolved config is the reference. If ``config_path`` is given, its decoding and
    data settings are used, but its model and tokenizer sections must match the run's (else a
    ``ConfigError`` names the first differing key). ``overrides`` (``--set``) apply on top.
    """
    run_dir, ckpt_path = resolve_checkpoint(model_path)
    run_cfg = load_config(run_dir / CONFIG_FILE)
    if config_path is not None:
        cfg = load_config(config_path, overrides)
        check_compatible(run_cfg, cfg, str(config_path))
    else:
        cfg = load_config(run_dir / CONFIG_FILE, overrides)
    tokenizer = load_tokenizer(run_dir / TOKENIZER_DIR)
    state = load_checkpoint(ckpt_path)
    if "model" not in state:
        raise CheckpointError(f"{ckpt_path} holds no model weights (keys: {', '.join(state)})")
    meta = state.get("meta", {})
    expected = model_fingerprint(cfg.model, tokenizer.vocab_size)
    if meta.get("model_fingerprint") not in (None, expected):
        raise CheckpointError(f"{ckpt_path} was saved for a different model configuration than {run_dir / CONFIG_FILE}")
    if meta.get("tokenizer_fingerprint") not in (None, tokenizer.fingerprint):
        raise CheckpointError(f"{ckpt_path} was trained with a different tokenizer than {run_dir / TOKENIZER_DIR}")
    model = Seq2SeqTransformer(cfg.model, tokenizer.vocab_size, tokenizer.pad_id)
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as e:
        raise CheckpointError(f"{ckpt_path} does not fit the model in its config: {str(e).splitlines()[0]}") from None
    model.to(select_device(device if device != "auto" else cfg.train.device)).eval()
    trainer_state = state.get("trainer")
    step = int(trainer_state.get("iteration", 0)) if isinstance(trainer_state, dict) else 0
    return LoadedRun(cfg, tokenizer, model, run_dir, ckpt_path, step)
