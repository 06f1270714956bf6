"""When training stops: a non-finite loss or gradient (checked on the device, read back in windows), a signal, a
spent budget."""

from __future__ import annotations

import logging
import math
import os
import signal
from typing import Any

import ignite.distributed as idist
import torch

from utils.config import TrainConfig

log = logging.getLogger("train")


class NonFiniteGuard:
    """Watches each optimizer step's loss and gradient norm (``train.nonfinite``) without waiting for the device:
    ``flags`` marks a step non-finite on the device, where the step is then skipped (no update); ``judge`` sees the
    steps in order once they are read back (every ``train.log_every`` iterations, before validation and checkpoints)
    and either stops training with one line naming the first bad step (``stop``) or logs it as skipped (``skip``; 20
    skipped in a row stop training). Every rank decides alike (the flags are all-reduced on the device). Healthy
    steps are untouched."""

    MAX_SKIPPED = 20

    def __init__(self, mode: str, check_grads: bool = True) -> None:
        self.mode, self.check_grads = mode, check_grads  # fp16: the grad scaler skips overflowing steps itself
        self.bad_loss: float | None = None  # the first non-finite loss of the current accumulation window
        self.skipped = 0

    def flags(self, losses: list[torch.Tensor], grad_norm: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One optimizer step's (skip, bad), 0-d bool tensors on the device, from its batches' ``losses`` and its
        gradient norm: ``skip``, no update (a non-finite loss or gradient, fp16 overflow included); ``bad``, what
        ``judge`` reports (a non-finite loss, or gradient unless the grad scaler handles those)."""
        loss_bad = (~torch.isfinite(torch.stack(losses).sum()) if losses
                    else torch.zeros((), dtype=torch.bool, device=grad_norm.device))
        grad_bad = ~torch.isfinite(grad_norm)
        skip = loss_bad | grad_bad
        bad = skip if self.check_grads else loss_bad
        if idist.get_world_size() > 1:
            both = idist.all_reduce(torch.stack([skip, bad]).float(), op="MAX") > 0
            skip, bad = both[0], both[1]
        return skip, bad

    def saw_loss(self, loss: float) -> None:
        if not math.isfinite(loss) and self.bad_loss is None:
            self.bad_loss = loss

    def judge(self, step: int, bad: bool, grad_norm: float) -> None:
        """Optimizer step ``step`` read back (its losses given to ``saw_loss`` first): a bad step is logged as
        skipped, or raises StopError when training must stop."""
        from utils.cli import StopError

        what = f"loss {self.bad_loss}" if self.bad_loss is not None else \
            f"gradient norm {grad_norm}" if self.check_grads and not math.isfinite(grad_norm) else \
            "loss or gradient on another rank"
        self.bad_loss = None
        if not bad:
            self.skipped = 0
            return
        if self.mode == "skip" and self.skipped < self.MAX_SKIPPED - 1:
            self.skipped += 1
            log.warning("step %d: non-finite %s, update skipped (train.nonfinite=skip)", step, what)
            return
        again = f" ({self.MAX_SKIPPED} steps in a row)" if self.mode == "skip" else ""
        raise StopError(f"training diverged at step {step}: non-finite {what}{again}; nothing of this step was "
                        "saved (lower train.lr, or set train.nonfinite=skip to skip such steps)")


class StepWindow:
    """Each iteration's loss and each optimizer step's gradient norm and guard flag, kept on the device from one read
    to the next: ``read`` brings them to the host in one transfer, the only point where training waits for the
    device."""

    def __init__(self) -> None:
        self.iterations: list[int] = []
        self.losses: list[torch.Tensor] = []
        self.steps: list[int] = []  # the iterations that stepped the optimizer
        self.norms: list[torch.Tensor] = []
        self.bad: list[torch.Tensor] = []

    def __len__(self) -> int:
        return len(self.iterations)

    def add_loss(self, iteration: int, loss: torch.Tensor) -> None:
        self.iterations.append(iteration)
        self.losses.append(loss.detach().float())

    def add_step(self, iteration: int, grad_norm: torch.Tensor, bad: torch.Tensor) -> None:
        self.steps.append(iteration)
        self.norms.append(grad_norm.detach().float())
        self.bad.append(bad.float())

    def read(self) -> list[tuple[int, float, tuple[float, bool] | None]]:
        """The window in order, emptied: (iteration, loss, (gradient norm, bad) where the optimizer stepped)."""
        if not self.iterations:
            return []
        parts = [self.losses, self.norms, self.bad] if self.steps else [self.losses]
        values = torch.cat([torch.stack(p) for p in parts]).tolist()
        n, k = len(self.losses), len(self.steps)
        stepped = dict(zip(self.steps, zip(values[n:n + k], (b > 0 for b in values[n + k:]), strict=True),
                           strict=True))
        out = [(it, loss, stepped.get(it)) for it, loss in zip(self.iterations, values[:n], strict=True)]
        for records in (self.iterations, self.losses, self.steps, self.norms, self.bad):
            records.clear()
        return out


class StopRequest:
    """Turns the first SIGINT/SIGTERM into a request honoured at the next iteration boundary; a signal again
    aborts at once, except the one a dying parent sends: ``kill -- -PGID`` or Ctrl-C on ``bench/study.py`` reaches
    its train.py from the kill and again as the study's death signal (``PR_SET_PDEATHSIG``), and that is one stop,
    which must still save last.pt. So the first repeat after the parent process changed is taken as that death
    signal (said in the log); any other repeat, e.g. Ctrl-C twice on train.py, aborts."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self._parent = 0
        self._absorbed = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopRequest:
        self._parent = os.getppid()
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not in the main thread
                pass
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.reason is not None:
            if not self._absorbed and os.getppid() != self._parent:  # the parent died: its death signal
                self._absorbed = True
                log.warning("%s: the parent process ended; still finishing this step and saving checkpoints/last.pt "
                            "(again to abort)", signal.Signals(signum).name)
                return
            raise KeyboardInterrupt  # asked again: stop now
        self.reason = signal.Signals(signum).name
        log.warning("%s received: finishing this step, saving checkpoints/last.pt (again to abort)", self.reason)


def finished_reason(t: TrainConfig, iteration: int, epoch_length: int, tokens: int,
                    early_stopping_counter: int) -> str | None:
    """Why a resumed run has nothing left to train (its budget is spent), or None."""
    if iteration >= t.epochs * epoch_length:
        return f"all train.epochs={t.epochs} are done"
    if t.max_steps is not None and iteration >= t.max_steps * t.accumulate:
        return f"train.max_steps={t.max_steps} is reached"
    if t.max_target_tokens is not None and tokens >= t.max_target_tokens:
        return f"train.max_target_tokens={t.max_target_tokens} is reached"
    if early_stopping_counter >= t.patience:
        return f"early stopping ended it (no better validation BLEU in train.patience={t.patience} evaluations)"
    return None
