"""Multi-head attention with a fused fast path and an explicit path that returns the weights.

Fast path: ``F.scaled_dot_product_attention`` with a boolean mask, or a float mask when an
attention-level encoding adds biases (``bias``, and ``logits_bias`` from q and k). Explicit path:
softmax(q k^T / sqrt(d) + mask) v, used when weights are requested (visualisation) or an encoding adds a
term to the values. Tests hold the two equal.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from models.config import ModelConfig
from models.positional import AttentionKind, build_attention_pe

#: SDPA's CUDA kernels allowed: all but cuDNN's, which builds a graph per new shape (on an H100, bf16 training with
#: batches of varying shapes: 12k target tok/s with it, 114k without in bench/sdpa_backends.py; train.py 3.34x).
CUDA_SDPA = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]

LayerCache = dict[str, torch.Tensor]


def build_mask(
    key_mask: torch.Tensor | None, q_pos: torch.Tensor, k_pos: torch.Tensor, causal: bool
) -> torch.Tensor | None:
    """Boolean mask, True = may attend, broadcastable to ``[B, H, Tq, Tk]``; None = attend everywhere.

    key_mask ``[B, Tk]`` marks real (non-pad) keys; ``causal`` forbids keys after the query position.
    """
    mask = None if key_mask is None else key_mask[:, None, None, :]
    if causal:
        allowed = k_pos[None, :] <= q_pos[:, None]  # [Tq, Tk]
        mask = allowed[None, None] if mask is None else mask & allowed
    return mask


class MultiHeadAttention(nn.Module):
    """Self- or cross-attention over ``[B, T, D]`` inputs with ``n_heads`` heads of ``D / n_heads``."""

    def __init__(self, cfg: ModelConfig, kind: AttentionKind) -> None:
        super().__init__()
        self.kind = kind
        self.n_heads = cfg.n_heads
        self.head_dim = cfg.d_model // cfg.n_heads
        if kind == "cross":
            self.q_proj = nn.Linear(cfg.d_model, cfg.d_model)
            self.kv_proj = nn.Linear(cfg.d_model, 2 * cfg.d_model)
        else:
            self.qkv_proj = nn.Linear(cfg.d_model, 3 * cfg.d_model)  # fused Q, K, V
        self.out_proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.dropout = cfg.attention_dropout
        self.pe = build_attention_pe(cfg, kind)

    def _heads(self, x: torch.Tensor, n: int) -> tuple[torch.Tensor, ...]:
        """[B, T, n*D] -> n tensors [B, H, T, Dh]."""
        b, t, _ = x.shape
        return x.view(b, t, n, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)

    def _grouped_cross(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor | None
    ) -> torch.Tensor:
        """Cross-attention of ``g`` rows per sentence (its beams) against the sentence's one K/V.

        q ``[n*g, H, Tq, Dh]``, k/v ``[n, H, S, Dh]``, key_mask ``[n, S]`` -> ``[n*g, Tq, D]`` (before
        ``out_proj``): the beams
        become extra queries of their sentence, so K/V are neither copied per beam nor reordered with them.
        """
        b, h, tq, dh = q.shape
        n = k.shape[0]
        g = b // n
        q = q.view(n, g, h, tq, dh).transpose(1, 2).reshape(n, h, g * tq, dh)
        mask = None if key_mask is None else key_mask[:, None, None, :]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0)
        return out.view(n, h, g, tq, dh).permute(0, 2, 3, 1, 4).reshape(b, tq, h * dh)

    def forward(
        self,
        x: torch.Tensor,
        *,
        memory: torch.Tensor | None = None,
        key_mask: torch.Tensor | None = None,
        causal: bool = False,
        q_pos: torch.Tensor,
        k_pos: torch.Tensor | None = None,
        cache: LayerCache | None = None,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x ``[B, Tq, D]`` -> (``[B, Tq, D]``, weights ``[B, H, Tq, Tk]`` or None).

        Self-attention: ``q_pos`` are the positions of x; with a ``cache`` the new keys/values are
        appended to the cached ones (incremental decoding). Cross-attention: keys/values come from
        ``memory`` (positions ``k_pos``), computed once and kept in ``cache``.
        """
        out, weights = self._attend(self._project(x), memory=memory, key_mask=key_mask, causal=causal, q_pos=q_pos,
                                    k_pos=k_pos, cache=cache, need_weights=need_weights)
        return self.out_proj(out), weights

    def forward_parts(self, x: torch.Tensor, rows: list[int], parts: list[dict[str, Any]]) -> torch.Tensor:
        """Several independent batches in one call: x ``[sum(rows), Tq, D]`` -> ``[sum(rows), Tq, D]``.

        The projections run once over all rows; attention runs per part (``parts[i]``: the keyword arguments
        of ``forward`` for the next ``rows[i]`` rows: their own positions, cache, memory and mask). Orca's
        selective batching (Yu et al. 2022, section 4.2): a decoding step of batches at different lengths.
        """
        projected = self._project(x).split(rows)
        return self.out_proj(torch.cat([self._attend(p, **kw)[0] for p, kw in zip(projected, parts, strict=True)]))

    def _project(self, x: torch.Tensor) -> torch.Tensor:
        """x ``[B, T, D]`` -> q ``[B, T, D]`` (cross) or q, k, v fused ``[B, T, 3D]`` (self)."""
        return self.q_proj(x) if self.kind == "cross" else self.qkv_proj(x)

    def _attend(
        self,
        projected: torch.Tensor,
        *,
        memory: torch.Tensor | None = None,
        key_mask: torch.Tensor | None = None,
        causal: bool = False,
        q_pos: torch.Tensor,
        k_pos: torch.Tensor | None = None,
        cache: LayerCache | None = None,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``_project``'s output ``[B, Tq, n*D]`` -> (attention output ``[B, Tq, D]`` before ``out_proj``, weights)."""
        b, tq, _ = projected.shape
        d = self.n_heads * self.head_dim
        if self.kind == "cross":
            (q,) = self._heads(projected, 1)
            if cache is not None and "k" in cache:
                k, v = cache["k"], cache["v"]
            else:
                assert memory is not None, "cross-attention needs the encoder memory"
                k, v = self._heads(self.kv_proj(memory), 2)
                if cache is not None:
                    cache["k"], cache["v"] = k, v
            if k_pos is None:
                k_pos = torch.arange(k.shape[2], device=q.device)
            if k.shape[0] != b:  # beam search: g = b / sentences consecutive rows share one sentence's K/V
                if self.pe is None and not need_weights:
                    return self._grouped_cross(q, k, v, key_mask), None
                g = b // k.shape[0]
                k, v = k.repeat_interleave(g, 0), v.repeat_interleave(g, 0)
                key_mask = None if key_mask is None else key_mask.repeat_interleave(g, 0)
            if self.pe is not None:
                q, k = self.pe.rotate(q, k, q_pos, k_pos)
        else:
            q, k, v = self._heads(projected, 3)
            if self.pe is not None:
                q, k = self.pe.rotate(q, k, q_pos, q_pos)  # keys are stored already rotated
            if cache is not None:
                if "k" in cache:
                    k = torch.cat((cache["k"], k), dim=2)
                    v = torch.cat((cache["v"], v), dim=2)
                cache["k"], cache["v"] = k, v
            k_pos = torch.arange(k.shape[2], device=q.device) if cache is not None else q_pos
            if cache is not None and tq == 1:
                causal = False  # one new query after the cached keys: nothing to mask (SDPA runs mask-free)

        mask = build_mask(key_mask, q_pos, k_pos, causal)
        bias = None
        if self.pe is not None:
            bias = self.pe.bias(q_pos, k_pos, q)
            from_keys = self.pe.logits_bias(q, k, q_pos, k_pos, mask)
            if from_keys is not None:
                bias = from_keys if bias is None else bias + from_keys
        explicit = need_weights or (self.pe is not None and self.pe.needs_explicit)
        if bias is not None:
            float_mask = bias.to(q.dtype)
            if mask is not None:
                float_mask = float_mask.masked_fill(~mask, float("-inf"))
            mask = float_mask
        dropout = self.dropout if self.training else 0.0

        weights = None
        if explicit:
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)
            if mask is not None:
                scores = scores + mask if mask.dtype != torch.bool else scores.masked_fill(~mask, float("-inf"))
            weights = scores.float().softmax(dim=-1).to(q.dtype)
            dropped = F.dropout(weights, dropout, self.training)
            out = dropped @ v
            extra = None if self.pe is None else self.pe.values(dropped, q_pos, k_pos)
            if extra is not None:
                out = out + extra
        else:
            use_causal = causal and mask is not None and key_mask is None and bias is None and cache is None
            dtype = q.dtype
            cpu_fp32 = q.device.type == "cpu" and (dtype == torch.bfloat16 or torch.is_autocast_enabled("cpu"))
            if cpu_fp32:  # the CPU flash kernel's bf16 backward is 6x slower than its fp32 one (benchmarks: hardware)
                q, k, v = q.float().contiguous(), k.float().contiguous(), v.float().contiguous()
                mask = mask.float() if mask is not None and mask.dtype != torch.bool else mask
            # ... and autocast would cast the fp32 inputs back to bf16: off around the kernel. On CUDA not cuDNN's
            # kernel: it builds a graph for every new shape, and batches of varying lengths make ~10x slower steps.
            with (torch.autocast("cpu", enabled=False) if cpu_fp32 else
                  sdpa_kernel(CUDA_SDPA) if q.is_cuda else contextlib.nullcontext()):
                if tq == 1 and mask is None and q.device.type == "cpu" and not self.training:
                    # One query per row (a cached decoding step): two batched products beat the CPU flash kernel.
                    out = ((q @ k.transpose(-2, -1)) * self.head_dim**-0.5).softmax(-1) @ v
                else:
                    out = F.scaled_dot_product_attention(
                        q, k, v, attn_mask=None if use_causal else mask, dropout_p=dropout, is_causal=use_causal
                    )
            out = out.to(dtype)
        return out.transpose(1, 2).reshape(b, tq, d), weights
