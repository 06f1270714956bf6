"""Attention-level encodings ALiBi, T5 bias, Shaw et al., KERPLE, Sandwich, FIRE, DPB and CoPE: the maths, against
hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from models.attention import MultiHeadAttention, build_mask
from models.positional import build_attention_pe
from models.positional.alibi import ALiBiPE, alibi_slopes
from models.positional.cope import CopeConfig, CopePE
from models.positional.dpb import DpbConfig, DpbPE
from models.positional.fire import FireConfig, FirePE
from models.positional.kerple import EPS, KerpleLogPE, KerplePowerPE
from models.positional.sandwich import SandwichConfig, SandwichPE
from models.positional.shaw import ShawPE
from models.positional.t5 import T5BiasPE, relative_position_bucket
from utils.config import ConfigError, ModelConfig, ShawConfig, T5BiasConfig, from_dict


def cfg(**kw) -> ModelConfig:
    base = dict(d_model=32, n_heads=4, encoder_layers=1, decoder_layers=1, d_ff=64, dropout=0.0)
    return ModelConfig(**{**base, **kw})


# ALiBi ---------------------------------------------------------------------------------------------------------------


def test_alibi_slopes_match_the_paper() -> None:
    assert alibi_slopes(4) == pytest.approx([1 / 4, 1 / 16, 1 / 64, 1 / 256])
    assert alibi_slopes(8) == pytest.approx([1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 32, 1 / 64, 1 / 128, 1 / 256])
    # 12 heads: the 8 slopes for 8 heads, then every other slope for 16 heads (2^-0.5, 2^-1.5, ...), first 4.
    r = 2**-0.5
    expected_12 = [1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 32, 1 / 64, 1 / 128, 1 / 256, r, r / 2, r / 4, r / 8]
    assert alibi_slopes(12) == pytest.approx(expected_12)


def test_alibi_bias_symmetric_in_encoder_and_causal_in_decoder() -> None:
    pos = torch.arange(6)
    m = torch.tensor([1 / 4, 1 / 16, 1 / 64, 1 / 256])
    i, j = pos[:, None], pos[None, :]
    for kind in ("encoder", "cross"):
        b = ALiBiPE(cfg(), kind).bias(pos, pos)
        assert b.shape == (1, 4, 6, 6)
        torch.testing.assert_close(b, b.transpose(-1, -2))
        torch.testing.assert_close(b[0], -m[:, None, None] * (i - j).abs().float())
    b = ALiBiPE(cfg(), "decoder").bias(pos, pos)[0]
    lower = (j <= i).expand(4, -1, -1)
    expected = -m[:, None, None] * (i - j).float()
    torch.testing.assert_close(b[lower], expected[lower])
    assert b[0, 5, 0] == -5 / 4 and b[3, 2, 2] == 0
    # An incremental step (query 5 against keys 0..5) is the last row of the full bias.
    torch.testing.assert_close(ALiBiPE(cfg(), "decoder").bias(torch.tensor([5]), pos)[0], b[:, 5:6])


def test_alibi_has_no_parameters() -> None:
    assert list(ALiBiPE(cfg(), "encoder").parameters()) == []


# T5 ------------------------------------------------------------------------------------------------------------------

T5_RELATIVE = [0, 1, -1, 7, 8, -8, 15, 16, 20, 50, 127, 128, 500, -500, -15, -16, -20, -32, -50, -64, -100, -127, -128]
# Bidirectional, 32 buckets: 16 per direction (+16 when j > i), exact below 8, then 8 + floor(2 log2(n / 8)), max 15.
T5_BIDIRECTIONAL = [0, 17, 1, 23, 24, 8, 25, 26, 26, 29, 31, 31, 31, 15, 9, 10, 10, 12, 13, 14, 15, 15, 15]
# Unidirectional, 32 buckets for n = max(i - j, 0): exact below 16, then 16 + floor(16/3 log2(n / 16)), max 31.
T5_UNIDIRECTIONAL = [0, 0, 1, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 31, 15, 16, 17, 21, 24, 26, 30, 31, 31]


def test_t5_buckets_match_hand_computed_values() -> None:
    rel = torch.tensor(T5_RELATIVE)
    assert relative_position_bucket(rel, True, 32, 128).tolist() == T5_BIDIRECTIONAL
    assert relative_position_bucket(rel, False, 32, 128).tolist() == T5_UNIDIRECTIONAL


def test_t5_bias_reads_the_table_by_bucket() -> None:
    c = cfg(t5=T5BiasConfig(num_buckets=32, max_distance=128))
    q_pos, k_pos = torch.tensor([0, 3, 140]), torch.arange(150)
    for kind, expected in (("encoder", T5_BIDIRECTIONAL), ("cross", T5_BIDIRECTIONAL), ("decoder", T5_UNIDIRECTIONAL)):
        pe = T5BiasPE(c, kind)
        b = pe.bias(q_pos, k_pos)
        assert b.shape == (1, 4, 3, 150)
        for rel, bucket in zip(T5_RELATIVE, expected, strict=True):
            for qi, i in enumerate(q_pos.tolist()):
                if 0 <= i + rel < 150:
                    torch.testing.assert_close(b[0, :, qi, i + rel], pe.rel_embed.weight[bucket])


# Shaw ----------------------------------------------------------------------------------------------------------------


def shaw_reference_bias(pe: ShawPE, q: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """Eq. 5's a^K term, literally: q_i . a_ij^K / sqrt(Dh), a_ij^K = w^K[clip(j - i, -k, k)]."""
    k = pe.max_distance
    rel = (k_pos[None, :] - q_pos[:, None]).clamp(-k, k) + k
    return torch.einsum("bhqd,qkd->bhqk", q, pe.key_embed.weight[rel]) / math.sqrt(pe.head_dim)


