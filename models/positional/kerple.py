"""KERPLE, kernelized relative positional embedding (Chi et al. 2022, "KERPLE: Kernelized Relative Positional
Embedding for Length Extrapolation", NeurIPS): its two practical kernels, the power and the logarithmic variant.

Head h adds a conditionally positive definite kernel of the distance to its scores (the paper's shift to a
positive definite kernel is a constant, which the softmax absorbs):

    kerple_log:    b_h(i, j) = -r1_h * log(1 + r2_h * |i - j|)      r1_h, r2_h > 0
    kerple_power:  b_h(i, j) = -r1_h * |i - j|^r2_h                 r1_h > 0, 0 < r2_h <= 2

r1 and r2 are learned per head, in every attention layer it serves: 2H parameters a layer. In the paper these are
the unnumbered displays of sec. 4 ("Practical Choice"): the composite kernel of its eq. (4) with the bias kernel of
eq. (3) taken from Corollary 1 (b) (log) and (a) (power); the kernels are as the authors' code computes them, below.

Initialisation and positivity follow the authors' code (github.com/chijames/KERPLE, ``megatron/mpu/layers.py``,
``ParallelKerpleLog`` and ``ParallelKerplePower``): uniform draws, log: r1 (their ``bias_p``) ~ U[0, 2),
r2 (``bias_a``) ~ U[0, 1); power: r1 (``bias_a``) ~ U[0, 1), r2 (``bias_p``) ~ U[0, 2). Every forward first
projects the parameters in place, outside autograd (their ``param.data = param.data.clamp(...)``), onto
r >= eps = 1e-2 (and the power's exponent onto [eps, 2]): the optimizer's step starts from the projected value
and the gradient is the kernel's at it (projected gradient descent; a clamp inside the graph would instead
zero the gradient of a parameter once it crossed eps, and leave it stuck there). NVIDIA NeMo's
``KERPLERelativePositionEmbedding`` was read too and not followed: in the version read it initialises the scale
from ALiBi slopes with a constant a = 0 and p = 1, under which -b log(1 + a |i - j|^p) is zero.

The authors' decoder (a causal language model) takes the distance i - j below the diagonal (``tril``). Here every
side uses |i - j|: encoder self- and cross-attention are symmetric, and in the decoder the keys after the query
are masked, so |i - j| is the authors' i - j wherever it counts (and log/power stay finite above the diagonal,
where i - j < 0 would give NaN, even if masked).

Two registry names (``kerple_log``, ``kerple_power``), not one name with a ``model.kerple.kernel`` setting: the
variants are different encodings (different parameters, ranges and initialisations; the paper reports them
separately), so a run's name, figures and README row say which, and every registry-wide test (cached decoding,
fused vs explicit attention, figures, CTranslate2 export) covers both kernels with no parametrisation of its own.

CTranslate2: the bias depends on j - i alone, so every layer exports it exactly as a T5-style relative bias table
with one bucket per distance below the exported length (``models.positional.t5.exact_bias_table``), on both sides.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch
from torch import nn

from models.positional.base import F32, AttentionKind, Share, Use
from models.positional.t5 import DistanceBiasPE

if TYPE_CHECKING:
    from models.transformer_config import TransformerConfig as ModelConfig  # the composed class is one

#: The authors' lower bound for both parameters (``self.eps = 1e-2``).
EPS = 1e-2


class KerplePE(DistanceBiasPE):
    """A learned kernel of |i - j| per head: ``r1``, ``r2`` ``[H]``, U[0, scale) then projected (see the module)."""

    positions = "real"  # |i - j| as a real number
    shift_invariant = True  # the distance alone

    #: U[0, scale) initialisation of r1 and r2 (the authors' ``get_parameter(scale, 'uniform')``).
    r1_scale: ClassVar[float]
    r2_scale: ClassVar[float]
    #: Upper bound of r2 after projection (None: unbounded).
    r2_max: ClassVar[float | None] = None

    def __init__(self, cfg: ModelConfig, kind: AttentionKind) -> None:
        super().__init__(cfg, kind)
        self.r1 = nn.Parameter(torch.rand(cfg.n_heads) * self.r1_scale)
        self.r2 = nn.Parameter(torch.rand(cfg.n_heads) * self.r2_scale)
        self.project()

    @classmethod
    def memory(cls, cfg: ModelConfig, kind: AttentionKind, use: Use) -> Share:
        """r1 and r2 ``[H]``; each forward's distances ``[T, T]`` and three ``[H, T, T]`` steps of the kernel."""
        return Share(parameters=F32 * 2 * cfg.n_heads, working=(20 + 3 * F32 * cfg.n_heads) * use.length**2,
                     key="data.max_len")

    def project(self) -> None:
        """The authors' constraint, in place and outside autograd: r1 >= eps, r2 in [eps, r2_max]."""
        self.r1.data.clamp_(min=EPS)
        self.r2.data.clamp_(min=EPS, max=self.r2_max)

    def kernel(self, dist: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor) -> torch.Tensor:
        """dist ``[1, Tq, Tk]`` (|i - j|, float32), r1 and r2 ``[H, 1, 1]`` -> ``[H, Tq, Tk]``."""
        raise NotImplementedError

    def bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor, q: torch.Tensor | None = None) -> torch.Tensor:
        """q_pos ``[Tq]``, k_pos ``[Tk]`` -> ``[1, H, Tq, Tk]`` float32: the kernel of |i - j| per head."""
        self.project()
        dist = (q_pos[:, None] - k_pos[None, :]).abs().float()[None]
        return self.kernel(dist, self.r1.float()[:, None, None], self.r2.float()[:, None, None])[None]


