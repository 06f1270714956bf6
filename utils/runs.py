"""Run directories: create one per training run, and load one back (config + tokenizer + weights).

The layout of a run directory (which file is where) is ``utils.rundir.RunDir``; a start that fails leaves no run
directory behind, and ``runs/<name>_latest`` moves to a run once it has a checkpoint.
"""

from __future__ import annotations

import fcntl
import itertools
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from models.transformer import Seq2SeqTransformer
from tokenizer import Tokenizer, load_tokenizer
from utils.checkpoint import (
    CheckpointError,
    average_checkpoints,
    load_checkpoint,
    model_fingerprint,
    model_shape_items,
    periodic_checkpoints,
)
from utils.config import Config, ConfigError, load_config, save_config
from utils.rundir import RunDir

_held_locks: dict[Path, int] = {}  # run directory -> descriptor of its lock file, held by this process


class RunLockedError(ConfigError):
    """Another process trains in this run directory."""


def lock_run(run_dir: Path | str) -> None:
    """Hold ``run_dir/train.lock`` (an exclusive ``flock``) until this process ends: one process trains in a run
    directory at a time, and nobody removes a directory being written. The kernel releases the lock when the
    process dies, ``kill -9`` included, so a stale lock cannot exist. RunLockedError, one line, if held."""
    run_dir = Path(run_dir).resolve()
    if run_dir in _held_locks:
        return
    fd = os.open(RunDir(run_dir).lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RunLockedError(f"{run_dir} is being trained by another process (pid {_lock_owner(run_dir)}); "
                             "wait for it to end") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    _held_locks[run_dir] = fd


def unlock_run(run_dir: Path | str) -> None:
    """Release a lock taken by ``lock_run`` (it is released at exit anyway)."""
    fd = _held_locks.pop(Path(run_dir).resolve(), None)
    if fd is not None:
        os.close(fd)


def run_locked_by(run_dir: Path | str) -> int | None:
    """The pid training in ``run_dir`` if another process holds its lock, else None."""
    run_dir = Path(run_dir).resolve()
    if run_dir in _held_locks or not (RunDir(run_dir).lock).is_file():
        return None
    try:
        fd = os.open(RunDir(run_dir).lock, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _lock_owner(run_dir) or -1
    finally:
        os.close(fd)
    return None


def _lock_owner(run_dir: Path) -> int | None:
    try:
        return int((RunDir(run_dir).lock).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def check_runs_root(root: Path | str) -> Path:
    """The folder run directories go in; ConfigError, one line, if it cannot hold them. Creates nothing."""
    root = Path(root)
    existing = root
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"--runs {root}: {existing} exists and is not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"--runs {root}: no permission to write in {existing}")
    return root


def create_run_dir(cfg: Config, root: Path | str = "runs", lock: bool = False) -> Path:
    """Make ``root/<name>_<timestamp>/`` holding ``config.yaml``, atomically: a run started at the same
    moment gets its own folder (``_2``, ``_3``... suffixes; ``mkdir`` decides). ``<name>_latest`` is not
    touched here: it moves to a run once that run has a checkpoint (``point_latest``). ``lock``: this process
    will train in it, and holds its lock (``lock_run``) from the start."""
    root = check_runs_root(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"--runs {root}: cannot create it ({e.strerror or type(e).__name__})") from None
    stamp = time.strftime("%Y%m%d_%H%M%S")
    for n in itertools.count(1):
        run = root / (f"{cfg.name}_{stamp}" if n == 1 else f"{cfg.name}_{stamp}_{n}")
        try:
            run.mkdir()
            break
        except FileExistsError:
            continue
    if lock:
        lock_run(run)  # before anything is written: no other process removes or trains in it
    RunDir(run).checkpoints.mkdir()
    save_config(cfg, RunDir(run).config)
    return run


def latest_link(run_dir: Path) -> Path:
    """``<root>/<name>_latest`` for a run directory ``<root>/<name>_<timestamp>[_n]``."""
    return RunDir(run_dir).latest_link(load_config(RunDir(run_dir).config).name)


def point_latest(run_dir: Path) -> None:
    """Point ``<name>_latest`` at ``run_dir`` atomically (a uniquely named link renamed over it)."""
    run_dir = Path(run_dir)
    link = latest_link(run_dir)
    tmp = link.parent / f".{link.name}.{os.getpid()}.{time.monotonic_ns()}.tmp"
    tmp.symlink_to(run_dir.name)
    try:
        os.replace(tmp, link)
    finally:
        if tmp.is_symlink():
            tmp.unlink()


def discard_if_untrained(run_dir: Path) -> bool:
    """Remove a run directory that never got a checkpoint (a start that failed); True if removed. A directory
    another process trains in (its lock is held) is never removed."""
    ckpt = RunDir(run_dir).checkpoints
    if any(ckpt.glob("*.pt")) or run_locked_by(run_dir) is not None:
        return False
    shutil.rmtree(run_dir, ignore_errors=True)
    unlock_run(run_dir)
    return True


def resolve_checkpoint(model_path: Path | str) -> tuple[Path, Path]:
    """A checkpoint file or a run directory -> (run_dir, checkpoint). A run dir means its best.pt (else last.pt)."""
    path = Path(model_path)
    if path.is_dir():
        run = path.resolve()
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


def average_path(run_dir: Path, kept: list[Path]) -> Path:
    """Where the average of ``kept`` (oldest first) is saved: ``checkpoints/average<N>_step_<a>-step_<b>.pt``."""
    return RunDir(run_dir).average(kept)


def save_average(run_dir: Path | str, n: int) -> Path:
    """Average the run's last ``n`` periodic checkpoints and save the result as a checkpoint of the run."""
    from utils.checkpoint import save_checkpoint

    run_dir = Path(model_dir(run_dir))
    kept = last_periodic(run_dir, n)
    path = average_path(run_dir, kept)
    save_checkpoint(path, average_checkpoints(kept))
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
        kept = last_periodic(run_dir, average)
        state = average_checkpoints(kept)
        ckpt_path = average_path(run_dir, kept)
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
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as e:
        raise CheckpointError(f"{ckpt_path} does not fit the model in its config: {str(e).splitlines()[0]}") from None
    model.to(select_device(device if device != "auto" else cfg.train.device)).eval()
    trainer_state = state.get("trainer")
    step = int(trainer_state.get("iteration", 0)) if isinstance(trainer_state, dict) else 0
    return LoadedRun(cfg, tokenizer, model, run_dir, ckpt_path, step)
