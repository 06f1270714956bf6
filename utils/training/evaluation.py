"""Validation: teacher-forced loss/accuracy as an Ignite metric, and BLEU of decoded sentences."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from ignite.engine import Engine
from ignite.metrics import Metric
from ignite.metrics.metric import reinit__is_reduced, sync_all_reduce

from data.batching import Batch
from models.transformer import Seq2SeqTransformer


def token_loss(logits: torch.Tensor, target: torch.Tensor, pad_id: int, label_smoothing: float = 0.0) -> torch.Tensor:
    """Summed cross-entropy over non-pad targets. logits ``[..., V]``, target ``[...]`` -> scalar."""
    return F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]),
        target.reshape(-1),
        ignore_index=pad_id,
        label_smoothing=label_smoothing,
        reduction="sum",
    )


class TokenLossAccuracy(Metric):
    """Per-token cross-entropy (no label smoothing), perplexity and accuracy over non-pad tokens.

    Expects the evaluator output ``(loss_sum, n_correct, n_tokens)`` per batch.
    """

    @reinit__is_reduced
    def reset(self) -> None:
        self._loss = 0.0
        self._correct = 0
        self._tokens = 0

    @reinit__is_reduced
    def update(self, output: tuple[float, int, int]) -> None:
        loss, correct, tokens = output
        self._loss += loss
        self._correct += correct
        self._tokens += tokens

    @sync_all_reduce("_loss", "_correct", "_tokens")
    def compute(self) -> dict[str, float]:
        tokens = max(self._tokens, 1)
        loss = self._loss / tokens
        return {"loss": loss, "ppl": math.exp(min(loss, 50.0)), "accuracy": self._correct / tokens}


def create_evaluator(
    model: Seq2SeqTransformer,
    pad_id: int,
    device: torch.device,
    autocast: Callable[[], contextlib.AbstractContextManager],
) -> Engine:
    """An Ignite engine computing validation loss, perplexity and token accuracy."""

    @torch.no_grad()
    def step(engine: Engine, batch: Batch) -> tuple[float, int, int]:
        model.eval()
        batch = batch.to(device)
        real = batch.tgt_out != pad_id
        target = batch.tgt_out[real]
        with autocast():
            logits = model(batch.src, batch.tgt_in, real)  # [N, V]: non-pad positions only
        loss = token_loss(logits, target, pad_id)
        correct = (logits.argmax(-1) == target).sum()
        return float(loss), int(correct), int(target.numel())

    evaluator = Engine(step)
    TokenLossAccuracy().attach(evaluator, "token")
    return evaluator