def test_shaw_bias_and_values_equal_the_paper_einsums() -> None:
    pe = ShawPE(cfg(shaw=ShawConfig(max_distance=3, values=True)), "encoder")
    torch.manual_seed(0)
    q = torch.randn(2, 4, 5, 8)
    q_pos, k_pos = torch.arange(2, 7), torch.arange(9)
    torch.testing.assert_close(pe.bias(q_pos, k_pos, q), shaw_reference_bias(pe, q, q_pos, k_pos))
    w = torch.randn(2, 4, 5, 9).softmax(-1)
    rel = (k_pos[None, :] - q_pos[:, None]).clamp(-3, 3) + 3
    expected = torch.einsum("bhqk,qkd->bhqd", w, pe.value_embed.weight[rel])
    torch.testing.assert_close(pe.values(w, q_pos, k_pos), expected)


def test_shaw_clips_distances_beyond_k() -> None:
    pe = ShawPE(cfg(shaw=ShawConfig(max_distance=2)), "encoder")
    idx = pe.relative_index(torch.tensor([5]), torch.arange(11))[0]
    assert idx.tolist() == [0, 0, 0, 0, 1, 2, 3, 4, 4, 4, 4]  # j - i = -5 .. 5
    q = torch.randn(1, 4, 1, 8)
    b = pe.bias(torch.tensor([5]), torch.arange(11), q)[0, :, 0]
    for far in (0, 1, 2):  # j - i <= -2 share w^K[-2]; j - i >= 2 share w^K[2]
        torch.testing.assert_close(b[:, far], b[:, 3])
        torch.testing.assert_close(b[:, 10 - far], b[:, 7])
    assert not torch.allclose(b[:, 3], b[:, 4])


def test_shaw_values_flag() -> None:
    off = ShawPE(cfg(shaw=ShawConfig(values=False)), "encoder")
    on = ShawPE(cfg(shaw=ShawConfig(values=True)), "encoder")
    pos = torch.arange(2)
    assert not off.needs_explicit and off.value_embed is None and off.values(torch.ones(1, 4, 2, 2), pos, pos) is None
    assert on.needs_explicit and not ShawPE.needs_explicit  # the instance, not the class
    assert sum(p.numel() for p in on.parameters()) == 2 * sum(p.numel() for p in off.parameters())


def test_shaw_values_use_the_explicit_path_and_change_the_output() -> None:
    outs = {}
    x = torch.randn(2, 5, 32)
    for values in (False, True):
        torch.manual_seed(0)  # same projections and w^K (built before w^V)
        attn = MultiHeadAttention(cfg(attention_pe="shaw", shaw=ShawConfig(values=values)), "encoder").eval()
        assert attn.pe.needs_explicit == values
        out, weights = attn(x, q_pos=torch.arange(5))
        assert (weights is not None) == values  # only the explicit path returns weights
        outs[values] = out
        if values:
            with torch.no_grad():
                attn.pe.value_embed.weight.zero_()  # a^V = 0 gives back the keys-only layer
            torch.testing.assert_close(attn(x, q_pos=torch.arange(5))[0], outs[False])
    assert (outs[True] - outs[False]).abs().max() > 1e-4


# FIRE ----------------------------------------------------------------------------------------------------------------


def fire_reference_bias(pe: FirePE, q_pos: list[int], k_pos: list[int]) -> torch.Tensor:
    """Li et al. 2024's FIRE bias, written out pair by pair and head by head in float64 with the module's own weights:
    b_h(i, j) = f_h(psi(i - j) / psi(max(L, i))), psi(x) = log(c x + 1), f(x) = W2 relu(W1 x + b1) + b2, and eps
    added to the normaliser as in the reference listing. Keys after the query (j > i, bidirectional kinds only) take
    the second MLP on the distance |i - j|."""
    c = abs(pe.c.item())
    threshold = abs(pe.threshold_scale.item()) * pe.init_threshold
    n_heads = pe.cfg.n_heads
    out = torch.zeros(n_heads, len(q_pos), len(k_pos), dtype=torch.float64)
    for qi, i in enumerate(q_pos):
        for kj, j in enumerate(k_pos):
            mlp = pe.mlp_ahead if j > i and pe.mlp_ahead is not None else pe.mlp
            w1, b1 = mlp[0].weight[:, 0].tolist(), mlp[0].bias.tolist()
            w2, b2 = mlp[2].weight.tolist(), mlp[2].bias.tolist()
            x = math.log(c * abs(i - j) + 1) / (math.log(c * max(threshold, i) + 1) + 1e-6)
            hidden = [max(0.0, w * x + b) for w, b in zip(w1, b1, strict=True)]
            for h in range(n_heads):
                out[h, qi, kj] = sum(w * a for w, a in zip(w2[h], hidden, strict=True)) + b2[h]
    return out[None]


