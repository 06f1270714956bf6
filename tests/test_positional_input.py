"""Input-level encodings: the maths of learnable_ln, onehot, gaussian and binary, and their length limits."""

from __future__ import annotations

import pytest
import torch

from models.positional import REGISTRY, PositionLimitError, build_input_pe
from models.positional.fixed import BinaryPE, gaussian_table
from models.transformer import Seq2SeqTransformer
from utils.config import ModelConfig

D = 32


def cfg(input_pe: str, **kw) -> ModelConfig:
    base = dict(d_model=D, n_heads=4, encoder_layers=1, decoder_layers=1, d_ff=64, dropout=0.0, max_positions=64)
    return ModelConfig(**{**base, "input_pe": input_pe, **kw})


def test_learnable_ln_is_layernorm_plus_table_and_trains_the_table() -> None:
    torch.manual_seed(0)
    pe = build_input_pe(cfg("learnable_ln"))
    x = torch.randn(2, 7, D) * 5 + 3
    pos = torch.arange(7)
    out = pe(x, pos)
    expected = torch.nn.functional.layer_norm(x, (D,)) + pe.weight[:7]
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(pe.table(7), pe.weight[:7].detach())
    assert 0.01 < pe.weight.std().item() < 0.03  # N(0, 0.02) init
    out.sum().backward()
    assert pe.weight.grad is not None and pe.weight.grad[:7].abs().sum() > 0
    assert pe.weight.grad[7:].abs().sum() == 0
    assert pe.norm.weight.grad is not None


def test_onehot_table_is_identity_rows() -> None:
    pe = build_input_pe(cfg("onehot"))
    torch.testing.assert_close(pe.table(5), torch.eye(5, D))
    x = torch.randn(2, 5, D)
    torch.testing.assert_close(pe(x, torch.arange(5)), x + torch.eye(5, D))


