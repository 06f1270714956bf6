"""What a training run checkpoints besides model and optimizer (RNG, tokens seen, pending gradients,
fingerprints), and the atomic save handler Ignite's ``Checkpoint`` writes through."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ignite.distributed as idist
import torch
from ignite.handlers.checkpoint import BaseSaveHandler

from utils.run.checkpoint import save_checkpoint
from utils.run.layout import RunDir


class RNGState:
    """torch CPU (and CUDA) generator state, checkpointed so a resumed run draws the same dropout masks."""

    def state_dict(self) -> dict[str, Any]:
        state = {"torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            state["cuda"] = torch.stack(torch.cuda.get_rng_state_all())
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        torch.set_rng_state(state["torch"])
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(list(state["cuda"]))


class TokenCount:
    """Target tokens the run has trained on, every rank together (each rank adds every step's all-reduced count),
    checkpointed so that ``train.max_target_tokens`` and the summary's ``run_target_tokens`` hold across resumes.
    A checkpoint of an older version kept its rank's own count (``"ranks"`` absent): resumed on ``world`` ranks it
    counts ``world`` times that, as those versions did."""

    def __init__(self, world: int = 1) -> None:
        self.tokens, self.world = 0, world

    def state_dict(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "ranks": "all"}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.tokens = int(state["tokens"]) * (1 if state.get("ranks") == "all" else self.world)


class PendingGradients:
    """Gradients accumulated since the last optimizer step (``train.accumulate`` > 1), checkpointed so that
    a run stopped inside an accumulation window resumes exactly. Empty at a window's end."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def state_dict(self) -> dict[str, Any]:
        return {n: p.grad.detach().clone() for n, p in self.model.named_parameters() if p.grad is not None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for n, p in self.model.named_parameters():
            p.grad = state[n].to(p.device, p.dtype) if n in state else None


@dataclass
class RunMeta:
    """Fingerprints stored in every checkpoint, checked when it is loaded."""

    model_fingerprint: str
    tokenizer_fingerprint: str
    vocab_size: int

    def state_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("model_fingerprint") != self.model_fingerprint:
            raise ValueError("checkpoint was saved for a different model configuration")
        if state.get("tokenizer_fingerprint") != self.tokenizer_fingerprint:
            raise ValueError("checkpoint was trained with a different tokenizer")


class AtomicSaver(BaseSaveHandler):
    """Ignite save handler writing ``dirname/filename`` atomically (temp file + rename).

    Ignite removes a checkpoint before writing one of the same name; with fixed names (best.pt,
    last.pt) that would leave a moment with no file, so removal of a name about to be rewritten is
    skipped: the rename replaces it.
    """

    def __init__(self, dirname: Path, on_first_save: Callable[[], None] | None = None) -> None:
        self.dirname = Path(dirname)
        self.fixed_names = {RunDir(self.dirname.parent).best.name, RunDir(self.dirname.parent).last.name}
        self.on_first_save = on_first_save  # e.g. point <name>_latest at the run once it has a checkpoint

    def __call__(self, checkpoint: dict[str, Any], filename: str, metadata: dict | None = None) -> None:
        if idist.get_rank() == 0:  # in data-parallel training only rank 0 writes
            save_checkpoint(self.dirname / filename, checkpoint)
            if self.on_first_save is not None and filename in self.fixed_names:  # a run one can load or resume
                self.on_first_save()
                self.on_first_save = None

    def remove(self, filename: str) -> None:
        if filename not in self.fixed_names and idist.get_rank() == 0:
            (self.dirname / filename).unlink(missing_ok=True)


def remove_stale_temporaries(ckpt_dir: Path) -> None:
    """Delete temporary checkpoint files a killed process left (``.last.pt.<random>.pt.tmp``): the real
    ``best.pt``/``last.pt`` are only ever replaced by a completed rename, so these are never needed."""
    if idist.get_rank() == 0:
        for tmp in Path(ckpt_dir).glob(".*.tmp"):
            tmp.unlink(missing_ok=True)
