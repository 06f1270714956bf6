"""Attention statistics: distance, entropy and cross-attention diagonality, on known matrices and a model."""

from __future__ import annotations

import math

import pytest
import torch

from models.transformer import Seq2SeqTransformer
from utils.config import ModelConfig
from utils.figures.attention_stats import attention_statistics, head_statistics


def test_identity_attention_is_at_distance_zero_with_no_entropy_and_fully_diagonal() -> None:
    w = torch.eye(5)[None]  # one head, each query on its own position
    s = head_statistics(w, window=0)
    assert s["distance"].item() == 0.0 and s["entropy"].item() == pytest.approx(0.0, abs=1e-9)
    assert s["diagonal"].item() == pytest.approx(5.0)  # a sum over 5 rows: a mean of 1


def test_uniform_and_shifted_attention() -> None:
    t = 4
    uniform = torch.full((1, t, t), 1.0 / t)
    s = head_statistics(uniform)
    assert s["entropy"].item() / t == pytest.approx(math.log(t))
    # mean |i - j| over a uniform 4x4 grid: (0+1+2+3 + 1+0+1+2 + 2+1+0+1 + 3+2+1+0) / 16 = 20 / 16
    assert s["distance"].item() / t == pytest.approx(20 / 16)
    previous = torch.zeros(1, t, t)  # every query on the token before it (the first on itself)
    previous[0, 0, 0] = 1.0
    for i in range(1, t):
        previous[0, i, i - 1] = 1.0
    assert head_statistics(previous)["distance"].item() / t == pytest.approx(3 / 4)


def test_cross_diagonal_follows_the_monotone_path_between_lengths() -> None:
    tq, tk = 3, 7  # path j* = 0, 3, 6
    on_path = torch.zeros(1, tq, tk)
    for i, j in enumerate((0, 3, 6)):
        on_path[0, i, j] = 1.0
    off_path = torch.zeros(1, tq, tk)
    off_path[0, :, 0] = 1.0  # everything on the first source token
    assert head_statistics(on_path, window=0)["diagonal"].item() == pytest.approx(3.0)
    assert head_statistics(off_path, window=2)["diagonal"].item() == pytest.approx(1.0)  # only row 0 is near


def test_model_statistics_have_one_value_per_layer_and_head() -> None:
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, n_heads=4, encoder_layers=2, decoder_layers=3, d_ff=64, dropout=0.0,
                      attention_pe="rope", input_pe="none")
    model = Seq2SeqTransformer(cfg, 50, 0)
    pairs = [([5, 6, 7, 8, 2], [9, 10, 11]), ([12, 13, 2], [14, 15, 16, 17, 18]), ([], [4])]
    stats = attention_statistics(model, 1, pairs, window=1)
    assert stats.sentences == 2 and stats.rows == {"encoder": 8, "decoder": 10, "cross": 10}
    assert set(stats.stats["cross"]) == {"distance", "entropy", "diagonal"}
    assert set(stats.stats["encoder"]) == {"distance", "entropy"}
    for kind, layers in (("encoder", 2), ("decoder", 3), ("cross", 3)):
        values = stats.stats[kind]["entropy"]
        assert len(values) == layers and all(len(h) == 4 for h in values)
        assert all(0.0 <= v <= math.log(5) + 1e-6 for h in values for v in h)
    # Decoder self-attention is causal: query i sees keys 0..i only, so its entropy is at most ln(i + 1) and its
    # distance at most i; over the 4 + 6 decoder rows: (ln 4! + ln 6!) / 10 nats and (6 + 15) / 10 tokens
    # (attending to all 4 or 6 tokens uniformly would give 1.63 nats).
    bound = (math.log(24) + math.log(720)) / 10
    assert all(v <= bound + 1e-9 for h in stats.stats["decoder"]["entropy"] for v in h)
    assert all(v <= 2.1 + 1e-9 for h in stats.stats["decoder"]["distance"] for v in h)
    assert len(stats.stats["decoder"]["distance"]) == 3  # one row of heads per layer