def test_gaussian_rows_peak_at_position_are_symmetric_and_shrink_to_onehot() -> None:
    sigma = 2.0
    pe = build_input_pe(cfg("gaussian", gaussian_sigma=sigma))
    table = pe.table(D)
    assert torch.equal(table.argmax(dim=1), torch.arange(D))
    torch.testing.assert_close(table.diagonal(), torch.ones(D))
    for i in range(D):
        for k in range(1, D):
            if 0 <= i - k and i + k < D:
                assert table[i, i - k] == table[i, i + k]
    j = torch.arange(D, dtype=torch.float64)
    torch.testing.assert_close(table[10].double(), torch.exp(-((j - 10) ** 2) / (2 * sigma**2)), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(gaussian_table(D, D, 0.05), torch.eye(D), atol=1e-6, rtol=0)
    x = torch.randn(1, 4, D)
    torch.testing.assert_close(pe(x, torch.arange(4)), x + table[:4])


def test_binary_bits_decode_to_position_and_keep_the_embedding_head() -> None:
    c = cfg("binary", max_positions=50)
    pe = build_input_pe(c)
    n = pe.n_bits
    assert n == 6 and pe.max_length == 64  # ceil(log2(50)) = 6
    x = torch.randn(2, pe.max_length, D)
    pos = torch.arange(pe.max_length)
    out = pe(x, pos)
    assert out.shape == x.shape
    torch.testing.assert_close(out[..., : D - n], x[..., : D - n])
    bits = out[..., D - n :]
    assert set(bits.unique().tolist()) <= {0.0, 1.0}
    decoded = (bits * (2 ** torch.arange(n))).sum(-1)  # least significant bit first
    assert torch.equal(decoded, pos.float().expand(2, -1))
    torch.testing.assert_close(pe.table(pe.max_length)[:, D - n :], bits[0])
    assert pe.table(3)[:, : D - n].abs().max() == 0


@pytest.mark.parametrize("max_positions,n_bits", [(1, 0), (2, 1), (64, 6), (65, 7), (1024, 10)])
def test_binary_bit_count_is_ceil_log2(max_positions: int, n_bits: int) -> None:
    pe = build_input_pe(cfg("binary", max_positions=max_positions))
    assert pe.n_bits == n_bits and pe.max_length == 2**n_bits >= max_positions


def test_binary_rejects_a_too_small_model() -> None:
    with pytest.raises(ValueError, match="model.d_model=8"):
        BinaryPE(cfg("binary", d_model=8, max_positions=256))  # 8 bits leave no room in 8 dims


@pytest.mark.parametrize("name", ["onehot", "gaussian", "binary"])
def test_fixed_encodings_have_no_parameters_and_empty_state(name: str) -> None:
    pe = build_input_pe(cfg(name))
    assert list(pe.parameters()) == []
    assert pe.state_dict() == {}
    build_input_pe(cfg(name)).load_state_dict(pe.state_dict())


@pytest.mark.parametrize("name", ["learnable_ln", "onehot", "gaussian", "binary"])
def test_state_dict_round_trip(name: str) -> None:
    torch.manual_seed(0)
    a = build_input_pe(cfg(name))
    torch.manual_seed(1)
    b = build_input_pe(cfg(name))
    b.load_state_dict(a.state_dict())
    x, pos = torch.randn(2, 6, D), torch.arange(6)
    torch.testing.assert_close(a(x, pos), b(x, pos))


@pytest.mark.parametrize(
    "name,kw,limit,key",
    [
        ("learnable_ln", dict(max_positions=10), 10, "model.max_positions=10"),
        ("onehot", {}, D, f"model.d_model={D}"),
        ("gaussian", {}, D, f"model.d_model={D}"),
        ("binary", dict(max_positions=10), 16, "model.max_positions=10"),
    ],
)
def test_length_limit_is_a_clear_error_and_inclusive(name: str, kw: dict, limit: int, key: str) -> None:
    pe = build_input_pe(cfg(name, **kw))
    assert pe.max_length == limit
    x = torch.randn(1, limit + 1, D)
    with pytest.raises(PositionLimitError, match=key) as err:
        pe(x, torch.arange(limit + 1))
    assert "\n" not in str(err.value) and str(limit + 1) in str(err.value)
    with pytest.raises(PositionLimitError, match=key):  # also a cached decoding step past the limit
        pe(x[:, :1], torch.tensor([limit]))
    assert pe(x[:, :limit], torch.arange(limit)).shape == (1, limit, D)  # exactly at the limit is fine


@pytest.mark.parametrize("name", ["learnable_ln", "onehot", "gaussian", "binary"])
def test_outputs_depend_on_positions(name: str) -> None:
    torch.manual_seed(0)
    pe = build_input_pe(cfg(name))
    x = torch.randn(1, 1, D).expand(1, 8, D)  # the same token everywhere
    out = pe(x, torch.arange(8))
    for i in range(8):
        for j in range(i + 1, 8):
            assert (out[0, i] - out[0, j]).abs().max() > 1e-3
    shifted = pe(x, torch.arange(3, 11))
    assert (shifted - out).abs().max() > 1e-3


def test_all_new_names_are_registered() -> None:
    assert {"learnable_ln", "onehot", "gaussian", "binary"} <= set(REGISTRY["input"])


@pytest.mark.parametrize("name", ["learnable_ln", "onehot", "gaussian", "binary"])
def test_encoder_is_not_permutation_equivariant(name: str) -> None:
    torch.manual_seed(0)
    model = Seq2SeqTransformer(cfg(name, encoder_layers=2, decoder_layers=2), 40, 0).eval()
    if name == "learnable_ln":  # a fresh table is tiny; make positions clearly distinct
        torch.nn.init.normal_(model.src_pe.weight, std=1.0)
    src = torch.randint(4, 40, (1, 8))
    perm = torch.arange(7, -1, -1)
    out, _ = model.encode(src)
    out_perm, _ = model.encode(src[:, perm])
    assert (out_perm - out[:, perm]).abs().max() > 1e-3