@pytest.mark.parametrize("kind", ["encoder", "decoder", "cross"])
def test_fire_bias_equals_the_papers_formula(kind: str) -> None:
    torch.manual_seed(0)
    pe = FirePE(cfg(fire=FireConfig(mlp_width=8, init_threshold=6.0)), kind)
    with torch.no_grad():  # away from the initial values; L = |-1.5| * 6 = 9, so query positions fall on both sides
        pe.c.fill_(0.7)
        pe.threshold_scale.fill_(-1.5)
    q_pos, k_pos = (list(range(2, 15)), list(range(18))) if kind == "cross" else (list(range(16)), list(range(16)))
    b = pe.bias(torch.tensor(q_pos), torch.tensor(k_pos))
    assert b.shape == (1, 4, len(q_pos), len(k_pos)) and torch.isfinite(b).all()
    expected = fire_reference_bias(pe, q_pos, k_pos)
    if kind == "decoder":  # the paper's causal setting: keys after the query are masked
        seen = (torch.tensor(k_pos)[None, :] <= torch.tensor(q_pos)[:, None]).expand(4, -1, -1)
        torch.testing.assert_close(b[0][seen].double(), expected[0][seen], atol=1e-5, rtol=1e-5)
        assert pe.mlp_ahead is None
    else:
        torch.testing.assert_close(b.double(), expected, atol=1e-5, rtol=1e-5)
    if kind != "decoder":  # one MLP per direction: below L the bias is a function of |i - j| per direction, and
        below = pe.bias(torch.arange(9), torch.arange(9))  # j before i differs from j after i (unlike ALiBi's)
        assert pe.mlp_ahead is not None and (below - below.transpose(-1, -2)).abs().max() > 1e-2


@pytest.mark.parametrize("kind", ["decoder", "cross"])
def test_fire_cached_step_is_its_row_of_the_full_bias(kind: str) -> None:
    """A KV-cached step passes its true offset t as the query position: it gets row t of the full bias, also past L
    (the normaliser psi(max(L, t)) reads the offset, not the step's length of 1)."""
    torch.manual_seed(0)
    pe = FirePE(cfg(fire=FireConfig(init_threshold=3.0)), kind)
    src = torch.arange(10)
    full = pe.bias(torch.arange(12), torch.arange(12) if kind == "decoder" else src)
    for t in range(12):
        keys = torch.arange(t + 1) if kind == "decoder" else src
        torch.testing.assert_close(pe.bias(torch.tensor([t]), keys), full[:, :, t : t + 1, : len(keys)])


@pytest.mark.parametrize("kind", ["encoder", "decoder", "cross"])
def test_fire_is_shift_invariant_below_its_threshold_and_interpolates_past_it(kind: str) -> None:
    """What FIRE is invariant to. While every query position is at most L the normaliser is the constant psi(L), so the
    bias depends on i - j alone (T5-like, shift-invariant). Past L it is not shift-invariant, but progressive
    interpolation makes it invariant to the length in another way: a query at any i >= L puts input 0 on itself and
    input ~1 on the first position (psi(i) / psi(i)), so b(i, i) and b(i, 0) are the same at every such i, and the
    decoder's MLP only ever sees inputs in [0, 1]."""
    torch.manual_seed(0)
    pe = FirePE(cfg(fire=FireConfig(init_threshold=64.0)), kind)
    q_pos, k_pos = torch.arange(6), torch.arange(9)
    base = pe.bias(q_pos, k_pos)
    for shift in (1, 20, 58):  # the last query position, 5 + 58 = 63, stays below L = 64
        torch.testing.assert_close(pe.bias(q_pos + shift, k_pos + shift), base)
    assert (pe.bias(q_pos + 300, k_pos + 300) - base).abs().max() > 1e-4
    far = torch.tensor([64, 100, 1000, 100_000])
    first = torch.cat([pe.bias(i[None], torch.tensor([0, int(i)])) for i in far], dim=2)[0]  # [H, 4, 2]
    torch.testing.assert_close(first, first[:, :1].expand_as(first), atol=1e-4, rtol=1e-4)
    if kind == "decoder":
        pos = torch.arange(0, 5000, 7)
        x = pe.normalized_distance(pos, pos)
        causal = pos[None, :] <= pos[:, None]
        assert x[causal].min() == 0 and x[causal].max() <= 1


# DPB -----------------------------------------------------------------------------------------------------------------


