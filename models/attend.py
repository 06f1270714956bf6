"""The attention kernel and its choice: softmax(q k^T / sqrt(Dh) + mask) v, fused or explicit.

Fused: ``F.scaled_dot_product_attention`` with a boolean mask, or a float mask when an encoding adds scores
(``bias``), or ``is_causal`` when the mask is the plain causal one. Explicit: the scores, their softmax and the
product written out, used when the weights are asked for (visualisation) or a term is added from the weights
(``values``). Tests hold the two equal. Projections, caches and positional hooks are ``MultiHeadAttention``'s.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

#: An extra term from the (dropped-out) weights ``[B, H, Tq, Tk]`` -> ``[B, H, Tq, Dh]``, added to the output.
Values = Callable[[torch.Tensor], torch.Tensor | None]


class Attend:
    """q ``[B, H, Tq, Dh]``, k and v ``[B, H, Tk, Dh]`` -> (output ``[B, H, Tq, Dh]``, weights ``[B, H, Tq, Tk]``
    or None), with dropout ``dropout`` on the weights in training.

    A plain class, not an ``nn.Module``: it holds no parameters, and a plain call keeps the Module's per-call
    dispatch (about 2 us, against 0.2) out of every decoding step; the caller passes its ``training`` flag.
    """

    #: SDPA's CUDA kernels allowed: all but cuDNN's, which builds a graph per new shape (on an H100, bf16 training
    #: with batches of varying shapes: 12k target tok/s with it, 114k without in bench/sdpa_backends.py).
    cuda_kernels: ClassVar[list[SDPBackend]] = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                                                SDPBackend.MATH]

    def __init__(self, head_dim: int, dropout: float = 0.0) -> None:
        self.head_dim = head_dim
        self.dropout = dropout

    @classmethod
    def kernels(cls, device: torch.device, fp32: bool = False) -> contextlib.AbstractContextManager[None]:
        """What surrounds the fused kernel on ``device``: on CUDA, only ``cuda_kernels`` allowed; on CPU with
        inputs cast to fp32 (``fp32``), autocast off (it would cast them back to bf16); else nothing."""
        if fp32:
            return torch.autocast("cpu", enabled=False)
        return sdpa_kernel(cls.cuda_kernels) if device.type == "cuda" else contextlib.nullcontext()

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
        *,
        training: bool = False,
        is_causal: bool = False,
        need_weights: bool = False,
        values: Values | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attention of q over k, v. ``mask``: boolean, True = may attend, broadcastable to ``[B, H, Tq, Tk]``
        (None: everywhere); ``bias``: scores added before the softmax, same broadcast; ``is_causal``: ``mask`` is
        the plain causal one (a square block, no padding), which the fused kernel may apply itself. The explicit
        path runs when ``need_weights`` or ``values`` is given; it alone returns the weights (before dropout)."""
        if bias is not None:
            float_mask = bias.to(q.dtype)
            if mask is not None:
                float_mask = float_mask.masked_fill(~mask, float("-inf"))
            mask = float_mask
        dropout = self.dropout if training else 0.0
        if need_weights or values is not None:
            return self.explicit(q, k, v, mask, dropout, training, values)
        return self.fused(q, k, v, mask, dropout, training, is_causal and mask is not None and bias is None), None

    def explicit(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None,
        dropout: float,
        training: bool,
        values: Values | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """softmax(q k^T / sqrt(Dh) + mask) v written out (``mask`` boolean or float) -> (output, weights); the
        softmax in fp32."""
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        if mask is not None:
            scores = scores + mask if mask.dtype != torch.bool else scores.masked_fill(~mask, float("-inf"))
        weights = scores.float().softmax(dim=-1).to(q.dtype)
        dropped = F.dropout(weights, dropout, training)
        out = dropped @ v
        extra = None if values is None else values(dropped)
        if extra is not None:
            out = out + extra
        return out, weights

    def fused(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None,
        dropout: float,
        training: bool,
        is_causal: bool,
    ) -> torch.Tensor:
        """``scaled_dot_product_attention`` (``mask`` boolean or float; ``is_causal``: the mask is left out and the
        kernel applies the causal one) -> output in q's dtype. On CPU, bf16 inputs or autocast run in fp32: the
        CPU flash kernel's bf16 backward is 6x slower than its fp32 one. One query per row on CPU in eval mode
        (a cached decoding step) without a mask: two batched products, faster than the CPU kernel."""
        dtype = q.dtype
        cpu_fp32 = q.device.type == "cpu" and (dtype == torch.bfloat16 or torch.is_autocast_enabled("cpu"))
        if cpu_fp32:
            q, k, v = q.float().contiguous(), k.float().contiguous(), v.float().contiguous()
            mask = mask.float() if mask is not None and mask.dtype != torch.bool else mask
        with self.kernels(q.device, cpu_fp32):
            if q.shape[2] == 1 and mask is None and q.device.type == "cpu" and not training:
                out = ((q @ k.transpose(-2, -1)) * self.head_dim**-0.5).softmax(-1) @ v
            else:
                out = F.scaled_dot_product_attention(
                    q, k, v, attn_mask=None if is_causal else mask, dropout_p=dropout, is_causal=is_causal
                )
        return out.to(dtype)
