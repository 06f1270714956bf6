"""Absolute input-level encodings added to the scaled token embeddings."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from models.positional.base import F32, InputPE, Plot, Share, Use

if TYPE_CHECKING:
    from models.transformer_config import TransformerConfig as ModelConfig  # the composed class is one


class PositionLimitError(ValueError):
    """A sequence is longer than a learned position table."""


def sinusoid_table(length: int, dim: int, base: float = 10000.0) -> torch.Tensor:
    """Vaswani et al. 2017, sec. 3.5: PE(t, 2i) = sin(t / base^(2i/d)), PE(t, 2i+1) = cos(...). -> [length, dim]."""
    return sinusoids(torch.arange(length), dim, base)


def sinusoids(positions: torch.Tensor, dim: int, base: float = 10000.0) -> torch.Tensor:
    """The sinusoids of ``sinusoid_table`` at any (real) positions ``[T]`` -> ``[T, dim]`` float32."""
    pos = positions.to(torch.float64)[:, None]
    inv_freq = torch.exp(-math.log(base) * torch.arange(0, dim, 2, dtype=torch.float64, device=pos.device) / dim)
    table = torch.zeros(len(pos), dim, dtype=torch.float64, device=pos.device)
    table[:, 0::2] = torch.sin(pos * inv_freq)
    table[:, 1::2] = torch.cos(pos * inv_freq[: dim // 2])
    return table.float()


class SinusoidalPE(InputPE):
    """Fixed sinusoids (Vaswani et al. 2017), computed for any position: no length limit; real positions (CAPE's
    training augmentation) too."""

    positions = "real"

    title = "Sinusoidal"
    summary = (
        "Adds to each token embedding a fixed vector of sines and cosines of its position, at geometric frequencies "
        "from one cycle per 2π positions down to one per 10000·2π. Nothing is learned, every position has a "
        "vector (no length limit), and the vector of position i + k is a linear function of that of i, which is "
        "how the original Transformer hoped to let attention find relative positions."
    )
    paper = ("Ashish Vaswani, Noam Shazeer, Niki Parmar, Jakob Uszkoreit, Llion Jones, Aidan N. Gomez, Łukasz Kaiser, "
             "Illia Polosukhin (2017). Attention Is All You Need. NeurIPS 2017, arXiv:1706.03762.")
    formula = (r"h_i = x_i + P_i, \qquad P_{i,2k} = \sin\left(\frac{i}{10000^{2k/d}}\right), \quad "
               r"P_{i,2k+1} = \cos\left(\frac{i}{10000^{2k/d}}\right)")

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        self.register_buffer("cached", sinusoid_table(cfg.max_positions, cfg.d_model), persistent=False)

    @classmethod
    def memory(cls, cfg: ModelConfig, use: Use) -> Share:
        """A float32 table of ``model.max_positions`` rows, regrown to the largest position trained on; building
        one takes 16 bytes a value (float64 table, angles and their sines) beside the table it replaces."""
        rows = max(cfg.max_positions, use.positions)
        key = "model.max_positions" if cfg.max_positions >= use.positions else use.positions_key
        old = F32 * cfg.max_positions * cfg.d_model if rows > cfg.max_positions else 0
        return Share(buffers=F32 * rows * cfg.d_model, working=16 * rows * cfg.d_model + old, key=key)

    def table(self, length: int) -> torch.Tensor:
        if length > self.cached.shape[0]:
            self.cached = sinusoid_table(length, self.cfg.d_model).to(self.cached.device)
        return self.cached[:length]

    def embed(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # Computed at the positions asked (integer or real), not looked up: the same floats as the table's rows,
        # and no read of the largest position back to the host (a training step never waits for the device).
        return x + sinusoids(positions, self.cfg.d_model).to(x.dtype)

    def decay(self) -> dict[str, Any]:
        return {"d_model": self.cfg.d_model}


class LearnablePE(InputPE):
    """A learned position table (Gehring et al. 2017; BERT), ``max_positions`` rows, N(0, 0.02) init."""

    title = "Learned absolute positions"
    summary = (
        "Adds a learned vector per position, one row of a table of `model.max_positions` rows initialised "
        "N(0, 0.02²), as in ConvS2S and BERT. The encoder and the decoder have separate tables. A sentence longer "
        "than the table is an error (`test.py` truncates instead, with a warning): positions past the table were "
        "never trained."
    )
    paper = ("Jonas Gehring, Michael Auli, David Grangier, Denis Yarats, Yann N. Dauphin (2017). Convolutional "
             "Sequence to Sequence Learning. ICML 2017, arXiv:1705.03122.")
    formula = r"h_i = x_i + P_i, \qquad P \in \mathbb{R}^{N \times d} \text{ learned}, \quad i < N"
    reads = ("max_positions",)

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        self.max_length = cfg.max_positions
        self.weight = nn.Parameter(torch.randn(cfg.max_positions, cfg.d_model) * 0.02)

    @classmethod
    def length_limit(cls, cfg: ModelConfig) -> tuple[int, str]:
        return cfg.max_positions, f"model.max_positions={cfg.max_positions}"

    @classmethod
    def memory(cls, cfg: ModelConfig, use: Use) -> Share:
        """The learned table ``[max_positions, d_model]`` (its N(0, 1) draw is scaled into a copy)."""
        table = F32 * cfg.max_positions * cfg.d_model
        return Share(parameters=table, working=table, key="model.max_positions")

    def table(self, length: int) -> torch.Tensor:
        return self.weight[:length].detach()

    def embed(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        limit = self.weight.shape[0]
        # Training positions fit the table by validation (data.max_len, augmentation shifts: models/positional/
        # augment.py), so on a GPU only evaluation and decoding check: a training step never waits for the device.
        if (positions.device.type == "cpu" or not self.training) and int(positions.max()) >= limit:
            raise PositionLimitError(
                f"sequence of {int(positions.max()) + 1} tokens exceeds the learned position table "
                f"(model.max_positions={limit})"
            )
        return x + self.weight[positions].to(x.dtype)


class LearnableLNPE(LearnablePE):
    """Learned, pre-layer-normalised positions: ``LayerNorm(x) + P[pos]`` for ``x [B, T, D]`` -> ``[B, T, D]``.

    The token embeddings are layer-normalised (affine, over D) before the learned table ``P``
    (``max_positions`` rows, N(0, 0.02) init, as in ``LearnablePE``) is added, so content and position
    enter at comparable scales (the "learned pre-LN" variant, cf. Wang et al.).
    """

    title = "Learned positions after a LayerNorm"
    summary = (
        "The learned table of `learnable`, added to token embeddings that first go through a LayerNorm (with its "
        "own gain and bias), so that content and position enter at comparable scales. Same length limit, "
        "`model.max_positions`."
    )
    paper = ""
    formula = r"h_i = \mathrm{LayerNorm}(x_i) + P_i, \qquad P \in \mathbb{R}^{N \times d} \text{ learned}"
    ct2_export = ("The LayerNorm depends on the token alone, so it is folded into CTranslate2's token table; the "
                  "learned table becomes its position table.")

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        self.norm = nn.LayerNorm(cfg.d_model)

    @classmethod
    def memory(cls, cfg: ModelConfig, use: Use) -> Share:
        share = super().memory(cfg, use)
        return replace(share, parameters=share.parameters + F32 * 2 * cfg.d_model)  # the LayerNorm's gain and bias

    def embed(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return super().embed(self.norm(x), positions)

    def plots(self, name: str, length: int, sides: dict[str, InputPE]) -> tuple[list[Plot], list[str]]:
        figs, notes = super().plots(name, length, sides)
        return figs, [f"input_pe={name}: the learned table is added to layer-normalised embeddings", *notes]

    def ct2_token_weight(self, weight: torch.Tensor, scale: float) -> torch.Tensor:
        """LN(scale E[w]) + P[pos]: the LayerNorm depends on the token only, so it folds into the token table."""
        with torch.no_grad():
            return self.norm(weight * scale) / scale
