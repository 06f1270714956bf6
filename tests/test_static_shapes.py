"""train.static_shapes: batches padded to a few (rows, length) shapes, with the loss and gradients of the
unpadded batch, the same pairs in the same order, and the padding reported."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import make_tiny_config, train_tiny_run

from data.batching import Batch, BatchIterable, TokenBatchSampler, collate, static_lengths
from data.cache import TokenizedSplit, load_or_build
from models.config import ModelConfig
from models.loss import linear_cross_entropy
from models.transformer import Seq2SeqTransformer
from utils.config import ConfigError, from_dict, load_config
from utils.run.layout import RunDir
from utils.training.evaluation import token_loss
from utils.training.setup import WholeBatchForward, build_setup, compile_mode, prepare

ROOT = Path(__file__).resolve().parents[1]
PAD, BOS, EOS = 0, 1, 2


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[TokenizedSplit, int]:
    """The demo corpus's training split under the tiny config's tokenizer (vocabulary 400), and its
    data.max_tokens (300)."""
    cfg = make_tiny_config(tmp_path_factory.mktemp("static"))
    corpus, tokenizer = prepare(cfg)
    assert (tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id) == (PAD, BOS, EOS)
    return load_or_build(cfg, tokenizer, lambda: corpus, ["train"])["train"], cfg.data.max_tokens


def epoch(split: TokenizedSplit, max_tokens: int, e: int = 0, **kw) -> list[Batch]:
    sampler = TokenBatchSampler(split.src_lengths, split.tgt_lengths, max_tokens, True, 1, **kw)
    batches = BatchIterable(split, sampler, PAD, BOS, EOS)
    batches.set_epoch(e)
    return list(batches)


def test_lengths_three_steps_per_doubling_up_to_the_widest_pair() -> None:
    assert static_lengths(129) == [8, 10, 13, 16, 20, 25, 32, 40, 51, 64, 81, 102, 129]
    assert static_lengths(65) == [8, 10, 13, 16, 20, 25, 32, 40, 51, 65]  # 64 is within 1/8 of 65: dropped
    assert static_lengths(17) == [8, 10, 13, 17]
    assert static_lengths(9) == [9]


def test_an_epoch_of_the_demo_data_takes_a_few_shapes(demo: tuple[TokenizedSplit, int]) -> None:
    """Every pair once, each batch padded to (max_tokens // L, L) for one of the few lengths L, never more than
    max_tokens positions; the real rows hold exactly what the unpadded batch of the same pairs holds."""
    split, max_tokens = demo
    plain, static = epoch(split, max_tokens), epoch(split, max_tokens, static_shapes=True)
    widest = int(max(split.src_lengths.max(), split.tgt_lengths.max())) + 1
    lengths = static_lengths(widest)
    shapes = {b.src.shape for b in static}
    assert len({(b.src.shape, b.tgt_in.shape) for b in plain}) >= 3 * len(shapes)  # the point: far fewer shapes
    assert len(shapes) <= 5 and len(shapes) <= len(lengths)  # 25 shapes unpadded
    assert shapes == {(max_tokens // n, n) for n in {s[1] for s in shapes}} and {s[1] for s in shapes} <= set(lengths)
    indices = np.concatenate([b.index[b.index >= 0].numpy() for b in static])
    assert sorted(indices) == sorted(split.index)  # every pair exactly once
    for b in static:
        assert b.src.shape == b.tgt_in.shape == b.tgt_out.shape and b.src.numel() <= max_tokens
        rows = int((b.index >= 0).sum())
        assert (b.index[:rows] >= 0).all()
        unpadded = collate(split, b.index[:rows].tolist(), PAD, BOS, EOS)  # (index = position here)
        s, t = unpadded.src.shape[1], unpadded.tgt_in.shape[1]
        assert torch.equal(b.src[:rows, :s], unpadded.src) and (b.src[:rows, s:] == PAD).all()
        assert torch.equal(b.tgt_in[:rows, :t], unpadded.tgt_in) and (b.tgt_in[:rows, t:] == PAD).all()
        assert torch.equal(b.tgt_out[:rows, :t], unpadded.tgt_out) and (b.tgt_out[:rows, t:] == PAD).all()
        # padding rows: source eos, target bos, then padding; no target token (no loss)
        assert (b.src[rows:, 0] == EOS).all() and (b.tgt_in[rows:, 0] == BOS).all()
        assert (b.src[rows:, 1:] == PAD).all() and (b.tgt_in[rows:, 1:] == PAD).all()
        assert (b.tgt_out[rows:] == PAD).all()
        assert b.n_tgt_tokens == unpadded.n_tgt_tokens == int((b.tgt_out != PAD).sum())
        assert b.n_padding == b.n_positions - int((unpadded.src != PAD).sum()) - b.n_tgt_tokens
    assert sum(b.n_tgt_tokens for b in static) == sum(b.n_tgt_tokens for b in plain)


def test_static_batches_repeat_shard_and_resume(demo: tuple[TokenizedSplit, int]) -> None:
    """A seed gives the same padded batches again; two ranks split them without overlap; a resumed epoch skips."""
    split, max_tokens = demo
    once, again = epoch(split, max_tokens, 3, static_shapes=True), epoch(split, max_tokens, 3, static_shapes=True)
    assert len(once) == len(again) and all(torch.equal(a.src, b.src) and torch.equal(a.tgt_out, b.tgt_out)
                                           for a, b in zip(once, again, strict=True))
    ranks = [epoch(split, max_tokens, 3, static_shapes=True, rank=r, world_size=2) for r in range(2)]
    assert [b.src.shape for b in ranks[0]] == [b.src.shape for b in once[0::2][:len(ranks[0])]]
    seen = [{int(i) for b in part for i in b.index if i >= 0} for part in ranks]
    assert seen[0] and seen[1] and not seen[0] & seen[1]
    sampler = TokenBatchSampler(split.src_lengths, split.tgt_lengths, max_tokens, True, 1, static_shapes=True)
    resumed = BatchIterable(split, sampler, PAD, BOS, EOS)
    resumed.set_epoch(3, skip=2)
    assert [b.index.tolist() for b in resumed] == [b.index.tolist() for b in once[2:]]


@pytest.mark.parametrize("fused", [True, False])
def test_padded_batch_gives_the_unpadded_loss_and_gradients(fused: bool) -> None:
    """A batch padded with 3 padding rows and 6 more columns: the training loss (label smoothing, fp32, sinusoidal
    input positions and RoPE) and every gradient as unpadded, to float rounding."""
    rng = np.random.default_rng(0)
    split = TokenizedSplit.from_sequences([rng.integers(3, 50, n).tolist() for n in (5, 9, 0, 7)],
                                          [rng.integers(3, 50, n).tolist() for n in (6, 3, 4, 10)])
    torch.manual_seed(0)
    model = Seq2SeqTransformer(ModelConfig(d_model=32, n_heads=2, encoder_layers=2, decoder_layers=2, d_ff=64,
                                           dropout=0.0, attention_pe="rope"), 50, PAD)
    model.train()

    def loss_and_grads(batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        real = batch.tgt_out != PAD
        out = model(batch.src, batch.tgt_in, real, output=not fused)
        target = batch.tgt_out[real]
        loss = (linear_cross_entropy(out, model.output_weight, target, 0.1) if fused
                else token_loss(out, target, PAD, 0.1)) / batch.n_tgt_tokens
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    unpadded = collate(split, [0, 1, 2, 3], PAD, BOS, EOS)
    padded = collate(split, [0, 1, 2, 3], PAD, BOS, EOS, (7, 17))
    assert (unpadded.src.shape, unpadded.tgt_in.shape) == ((4, 10), (4, 11))
    assert padded.src.shape == padded.tgt_in.shape == (7, 17)
    loss, grads = loss_and_grads(unpadded)
    padded_loss, padded_grads = loss_and_grads(padded)
    torch.testing.assert_close(padded_loss, loss, rtol=1e-6, atol=0)
    assert grads.keys() == padded_grads.keys() and len(grads) > 20
    for name, grad in grads.items():
        torch.testing.assert_close(padded_grads[name], grad, rtol=1e-5, atol=1e-7, msg=name)


def test_reduce_overhead_needs_static_shapes() -> None:
    raw = make_tiny_config(Path("unused")).to_dict()
    with pytest.raises(ConfigError) as e:
        from_dict(raw, ["train.compile=reduce-overhead"])
    assert str(e.value) == ("train.compile: reduce-overhead (CUDA graphs) needs train.static_shapes=true: a graph is "
                            "recorded per batch shape")
    cfg = from_dict(raw, ["train.compile=reduce-overhead", "train.static_shapes=true"]).train
    assert compile_mode(cfg, torch.device("cuda")) == ("reduce-overhead", False)
    assert compile_mode(cfg, torch.device("cpu")) == (None, False)  # no CUDA graphs on a CPU: as compile=true
    assert compile_mode(from_dict(raw, ["train.compile=true"]).train, torch.device("cpu")) == (None, True)


def test_recorded_configs_resolve_as_recorded() -> None:
    """A run recorded before these keys existed (compile: false) and the shipped configs load as they were."""
    legacy = load_config(ROOT / "tests" / "data" / "legacy_run" / "config.yaml").train
    assert (legacy.compile, legacy.static_shapes) == (False, False)
    for name in ("demo", "bench_small", "bench_short_rope", "iwslt2017"):
        t = load_config(ROOT / "configs" / f"{name}.yaml").train
        assert (t.compile, t.static_shapes) == (False, False)
    raw = make_tiny_config(Path("unused")).to_dict()
    raw["train"]["compile"] = True
    assert from_dict(raw).train.compile is True


def test_a_static_run_reports_its_shapes_and_padding(tmp_path: Path, caplog) -> None:
    """A static-shapes run on the demo corpus (4 steps) logs its shapes and, every log_every steps, the padding
    of the window; summary.json holds the run's share; with train.compile its forward is compiled over the whole
    padded batch (not run here: compiling is lazy)."""
    with caplog.at_level(logging.INFO, logger="train"):
        run = train_tiny_run(tmp_path, ["train.static_shapes=true"], max_steps=4, eval_every=4, log_every=2,
                             valid_bleu_sentences=2, log_attention_every=0)
    messages = [r.getMessage() for r in caplog.records]
    [shapes] = [m for m in messages if m.startswith("static shapes: ")]
    progress = [m for m in messages if "target tokens/s | padding " in m]
    assert len(progress) == 2 and all(m.endswith(" %") for m in progress)
    summary = json.loads(RunDir(run).summary_json.read_text())
    assert 0 < summary["padding"] < 0.6
    windows = [float(m.rsplit("padding ", 1)[1].rstrip(" %")) for m in progress]
    assert min(windows) - 0.1 <= 100 * summary["padding"] <= max(windows) + 0.1  # the run's: between its windows
    cfg = from_dict(make_tiny_config(tmp_path, num_threads=1).to_dict(),
                    ["train.static_shapes=true", "train.compile=true"])
    threads = torch.get_num_threads()
    try:
        with caplog.at_level(logging.INFO, logger="train"):
            setup = build_setup(cfg, tmp_path / "setup")
    finally:
        torch.set_num_threads(threads)
    assert isinstance(setup.model, WholeBatchForward)
    count = len(setup.train_data.sampler.shapes())
    assert shapes.startswith(f"static shapes: {count} (rows x length): ")
    assert f"train.compile: the training forward compiles once per static shape (inductor, {count} shapes)" in \
        [r.getMessage() for r in caplog.records]
