"""Load a trained run back for decoding: config + tokenizer + weights (a checkpoint, or the average of the
run's last periodic checkpoints), checked against each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from models.transformer import Seq2SeqTransformer
from tokenizer import Tokenizer, load_tokenizer
from utils.config import Config, ConfigError, load_config
from utils.run.checkpoint import (
    CheckpointError,
    average_checkpoints,
    fit_state_dict,
    load_checkpoint,
    model_fingerprint,
    model_shape_items,
    periodic_checkpoints,
    save_checkpoint,
)
from utils.run.layout import RunDir
from utils.run.store import select_device


def resolve_checkpoint(model_path: Path | str) -> tuple[Path, Path]:
    """A checkpoint file or a run directory -> (run_dir, checkpoint). A run dir means its best.pt (else last.pt)."""
    path = Path(model_path)
    if path.is_dir():
        run = RunDir(path).root.resolve()  # a <name>_latest link: the run it points at
        rd = RunDir(run)
        for ckpt in (rd.best, rd.last):
            if ckpt.is_file():
                return run, ckpt
        best, last = (p.relative_to(run) for p in (rd.best, rd.last))
        raise CheckpointError(f"no {best} or {last} in run directory {path}")
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    path = path.resolve()
    names = RunDir(".")
    run = path.parent.parent if path.parent.name == names.checkpoints.name else path.parent
    if not RunDir(run).config.is_file():
        raise CheckpointError(f"{path} is not inside a run directory "
                              f"(no {names.config.name} next to {names.checkpoints.name}/)")
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
    if run_cfg.tokenizer.to_dict() != cfg.tokenizer.to_dict():
        raise ConfigError(f"{source} describes a different tokenizer than the one the checkpoint was trained with")


@dataclass
class LoadedRun:
    cfg: Config
    tokenizer: Tokenizer
    model: Seq2SeqTransformer
    run_dir: Path
    checkpoint: Path
    step: int = 0  # training iteration recorded in the checkpoint (0 if none)


def average_run(run_dir: Path | str, n: int) -> tuple[Path, dict]:
    """The run's last ``n`` periodic checkpoints averaged (``average_checkpoints``), and the path that average
    has as a checkpoint of the run (``checkpoints/average<N>_step_<a>-step_<b>.pt``): the one averaging path of
    ``load_run(average=n)`` and ``save_average``."""
    run_dir = model_dir(run_dir)
    kept = last_periodic(run_dir, n)
    return RunDir(run_dir).average(kept), average_checkpoints(kept)


def save_average(run_dir: Path | str, n: int) -> Path:
    """Average the run's last ``n`` periodic checkpoints and save the result as a checkpoint of the run."""
    path, state = average_run(run_dir, n)
    save_checkpoint(path, state)
    return path


def check_finite(weights: dict[str, torch.Tensor], source: Path | str) -> None:
    """CheckpointError, one line, if a floating-point weight holds NaN or inf (a run that diverged): such a
    model translates nothing, and decoding it would only produce length-capped noise."""
    for name, tensor in weights.items():
        if torch.is_tensor(tensor) and torch.is_floating_point(tensor) and not bool(torch.isfinite(tensor).all()):
            raise CheckpointError(f"{source} has non-finite weights ({name} holds NaN or inf): its training "
                                  "diverged; use an earlier checkpoint or train again with a lower train.lr")


def last_periodic(run_dir: Path, n: int) -> list[Path]:
    """The run's last ``n`` periodic checkpoints, oldest first; CheckpointError, one line, saying why there are
    fewer (the keep_checkpoints setting, or a run that wrote fewer than it keeps) and what would work."""
    kept = periodic_checkpoints(RunDir(run_dir).checkpoints)
    if len(kept) >= n:
        return kept[-n:]
    t = load_config(RunDir(run_dir).config).train
    where = f"--average {n}: {RunDir(run_dir).checkpoints} holds {len(kept)} periodic checkpoint(s) (step_*.pt)"
    if t.keep_checkpoints < n:
        raise CheckpointError(f"{where}: the run kept train.keep_checkpoints={t.keep_checkpoints}; "
                              f"average at most {len(kept)}, or train with train.keep_checkpoints >= {n}")
    every = f"one every train.checkpoint_every={t.checkpoint_every} iterations" if t.checkpoint_every else \
        "one per validation"
    raise CheckpointError(f"{where}: the run wrote only {len(kept)} ({every}) although it keeps "
                          f"{t.keep_checkpoints}; average at most {len(kept)}, or checkpoint more often")


def model_dir(model_path: Path | str) -> Path:
    """The run directory of a checkpoint file or run directory."""
    return resolve_checkpoint(model_path)[0]


def load_run(
    model_path: Path | str,
    config_path: Path | str | None = None,
    overrides: list[str] | None = None,
    device: str = "auto",
    average: int | None = None,
) -> LoadedRun:
    """Load a trained model for inference.

    The run directory's resolved config is the reference. If ``config_path`` is given, its decoding and
    data settings are used, but its model and tokenizer sections must match the run's (else a
    ``ConfigError`` names the first differing key). ``overrides`` (``--set``) apply on top. ``average``: use
    the parameters averaged over the run's last N periodic checkpoints (``train.keep_checkpoints``).
    """
    run_dir, ckpt_path = resolve_checkpoint(model_path)
    rd = RunDir(run_dir)
    run_cfg = load_config(rd.config)
    if config_path is not None:
        cfg = load_config(config_path, overrides)
        check_compatible(run_cfg, cfg, str(config_path))
    else:
        cfg = load_config(rd.config, overrides)
    tokenizer = load_tokenizer(rd.tokenizer)
    if average:
        ckpt_path, state = average_run(run_dir, average)
    else:
        state = load_checkpoint(ckpt_path)
    if "model" not in state:
        raise CheckpointError(f"{ckpt_path} holds no model weights (keys: {', '.join(state)})")
    check_finite(state["model"], ckpt_path)
    meta = state.get("meta", {})
    expected = model_fingerprint(cfg.model, tokenizer.vocab_size)
    if meta.get("model_fingerprint") not in (None, expected):
        raise CheckpointError(f"{ckpt_path} was saved for a different model configuration than {rd.config}")
    if meta.get("tokenizer_fingerprint") not in (None, tokenizer.fingerprint):
        raise CheckpointError(f"{ckpt_path} was trained with a different tokenizer than {rd.tokenizer}")
    model = Seq2SeqTransformer(cfg.model, tokenizer.vocab_size, tokenizer.pad_id)
    fit_state_dict(model, state["model"], ckpt_path)
    model.to(select_device(device if device != "auto" else cfg.train.device)).eval()
    trainer_state = state.get("trainer")
    step = int(trainer_state.get("iteration", 0)) if isinstance(trainer_state, dict) else 0
    return LoadedRun(cfg, tokenizer, model, run_dir, ckpt_path, step)
