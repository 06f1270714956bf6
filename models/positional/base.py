"""The positional-encoding interface: one registry, two levels, four hooks.

An *input-level* encoding acts once, on the scaled token embeddings (hook ``embed``). An
*attention-level* encoding acts inside every attention layer it applies to, through up to three
hooks: ``rotate`` (transform q and k, e.g. RoPE), ``bias`` (additive scores given to
``scaled_dot_product_attention`` as a float mask, e.g. ALiBi/T5) and ``values`` (an extra term added
to the attention output, which needs the explicit attention path, e.g. Shaw et al.'s a_V).

Positions are explicit ``LongTensor [T]`` (shared by the batch: padding is on the right), so a
KV-cached decoding step passes its true offset and the same code serves training and inference.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

import torch
from torch import nn

from models.config import ConfigError, ModelConfig

if TYPE_CHECKING:
    from models.config import Experiment as Config

AttentionKind = Literal["encoder", "decoder", "cross"]


class InputPE(nn.Module):
    """Input-level encoding: ``embed(x [B, T, D], positions [T]) -> [B, T, D]``."""

    level: ClassVar[str] = "input"
    #: Longest sequence the encoding can represent (None: unbounded).
    max_length: int | None = None

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg

    @classmethod
    def length_limit(cls, cfg: ModelConfig) -> tuple[int, str] | None:
        """(positions the encoding represents, the key that sets them) for ``cfg``, or None if unbounded."""
        return None

    @classmethod
    def check(cls, cfg: Config) -> None:
        """ConfigError, one line, for settings this encoding cannot train with (validation calls it): by
        default, a length limit below the longest training sequence (``data.max_len`` tokens and eos/bos)."""
        limit = cls.length_limit(cfg.model)
        need = cfg.data.max_len + 1
        if limit is not None and limit[0] < need:
            raise ConfigError(f"model.input_pe={cfg.model.input_pe} represents {limit[0]} positions ({limit[1]}), "
                              f"fewer than the {need} of a data.max_len={cfg.data.max_len} sentence with its eos")

    def embed(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.embed(x, positions)

    def table(self, length: int) -> torch.Tensor | None:
        """The ``[length, D]`` table added to embeddings, for plots; None if it has none."""
        return None


class AttentionPE(nn.Module):
    """Attention-level encoding, built once per attention layer it applies to.

    ``kind`` says which attention it serves (encoder self, decoder self, or cross), so a scheme can be
    bidirectional in the encoder and causal in the decoder.
    """

    level: ClassVar[str] = "attention"
    #: Whether ``values`` is implemented (forces the explicit attention path).
    needs_explicit: ClassVar[bool] = False

    def __init__(self, cfg: ModelConfig, kind: AttentionKind) -> None:
        super().__init__()
        self.cfg = cfg
        self.kind = kind
        self.head_dim = cfg.d_model // cfg.n_heads

    @classmethod
    def check(cls, cfg: Config, key: str) -> None:
        """ConfigError, one line, for settings this encoding cannot run with; ``key`` names the setting that
        chose it (model.attention_pe or model.cross_attention_pe). Validation calls it."""

    def rotate(
        self, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q ``[B, H, Tq, Dh]``, k ``[B, H, Tk, Dh]`` -> the same shapes. Identity by default."""
        return q, k

    def bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor, q: torch.Tensor | None = None) -> torch.Tensor | None:
        """Additive scores ``[1 or B, H, Tq, Tk]`` (added before softmax), or None."""
        return None

    def values(self, attn: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor | None:
        """Extra output term from weights ``[B, H, Tq, Tk]`` -> ``[B, H, Tq, Dh]``, or None."""
        return None


class NoInputPE(InputPE):
    """No input-level position information (the encoder is then permutation-equivariant)."""

    def embed(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return x
