"""T5 relative attention bias (Raffel et al. 2020, sec. 2.1; ``_relative_position_bucket`` of the T5 code).

Each head adds a learned scalar b_h(bucket(j - i)) to the score of query i and key j. The relative position
j - i is mapped to one of ``num_buckets`` buckets: bidirectionally (encoder self- and cross-attention) half of
them serve j > i and half j <= i; unidirectionally (decoder, causal) all of them serve j <= i and any j > i
falls in bucket 0. Within a direction, with B buckets and n = |j - i|, the first B/2 buckets are exact
(bucket n for n < B/2); larger n are log-spaced up to ``max_distance``:
B/2 + floor(log(n / (B/2)) / log(max_distance / (B/2)) * (B - B/2)), capped at B - 1.

T5 shares one table across all layers of a stack; here every attention layer has its own (one module per layer).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch
from pydantic import Field
from torch import nn

from models.positional.base import F32, AttentionKind, AttentionPE, Plot, Share, Use, largest
from utils.schema import ConfigError, Section

if TYPE_CHECKING:
    from models.transformer_config import Experiment as Config
    from models.transformer_config import TransformerConfig as ModelConfig  # the composed class is one


def relative_position_bucket(
    relative_position: torch.Tensor, bidirectional: bool = True, num_buckets: int = 32, max_distance: int = 128
) -> torch.Tensor:
    """relative_position (j - i, any shape, long) -> bucket ids in [0, num_buckets), same shape.

    As in T5 (and Hugging Face's port), the log is taken in float32 and truncated toward zero.
    """
    buckets = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative_position > 0).long() * num_buckets
        n = relative_position.abs()
    else:
        n = (-relative_position).clamp(min=0)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    log_ratio = torch.log(n.clamp(min=max_exact).float() / max_exact) / math.log(max_distance / max_exact)
    if_large = (max_exact + (log_ratio * (num_buckets - max_exact)).long()).clamp(max=num_buckets - 1)
    return buckets + torch.where(is_small, n, if_large)


def exact_bias_table(pe: AttentionPE, length: int) -> tuple[np.ndarray, np.int32]:
    """(table ``[buckets, H]``, max_distance) for CTranslate2's T5 relative attention bias that holds ``pe.bias``
    exactly for every distance below ``length``, for an encoding whose bias depends on j - i alone (not on q).

    Half the buckets of a direction are exact (``relative_position_bucket``), so the encoder's bidirectional table
    takes 4 * length buckets and the decoder's unidirectional one (j <= i) 2 * length: distance n < length has
    bucket n of its direction. max_distance (where log-spaced buckets would end) is past them all.
    """
    bidirectional = pe.kind != "decoder"
    buckets = (4 if bidirectional else 2) * length
    rel = torch.arange(-(length - 1), length if bidirectional else 1)  # j - i
    anchor = next(iter(pe.buffers()), None)
    anchor = anchor if anchor is not None else next(iter(pe.parameters()), None)
    device = anchor.device if anchor is not None else None
    with torch.no_grad():  # query length - 1 against keys 0 .. length - 1 (+ length - 1 more bidirectionally)
        values = pe.bias(torch.tensor([length - 1], device=device), rel.to(device) + length - 1)
    assert values is not None and values.shape[0] == 1 and values.shape[2] == 1, "a q-independent bias per head"
    table = torch.zeros(buckets, values.shape[1])
    table[relative_position_bucket(rel, bidirectional, buckets, 2 * buckets)] = values[0, :, 0].T.float().cpu()
    return table.numpy(), np.int32(2 * buckets)


class DistanceBiasPE(AttentionPE):
    """Base of an encoding whose bias depends on j - i alone (KERPLE, Sandwich, DPB): its figure is the bias grid per
    head, and both stacks export exactly to CTranslate2 as a relative bias table (``exact_bias_table``)."""

    ct2_export = ("Both stacks: CTranslate2's T5 relative attention bias, one table per layer, with one exact bucket "
                  "per distance below the exported length.")

    def plots(self, what: str, length: int) -> list[Plot]:
        return [self.bias_plot(what, length)]

    @classmethod
    def ct2_stack(cls, cfg: ModelConfig, side: Literal["encoder", "decoder"]) -> dict[str, Any]:
        """Both sides: CTranslate2's T5 relative attention bias, one table per layer (see ``ct2_fill``)."""
        return {"relative_attention_bias": True}

    def ct2_fill(self, spec: Any, length: int) -> None:
        """This layer's bias as a relative bias table, exact for every distance below ``length``."""
        spec.relative_attention_bias, spec.relative_attention_max_distance = exact_bias_table(self, length)


class T5BiasConfig(Section):
    """T5's bucketed relative attention bias (Raffel et al. 2020)."""

    num_buckets: int = Field(32, ge=2, le=65536, description="Relative-distance buckets, each with one learned bias "
                             "per head. The encoder and cross-attention split them between keys before and after the "
                             "query (so at least 4 there); in each direction half are exact distances, the rest "
                             "log-spaced up to `max_distance`.")
    max_distance: int = Field(128, ge=1, le=1_000_000, description="Distances from this one on share the last bucket; "
                              "must exceed `num_buckets` // 2.")


class T5BiasPE(DistanceBiasPE):
    """Learned per-head scalar bias indexed by a bucketed relative position (``model.t5``).

    The table is ``rel_embed`` [num_buckets, H], initialised N(0, d_model^-0.5) here, as in T5 (the model's
    ``_init_weights`` leaves positional modules alone).
    """

    settings = ("t5", T5BiasConfig)
    shift_invariant = True  # buckets of the integer distance j - i (positions: "integer")

    title = "T5 relative bias"
    summary = (
        "Each head adds a learned scalar to its attention scores, looked up by the bucket of the relative distance "
        "j - i: one bucket per distance for short distances, log-spaced buckets for longer ones, one last bucket "
        "from `model.t5.max_distance` on. Bidirectional in the encoder and cross-attention (half the buckets for "
        "keys after the query), causal in the decoder."
    )
    paper = ("Colin Raffel, Noam Shazeer, Adam Roberts, Katherine Lee, Sharan Narang, Michael Matena, Yanqi Zhou, "
             "Wei Li, Peter J. Liu (2020). Exploring the Limits of Transfer Learning with a Unified Text-to-Text "
             "Transformer. JMLR 21(140), arXiv:1910.10683.")
    formula = (r"s_{ij} = \frac{q_i \cdot k_j}{\sqrt{d_h}} + b_h\big(\mathrm{bucket}(j - i)\big), \qquad "
               r"\mathrm{bucket}(n) = \begin{cases} n & n < B/2 \\ \min\Big(B - 1,\ \frac{B}{2} + \Big\lfloor "
               r"\frac{\log(2n/B)}{\log(2D/B)} \cdot \frac{B}{2} \Big\rfloor\Big) & \text{otherwise} "
               r"\end{cases}")
    notes = (
        "In the formula n = |j - i| within one direction, B the buckets of that direction (half of "
        "`model.t5.num_buckets` in the encoder and cross-attention, all of them in the decoder) and D = "
        "`model.t5.max_distance`. T5 shares one table across the layers of a stack; here every attention layer "
        "has its own (`model.t5.num_buckets` × heads parameters per layer), initialised N(0, 1/d_model)."
    )
    ct2_export = "CTranslate2's T5 relative attention bias: each layer's own table and `max_distance`."

    @classmethod
    def check(cls, cfg: Config, key: str) -> None:
        t5 = cfg.model.t5
        if t5.num_buckets < 4:  # bidirectional (encoder, cross): half the buckets a direction, half of those exact
            raise ConfigError(f"{key}=t5 needs model.t5.num_buckets >= 4 (two directions of at least one exact and "
                              f"one log-spaced bucket), got {t5.num_buckets}")
        if t5.max_distance <= t5.num_buckets // 2:
            raise ConfigError(f"model.t5.max_distance: must exceed the {t5.num_buckets // 2} exact distances of "
                              f"model.t5.num_buckets={t5.num_buckets}, got {t5.max_distance}")

    @classmethod
    def memory(cls, cfg: ModelConfig, kind: AttentionKind, use: Use) -> Share:
        """The table ``[num_buckets, H]``; each forward's bucket ids (int64 steps) ``[T, T]`` and bias ``[H, T, T]``."""
        table, grid = F32 * cfg.t5.num_buckets * cfg.n_heads, (100 + 3 * F32 * cfg.n_heads) * use.length**2
        return Share(parameters=table, working=grid,
                     key=largest(("model.t5.num_buckets", 4 * table), ("data.max_len", grid)))

    def __init__(self, cfg: ModelConfig, kind: AttentionKind) -> None:
        super().__init__(cfg, kind)
        self.num_buckets = cfg.t5.num_buckets
        self.max_distance = cfg.t5.max_distance
        self.bidirectional = kind != "decoder"
        self.rel_embed = nn.Embedding(self.num_buckets, cfg.n_heads)
        nn.init.normal_(self.rel_embed.weight, 0.0, cfg.d_model**-0.5)

    def buckets(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """q_pos ``[Tq]``, k_pos ``[Tk]`` -> bucket ids ``[Tq, Tk]`` of j - i."""
        rel = k_pos[None, :].long() - q_pos[:, None].long()
        return relative_position_bucket(rel, self.bidirectional, self.num_buckets, self.max_distance)

    def bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor, q: torch.Tensor | None = None) -> torch.Tensor:
        """-> ``[1, H, Tq, Tk]``: b_h(bucket(j - i))."""
        return self.rel_embed(self.buckets(q_pos, k_pos)).permute(2, 0, 1)[None]

    def ct2_fill(self, spec: Any, length: int) -> None:
        """CTranslate2's T5 relative bias: this layer's own table ``[num_buckets, H]`` and max_distance."""
        spec.relative_attention_bias = self.rel_embed.weight.detach().float().cpu().numpy()
        spec.relative_attention_max_distance = np.int32(self.max_distance)