def dpb_reference_bias(pe: DpbPE, n: int, log_distance: bool, norm: bool) -> torch.Tensor:
    """x-transformers' ``DynamicPositionBias.forward(n, n)`` written out in float64 with the module's own weights: the
    MLP on the 2n - 1 inputs -(n-1) .. n-1 (sign(x) log(|x| + 1) if ``log_distance``), each block x -> W x + b,
    LayerNorm (biased variance, eps 1e-5, its weight and bias) if ``norm``, then SiLU = x sigmoid(x); a last W x + b
    per head; then the [n, n] grid indexed by (i - j) + (n - 1). -> ``[1, H, n, n]``."""
    linears = [m for m in pe.mlp if isinstance(m, torch.nn.Linear)]
    norms = [m for m in pe.mlp if isinstance(m, torch.nn.LayerNorm)]
    assert len(norms) == (len(linears) - 1 if norm else 0)
    x = torch.arange(-n + 1, n, dtype=torch.float64)[:, None]
    if log_distance:
        x = torch.sign(x) * torch.log(x.abs() + 1)
    for k, lin in enumerate(linears):
        x = x @ lin.weight.detach().double().T + lin.bias.detach().double()
        if k == len(linears) - 1:
            break
        if norm:
            ln = norms[k]
            mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
            x = (x - mean) / torch.sqrt(var + 1e-5) * ln.weight.detach().double() + ln.bias.detach().double()
        x = x * torch.sigmoid(x)
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    return x[i - j + n - 1].permute(2, 0, 1)[None]


@pytest.mark.parametrize(("log_distance", "norm", "depth"), [(False, False, 2), (True, False, 2), (False, True, 3),
                                                             (True, True, 1)])
@pytest.mark.parametrize("kind", ["encoder", "decoder", "cross"])
def test_dpb_bias_equals_x_transformers_dynamic_position_bias(kind: str, log_distance: bool, norm: bool,
                                                               depth: int) -> None:
    torch.manual_seed(0)
    pe = DpbPE(cfg(dpb=DpbConfig(mlp_width=8, depth=depth, log_distance=log_distance, norm=norm)), kind)
    if norm:  # away from LayerNorm's initial weight 1 and bias 0
        with torch.no_grad():
            for m in pe.mlp:
                if isinstance(m, torch.nn.LayerNorm):
                    m.weight.uniform_(0.5, 1.5)
                    m.bias.uniform_(-0.5, 0.5)
    assert sum(isinstance(m, torch.nn.Linear) for m in pe.mlp) == depth + 1
    b = pe.bias(torch.arange(12), torch.arange(12))
    assert b.shape == (1, 4, 12, 12) and b.dtype == torch.float32
    torch.testing.assert_close(b.double(), dpb_reference_bias(pe, 12, log_distance, norm), atol=1e-5, rtol=1e-5)
    # one MLP of the signed distance: j before i differs from j after i, so the bias is not symmetric
    assert (b - b.transpose(-1, -2)).abs().max() > 1e-3


@pytest.mark.parametrize(("depth", "norm"), [(2, False), (3, True)])
def test_dpb_parameter_count_is_readmes(depth: int, norm: bool) -> None:
    """README: 2w + (depth - 1)(w^2 + w) + (w + 1) heads per layer, + 2w depth with LayerNorm; w = d_model // 4."""
    pe = DpbPE(cfg(d_model=512, n_heads=8, dpb=DpbConfig(depth=depth, norm=norm)), "encoder")
    w, count = 128, sum(p.numel() for p in pe.parameters())
    assert count == 2 * w + (depth - 1) * (w * w + w) + (w + 1) * 8 + 2 * w * depth * norm
    assert (depth, norm) != (2, False) or count == 17_800


@pytest.mark.parametrize("kind", ["decoder", "cross"])
def test_dpb_offsets_cached_steps_and_real_positions_read_the_same_function(kind: str) -> None:
    """The bias is g(i - j) wherever i and j are: a cached step at offset t gets row t of the full bias; target
    positions 3..10 against source positions 0..14 (cross-attention) read the full square's entries; CAPE's float64
    positions (every pair through the MLP) give what the integer path (once per distance, then indexed) gives."""
    torch.manual_seed(0)
    pe = DpbPE(cfg(dpb=DpbConfig(log_distance=True)), kind)
    assert pe.mlp[0].out_features == 32 // 4  # mlp_width null: d_model // 4, as x-transformers' dim // 4
    full = pe.bias(torch.arange(15), torch.arange(15))
    for t in range(15):
        keys = torch.arange(t + 1) if kind == "decoder" else torch.arange(15)
        torch.testing.assert_close(pe.bias(torch.tensor([t]), keys), full[:, :, t : t + 1, : len(keys)])
    torch.testing.assert_close(pe.bias(torch.arange(3, 11), torch.arange(15)), full[:, :, 3:11, :])
    real = pe.bias(torch.arange(3, 11).double(), torch.arange(15).double())
    torch.testing.assert_close(real, full[:, :, 3:11, :], atol=1e-6, rtol=1e-6)
    half = pe.bias(torch.tensor([2.5], dtype=torch.float64), torch.tensor([0.0, 2.5], dtype=torch.float64))
    torch.testing.assert_close(half[..., 0, 1], full[..., 0, 0])  # distance 0, at a real position
    assert not torch.allclose(half[..., 0, 0], full[..., 2, 0]) and not torch.allclose(half[..., 0, 0], full[..., 3, 0])


