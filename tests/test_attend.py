"""The attention kernel and its choice (models/attend.py): fused and explicit agree, the weights come back when
asked, masks and biases act, CPU bf16 runs in fp32, and on CUDA every SDPA kernel but cuDNN's is allowed."""

from __future__ import annotations

import math

import pytest
import torch

from models.attend import Attend

B, H, TQ, TK, DH = 2, 3, 5, 7, 8


def qkv(tq: int = TQ, tk: int = TK, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, tq, DH, generator=g), torch.randn(B, H, tk, DH, generator=g),
            torch.randn(B, H, tk, DH, generator=g))


def padding(tk: int = TK) -> torch.Tensor:
    """``[B, 1, 1, Tk]``: the second row's last 3 keys are padding."""
    keep = torch.ones(B, tk, dtype=torch.bool)
    keep[1, -3:] = False
    return keep[:, None, None, :]


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
              bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q k^T / sqrt(Dh) + bias, masked keys at -inf) v, written out here: (output, weights)."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if bias is not None:
        scores = scores + bias
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(-1)
    return weights @ v, weights


CAUSAL = torch.ones(TQ, TQ, dtype=torch.bool).tril()[None, None]
BIAS = -0.3 * (torch.arange(TQ)[:, None] - torch.arange(TK)[None, :]).abs().float().expand(1, H, TQ, TK)
CASES = {  # name: (tq, tk, mask, bias, is_causal)
    "no mask": (TQ, TK, None, None, False),
    "padding": (TQ, TK, padding(), None, False),
    "causal": (TQ, TQ, CAUSAL, None, True),
    "bias": (TQ, TK, None, BIAS, False),
    "bias and padding": (TQ, TK, padding(), BIAS, False),
    "one query, no mask": (1, TK, None, None, False),  # a cached decoding step
    "one query, padding": (1, TK, padding(), None, False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_fused_and_explicit_give_the_written_out_attention(case: str) -> None:
    tq, tk, mask, bias, is_causal = CASES[case]
    q, k, v = qkv(tq, tk)
    attend = Attend(DH)
    want, want_weights = reference(q, k, v, mask, bias)
    fused, none = attend(q, k, v, mask, bias, is_causal=is_causal)
    explicit, weights = attend(q, k, v, mask, bias, is_causal=is_causal, need_weights=True)
    assert none is None and weights is not None and weights.shape == (B, H, tq, tk)
    torch.testing.assert_close(fused, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(explicit, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weights, want_weights.expand(B, H, tq, tk), atol=1e-6, rtol=1e-5)


def test_masked_keys_get_no_weight_and_do_not_reach_the_output() -> None:
    q, k, v = qkv()
    attend = Attend(DH)
    out, weights = attend(q, k, v, padding(), BIAS, need_weights=True)
    assert weights is not None and torch.all(weights[1, :, :, -3:] == 0) and torch.all(weights[0] > 0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(B, H, TQ))
    v2 = v.clone()
    v2[1, :, -3:] = 1e3  # the padded keys' values: changed, and nothing changes
    for need_weights in (False, True):
        torch.testing.assert_close(attend(q, k, v2, padding(), BIAS, need_weights=need_weights)[0], out)


def test_values_term_is_added_from_the_weights_on_the_explicit_path() -> None:
    q, k, v = qkv()
    seen: list[torch.Tensor] = []

    def values(weights: torch.Tensor) -> torch.Tensor:
        seen.append(weights)
        return weights.sum(-1, keepdim=True).expand(B, H, TQ, DH) * 2.0  # 2 everywhere (rows sum to 1)

    out, weights = Attend(DH)(q, k, v, padding(), values=values)
    plain, _ = reference(q, k, v, padding())
    assert len(seen) == 1 and seen[0].shape == (B, H, TQ, TK) and weights is not None
    torch.testing.assert_close(out, plain + 2.0, atol=1e-5, rtol=1e-5)


def test_dropout_acts_in_training_only() -> None:
    q, k, v = qkv()
    attend = Attend(DH, dropout=0.5)
    want, _ = reference(q, k, v, padding())
    for need_weights in (False, True):
        torch.testing.assert_close(attend(q, k, v, padding(), need_weights=need_weights)[0], want, atol=1e-5,
                                   rtol=1e-5)
        torch.manual_seed(0)
        dropped, weights = attend(q, k, v, padding(), training=True, need_weights=need_weights)
        assert (dropped - want).abs().max() > 0.1
        if need_weights:  # the weights come back before dropout
            torch.testing.assert_close(weights, reference(q, k, v, padding())[1], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("autocast", [False, True])
def test_bf16_on_cpu_runs_the_kernel_in_fp32(autocast: bool) -> None:
    """The CPU kernel's bf16 backward is slow: bf16 inputs (or autocast) are computed in fp32, then cast back."""
    q, k, v = (t.bfloat16() for t in qkv())
    bias = BIAS.bfloat16().float()  # the bias in the inputs' dtype, as the kernel takes it
    want = Attend(DH)(q.float(), k.float(), v.float(), padding(), bias)[0].bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out, _ = Attend(DH)(q, k, v, padding(), BIAS)
    assert out.dtype == torch.bfloat16 and torch.equal(out, want)


def test_on_cuda_every_sdpa_kernel_but_cudnns_is_allowed() -> None:
    """cuDNN's SDPA kernel builds a graph per new shape: ~10x slower bf16 training steps with batches of varying
    lengths on an H100. What the fused call runs under on a CUDA device, read from PyTorch's switches (no GPU
    needed); on CPU nothing is switched."""
    cuda = torch.backends.cuda

    def switches() -> dict[str, bool]:
        return {"flash": cuda.flash_sdp_enabled(), "efficient": cuda.mem_efficient_sdp_enabled(),
                "math": cuda.math_sdp_enabled(), "cudnn": cuda.cudnn_sdp_enabled()}

    before = switches()
    with Attend.kernels(torch.device("cuda")):
        assert switches() == {"flash": True, "efficient": True, "math": True, "cudnn": False}
    assert switches() == before
    with Attend.kernels(torch.device("cpu")):
        assert switches() == before
