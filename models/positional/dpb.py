"""Dynamic position bias: a small MLP of the signed relative distance, one output per head. The 1-D form that
x-transformers' ``DynamicPositionBias`` (``x_transformers/x_transformers.py``) gives to the DPB of CrossFormer
(Wang et al. 2022, "CrossFormer: A Versatile Vision Transformer Hinging on Cross-scale Attention", ICLR 2022,
arXiv:2108.00154), an MLP of the relative coordinates of two image patches; the simpler relative of FIRE.

Head h adds to the score of query i and key j

    b_h(i, j) = g(x)_h,     x = i - j,   or with ``model.dpb.log_distance``  x = sign(i - j) log(|i - j| + 1)

g: ``depth`` blocks Linear -> (LayerNorm if ``model.dpb.norm``) -> SiLU of width w (the first from the one input x),
then Linear(w, H). Defaults are x-transformers' (``AttentionLayers(dynamic_pos_bias=True)``): w = d_model // 4,
depth 2, no LayerNorm, no log; PyTorch's default ``nn.Linear`` initialisation (the model's ``_init_weights`` leaves
positional modules alone), as there. The LayerNorm is ``nn.LayerNorm`` in every block, as in earlier x-transformers
versions; recent ones make the first block's bias-free (w parameters fewer, the same function at initialisation).
With the raw distance the untrained g is close to linear in i - j, so attention starts tilted by position: across a
40-token sentence the bias spans 4.1 nats per head on average (0.9 to 11.7; d_model 256, 4 heads, 5 seeds), 0.35 with
the log input.

Against FIRE (``models/positional/fire.py``): no normalisation by the query position, so the bias depends on i - j
alone (shift-invariant, exact cached decoding, exported exactly below); and the direction is in the sign of x, so one
MLP serves the bidirectional encoder (FIRE's |i - j| needs a second one; ALiBi's |i - j| cannot tell a sentence from
its reverse). Outside the trained distances g extrapolates as its last SiLU layer does, roughly linearly in x (or in
log |x| with the log).

Computed as x-transformers does: for integer positions the MLP runs once per distance in [min(i - j), max(i - j)]
and the [Tq, Tk] grid indexes the result (x-transformers: -(n-1) .. n-1); real positions (CAPE) run it per pair.
Always in float32 with autocast off: in bf16 the raw distance itself is rounded past 256 (256 and 257 would get one
bias) and the output by up to about 1 at 600 tokens.
x-transformers shares one module across a stack's layers; here every attention layer has its own (as T5 here).

CTranslate2: a function of j - i alone, so every layer exports exactly as a T5-style relative bias table with one
bucket per distance below the exported length (``models.positional.t5.exact_bias_table``), on both sides.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from pydantic import Field
from torch import nn

from models.positional.base import F32, AttentionKind, Share, Use, largest
from models.positional.t5 import DistanceBiasPE
from utils.schema import Section

if TYPE_CHECKING:
    from models.transformer_config import TransformerConfig as ModelConfig  # the composed class is one


class DpbConfig(Section):
    """Dynamic position bias (x-transformers' ``DynamicPositionBias``): the MLP's shape and its input."""

    mlp_width: int | None = Field(None, ge=1, le=65536, description="Hidden units of the MLP; null: `model.d_model` // "
                                  "4 (x-transformers' default).")
    depth: int = Field(2, ge=1, le=64, description="Hidden Linear-SiLU blocks of the MLP (x-transformers' "
                       "`dynamic_pos_bias_mlp_depth`).")
    log_distance: bool = Field(False, description="Feed the MLP sign(i - j) log(|i - j| + 1) instead of the raw "
                               "distance i - j.")
    norm: bool = Field(False, description="LayerNorm before each SiLU (x-transformers' `dynamic_pos_bias_norm`).")


def dpb_mlp(width: int, depth: int, n_heads: int, norm: bool) -> nn.Sequential:
    """g: ``[..., 1] -> [..., n_heads]``, ``depth`` blocks Linear(-> width) [LayerNorm] SiLU, then Linear(width, H)."""
    layers: list[nn.Module] = []
    for n_in in [1] + [width] * (depth - 1):
        layers += [nn.Linear(n_in, width), *([nn.LayerNorm(width)] if norm else []), nn.SiLU()]
    return nn.Sequential(*layers, nn.Linear(width, n_heads))


class DpbPE(DistanceBiasPE):
    """A learned MLP of the signed distance i - j per head (``model.dpb``); parameters: ``mlp`` per layer."""

    positions = "real"  # g of a real number
    shift_invariant = True  # i - j alone

    settings = ("dpb", DpbConfig)

    title = "Dynamic position bias"
    summary = (
        "Each head adds a bias computed by a small learned MLP of the signed distance i - j (or of its signed "
        "logarithm with `model.dpb.log_distance`). The sign tells a key before the query from one after it, so one "
        "MLP serves both directions; the bias depends on i - j alone. The simpler relative of FIRE: no "
        "normalisation by the query's position."
    )
    paper = ("Wenxiao Wang, Lu Yao, Long Chen, Binbin Lin, Deng Cai, Xiaofei He, Wei Liu (2022). CrossFormer: A "
             "Versatile Vision Transformer Hinging on Cross-scale Attention. ICLR 2022, arXiv:2108.00154.")
    formula = (r"b_h(i, j) = g(x)_h, \qquad x = i - j \quad \text{or} \quad x = \mathrm{sign}(i - j)\,"
               r"\log(|i - j| + 1)")
    notes = (
        "g is `model.dpb.depth` blocks Linear → SiLU (a LayerNorm before each SiLU with `model.dpb.norm`) of width "
        "`model.dpb.mlp_width` (null: d_model/4), then one output per head: the 1-D form that x-transformers' "
        "`DynamicPositionBias` gives CrossFormer's bias over image patches, with its defaults. x-transformers shares "
        "one MLP across a stack; here every layer has its own. With the raw distance the untrained bias is nearly "
        "linear in i - j: across a 40-token sentence it spans 4.1 nats per head on average (d_model 256, 4 heads, "
        "5 seeds), 0.35 with the log input. Computed in float32 even under bf16."
    )

    def __init__(self, cfg: ModelConfig, kind: AttentionKind) -> None:
        super().__init__(cfg, kind)
        dpb = cfg.dpb
        self.log_distance = dpb.log_distance
        self.mlp = dpb_mlp(dpb.mlp_width or max(1, cfg.d_model // 4), dpb.depth, cfg.n_heads, dpb.norm)

    @classmethod
    def memory(cls, cfg: ModelConfig, kind: AttentionKind, use: Use) -> Share:
        """The MLP; per forward its blocks' outputs (``[2T - 1, width]`` each, one per distance; ``[T, T, width]``
        under CAPE's real positions, one per pair), kept for the backward, and the bias ``[T, T, H]``."""
        dpb, heads = cfg.dpb, cfg.n_heads
        width = dpb.mlp_width or max(1, cfg.d_model // 4)
        params = F32 * (2 * width + (dpb.depth - 1) * (width**2 + width) + 2 * width * dpb.depth * dpb.norm
                        + width * heads + heads)
        rows = use.length**2 if cfg.augment.method == "cape" else 2 * use.length
        blocks = F32 * rows * (width * dpb.depth * (2 + dpb.norm) + 2)
        grid = (16 + 2 * F32 * heads) * use.length**2
        wide = dpb.mlp_width / max(1, cfg.d_model // 4) if dpb.mlp_width else 1.0  # against the default width
        mlp = "model.dpb.depth" if dpb.depth / 2 > wide else "model.dpb.mlp_width" if dpb.mlp_width else "model.d_model"
        return Share(parameters=params, working=blocks + grid,
                     key=largest((mlp, blocks + 4 * params), ("data.max_len", grid)))

    def features(self, rel: torch.Tensor) -> torch.Tensor:
        """i - j (float) -> the MLP's input x: itself, or sign(i - j) log(|i - j| + 1)."""
        return torch.sign(rel) * torch.log1p(rel.abs()) if self.log_distance else rel

    def bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor, q: torch.Tensor | None = None) -> torch.Tensor:
        """q_pos ``[Tq]``, k_pos ``[Tk]`` -> ``[1, H, Tq, Tk]``: g(x(i - j)), float32."""
        rel = q_pos[:, None] - k_pos[None, :]  # [Tq, Tk]
        with torch.autocast(rel.device.type, enabled=False):  # float32 throughout, never bf16
            if rel.is_floating_point():  # real positions: every pair
                out = self.mlp(self.features(rel.float())[..., None])
            else:  # once per distance, then index
                low, high = torch.stack(torch.aminmax(rel)).tolist()  # one host sync
                distances = torch.arange(low, high + 1, device=rel.device, dtype=torch.float32)
                out = self.mlp(self.features(distances)[:, None])[rel - low]  # [Tq, Tk, H]
        return out.permute(2, 0, 1)[None]
