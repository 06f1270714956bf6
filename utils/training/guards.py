"""When training stops: a non-finite loss or gradient, a signal, a spent budget."""

from __future__ import annotations

import logging
import math
import os
import signal
from typing import Any

import ignite.distributed as idist

from utils.config import TrainConfig

log = logging.getLogger("train")


class NonFiniteGuard:
    """Watches each optimizer step's loss and gradient norm (``train.nonfinite``): a NaN or inf either stops
    training with one line naming the step (``stop``) or skips the update (``skip``; 20 skipped in a row stop
    training). Every rank decides alike (the flag is all-reduced). Healthy steps are untouched."""

    MAX_SKIPPED = 20

    def __init__(self, mode: str, check_grads: bool = True) -> None:
        self.mode, self.check_grads = mode, check_grads  # fp16: the grad scaler skips overflowing steps itself
        self.bad_loss: float | None = None  # the first non-finite loss of the current accumulation window
        self.skipped = 0

    def saw_loss(self, loss: float) -> None:
        if not math.isfinite(loss) and self.bad_loss is None:
            self.bad_loss = loss

    def step_is_finite(self, grad_norm: float, step: int) -> bool:
        """Whether the optimizer may step; raises StopError when training must stop."""
        from utils.cli import StopError

        what = f"loss {self.bad_loss}" if self.bad_loss is not None else \
            f"gradient norm {grad_norm}" if self.check_grads and not math.isfinite(grad_norm) else None
        self.bad_loss = None
        bad = what is not None
        if idist.get_world_size() > 1:
            bad = bool(idist.all_reduce(int(bad), op="MAX"))
            what = what or "loss or gradient on another rank"
        if not bad:
            self.skipped = 0
            return True
        if self.mode == "skip" and self.skipped < self.MAX_SKIPPED - 1:
            self.skipped += 1
            log.warning("step %d: non-finite %s, update skipped (train.nonfinite=skip)", step, what)
            return False
        again = f" ({self.MAX_SKIPPED} steps in a row)" if self.mode == "skip" else ""
        raise StopError(f"training diverged at step {step}: non-finite {what}{again}; nothing of this step was "
                        "saved (lower train.lr, or set train.nonfinite=skip to skip such steps)")


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
