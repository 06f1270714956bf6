"""train.compile: the compiled training forward trains the same model as eager (same seed, same dropout), for
dynamic shapes (``true``) and for static shapes (``train.static_shapes``, one graph per shape); in process, on
a d 32 model and a few hand-made batches (the compilation is what takes the time)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from conftest import assert_same_weights

from data.batching import Batch, TokenBatchSampler, collate
from data.cache import TokenizedSplit
from models.config import ModelConfig
from models.loss import linear_cross_entropy
from models.transformer import Seq2SeqTransformer
from utils.config import TrainConfig
from utils.training.setup import compiled

VOCAB, PAD, BOS, EOS = 60, 0, 1, 2
MAX_TOKENS = 120


@pytest.fixture(scope="module")
def split() -> TokenizedSplit:
    """160 pairs of 0 to 11 tokens, target lengths near the source's."""
    rng = np.random.default_rng(0)
    src = rng.integers(0, 12, 160)
    tgt = np.clip(src + rng.integers(-2, 3, 160), 0, None)
    return TokenizedSplit.from_sequences([rng.integers(3, VOCAB, n).tolist() for n in src],
                                         [rng.integers(3, VOCAB, n).tolist() for n in tgt])


def train_steps(batches: list[Batch], t: TrainConfig | None, **model: str) -> tuple[list[float], dict]:
    """AdamW steps of a d 32 model (dropout 0.1, label smoothing, the fused loss; ``model`` keys) from seed 0, one a
    batch, compiled for ``t`` (None: eager); the losses and the weights."""
    torch.manual_seed(0)
    core = Seq2SeqTransformer(ModelConfig(d_model=32, n_heads=2, encoder_layers=1, decoder_layers=1, d_ff=64,
                                          **model), VOCAB, PAD)
    model = core if t is None else compiled(core, t, torch.device("cpu"), core, shapes=1)
    optimizer = torch.optim.AdamW(core.parameters(), lr=1e-3)
    losses = []
    for batch in batches:
        model.train()
        real = batch.tgt_out != PAD
        loss = linear_cross_entropy(model(batch.src, batch.tgt_in, real, output=False), core.output_weight,
                                    batch.tgt_out[real], 0.1) / batch.n_tgt_tokens
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return losses, core.state_dict()


@pytest.mark.slow  # compiling for dynamic shapes: 45 to 85 s on 2 cores, where the static test takes 15
def test_compiled_and_eager_training_agree(split: TokenizedSplit) -> None:
    """train.compile=true (dynamic shapes), sinusoidal input positions and RoPE (graph breaks, a memo): three
    batches of three shapes, the same losses and weights as eager up to float rounding (inductor fuses and
    reorders sums)."""
    from torch._dynamo.utils import counters

    sampler = TokenBatchSampler(split.src_lengths, split.tgt_lengths, MAX_TOKENS, True, 1)
    batches = [collate(split, b.tolist(), PAD, BOS, EOS) for b in sampler.batches[::2][:3]]
    assert len({b.src.shape for b in batches}) == 3
    pes = dict(input_pe="sinusoidal", attention_pe="rope")
    eager = train_steps(batches, None, **pes)
    counters.clear()
    torch._dynamo.reset()
    compiled_run = train_steps(batches, TrainConfig(compile=True), **pes)
    assert counters["stats"]["unique_graphs"] > 0  # it really went through inductor
    np.testing.assert_allclose(compiled_run[0], eager[0], rtol=1e-5)
    assert_same_weights(compiled_run[1], eager[1])


def test_static_shapes_compiled_and_eager_training_agree(split: TokenizedSplit, caplog) -> None:
    """train.compile=reduce-overhead with static shapes on a CPU: one line says it compiles as ``true`` there (no
    CUDA graphs); then four batches of one static shape train as in eager, from one graph compiled once (a
    model without positions: no encoding's own graph breaks or memo)."""
    from torch._dynamo.utils import counters

    sampler = TokenBatchSampler(split.src_lengths, split.tgt_lengths, MAX_TOKENS, True, 1, static_shapes=True)
    shape = sampler.shapes()[0]
    batches = [collate(split, b.tolist(), PAD, BOS, EOS, shape) for b in sampler.batches
               if sampler.shape(b) == shape][-4:]
    assert all(b.src.shape == b.tgt_in.shape == shape for b in batches)
    assert len(batches) == 4 and (batches[-1].index == -1).sum() == 3  # with padding rows
    eager = train_steps(batches, None, input_pe="none")
    counters.clear()
    torch._dynamo.reset()
    with caplog.at_level(logging.INFO, logger="train"):
        compiled_run = train_steps(batches, TrainConfig(compile="reduce-overhead", static_shapes=True),
                                   input_pe="none")
    assert "train.compile=reduce-overhead: CUDA graphs need a CUDA device; on cpu it compiles as " \
           "train.compile=true" in caplog.messages
    assert counters["stats"]["unique_graphs"] == 1  # the whole padded batch in one graph, compiled once
    np.testing.assert_allclose(compiled_run[0], eager[0], rtol=1e-5)
    assert_same_weights(*(without_key_bias(w) for w in (compiled_run[1], eager[1])))


def without_key_bias(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``weights`` without the key third of the self-attention biases: without positions its gradient is zero in
    exact arithmetic (it adds the same score to every key), and Adam scales the rounding noise to full steps."""
    return {name: torch.cat(w.chunk(3)[::2]) if name.endswith("self_attn.qkv_proj.bias") else w
            for name, w in weights.items()}
