"""FIRE, functional interpolation for relative positions (Li et al. 2024, "Functional Interpolation for Relative
Positions Improves Long Context Transformers", ICLR 2024, arXiv:2310.04418; the FIRE bias of its method section).

Head h adds to the score of query i and key j (the paper's causal setting, i >= j):

    b_h(i, j) = f_theta( psi(i - j) / psi(max(L, i)) )_h,        psi(x) = log(c x + 1)

f_theta is a small MLP, 1 -> ``mlp_width`` (ReLU) -> H, one output per head; c > 0 and the threshold L are learned.
Dividing by psi(i), the query's own position, is the paper's *progressive interpolation*: in causal attention
i - j lies in [0, i], so the MLP's input stays in [0, 1] at any length; the threshold L keeps short prefixes
(i < L) from being stretched over that whole range. Initial values follow the PyTorch listing that public
implementations reproduce with the paper's link (e.g. mcleish7/arithmetic, cramming/architectures/embeddings.py,
class ``FIRE``): width 32, c = 0.1, L = 512 held as a fixed 512 times a learned multiplier (init 1), c and L used
through their absolute values, and eps = 1e-6 added to the normaliser.

Beyond the paper (which is causal):

- Direction. The listing takes |c (i - j)|, so one MLP would give the bidirectional encoder a symmetric bias that
  cannot tell j before i from j after i (ALiBi's blind spot, a sentence and its reverse). Encoder self- and
  cross-attention therefore have two MLPs, ``mlp`` for keys at or before the query (j <= i, exactly the paper's
  f_theta) and ``mlp_ahead`` for keys after it (j > i), both on psi(|i - j|) / psi(max(L, i)) with shared c and L:
  T5's bidirectional split (half its buckets per direction), with a function instead of buckets. Separate MLPs
  rather than the sign as a second input (x-transformers' ``DynamicPositionBias``, registered here as ``dpb``, feeds
  sign(x) log(|x| + 1) to one MLP) keep each direction's function independent and the j <= i half literally the
  paper's. The decoder is causal and has only ``mlp`` (keys after the query are masked; they get
  f(psi(|i - j|) / ...) too, finite).
- Normaliser. Every kind divides by psi(max(L, i)) of the *query* position, as the paper does, rather than of the
  key length: keys here are the batch's padded length (positions are shared by the batch), so a key-length
  normaliser would make a sentence's encoding depend on the other sentences of its batch; and a KV-cached decoding
  step, whose query carries its true offset, gets exactly the row the full forward computes.

FIRE is not shift-invariant: moving every position by s changes psi(max(L, i)) once i passes L. Below the threshold
(every query position <= L) the normaliser is the constant psi(L) and the bias depends on i - j alone.

The MLPs run in float32 with autocast off, also when training in bf16 (their output is the bias itself).

CTranslate2: refused in one line (it has no MLP bias, and the normaliser makes the bias depend on the query's
position, not on i - j alone, so no relative table can hold it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from pydantic import Field
from torch import nn

from models.positional.base import F32, AttentionKind, AttentionPE, Plot, Share, Use, largest
from utils.schema import Section

if TYPE_CHECKING:
    from models.transformer_config import TransformerConfig as ModelConfig  # the composed class is one

#: Added to psi(max(L, i)) before dividing (the reference listing's eps).
EPS = 1e-6


class FireConfig(Section):
    """FIRE (Li et al. 2024): the MLP's width and the initial values of the learned c and L."""

    mlp_width: int = Field(32, ge=1, le=65536, description="Hidden units of the MLP (the paper's 32).")
    init_c: float = Field(0.1, gt=0, le=1e6, description="Initial value of the learned c in psi(x) = log(c x + 1).")
    init_threshold: float = Field(512.0, gt=0, le=1e9, description="Initial value of the learned threshold L: the "
                                  "query position is normalised by psi(max(L, i)).")


def fire_mlp(width: int, n_heads: int) -> nn.Sequential:
    """f_theta: ``[..., 1] -> [..., n_heads]``, one hidden ReLU layer of ``width`` units."""
    return nn.Sequential(nn.Linear(1, width), nn.ReLU(), nn.Linear(width, n_heads))