def test_dpb_initial_tilt_is_readmes() -> None:
    """README: untrained, the raw distance's bias spans 4.1 nats per head across 40 tokens on average (0.9 to 11.7;
    d_model 256, 4 heads, seeds 0-4), the log input's 0.35."""
    for log, (low, mean, high) in [(False, (0.9, 4.1, 11.7)), (True, (0.085, 0.35, 0.87))]:
        spans = []
        for seed in range(5):
            torch.manual_seed(seed)
            pe = DpbPE(cfg(d_model=256, dpb=DpbConfig(log_distance=log)), "encoder")
            b = pe.bias(torch.arange(40), torch.arange(40))[0]
            spans += (b.amax((1, 2)) - b.amin((1, 2))).tolist()
        assert (min(spans), sum(spans) / len(spans), max(spans)) == pytest.approx((low, mean, high), abs=0.05)


@pytest.mark.parametrize("name", ["fire", "dpb"])
def test_mlp_biases_stay_float32_under_bf16_autocast(name: str) -> None:
    """FIRE's and DPB's MLPs run in float32 with autocast off (as ``train.amp=bf16`` trains): the same bias as
    without autocast. In bf16 DPB's raw distance would round past 256, giving 256 and 257 one bias."""
    torch.manual_seed(0)
    pe = build_attention_pe(cfg(d_model=64, attention_pe=name), "encoder")
    q_pos, k_pos = torch.arange(300, 302), torch.arange(0, 45)
    plain = pe.bias(q_pos, k_pos)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = pe.bias(q_pos, k_pos)
    assert mixed.dtype == torch.float32
    torch.testing.assert_close(mixed, plain, atol=0, rtol=0)
    if name == "dpb":  # distances 256 and 257 (query 300 against keys 44 and 43)
        assert (mixed[0, :, 0, 44] - mixed[0, :, 0, 43]).abs().max() > 0


# Several at once ------------------------------------------------------------------------------------------------------


# KERPLE --------------------------------------------------------------------------------------------------------------

KERPLE = {"kerple_log": KerpleLogPE, "kerple_power": KerplePowerPE}


def kerple_kernel(name: str, r1: float, r2: float, i: int, j: int) -> float:
    """The paper's two kernels at one head, query i and key j, in plain Python."""
    d = abs(i - j)
    return -r1 * math.log(1 + r2 * d) if name == "kerple_log" else -r1 * d**r2


@pytest.mark.parametrize("name", list(KERPLE))
@pytest.mark.parametrize("kind", ["encoder", "decoder", "cross"])
def test_kerple_bias_is_the_kernel_of_each_head_and_distance(name: str, kind: str) -> None:
    torch.manual_seed(0)
    pe = build_attention_pe(cfg(attention_pe=name, cross_attention_pe=name), kind)
    assert isinstance(pe, KERPLE[name])
    q_pos, k_pos = torch.tensor([0, 3, 9]), torch.arange(12)
    b = pe.bias(q_pos, k_pos)
    assert b.shape == (1, 4, 3, 12) and b.dtype == torch.float32
    r1, r2 = pe.r1.tolist(), pe.r2.tolist()
    for h in range(4):
        for qi, i in enumerate(q_pos.tolist()):
            for j in k_pos.tolist():  # the decoder's j > i are masked, but finite too
                assert b[0, h, qi, j].item() == pytest.approx(kerple_kernel(name, r1[h], r2[h], i, j), rel=1e-5,
                                                              abs=1e-6)
    assert torch.isfinite(b).all()
    pos = torch.arange(7)
    square = pe.bias(pos, pos)
    torch.testing.assert_close(square, square.transpose(-1, -2))
    torch.testing.assert_close(pe.bias(torch.tensor([6]), pos), square[:, :, 6:7])  # an incremental step: last row


def authors_kerple(name: str, r1: torch.Tensor, r2: torch.Tensor, seq_len: int) -> torch.Tensor:
    """The authors' decoder bias ``[H, T, T]``, transcribed from chijames/KERPLE megatron/mpu/layers.py
    (``ParallelKerpleLog.forward``, ``ParallelKerplePower.forward``): diff = tril(i - j), then
    log: -bias_p * log(1 + bias_a * diff) with bias_p = r1, bias_a = r2;
    power: -(diff ** bias_p) * bias_a with bias_a = r1, bias_p = r2."""
    diff = torch.tril(torch.arange(seq_len).view(seq_len, 1).repeat(1, seq_len) + torch.arange(0, -seq_len, -1))
    diff = diff.to(torch.float32)
    if name == "kerple_log":
        bias_p, bias_a = r1[:, None, None], r2[:, None, None]
        return -bias_p * torch.log(1 + bias_a * diff)
    bias_a, bias_p = r1[:, None, None], r2[:, None, None]
    return -diff.pow(bias_p) * bias_a


