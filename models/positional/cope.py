"""Contextual position encoding, CoPE (Golovneva et al. 2024, "Contextual Position Encoding: Learning to Count
What's Important", eqs. 1-5), for causal (decoder) self-attention only.

A position is not a token count but a sum of gates the query opens on the keys it can see:

    g_ij  = sigmoid(q_i . k_j / sqrt(Dh))                      gate of key j for query i, j <= i
    p_ij  = min(sum_{t=j..i} g_it, npos_max - 1)               contextual position of key j seen from query i
    e(p)  = (p - floor(p)) e[ceil(p)] + (1 - p + floor(p)) e[floor(p)]     interpolated position embedding
    a_ij  = softmax_j((q_i . k_j + q_i . e(p_ij)) / sqrt(Dh))

e[0..npos_max-1] is a learned table E ``[npos_max, Dh]`` (``model.cope.npos_max``), one per layer, shared by the
heads, initialised to zeros; each head computes its own gates and positions from its own q and k. Keys that are
masked (after the query, or padding) have no gate: they are neither counted nor attended.

As the reference implementation does (facebookresearch/RAM, ``projects/cope/src/cope/context_position.py``, and
lucidrains' x-transformers ``CoPE``): q . e(p) is not computed per (i, j) but as ``q @ E^T`` for every integer
position (``[B, H, Tq, npos_max]``), then gathered at floor(p) and ceil(p) and interpolated, which is the same
because q . e(p) is linear in e. The paper writes the scores without the 1/sqrt(Dh) scaling; the reference
divides both the gate logits and the summed logits by sqrt(Dh) (its default, without ``--cope-nodiv``), and so
does this module (the attention layer scales q . k, the CoPE term is returned already divided). The reference's
default ``npos`` is its context length + 1; here ``npos_max`` is a setting (positions beyond it are clipped to
its last row, as the paper allows).

CoPE needs the keys, so it uses the ``logits_bias`` hook (q, k, positions and the mask -> an additive
``[B, H, Tq, Tk]`` term that reaches ``scaled_dot_product_attention`` in its float mask, the fused path); in a
cached decoding step k holds the cached keys, so one new query counts over all of them.

CTranslate2: refused in one line (its positions depend on the keys' content: no table of i - j can hold them).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from pydantic import Field
from torch import nn

from models.positional.base import F32, AttentionKind, AttentionPE, Plot, Share, Use, largest
from utils.schema import Section

if TYPE_CHECKING:
    from models.transformer_config import TransformerConfig as ModelConfig  # the composed class is one


class CopeConfig(Section):
    """Contextual position encoding (Golovneva et al. 2024)."""

    npos_max: int = Field(64, ge=2, le=1_000_000, description="Rows of the learned position table; contextual "
                          "positions (gated counts of keys) are clipped to npos_max - 1.")


class CopePE(AttentionPE):
    """CoPE in decoder self-attention: gates sigma(q.k/sqrt(Dh)) summed from each key to the query give fractional
    positions, whose interpolated embeddings from ``pos_embed`` [npos_max, Dh] add q.e(p)/sqrt(Dh) to the scores."""

    positions = "real"  # positions only order keys (the causal test j <= i); counts come from gates
    shift_invariant = True
    order_only = True  # so no model.augment method changes it

    settings = ("cope", CopeConfig)
    causal_only = True

    title = "CoPE"
    summary = (
        "Contextual positions: instead of counting tokens, each query counts the keys it finds relevant. A gate "
        "σ(q·k) per key is summed from the key to the query, giving a fractional position, whose learned embedding "
        "(interpolated between two table rows) adds q·e(p) to the score. Defined for causal (decoder) "
        "self-attention only."
    )
    paper = ("Olga Golovneva, Tianlu Wang, Jason Weston, Sainbayar Sukhbaatar (2024). Contextual Position Encoding: "
             "Learning to Count What's Important. arXiv:2405.18719.")
    formula = (r"\begin{aligned} g_{ij} &= \sigma\big(q_i \cdot k_j / \sqrt{d_h}\big), \qquad p_{ij} = "
               r"\min\Big(\sum_{t=j}^{i} g_{it},\ N - 1\Big) \\ e(p) &= (p - \lfloor p \rfloor)\, "
               r"e[\lceil p \rceil] + (1 - p + \lfloor p \rfloor)\, e[\lfloor p \rfloor], \qquad s_{ij} = "
               r"\frac{q_i \cdot k_j + q_i \cdot e(p_{ij})}{\sqrt{d_h}} \end{aligned}")
    notes = (
        "N is `model.cope.npos_max`. The table e is learned per layer, shared by the heads and initialised to "
        "zeros, as in the authors' code; each head computes its own gates. Padding and keys after the query are "
        "not counted. Put it in the decoder with `model.decoder_pe.attention=cope`, e.g. RoPE in the encoder and "
        "CoPE in the decoder: `--set model.input_pe=none --set model.encoder_pe.attention=rope "
        "--set model.decoder_pe.attention=cope`. The figure shows the contextual positions p_ij, for random queries "
        "and keys: the untrained table is all zeros."
    )
    figure = "position/cope/positions/decoder"

    def __init__(self, cfg: ModelConfig, kind: AttentionKind) -> None:
        super().__init__(cfg, kind)
        self.npos_max = cfg.cope.npos_max
        self.pos_embed = nn.Parameter(torch.zeros(self.npos_max, self.head_dim))  # zeros, as the reference

    @classmethod
    def memory(cls, cfg: ModelConfig, kind: AttentionKind, use: Use) -> Share:
        """The table ``[npos_max, Dh]``; per forward the scores of every query against each table row,
        ``[B, H, Tq, npos_max]`` (and three more such in the backward: one gradient per gather, their sum), and about
        twenty ``[B, H, Tq, Tk]`` steps (gates, their sums, the gathers)."""
        table = F32 * cfg.cope.npos_max * (cfg.d_model // cfg.n_heads)
        per_position = 4 * F32 * use.tokens * cfg.n_heads * cfg.cope.npos_max
        grid = 80 * use.tokens * cfg.n_heads * use.length
        return Share(parameters=table, working=per_position + grid,
                     key=largest(("model.cope.npos_max", 4 * table + per_position), ("data.max_len", grid)))

    def contextual_positions(
        self, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """q ``[B, H, Tq, Dh]``, k ``[B, H, Tk, Dh]``, q_pos ``[Tq]``, k_pos ``[Tk]``, mask (bool, True = may attend,
        broadcastable to ``[B, H, Tq, Tk]``) or None -> p ``[B, H, Tq, Tk]`` float32 in [0, npos_max - 1]: the sum of
        the gates of keys j..i counted by query i (0 where key j is masked or after the query)."""
        with torch.autocast(q.device.type, enabled=False):  # a sum of up to Tk gates: float32, never bf16
            gates = torch.sigmoid(q.float() @ k.float().transpose(-2, -1) / math.sqrt(self.head_dim))
            counted = k_pos[None, :] <= q_pos[:, None]  # [Tq, Tk]: causal even where the mask leaves it out
            if mask is not None:
                counted = counted & mask
            gates = gates * counted
            return gates.flip(-1).cumsum(-1).flip(-1).clamp(max=self.npos_max - 1)  # p_ij = sum_{t >= j} g_it

    def logits_bias(
        self, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """q ``[B, H, Tq, Dh]``, k ``[B, H, Tk, Dh]`` -> q_i . e(p_ij) / sqrt(Dh), ``[B, H, Tq, Tk]`` float32
        (any value where the mask is False: those scores become -inf)."""
        positions = self.contextual_positions(q, k, q_pos, k_pos, mask)
        with torch.autocast(q.device.type, enabled=False):
            per_position = q.float() @ self.pos_embed.float().T  # [B, H, Tq, npos_max]: q_i . e[p], integer p
            floor = positions.floor()
            ceil_logits = per_position.gather(-1, positions.ceil().long())
            floor_logits = per_position.gather(-1, floor.long())
            weight = positions - floor  # differentiable through the gates; floor and ceil are not
            return (ceil_logits * weight + floor_logits * (1 - weight)) / math.sqrt(self.head_dim)

    def plots(self, what: str, length: int) -> list[Plot]:
        """``position/cope/{table,positions,bias}/<kind>``: the learned table E, and for one sequence of ``length``
        random q, k ~ N(0, 1) (seed 0, the same for both; CoPE depends on q and k, so there is no q-independent
        grid) the contextual positions p_ij and the term q_i . e(p_ij) / sqrt(Dh) each head adds."""
        weight = self.pos_embed.detach()
        g = torch.Generator().manual_seed(0)
        q, k = (torch.randn(1, self.cfg.n_heads, length, self.head_dim, generator=g).to(weight) for _ in range(2))
        pos = torch.arange(length, device=weight.device)
        positions = self.contextual_positions(q, k, pos, pos, None)[0]
        bias = self.logits_bias(q, k, pos, pos, None)[0]
        random = "random q, k ~ N(0, 1), seed 0"
        return [
            Plot(f"position/cope/table/{self.kind}", "pe_heatmap",
                 (weight, f"{what}: table e[0..{self.npos_max - 1}]")),
            Plot(f"position/cope/positions/{self.kind}", "bias_grid",
                 (positions, f"{what}: contextual positions p_ij for {random}"), {"causal": True}),
            Plot(f"position/cope/bias/{self.kind}", "bias_grid",
                 (bias, f"{what}: q.e(p_ij)/sqrt(Dh) added to the scores, {random}"), {"causal": True}),
        ]
