"""Absolute input-level encodings added to the scaled token embeddings."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from models.positional.base import InputPE, Plot

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

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        self.register_buffer("cached", sinusoid_table(cfg.max_positions, cfg.d_model), persistent=False)

    def table(self, length: int) -> torch.Tensor:
        if length > self.cached.shape[0]:
            self.cached = sinusoid_table(length, self.cfg.d_model).to(self.cached.device)
        return self.cached[:length]

    def embed(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if positions.is_floating_point():  # real positions: the sinusoids at those points
            return x + sinusoids(positions, self.cfg.d_model).to(x.dtype)
        table = self.table(int(positions.max()) + 1)
        return x + table[positions].to(x.dtype)

    def decay(self) -> dict[str, Any]:
        return {"d_model": self.cfg.d_model}


class LearnablePE(InputPE):
    """A learned position table (Gehring et al. 2017; BERT), ``max_positions`` rows, N(0, 0.02) init."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        self.max_length = cfg.max_positions
        self.weight = nn.Parameter(torch.randn(cfg.max_positions, cfg.d_model) * 0.02)

    @classmethod
    def length_limit(cls, cfg: ModelConfig) -> tuple[int, str]:
        return cfg.max_positions, f"model.max_positions={cfg.max_positions}"

    def table(self, length: int) -> torch.Tensor:
        return self.weight[:length].detach()

    def embed(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        limit = self.weight.shape[0]
        if int(positions.max()) >= limit:
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

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        self.norm = nn.LayerNorm(cfg.d_model)

    def embed(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return super().embed(self.norm(x), positions)

    def plots(self, name: str, length: int, sides: dict[str, InputPE]) -> tuple[list[Plot], list[str]]:
        figs, notes = super().plots(name, length, sides)
        return figs, [f"input_pe={name}: the learned table is added to layer-normalised embeddings", *notes]

    def ct2_token_weight(self, weight: torch.Tensor, scale: float) -> torch.Tensor:
        """LN(scale E[w]) + P[pos]: the LayerNorm depends on the token only, so it folds into the token table."""
        with torch.no_grad():
            return self.norm(weight * scale) / scale
