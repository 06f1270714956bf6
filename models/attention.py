"""Multi-head attention: projections, the KV cache, beams sharing their sentence's memory, positional hooks.

The kernel and its choice (fused or explicit, dtype rules, the CUDA kernels allowed) are ``models.attend``'s.
An attention-level encoding acts through its hooks: ``rotate`` q and k, additive scores (``bias``, and
``logits_bias`` from q and k) and a term from the weights (``values``, which takes the explicit path).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import nn

from models.attend import Attend, Values
from models.config import ModelConfig
from models.positional import AttentionKind, build_attention_pe

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
        self.attend = Attend(self.head_dim, cfg.attention_dropout)
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
        ``out_proj``): the beams become extra queries of their sentence, so K/V are neither copied per beam nor
        reordered with them.
        """
        b, h, tq, dh = q.shape
        n = k.shape[0]
        g = b // n
        q = q.view(n, g, h, tq, dh).transpose(1, 2).reshape(n, h, g * tq, dh)
        mask = None if key_mask is None else key_mask[:, None, None, :]
        out, _ = self.attend(q, k, v, mask, training=self.training)
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
        if self.kind == "cross":
            (q,) = self._heads(projected, 1)
            k, v = self._memory_kv(memory, cache)
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
        bias = values = None
        if self.pe is not None:
            bias, values = self._pe_terms(q, k, q_pos, k_pos, mask)
        out, weights = self.attend(q, k, v, mask, bias, training=self.training, need_weights=need_weights,
                                   values=values, is_causal=causal and key_mask is None and cache is None)
        return out.transpose(1, 2).reshape(b, tq, self.n_heads * self.head_dim), weights

    def _memory_kv(self, memory: torch.Tensor | None, cache: LayerCache | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Cross-attention's k, v ``[n, H, S, Dh]`` of the encoder memory ``[n, S, D]``: from ``cache`` once there."""
        if cache is not None and "k" in cache:
            return cache["k"], cache["v"]
        assert memory is not None, "cross-attention needs the encoder memory"
        k, v = self._heads(self.kv_proj(memory), 2)
        if cache is not None:
            cache["k"], cache["v"] = k, v
        return k, v

    def _pe_terms(
        self, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor, mask: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, Values | None]:
        """The encoding's additive scores (``bias`` plus ``logits_bias``, ``[1 or B, H, Tq, Tk]``, or None) and its
        term from the weights (``values``, where it has one)."""
        assert self.pe is not None
        bias = self.pe.bias(q_pos, k_pos, q)
        from_keys = self.pe.logits_bias(q, k, q_pos, k_pos, mask)
        if from_keys is not None:
            bias = from_keys if bias is None else bias + from_keys
        values = partial(self.pe.values, q_pos=q_pos, k_pos=k_pos) if self.pe.needs_explicit else None
        return bias, values
