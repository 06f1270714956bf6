"""RoPE length extension: linear, NTK-aware and YaRN scaling (settable at inference)."""

from __future__ import annotations

import math

import pytest
import torch

from models.positional.rotary import RotaryPE, rope_inv_freq, scaled_inv_freq
from models.transformer import Seq2SeqTransformer
from utils.config import ModelConfig, RopeConfig
from utils.run.load import check_compatible

DIM = 64


@pytest.mark.parametrize("scaling", ["none", "linear", "ntk", "yarn"])
def test_every_scaling_is_plain_rope_at_factor_one(scaling: str) -> None:
    inv, scale = scaled_inv_freq(RopeConfig(scaling=scaling, factor=1.0), DIM)
    torch.testing.assert_close(inv, rope_inv_freq(DIM, 10000.0))
    assert scale == 1.0


def test_linear_interpolates_positions() -> None:
    cfg = ModelConfig(d_model=DIM, n_heads=1, attention_pe="rope", rope=RopeConfig(scaling="linear", factor=4.0))
    plain = RotaryPE(ModelConfig(d_model=DIM, n_heads=1, attention_pe="rope"), "encoder")
    scaled = RotaryPE(cfg, "encoder")
    pos = torch.arange(0, 40, 4)
    cos_s, sin_s = scaled.angles(pos)
    cos_p, sin_p = plain.angles(pos // 4)  # position m under factor 4 is position m/4 unscaled
    torch.testing.assert_close(cos_s, cos_p)
    torch.testing.assert_close(sin_s, sin_p)


def test_ntk_scales_the_base() -> None:
    s = 8.0
    inv, _ = scaled_inv_freq(RopeConfig(scaling="ntk", factor=s), DIM)
    torch.testing.assert_close(inv, rope_inv_freq(DIM, 10000.0 * s ** (DIM / (DIM - 2))))
    assert inv[0] == 1.0  # the highest frequency is unchanged
    torch.testing.assert_close(inv[-1], rope_inv_freq(DIM, 10000.0)[-1] / s, rtol=1e-2, atol=0)  # lowest ~ interpolated


def test_yarn_keeps_high_frequencies_and_interpolates_low_ones() -> None:
    cfg = RopeConfig(scaling="yarn", factor=4.0, original_max_len=2048, beta_fast=32.0, beta_slow=1.0)
    inv, scale = scaled_inv_freq(cfg, DIM)
    plain = rope_inv_freq(DIM, 10000.0)
    rotations = 2048 * plain / (2 * math.pi)
    high, low = rotations > 32, rotations < 1
    assert high.any() and low.any()
    torch.testing.assert_close(inv[high], plain[high])  # unchanged
    torch.testing.assert_close(inv[low], plain[low] / 4)  # fully interpolated
    mid = ~high & ~low
    assert torch.all(inv[mid] < plain[mid]) and torch.all(inv[mid] > plain[mid] / 4)  # ramp in between
    assert scale == pytest.approx(0.1 * math.log(4.0) + 1)


def test_yarn_temperature_scales_scores_and_keeps_them_relative() -> None:
    cfg = ModelConfig(d_model=DIM, n_heads=1, attention_pe="rope", rope=RopeConfig(scaling="yarn", factor=4.0))
    rope = RotaryPE(cfg, "encoder")
    q = torch.randn(1, 1, 1, DIM).expand(1, 1, 8, DIM)
    k = torch.randn(1, 1, 1, DIM).expand(1, 1, 8, DIM)
    pos = torch.arange(8)
    rq, rk = rope.rotate(q, k, pos, pos)
    scores = (rq @ rk.transpose(-1, -2))[0, 0]
    for shift in range(-7, 8):
        d = torch.diagonal(scores, shift)
        torch.testing.assert_close(d, d[0].expand_as(d), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(rq.norm(dim=-1), q.norm(dim=-1) * rope.scale)


def test_scaling_is_settable_at_inference_without_retraining() -> None:
    from utils.config import Config

    trained = Config(model=ModelConfig(d_model=32, n_heads=2, attention_pe="rope"))
    at_inference = Config(model=ModelConfig(d_model=32, n_heads=2, attention_pe="rope",
                                            rope=RopeConfig(scaling="yarn", factor=4.0, original_max_len=16)))
    check_compatible(trained, at_inference, "test")  # no error: no parameter changes
    torch.manual_seed(0)
    model = Seq2SeqTransformer(trained.model, 30, 0)
    scaled = Seq2SeqTransformer(at_inference.model, 30, 0)
    scaled.load_state_dict(model.state_dict())
    src = torch.randint(3, 30, (1, 40))
    assert not torch.allclose(model.eval().encode(src)[0], scaled.eval().encode(src)[0])


@pytest.mark.parametrize("dim,length,factor,fast,slow", [(64, 2048, 4.0, 32.0, 1.0), (32, 128, 8.0, 32.0, 1.0),
                                                          (128, 4096, 16.0, 16.0, 2.0)])
def test_yarn_matches_the_reference_implementation(dim: int, length: int, factor: float, fast: float,
                                                    slow: float) -> None:
    """The YaRN authors' code (also Hugging Face's ``_compute_yarn_parameters``): correction range in pair
    index, floored and ceiled, a linear ramp over the pair index, mscale 0.1 ln s + 1."""
    base = 10000.0

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(length / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low = max(math.floor(correction_dim(fast)), 0)
    high = min(math.ceil(correction_dim(slow)), dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low), 0, 1)
    extrapolation_factor = 1 - ramp
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    expected = (1.0 / (factor * pos_freqs)) * (1 - extrapolation_factor) + (1.0 / pos_freqs) * extrapolation_factor
    cfg = RopeConfig(scaling="yarn", factor=factor, original_max_len=length, beta_fast=fast, beta_slow=slow)
    inv, scale = scaled_inv_freq(cfg, dim)
    torch.testing.assert_close(inv, expected, rtol=1e-12, atol=0)
    assert scale == pytest.approx(0.1 * math.log(factor) + 1.0)
