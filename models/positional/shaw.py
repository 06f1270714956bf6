"""Relative position representations (Shaw et al. 2018, "Self-Attention with Relative Position
Representations", eqs. 3-5).

Learned vectors a_ij^K = w^K_clip(j - i, k) and a_ij^V = w^V_clip(j - i, k), clip(x, k) = max(-k, min(k, x)),
k = ``model.shaw.max_distance``: 2k + 1 vectors of size Dh each, shared across heads, one set per layer.

    e_ij = q_i (k_j + a_ij^K)^T / sqrt(Dh)              (eq. 5; the a^K part is returned by ``bias``)
    z_i  = sum_j alpha_ij (v_j + a_ij^V)                (eq. 3; the a^V part is returned by ``values``)

The a^K term depends on q, so ``bias`` is ``[B, H, Tq, Tk]`` (still the fused path). The a^V term
(``model.shaw.values``) needs the attention weights, hence the explicit path; without it there is no a^V.
Both are computed per relative distance (q @ w^K^T, then a gather; weights summed per distance, then @ w^V),
which equals the paper's einsums over a_ij without building the [Tq, Tk, Dh] tensors.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Literal

import torch
from pydantic import Field
from torch import nn

from models.positional.base import F32, AttentionKind, AttentionPE, Plot, Share, Use, largest
from utils.schema import Section

if TYPE_CHECKING:
    from models.transformer_config import TransformerConfig as ModelConfig  # the composed class is one


class ShawConfig(Section):
    """Relative position representations (Shaw et al. 2018)."""

    max_distance: int = Field(16, ge=1, le=1_000_000, description="k: relative distances are clipped to [-k, k], so 2k "
                              "+ 1 learned embeddings per layer.")
    values: bool = Field(False, description="Also add learned relative embeddings to the values (Shaw et al.'s "
                         "a_V), which needs the slower explicit attention path.")


class ShawPE(AttentionPE):
    """Clipped relative key (and optionally value) embeddings ``key_embed``/``value_embed`` [2k+1, Dh].

    Initialised N(0, d_model^-0.5) here (the model's ``_init_weights`` leaves positional modules alone).
    """

    settings = ("shaw", ShawConfig)
    shift_invariant = True  # the integer distance j - i, clipped (positions: "integer")

    title = "Shaw relative positions"
    summary = (
        "Learned vectors for each relative distance j - i, clipped to ±`model.shaw.max_distance`, are added to the "
        "keys when scores are computed (a^K) and, with `model.shaw.values`, to the values when the output is summed "
        "(a^V). The vectors are shared by the heads of a layer; every layer has its own."
    )
    paper = ("Peter Shaw, Jakob Uszkoreit, Ashish Vaswani (2018). Self-Attention with Relative Position "
             "Representations. NAACL 2018, arXiv:1803.02155.")
    formula = (r"e_{ij} = \frac{q_i \cdot (k_j + a^K_{ij})}{\sqrt{d_h}}, \qquad z_i = \sum_j \alpha_{ij} "
               r"\,(v_j + a^V_{ij}), \qquad a^{K,V}_{ij} = w^{K,V}_{\mathrm{clip}(j - i,\,k)}, \quad "
               r"\mathrm{clip}(x, k) = \max(-k, \min(k, x))")
    notes = (
        "The a^K term depends on the query, so it is computed per distance (q·w^K, then gathered) and added to the "
        "scores, keeping the fast fused attention. The a^V term needs the attention weights themselves, so "
        "`model.shaw.values=true` takes the slower explicit attention path. Parameters per layer: (2k + 1)·d_h, "
        "twice that with a^V."
    )
    ct2_export = "CTranslate2's relative position keys and values (the values are zeros without a^V)."

    def __init__(self, cfg: ModelConfig, kind: AttentionKind) -> None:
        super().__init__(cfg, kind)
        self.max_distance = cfg.shaw.max_distance
        size = 2 * self.max_distance + 1
        self.key_embed = nn.Embedding(size, self.head_dim)
        nn.init.normal_(self.key_embed.weight, 0.0, cfg.d_model**-0.5)
        self.value_embed: nn.Embedding | None = None
        if cfg.shaw.values:
            self.needs_explicit = True  # instance attribute: shadows the ClassVar default
            self.value_embed = nn.Embedding(size, self.head_dim)
            nn.init.normal_(self.value_embed.weight, 0.0, cfg.d_model**-0.5)

    @classmethod
    def memory(cls, cfg: ModelConfig, kind: AttentionKind, use: Use) -> Share:
        """The tables ``[2k+1, Dh]`` (two with a^V); per forward the scores of every query against each distance,
        ``[B, H, Tq, 2k+1]`` (three such with a^V), the gathered ``[B, H, Tq, Tk]`` and the index ``[T, T]``."""
        size, tables = 2 * cfg.shaw.max_distance + 1, 1 + cfg.shaw.values
        params = F32 * size * (cfg.d_model // cfg.n_heads) * tables
        per_distance = F32 * use.tokens * cfg.n_heads * size * (1 + 2 * cfg.shaw.values)
        rest = F32 * use.tokens * cfg.n_heads * use.length * tables + 24 * use.length**2
        return Share(parameters=params, working=per_distance + rest,
                     key=largest(("model.shaw.max_distance", 4 * params + per_distance), ("data.max_len", rest)))

    def relative_index(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """q_pos ``[Tq]``, k_pos ``[Tk]`` -> clip(j - i, -k, k) + k in [0, 2k], ``[Tq, Tk]``."""
        rel = k_pos[None, :].long() - q_pos[:, None].long()
        return rel.clamp(-self.max_distance, self.max_distance) + self.max_distance

    def bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor, q: torch.Tensor | None = None) -> torch.Tensor:
        """q ``[B, H, Tq, Dh]`` -> ``[B, H, Tq, Tk]`` = einsum('bhqd,qkd->bhqk', q, a^K) / sqrt(Dh)."""
        assert q is not None, "Shaw's key term needs q"
        per_distance = q @ self.key_embed.weight.to(q.dtype).T  # [B, H, Tq, 2k+1]
        index = self.relative_index(q_pos, k_pos).expand(*q.shape[:2], -1, -1)
        return per_distance.gather(-1, index) / math.sqrt(self.head_dim)

    def values(self, attn: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor | None:
        """attn ``[B, H, Tq, Tk]`` -> ``[B, H, Tq, Dh]`` = einsum('bhqk,qkd->bhqd', attn, a^V); None without a^V."""
        if self.value_embed is None:
            return None
        index = self.relative_index(q_pos, k_pos).expand(*attn.shape[:2], -1, -1)
        per_distance = attn.new_zeros(*attn.shape[:3], self.value_embed.num_embeddings)
        per_distance = per_distance.scatter_add(-1, index, attn)  # weight summed per clipped distance
        return per_distance @ self.value_embed.weight.to(attn.dtype)

    def plots(self, what: str, length: int) -> list[Plot]:
        """``position/shaw/<kind>``: the learned tables themselves (distance x dim), their score term depending on q."""
        tables = {"a^K (keys)": self.key_embed.weight}
        if self.value_embed is not None:
            tables["a^V (values)"] = self.value_embed.weight
        return [Plot(f"position/shaw/{self.kind}", "relative_tables",
                     (tables, self.max_distance, f"{what}: relative tables (k={self.max_distance})"))]

    @classmethod
    def ct2_stack(cls, cfg: ModelConfig, side: Literal["encoder", "decoder"]) -> dict[str, Any]:
        return {"relative_position": True}

    def ct2_fill(self, spec: Any, length: int) -> None:
        """CTranslate2's Shaw keys and values (zeros without a^V), ``[2k+1, Dh]`` each."""
        keys = self.key_embed.weight.detach().float().cpu()
        values = torch.zeros_like(keys) if self.value_embed is None else self.value_embed.weight.detach().float().cpu()
        spec.relative_position_keys = keys.numpy()
        spec.relative_position_values = values.numpy()