class KerpleLogPE(KerplePE):
    """The logarithmic variant: -r1_h log(1 + r2_h |i - j|) (computed as log1p)."""

    title = "KERPLE, logarithmic kernel"
    summary = (
        "Each head subtracts a learned logarithm of the distance from its scores: like ALiBi, but the penalty grows "
        "as log(1 + r2·|i - j|) instead of linearly, with a learned scale r1 and rate r2 per head. The kernel of "
        "KERPLE that the paper found to extrapolate best."
    )
    paper = ("Ta-Chung Chi, Ting-Han Fan, Peter J. Ramadge, Alexander I. Rudnicky (2022). KERPLE: Kernelized "
             "Relative Positional Embedding for Length Extrapolation. NeurIPS 2022, arXiv:2205.09921.")
    formula = r"b_h(i, j) = -r_{1,h}\, \log\big(1 + r_{2,h}\, |i - j|\big), \qquad r_{1,h},\ r_{2,h} > 0"
    notes = (
        "r1 and r2 are learned per head in every attention layer (2·heads parameters a layer), initialised "
        "U[0, 2) and U[0, 1) and projected onto ≥ 0.01 before every forward, as the authors' code does. The "
        "decoder uses |i - j| too (keys after the query are masked)."
    )

    r1_scale = 2.0
    r2_scale = 1.0

    def kernel(self, dist: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor) -> torch.Tensor:
        return -r1 * torch.log1p(r2 * dist)


class KerplePowerPE(KerplePE):
    """The power variant: -r1_h |i - j|^r2_h, 0 < r2_h <= 2."""

    title = "KERPLE, power kernel"
    summary = (
        "Each head subtracts a learned power of the distance from its scores, r1·|i - j|^r2 with 0 < r2 ≤ 2: "
        "ALiBi's linear penalty when r2 = 1, flatter below, steeper above. The second practical kernel of KERPLE."
    )
    paper = KerpleLogPE.paper
    formula = r"b_h(i, j) = -r_{1,h}\, |i - j|^{r_{2,h}}, \qquad r_{1,h} > 0, \quad 0 < r_{2,h} \le 2"
    notes = (
        "r1 and r2 are learned per head in every attention layer (2·heads parameters a layer), initialised "
        "U[0, 1) and U[0, 2) and projected onto r1 ≥ 0.01, 0.01 ≤ r2 ≤ 2 before every forward, as the authors' "
        "code does."
    )

    r1_scale = 1.0
    r2_scale = 2.0
    r2_max = 2.0

    def kernel(self, dist: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor) -> torch.Tensor:
        return -r1 * dist.pow(r2)
