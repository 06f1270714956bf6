"""Sandwich (Chi et al. 2023, "Dissecting Transformer Length Extrapolation via the Lens of Receptive Field
Analysis", ACL): the inner product of sinusoidal position embeddings as a parameter-free attention bias.

Of the score between (x_i + p_i) and (x_j + p_j), Sandwich keeps only the position-position term p_i . p_j and
adds it to the scores as a bias. With d' = ``model.sandwich.dim`` and p_i = [cos(i w_k), sin(i w_k)], k = 1 .. d'/2,
w_k = 10000^(-2k/d'), head h = 1 .. H adds

    b_h(i, j) = (p_i . p_j - d'/2) / r_h = (sum_{k=1}^{d'/2} cos((i - j) / 10000^(2k/d')) - d'/2) / r_h,   r_h = 8h/H

p_i . p_j = sum_k cos((i - j) w_k) depends on i - j alone and decays (not monotonically) with |i - j|, roughly
logarithmically; r_h, the same 8h/H that sets ALiBi's slope 2^(-8h/H) (the paper's Figure 1), compresses it per
head so heads get different receptive fields. Subtracting d'/2 makes b_h(i, i) = 0 and every bias <= 0 like
ALiBi's; it is a constant per head, which the softmax ignores.

Sources (the paper's Sandwich section and the official code were not in the searchable index, so no equation
number is given): NVIDIA NeMo's ``SandwichRelativePositionEmbedding``
(``nemo/collections/nlp/modules/common/megatron/position_embedding/sandwich_relative_position_embedding.py``):
k = 1 .. d'/2, the - d'/2 offset and the division by 8h/H as above, with d' the head dimension; and
attention-gym's ``generate_sandwich_bias`` (``attn_gym/mods/sandwich.py``): the same 8h/H, d' = 128 ("paper uses
128"), k = 0 .. d'/2 - 1 (the rows of the usual sinusoid table) and no offset. This follows the k = 1 .. d'/2 of
the formula as written (and NeMo), with d' = 128 by default (set ``model.sandwich.dim`` to the head dimension for
NeMo's choice).

Computed as the paper states it, an inner product: p of each position once per forward (float64, shared by every
layer through ``self.shared``), then ``[Tq, d'] @ [d', Tk]``; no [Tq, Tk, d'/2] tensor of cosines. Encoder self-
and cross-attention use it as is (cos is even: symmetric); the decoder's keys after the query are masked (causal).

CTranslate2: a function of j - i alone, the same in every layer: exported exactly as a T5-style relative bias table
with one bucket per distance below the exported length (``models.positional.t5.exact_bias_table``), both sides.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from pydantic import Field

from models.positional.base import F32, F64, AttentionKind, Share, Use, largest
from models.positional.t5 import DistanceBiasPE
from utils.schema import ConfigError, Section

if TYPE_CHECKING:
    from models.transformer_config import Experiment as Config
    from models.transformer_config import TransformerConfig as ModelConfig  # the composed class is one


class SandwichConfig(Section):
    """Sandwich (Chi et al. 2023): the sinusoid dimension d' of the position inner product."""

    dim: int = Field(128, ge=2, le=65536, description="d', the dimension of the sinusoidal embeddings whose inner "
                     "product is the bias (d'/2 frequencies 10000^(-2k/d')); even.")


def sandwich_embeddings(positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """positions ``[T]``, w_k ``[d'/2]`` -> p ``[T, d']`` float64: [cos(i w_k), sin(i w_k)]."""
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    return torch.cat((angles.cos(), angles.sin()), dim=-1)


class SandwichPE(DistanceBiasPE):
    """Parameter-free: buffers w_k ``inv_freq`` [d'/2] and r_h ``ratio`` [H] (float64, not saved)."""

    positions = "real"  # sinusoids of any real position
    shift_invariant = True  # p_i . p_j depends on i - j only

    settings = ("sandwich", SandwichConfig)

    title = "Sandwich"
    summary = (
        "Keeps only the position-by-position term of sinusoidal embeddings, the inner product p_i·p_j, and adds it "
        "to the attention scores as a bias, divided by a per-head ratio like ALiBi's slopes. No parameters; the bias "
        "depends on i - j only and decays, roughly logarithmically and not monotonically, with the distance."
    )
    paper = ("Ta-Chung Chi, Ting-Han Fan, Alexander I. Rudnicky, Peter J. Ramadge (2023). Dissecting Transformer "
             "Length Extrapolation via the Lens of Receptive Field Analysis. ACL 2023, arXiv:2212.10356.")
    formula = (r"b_h(i, j) = \frac{1}{r_h} \left( \sum_{k=1}^{d'/2} \cos\frac{i - j}{10000^{2k/d'}} - "
               r"\frac{d'}{2} \right), \qquad r_h = \frac{8h}{H}")
    notes = (
        "d' is `model.sandwich.dim` (128, the value the paper uses). Subtracting d'/2, a constant per head that the "
        "softmax ignores, makes b_h(i, i) = 0 and every bias ≤ 0, as NVIDIA NeMo's implementation does; set "
        "`model.sandwich.dim` to the head dimension for NeMo's choice of d'."
    )

    def __init__(self, cfg: ModelConfig, kind: AttentionKind) -> None:
        super().__init__(cfg, kind)
        self.dim = cfg.sandwich.dim
        k = torch.arange(1, self.dim // 2 + 1, dtype=torch.float64)
        self.register_buffer("inv_freq", 10000.0 ** (-2.0 * k / self.dim), persistent=False)
        h = torch.arange(1, cfg.n_heads + 1, dtype=torch.float64)
        self.register_buffer("ratio", 8.0 * h / cfg.n_heads, persistent=False)

    @classmethod
    def memory(cls, cfg: ModelConfig, kind: AttentionKind, use: Use) -> Share:
        """w_k ``[d'/2]`` and r_h ``[H]`` (float64); per forward the embeddings ``[T, d']`` (float64, built through
        angles, cosines and sines, kept in the model's memo of a few positions tensors) and the bias ``[H, T, T]``."""
        embeddings = 7 * F64 * use.length * cfg.sandwich.dim
        grid = (2 * F64 + (F64 + F32) * cfg.n_heads) * use.length**2
        return Share(buffers=F64 * (cfg.sandwich.dim // 2 + cfg.n_heads), working=embeddings + grid,
                     key=largest(("model.sandwich.dim", embeddings), ("data.max_len", grid)))

    @classmethod
    def check(cls, cfg: Config, key: str) -> None:
        dim = cfg.model.sandwich.dim
        if dim % 2:
            raise ConfigError(f"model.sandwich.dim: {key}=sandwich pairs a cosine with a sine per frequency, "
                              f"so the dimension must be even, got {dim}")

    def embeddings(self, positions: torch.Tensor) -> torch.Tensor:
        """positions ``[T]`` -> p ``[T, d']``, computed once per positions tensor and shared by every layer."""
        return self.shared.get(positions, ("sandwich", self.dim),
                               lambda: sandwich_embeddings(positions, self.inv_freq))

    def bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor, q: torch.Tensor | None = None) -> torch.Tensor:
        """q_pos ``[Tq]``, k_pos ``[Tk]`` -> ``[1, H, Tq, Tk]`` float32: (p_i . p_j - d'/2) / r_h."""
        p_q = self.embeddings(q_pos)
        p_k = p_q if k_pos is q_pos else self.embeddings(k_pos)
        dots = p_q @ p_k.T - self.dim / 2  # [Tq, Tk]
        return (dots[None] / self.ratio[:, None, None]).float()[None]
