"""models/loss.py: the chunked output layer + cross-entropy equals F.linear + F.cross_entropy, values and gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_same_weights

import models.loss
from models.loss import chunk_rows, linear_cross_entropy


def _reference(h: torch.Tensor, w: torch.Tensor, y: torch.Tensor, eps: float) -> torch.Tensor:
    return F.cross_entropy(F.linear(h, w).float(), y, label_smoothing=eps, reduction="sum")


def _grads(fn, h: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    h, w = h.clone().requires_grad_(), w.clone().requires_grad_()
    loss = fn(h, w)
    (loss * 0.37).backward()  # a scale on the way back, as 1 / tokens / accumulate is
    return loss.detach(), h.grad, w.grad


@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("rows", [1, 7, 64, 1000])
def test_equals_linear_then_cross_entropy_fp32(eps: float, rows: int) -> None:
    g = torch.Generator().manual_seed(0)
    h, w = torch.randn(53, 16, generator=g), torch.randn(101, 16, generator=g) * 0.5
    y = torch.randint(0, 101, (53,), generator=g)
    ref = _grads(lambda a, b: _reference(a, b, y, eps), h, w)
    ours = _grads(lambda a, b: linear_cross_entropy(a, b, y, eps, rows=rows), h, w)
    for r, o in zip(ref, ours, strict=True):
        torch.testing.assert_close(o, r, rtol=1e-5, atol=1e-5)


def test_under_bf16_autocast_it_follows_the_autocast_path() -> None:
    """bf16 products and fp32 softmax, as F.linear under autocast then .float(): as close to the fp32 truth
    as the autocast path is (its weight gradient, summed in fp32 over chunks, closer)."""
    g = torch.Generator().manual_seed(1)
    h, w = torch.randn(200, 32, generator=g), torch.randn(300, 32, generator=g) * 0.3
    y = torch.randint(0, 300, (200,), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = _grads(lambda a, b: _reference(a, b, y, 0.1), h, w)
        ours = _grads(lambda a, b: linear_cross_entropy(a, b, y, 0.1, rows=48), h, w)
    fp32 = _grads(lambda a, b: _reference(a, b, y, 0.1), h, w)
    assert ours[1].dtype == h.dtype and ours[2].dtype == w.dtype == torch.float32
    torch.testing.assert_close(ours[0], ref[0], rtol=2e-3, atol=0)
    for r, o, t in zip(ref[1:], ours[1:], fp32[1:], strict=True):
        assert (o - t).norm() <= 1.1 * (r - t).norm()
        assert (o - r).norm() <= 0.01 * t.norm()
    assert (ours[0] - fp32[0]).abs() > 1e-4  # it did compute in bf16, not silently in fp32


def test_tied_weight_gets_both_gradients() -> None:
    """The output layer tied to an embedding: the embedding's gradient and the loss's add up."""
    g = torch.Generator().manual_seed(2)
    emb = torch.randn(40, 8, generator=g)
    ids, y = torch.randint(0, 40, (30,), generator=g), torch.randint(0, 40, (30,), generator=g)

    def run(fused: bool) -> torch.Tensor:
        w = emb.clone().requires_grad_()
        h = torch.tanh(F.embedding(ids, w))
        loss = linear_cross_entropy(h, w, y, 0.1, rows=8) if fused else _reference(h, w, y, 0.1)
        loss.backward()
        return w.grad

    torch.testing.assert_close(run(True), run(False), rtol=1e-5, atol=1e-5)


def test_chunks_stay_under_the_mmap_threshold() -> None:
    assert chunk_rows(8000) * 8000 * 4 <= 32 * 2**20
    assert chunk_rows(32000) * 32000 * 4 <= 32 * 2**20
    assert chunk_rows(10**7) == 16


class _LargestTensor(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the most elements of any tensor an op creates while active."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("fused", [True, False])
def test_a_training_step_never_holds_the_logits_when_fused(tmp_path, tiny_config, monkeypatch, fused: bool) -> None:
    """The training step of the real loop, forward and backward: with ``train.fused_loss`` no tensor as large as
    the ``[N, V]`` logits exists (the plain path makes several), and the two paths give the same loss."""
    from utils.run.store import create_run_dir
    from utils.training.loop import Recipe

    cfg = tiny_config(tmp_path, max_steps=1, fused_loss=fused)
    recipe = Recipe(cfg, create_run_dir(cfg, tmp_path / "runs"), resume=False)
    batch = max(recipe.s.train_data, key=lambda b: int(b.n_tgt_tokens))
    n_vocab = recipe.s.core.vocab_size
    monkeypatch.setattr(models.loss, "CHUNK_ELEMENTS", 32 * n_vocab)  # the tiny model's chunks: 32 rows
    n_real = int((batch.tgt_out != recipe.s.tokenizer.pad_id).sum())
    engine = type("E", (), {"state": type("S", (), {"iteration": 1})()})()
    with _LargestTensor() as mode:
        out = recipe.train_step(engine, batch)
    logits = n_real * n_vocab
    assert n_real > 100
    if fused:
        assert mode.largest < logits, (mode.largest, logits)
    else:
        assert mode.largest >= logits
    assert out["loss"] > 0 and out["tokens"] == n_real


def test_fused_and_plain_training_reach_the_same_weights(train_tiny) -> None:
    """Three real training steps each way (label smoothing, dropout, Adam): equal up to float summation order."""
    fused = train_tiny("fused", max_steps=3, eval_every=3, fused_loss=True)
    plain = train_tiny("plain", max_steps=3, eval_every=3, fused_loss=False)
    assert_same_weights(fused, plain)
    assert any(not torch.equal(fused[n], t) for n, t in plain.items())  # two paths really ran