class FirePE(AttentionPE):
    """Learned MLP of the log-distance over the log of the query position, per head (``model.fire``).

    Parameters per layer: ``c`` and ``threshold_scale`` (L = |threshold_scale| * init_threshold), the MLP ``mlp``
    (j <= i) and, in encoder self- and cross-attention, ``mlp_ahead`` (j > i). The MLPs keep PyTorch's default
    ``nn.Linear`` init (the model's ``_init_weights`` leaves positional modules alone), as the reference does.
    """

    positions = "real"  # psi(|i - j|) / psi(max(L, i)) of real positions (not shift-invariant: max(L, i))

    settings = ("fire", FireConfig)

    title = "FIRE"
    summary = (
        "Each head adds a bias computed by a small learned MLP from the log-distance divided by the log of the "
        "query's position (progressive interpolation: the MLP's input stays in [0, 1] at any length). A learned "
        "threshold L keeps short prefixes from being stretched over that range."
    )
    paper = ("Shanda Li, Chong You, Guru Guruganesh, Joshua Ainslie, Santiago Ontañón, Manzil Zaheer, Sumit Sanghai, "
             "Yiming Yang, Sanjiv Kumar, Srinadh Bhojanapalli (2024). Functional Interpolation for Relative Positions "
             "Improves Long Context Transformers. ICLR 2024, arXiv:2310.04418.")
    formula = (r"b_h(i, j) = f_\theta\left( \frac{\psi(|i - j|)}{\psi(\max(L, i))} \right)_h, \qquad "
               r"\psi(x) = \log(c\,x + 1)")
    notes = (
        "f_θ is an MLP 1 → `model.fire.mlp_width` (ReLU) → heads; c and L are learned (initial values "
        "`model.fire.init_c` and `model.fire.init_threshold`). The paper is causal (the decoder). In the encoder and "
        "cross-attention a second MLP serves keys after the query (j > i), as T5 splits its buckets by direction: "
        "with one MLP of |i - j| a sentence and its reverse would look alike. FIRE is not shift-invariant once "
        "i passes L. Parameters per layer: 2w + (w + 1)·heads for each MLP, and c and L."
    )

    def __init__(self, cfg: ModelConfig, kind: AttentionKind) -> None:
        super().__init__(cfg, kind)
        fire = cfg.fire
        self.init_threshold = fire.init_threshold
        self.c = nn.Parameter(torch.tensor(float(fire.init_c)))
        self.threshold_scale = nn.Parameter(torch.tensor(1.0))
        self.mlp = fire_mlp(fire.mlp_width, cfg.n_heads)
        self.mlp_ahead = fire_mlp(fire.mlp_width, cfg.n_heads) if kind != "decoder" else None

    @classmethod
    def memory(cls, cfg: ModelConfig, kind: AttentionKind, use: Use) -> Share:
        """c, L and one MLP (two outside the decoder); per forward the normalised distances ``[T, T]`` and, for
        each MLP, its hidden layer before and after the ReLU ``[T, T, mlp_width]`` (kept for the backward, which
        makes two more such) and its output ``[T, T, H]``."""
        width, heads, mlps = cfg.fire.mlp_width, cfg.n_heads, 1 if kind == "decoder" else 2
        params = F32 * (mlps * (2 * width + width * heads + heads) + 2)
        hidden = F32 * mlps * 4 * width * use.length**2
        rest = (32 + F32 * (mlps + 1) * heads + 1) * use.length**2
        return Share(parameters=params, working=hidden + rest,
                     key=largest(("model.fire.mlp_width", hidden + 4 * params), ("data.max_len", rest)))

    @property
    def threshold(self) -> torch.Tensor:
        """L, a scalar tensor: |threshold_scale * init_threshold|."""
        return (self.threshold_scale * self.init_threshold).abs()

    def psi(self, x: torch.Tensor) -> torch.Tensor:
        """psi(x) = log(|c x| + 1), elementwise (x >= 0 here)."""
        return torch.log((self.c * x).abs() + 1)

    def normalized_distance(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """q_pos ``[Tq]``, k_pos ``[Tk]`` -> psi(|i - j|) / (psi(max(L, i)) + eps), ``[Tq, Tk]`` float32."""
        i = q_pos.to(self.c.dtype)
        j = k_pos.to(self.c.dtype)
        distance = (i[:, None] - j[None, :]).abs()
        normaliser = self.psi(torch.maximum(i, self.threshold))[:, None] + EPS
        return self.psi(distance) / normaliser

    def bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor, q: torch.Tensor | None = None) -> torch.Tensor:
        """q_pos ``[Tq]``, k_pos ``[Tk]`` (true positions) -> ``[1, H, Tq, Tk]``: f(psi(|i - j|) / psi(max(L, i)))
        with f = ``mlp`` where j <= i and, bidirectionally, ``mlp_ahead`` where j > i."""
        x = self.normalized_distance(q_pos, k_pos)[..., None]  # [Tq, Tk, 1]
        with torch.autocast(x.device.type, enabled=False):  # the MLPs in float32, never bf16
            out = self.mlp(x)  # [Tq, Tk, H]
            if self.mlp_ahead is not None:
                ahead = k_pos[None, :] > q_pos[:, None]  # [Tq, Tk]
                out = torch.where(ahead[..., None], self.mlp_ahead(x), out)
        return out.permute(2, 0, 1)[None]

    def plots(self, what: str, length: int) -> list[Plot]:
        return [self.bias_plot(what, length)]