@pytest.mark.parametrize("name", list(KERPLE))
def test_kerple_decoder_equals_the_authors_causal_bias(name: str) -> None:
    torch.manual_seed(1)
    pe = KERPLE[name](cfg(), "decoder")
    with torch.no_grad():
        theirs = authors_kerple(name, pe.r1, pe.r2, 10)
    ours = pe.bias(torch.arange(10), torch.arange(10))[0]
    lower = torch.ones(10, 10, dtype=torch.bool).tril().expand(4, -1, -1)  # what the causal mask lets through
    torch.testing.assert_close(ours[lower], theirs[lower])
    # Their cached step (one query, seq_len_k keys) reads row seq_len_k - 1; ours is given the query's position.
    torch.testing.assert_close(pe.bias(torch.tensor([9]), torch.arange(10))[0, :, 0], theirs[:, 9])


@pytest.mark.parametrize("name", list(KERPLE))
def test_kerple_initialisation_and_projection_follow_the_authors(name: str) -> None:
    torch.manual_seed(0)
    pe = KERPLE[name](cfg(d_model=64, n_heads=64), "encoder")
    r1_top, r2_top = (2.0, 1.0) if name == "kerple_log" else (1.0, 2.0)  # U[0, 2) and U[0, 1), per the variant
    for p, top in ((pe.r1, r1_top), (pe.r2, r2_top)):
        assert p.shape == (64,) and p.min() >= EPS and p.max() < top and p.max() > 0.9 * top
    assert sum(p.numel() for p in pe.parameters()) == 2 * 64
    with torch.no_grad():  # as an optimizer step could leave them
        pe.r1[0], pe.r2[1] = -1.0, 5.0
    pos = torch.arange(6)
    first = pe.bias(pos, pos)  # projects in place: r1 >= eps; r2 >= eps, and <= 2 for the power
    assert pe.r1[0].item() == pytest.approx(EPS)
    assert pe.r2[1].item() == (5.0 if name == "kerple_log" else 2.0)
    second = pe.bias(pos, pos)  # two forwards before one backward: the projection is outside autograd
    (first.sum() + second.sum()).backward()
    assert pe.r1.grad is not None and pe.r1.grad[0] != 0  # the projected parameter still learns (no clamp in the graph)
    assert pe.r2.grad is not None and torch.isfinite(pe.r2.grad).all()


# Sandwich ------------------------------------------------------------------------------------------------------------


