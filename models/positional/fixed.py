"""Fixed (untrained) input-level encodings with a hard length limit: one-hot, Gaussian window, binary code.

All are deterministic functions of the config, kept as non-persistent buffers (or computed on the fly),
so they add no parameters and nothing to checkpoints.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from models.positional.absolute import PositionLimitError
from models.positional.base import F32, F64, InputPE, Plot, Share, Use
from utils.schema import ConfigError

if TYPE_CHECKING:
    from models.transformer_config import Experiment as Config
    from models.transformer_config import TransformerConfig as ModelConfig  # the composed class is one


def check_length(length: int, limit: int, what: str) -> None:
    """Raise ``PositionLimitError`` (one line) if ``length > limit``; ``what`` names the limit and its config key."""
    if length > limit:
        raise PositionLimitError(f"sequence of {length} tokens exceeds {what}")


def gaussian_table(length: int, dim: int, sigma: float) -> torch.Tensor:
    """PE[i, j] = exp(-(j - i)^2 / (2 sigma^2)): the one-hot row i smoothed by a normal window. -> [length, dim]."""
    i = torch.arange(length, dtype=torch.float64)[:, None]
    j = torch.arange(dim, dtype=torch.float64)[None, :]
    return torch.exp(-((j - i) ** 2) / (2.0 * sigma**2)).float()


def binary_bits(positions: torch.Tensor, n_bits: int) -> torch.Tensor:
    """positions ``[T]`` -> their bits ``[T, n_bits]`` (0/1, least significant first), as float."""
    shifts = torch.arange(n_bits, device=positions.device)
    return ((positions[:, None] >> shifts) & 1).float()


class _FixedTablePE(InputPE):
    """A fixed ``[d_model, d_model]`` table (row i = position i) added to the embeddings; limit ``d_model``."""

    name: str = ""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        self.max_length = cfg.d_model
        self.register_buffer("cached", self.build(cfg), persistent=False)

    @classmethod
    def length_limit(cls, cfg: ModelConfig) -> tuple[int, str]:
        return cfg.d_model, f"model.d_model={cfg.d_model}"

    @classmethod
    def memory(cls, cfg: ModelConfig, use: Use) -> Share:
        """The float32 ``[d_model, d_model]`` table, built through float64 ``[d_model, d_model]`` steps."""
        return Share(buffers=F32 * cfg.d_model**2, working=4 * F64 * cfg.d_model**2, key="model.d_model")

    def build(self, cfg: ModelConfig) -> torch.Tensor:
        raise NotImplementedError

    def limit_message(self) -> str:
        return f"the {self.name} position table (model.d_model={self.max_length} positions)"

    def table(self, length: int) -> torch.Tensor:
        check_length(length, self.max_length, self.limit_message())
        return self.cached[:length]

    def embed(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        check_length(int(positions.max()) + 1, self.max_length, self.limit_message())
        return x + self.cached[positions].to(x.dtype)


class OneHotPE(_FixedTablePE):
    """One-hot positions: PE[i] = e_i (dimension i set to 1), added to ``x [B, T, D]``; needs T <= d_model."""

    name = "one-hot"

    title = "One-hot positions"
    summary = (
        "Position i adds 1 to dimension i of its token embedding: a fixed, untrained code in which every two "
        "positions are equally far apart (no notion of nearness). It needs a dimension per position, so sentences "
        "are limited to `model.d_model` tokens."
    )
    formula = r"h_i = x_i + e_i, \qquad e_i \in \{0, 1\}^d \text{ the } i\text{-th unit vector}, \quad i < d"

    def build(self, cfg: ModelConfig) -> torch.Tensor:
        return torch.eye(cfg.d_model)


class GaussianPE(_FixedTablePE):
    """One-hot positions smoothed by a normal window of width ``model.gaussian_sigma``.

    PE[i, j] = exp(-(j - i)^2 / (2 sigma^2)) (peak 1 at j = i), added to ``x [B, T, D]``; needs T <= d_model.
    """

    name = "Gaussian"

    title = "Gaussian-window positions"
    summary = (
        "The one-hot code smoothed by a normal window of width `model.gaussian_sigma`: position i adds a bump "
        "centred on dimension i, so nearby positions get overlapping vectors. Fixed and untrained; limited to "
        "`model.d_model` tokens like `onehot`."
    )
    formula = r"h_i = x_i + P_i, \qquad P_{i,j} = \exp\left(-\frac{(j - i)^2}{2\sigma^2}\right), \quad i < d"
    reads = ("gaussian_sigma",)
    owns = ("gaussian_sigma",)

    def build(self, cfg: ModelConfig) -> torch.Tensor:
        return gaussian_table(cfg.d_model, cfg.d_model, cfg.gaussian_sigma)


class BinaryPE(InputPE):
    """Binary position code concatenated to a narrowed token embedding.

    n_bits = ceil(log2(max_positions)); ``x [B, T, D]`` -> ``cat(x[..., :D - n_bits], bits(pos))`` ``[B, T, D]``,
    bits least significant first, values 0/1. Represents positions < 2**n_bits (>= ``model.max_positions``).
    """

    title = "Binary position code"
    summary = (
        "The last n = ⌈log2 `model.max_positions`⌉ dimensions of each token embedding are replaced by the bits of "
        "its position (0/1, least significant first): a compact, fixed code, concatenated rather than added. It "
        "represents 2^n positions."
    )
    formula = (r"h_i = \big[\, x_{i,1}, \dots, x_{i,d-n},\ b_0(i), \dots, b_{n-1}(i) \,\big], \qquad "
               r"b_k(i) = \lfloor i / 2^k \rfloor \bmod 2, \quad n = \lceil \log_2 N \rceil")
    reads = ("max_positions",)
    ct2_export = ("The last n dimensions of CTranslate2's token table are zeroed, and the bits become its additive "
                  "position table.")

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        self.n_bits = (cfg.max_positions - 1).bit_length()  # = ceil(log2(max_positions)), exactly
        if self.n_bits >= cfg.d_model:
            raise ValueError(
                f"input_pe=binary needs {self.n_bits} bits for model.max_positions={cfg.max_positions}, "
                f"which leaves no room in model.d_model={cfg.d_model}"
            )
        self.max_length = 2**self.n_bits

    @classmethod
    def length_limit(cls, cfg: ModelConfig) -> tuple[int, str]:
        return 2 ** (cfg.max_positions - 1).bit_length(), f"model.max_positions={cfg.max_positions}"

    @classmethod
    def memory(cls, cfg: ModelConfig, use: Use) -> Share:
        """No table: the bits of each forward's positions, ``[T, n_bits]``."""
        return Share(working=F32 * use.length * (cfg.max_positions - 1).bit_length())

    @classmethod
    def check(cls, cfg: Config, key: str = "model.input_pe") -> None:
        bits = (cfg.model.max_positions - 1).bit_length()
        if bits >= cfg.model.d_model:
            raise ConfigError(f"{key}=binary needs {bits} bits for model.max_positions="
                              f"{cfg.model.max_positions}, which leaves no room in model.d_model={cfg.model.d_model}")
        super().check(cfg, key)

    def limit_message(self) -> str:
        return (
            f"the {self.n_bits}-bit binary position code ({self.max_length} positions, "
            f"from model.max_positions={self.cfg.max_positions})"
        )

    def table(self, length: int) -> torch.Tensor:
        """The position part ``[length, D]`` (zeros, then the bits): it *replaces* the last n_bits dims, not added."""
        check_length(length, self.max_length, self.limit_message())
        out = torch.zeros(length, self.cfg.d_model)
        out[:, self.cfg.d_model - self.n_bits :] = binary_bits(torch.arange(length), self.n_bits)
        return out

    def plots(self, name: str, length: int, sides: dict[str, InputPE]) -> tuple[list[Plot], list[str]]:
        """The bits that replace the last n_bits dims, and the cosine between whole position codes."""
        what, bits, table = f"input_pe={name}", self.n_bits, self.table(length)
        note = f"{what}: the plots show the {bits}-bit code that replaces the last {bits} embedding dims"
        return [Plot("position/input/heatmap", "pe_heatmap",
                     (table[:, -bits:], f"{what}: bits (least significant first) replacing the last {bits} dims")),
                Plot("position/input/cosine", "pe_cosine", (table, f"{what}: cosine between position codes"))], [note]

    def ct2_token_weight(self, weight: torch.Tensor, scale: float) -> torch.Tensor:
        """The last n_bits dimensions are replaced by the position's bits: zero them in the token table."""
        weight = weight.clone()
        weight[:, weight.shape[1] - self.n_bits :] = 0.0
        return weight

    def embed(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        check_length(int(positions.max()) + 1, self.max_length, self.limit_message())
        bits = binary_bits(positions, self.n_bits).to(x.dtype).expand(*x.shape[:-1], self.n_bits)
        return torch.cat([x[..., : x.shape[-1] - self.n_bits], bits], dim=-1)
