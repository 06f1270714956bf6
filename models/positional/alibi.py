"""ALiBi, attention with linear biases (Press et al. 2022, "Train Short, Test Long", sec. 3).

No parameters: head h adds -m_h * distance to its attention scores, softmax(q_i k^T + m_h * [-(i-1), ..., -1, 0])
in the paper's causal notation. Slopes are geometric (the official ``get_slopes``): for n heads, n a power of 2,
m_h = 2^(-8h/n), h = 1..n; otherwise the slopes for the closest power of 2 below n, followed by every other slope
for twice that power until there are n. Encoder self- and cross-attention use the symmetric -m_h |i - j|; the
decoder uses the paper's causal -m_h (i - j) (keys after the query are masked anyway).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Literal

import torch

from models.positional.base import F32, AttentionKind, AttentionPE, Plot, Share, Use

if TYPE_CHECKING:
    from models.transformer_config import TransformerConfig as ModelConfig  # the composed class is one


def alibi_slopes(n_heads: int) -> list[float]:
    """Head slopes m_1 .. m_n (Press et al.'s ``get_slopes``), e.g. 8 heads -> 1/2, 1/4, ..., 1/256."""
    if n_heads <= 0:
        raise ValueError(f"n_heads must be positive, got {n_heads}")
    if n_heads & (n_heads - 1) == 0:  # a power of 2
        return [2.0 ** (-8.0 * h / n_heads) for h in range(1, n_heads + 1)]
    closest = 2 ** math.floor(math.log2(n_heads))
    return alibi_slopes(closest) + alibi_slopes(2 * closest)[0::2][: n_heads - closest]


class ALiBiPE(AttentionPE):
    """Fixed linear distance penalty per head, given to the fused attention as a float mask."""

    positions = "real"  # -m_h times any real distance
    shift_invariant = True

    title = "ALiBi"
    summary = (
        "Each head subtracts from its attention scores a penalty proportional to the distance between query and "
        "key, with a fixed slope per head (a geometric sequence: 1/2, 1/4, ..., 1/256 for 8 heads). No "
        "parameters and nothing added to the embeddings; attention is pushed towards nearby tokens, more strongly "
        "in some heads than in others, which is meant to let a model trained on short inputs read longer ones."
    )
    paper = ("Ofir Press, Noah A. Smith, Mike Lewis (2022). Train Short, Test Long: Attention with Linear Biases "
             "Enables Input Length Extrapolation. ICLR 2022, arXiv:2108.12409.")
    formula = (r"s_{ij} = \frac{q_i \cdot k_j}{\sqrt{d_h}} - m_h\,|i - j| \ \text{(encoder, cross)}, \qquad "
               r"s_{ij} = \frac{q_i \cdot k_j}{\sqrt{d_h}} - m_h\,(i - j) \ \text{(decoder)}, \qquad "
               r"m_h = 2^{-8h/H}")
    notes = (
        "The slopes are the official `get_slopes`: m_h = 2^(-8h/H) for H a power of 2; otherwise the slopes of the "
        "closest power of 2 below H, then every other slope of twice that power until there are H. The encoder's "
        "symmetric -m_h |i - j| cannot tell a key before the query from one after it."
    )
    ct2_export = ("Decoder: CTranslate2's own (causal) ALiBi. Encoder: a T5-style relative bias table with one "
                  "exact bucket per distance below the exported length.")

    def __init__(self, cfg: ModelConfig, kind: AttentionKind) -> None:
        super().__init__(cfg, kind)
        slopes = torch.tensor(alibi_slopes(cfg.n_heads), dtype=torch.float32)
        self.register_buffer("slopes", slopes, persistent=False)  # [H]

    @classmethod
    def memory(cls, cfg: ModelConfig, kind: AttentionKind, use: Use) -> Share:
        """The slopes ``[H]``; each forward's distances ``[T, T]`` and bias ``[H, T, T]``."""
        return Share(buffers=F32 * cfg.n_heads, working=(16 + F32 * cfg.n_heads) * use.length**2, key="data.max_len")

    def bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor, q: torch.Tensor | None = None) -> torch.Tensor:
        """q_pos ``[Tq]``, k_pos ``[Tk]`` -> ``[1, H, Tq, Tk]``: -m_h |i - j| (decoder: -m_h (i - j))."""
        dist = (q_pos[:, None] - k_pos[None, :]).to(self.slopes.dtype)  # i - j, [Tq, Tk]
        if self.kind != "decoder":
            dist = dist.abs()
        return -self.slopes[None, :, None, None] * dist[None, None]

    def plots(self, what: str, length: int) -> list[Plot]:
        return [self.bias_plot(what, length)]

    @classmethod
    def ct2_stack(cls, cfg: ModelConfig, side: Literal["encoder", "decoder"]) -> dict[str, Any]:
        """Decoder: CTranslate2's own (causal) ALiBi; encoder: a relative bias table (see ``ct2_fill``)."""
        return {"alibi": True} if side == "decoder" else {"relative_attention_bias": True}

    def ct2_fill(self, spec: Any, length: int) -> None:
        """Encoder: the symmetric ALiBi as a T5-style relative bias table with an exact bucket for every distance
        below ``length``, each holding -m_h |j - i| (``exact_bias_table``). Decoder: nothing (native)."""
        from models.positional.t5 import exact_bias_table

        if self.kind == "decoder":
            return
        spec.relative_attention_bias, spec.relative_attention_max_distance = exact_bias_table(self, length)