def sandwich_formula(dim: int, n_heads: int, h: int, i: int, j: int) -> float:
    """(sum_{k=1}^{d'/2} cos((i - j) / 10000^(2k/d')) - d'/2) / (8 (h + 1) / H) for head h (0-based), literally."""
    dots = sum(math.cos((i - j) / 10000 ** (2 * k / dim)) for k in range(1, dim // 2 + 1))
    return (dots - dim / 2) / (8 * (h + 1) / n_heads)


@pytest.mark.parametrize("dim", [8, 128])
@pytest.mark.parametrize("kind", ["encoder", "decoder", "cross"])
def test_sandwich_bias_is_the_compressed_inner_product_of_sinusoids(dim: int, kind: str) -> None:
    pe = SandwichPE(cfg(sandwich=SandwichConfig(dim=dim)), kind)
    q_pos, k_pos = torch.tensor([0, 5, 40]), torch.arange(48)
    b = pe.bias(q_pos, k_pos)
    assert b.shape == (1, 4, 3, 48) and b.dtype == torch.float32
    for h in range(4):
        for qi, i in enumerate(q_pos.tolist()):
            for j in k_pos.tolist():
                assert b[0, h, qi, j].item() == pytest.approx(sandwich_formula(dim, 4, h, i, j), rel=1e-5, abs=1e-5)


def test_sandwich_has_no_parameters_zero_diagonal_and_heads_of_decreasing_reach() -> None:
    pe = SandwichPE(cfg(), "encoder")
    assert list(pe.parameters()) == [] and pe.state_dict() == {}  # nothing to learn or to save
    pos = torch.arange(30)
    b = pe.bias(pos, pos)[0]
    torch.testing.assert_close(b, b.transpose(-1, -2))
    assert b.diagonal(dim1=-2, dim2=-1).abs().max() < 1e-5 and b.max() <= 1e-5  # 0 at i = j, <= 0 elsewhere
    torch.testing.assert_close(b[1:] * torch.tensor([2.0, 3.0, 4.0])[:, None, None], b[:1].expand(3, -1, -1))  # / 8h/H
    assert b[0, 0, 1] > b[0, 0, 10]  # farther is penalised more (on average: the cosines decay)
    decoder = SandwichPE(cfg(), "decoder")
    torch.testing.assert_close(decoder.bias(torch.tensor([29]), pos)[0], b[:, 29:30])  # an incremental step


def test_sandwich_dimension_must_be_even() -> None:
    with pytest.raises(ConfigError, match="model.sandwich.dim: .* must be even, got 7"):
        from_dict({"model": {"attention_pe": "sandwich", "sandwich": {"dim": 7}}})
    assert from_dict({"model": {"attention_pe": "sandwich", "sandwich": {"dim": 8}}}).model.sandwich.dim == 8


# All of them ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["alibi", "t5", "shaw", "kerple_log", "kerple_power", "sandwich", "dpb"])
@pytest.mark.parametrize("kind", ["encoder", "decoder", "cross"])
def test_bias_is_invariant_to_shifting_all_positions(name: str, kind: str) -> None:
    c = cfg(attention_pe=name, cross_attention_pe=name, shaw=ShawConfig(max_distance=4, values=True))
    torch.manual_seed(0)
    pe = build_attention_pe(c, kind)
    q = torch.randn(2, 4, 6, 8)
    q_pos, k_pos = torch.arange(6), torch.arange(9)
    base = pe.bias(q_pos, k_pos, q)
    w = torch.randn(2, 4, 6, 9).softmax(-1)
    for shift in (1, 37, 300):
        torch.testing.assert_close(pe.bias(q_pos + shift, k_pos + shift, q), base)
        if name == "shaw":
            torch.testing.assert_close(pe.values(w, q_pos + shift, k_pos + shift), pe.values(w, q_pos, k_pos))
    if name != "alibi":
        assert (pe.bias(q_pos + 5, k_pos, q) - base).abs().max() > 0  # but not to a relative shift


#: Every learned tensor of each learned encoding: T5's table, Shaw's w^K and w^V, KERPLE's r1 and r2, FIRE's c, L
#: and both MLPs (two layers each) of the bidirectional encoder, DPB's one MLP (three layers at depth 2).
LEARNED = {"t5": ["rel_embed.weight"], "shaw": ["key_embed.weight", "value_embed.weight"],
           "kerple_log": ["r1", "r2"], "kerple_power": ["r1", "r2"],
           "fire": ["c", "threshold_scale", *(f"{mlp}.{i}.{w}" for mlp in ("mlp", "mlp_ahead") for i in (0, 2)
                                              for w in ("weight", "bias"))],
           "dpb": [f"mlp.{i}.{w}" for i in (0, 2, 4) for w in ("weight", "bias")]}


@pytest.mark.parametrize("name", list(LEARNED))
def test_gradient_reaches_the_tables(name: str) -> None:
    c = cfg(attention_pe=name, shaw=ShawConfig(values=True))
    torch.manual_seed(0)
    attn = MultiHeadAttention(c, "encoder")
    out, _ = attn(torch.randn(2, 5, 32), q_pos=torch.arange(5))
    out.square().sum().backward()
    tables = dict(attn.pe.named_parameters())
    assert list(tables) == LEARNED[name]
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in tables.values())


# CoPE ----------------------------------------------------------------------------------------------------------------


def cope(npos_max: int = 64, **kw) -> CopePE:
    """A CoPE layer whose table E is drawn N(0, 1) (it starts at zeros, as in the reference)."""
    pe = CopePE(cfg(decoder_pe={"attention": "cope"}, cope=CopeConfig(npos_max=npos_max), **kw), "decoder")
    with torch.no_grad():
        pe.pos_embed.normal_(generator=torch.Generator().manual_seed(3))
    return pe


def cope_reference_logits(pe: CopePE, q: torch.Tensor, k: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
    """The paper's equations, one (b, h, i, j) at a time, with the module's table E and the reference's 1/sqrt(Dh):
    g_it = sigmoid(q_i.k_t / sqrt(Dh)) for the keys t <= i that are not padding, p_ij = min(sum_{t=j..i} g_it,
    npos_max - 1), e(p) = (p - floor p) E[ceil p] + (1 - p + floor p) E[floor p], term q_i.e(p_ij) / sqrt(Dh);
    NaN where key j is not attended (after i, or padding)."""
    b_n, h_n, t_q, dh = q.shape
    e = pe.pos_embed.detach().double()
    out = torch.full((b_n, h_n, t_q, k.shape[2]), float("nan"), dtype=torch.float64)
    for b in range(b_n):
        for h in range(h_n):
            for i in range(t_q):
                qi = q[b, h, i].double()
                for j in range(i + 1):
                    if not key_mask[b, j]:
                        continue
                    p = sum(torch.sigmoid(qi @ k[b, h, t].double() / math.sqrt(dh)) for t in range(j, i + 1)
                            if key_mask[b, t])
                    p = min(float(p), pe.npos_max - 1)
                    lo, hi = math.floor(p), math.ceil(p)
                    e_p = (p - lo) * e[hi] + (1 - p + lo) * e[lo]
                    out[b, h, i, j] = qi @ e_p / math.sqrt(dh)
    return out


@pytest.mark.parametrize("npos_max", [64, 4])  # 4: most positions clipped to E[3]
def test_cope_term_equals_the_papers_equations_on_a_padded_batch(npos_max: int) -> None:
    pe = cope(npos_max)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 4, 9, 8, generator=g), torch.randn(2, 4, 9, 8, generator=g)
    key_mask = torch.ones(2, 9, dtype=torch.bool)
    key_mask[1, 6:] = False  # a padded sentence: its padding queries must not count the padding keys either
    pos = torch.arange(9)
    mask = build_mask(key_mask, pos, pos, causal=True)
    ours = pe.logits_bias(q, k, pos, pos, mask)
    assert ours.shape == (2, 4, 9, 9) and ours.dtype == torch.float32
    expected = cope_reference_logits(pe, q, k, key_mask)
    attended = ~expected.isnan()
    assert attended.sum() == 4 * (45 + 21 + 3 * 6)  # 4 heads; row 1's padding queries still attend its 6 real keys
    torch.testing.assert_close(ours.double()[attended], expected[attended], atol=1e-5, rtol=1e-5)
    positions = pe.contextual_positions(q, k, pos, pos, mask)
    assert positions.max() <= npos_max - 1 and (positions.max() == npos_max - 1) == (npos_max == 4)
    assert positions[~mask.expand_as(positions)].abs().max() == 0  # masked keys have no position (not counted)


def test_cope_with_every_gate_open_is_a_relative_position_embedding() -> None:
    """q.k >> 0 everywhere: every gate is 1, p_ij = i - j + 1 (tokens counted from j to i), and the term is
    q_i.E[i - j + 1] / sqrt(Dh); with every gate shut (q.k << 0), p_ij = 0 and it is q_i.E[0] / sqrt(Dh)."""
    pe = cope()
    u = torch.randn(8)
    q = (20 * u / u.norm()).expand(1, 4, 6, 8)
    i, j = torch.arange(6)[:, None], torch.arange(6)[None, :]
    lower = (j <= i).expand(1, 4, 6, 6)
    pos = torch.arange(6)
    for sign, p in ((1, i - j + 1), (-1, torch.zeros(6, 6, dtype=torch.long))):
        positions = pe.contextual_positions(q, sign * q, pos, pos, None)
        torch.testing.assert_close(positions[lower], p.float().expand(1, 4, 6, 6)[lower])
        expected = (q[0, 0, 0] @ pe.pos_embed[p].transpose(-1, -2)).detach() / math.sqrt(8)  # [6, 6]
        torch.testing.assert_close(pe.logits_bias(q, sign * q, pos, pos, None)[lower],
                                   expected.expand(1, 4, 6, 6)[lower])


def test_cope_in_a_cached_step_counts_over_the_cached_keys() -> None:
    """One new query at position t against keys 0..t (the step's mask has no causal part) gives row t of the
    full sequence's term, however many keys after t the full sequence has."""
    pe = cope()
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(2, 4, 7, 8, generator=g), torch.randn(2, 4, 7, 8, generator=g)
    pos = torch.arange(7)
    full = pe.logits_bias(q, k, pos, pos, build_mask(None, pos, pos, causal=True))
    for t in range(7):
        step = pe.logits_bias(q[:, :, t : t + 1], k[:, :, : t + 1], pos[t : t + 1], pos[: t + 1], None)
        torch.testing.assert_close(step, full[:, :, t : t + 1, : t + 1])


def test_cope_fused_attention_equals_explicit_with_padding() -> None:
    torch.manual_seed(0)
    attn = MultiHeadAttention(cfg(decoder_pe={"attention": "cope"}), "decoder").eval()
    assert isinstance(attn.pe, CopePE) and not attn.pe.needs_explicit
    torch.nn.init.normal_(attn.pe.pos_embed)
    x = torch.randn(2, 6, 32)
    key_mask = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    fused, none = attn(x, key_mask=key_mask, causal=True, q_pos=torch.arange(6))
    explicit, weights = attn(x, key_mask=key_mask, causal=True, q_pos=torch.arange(6), need_weights=True)
    assert none is None and weights is not None
    torch.testing.assert_close(fused, explicit, atol=1e-5, rtol=1e-5)
    assert weights.triu(1).abs().max() == 0 and weights[1, :, :, 4:].abs().max() == 0
    with torch.no_grad():
        attn.pe.pos_embed.zero_()  # E = 0: no CoPE term, the plain causal layer
    assert (attn(x, key_mask=key_mask, causal=True, q_pos=torch.arange(6))[0] - fused).abs().max() > 1e-4


def test_cope_gradient_reaches_the_table_and_the_gates() -> None:
    torch.manual_seed(0)
    attn = MultiHeadAttention(cfg(decoder_pe={"attention": "cope"}), "decoder")
    assert attn.pe.pos_embed.abs().max() == 0  # zeros at first, as in the reference ...
    x = torch.randn(2, 5, 32)
    attn(x, causal=True, q_pos=torch.arange(5))[0].square().sum().backward()
    grad = attn.pe.pos_embed.grad
    assert grad is not None and grad.abs().sum() > 0  # ... and still learned
    assert sum(p.numel() for p in attn.pe.parameters()) == 64 * 8  # npos_max x Dh per layer, shared by heads
    pe = cope()  # the gates: the term depends on k through them (only through them)
    q = torch.randn(1, 4, 5, 8)
    k = torch.randn(1, 4, 5, 8, requires_grad=True)
    pos = torch.arange(5)
    (dk,) = torch.autograd.grad(pe.logits_bias(q, k, pos, pos, None).sum(), k)
    assert dk.abs().sum() > 0
