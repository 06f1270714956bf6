"""xPos, the extrapolatable position embedding (Sun et al. 2022, "A Length-Extrapolatable Transformer", sec. 3).

RoPE (``rotary.py``) whose rotation is also scaled, per pair of dimensions i = 0 .. d/2 - 1 of a head of d dims:

    zeta_i   = (i / (d/2) + gamma) / (1 + gamma)        in (0, 1]   gamma = ``model.xpos.gamma`` (0.4)
    q~_n     = zeta^( n / B) * R_n q                                B = ``model.xpos.scale_base`` (512)
    k~_m     = zeta^(-m / B) * R_m k
    q~_n . k~_m = sum_i zeta_i^((n - m) / B) * [pair i of q . pair i of k, rotated by (n - m) theta_i]

where R_n is RoPE's rotation of pair i by n * theta_i, theta_i = theta^(-2i/d) (``model.xpos.theta``), and B is
the reference code's ``scale_base`` (a setting of its own, apart from gamma). zeta_i is eq. (9) of the paper (arXiv
v1, sec. 3.2) and the scaled rotation of q and k its eq. (10); v1 names neither gamma = 0.4 nor B: both values are
torchscale's defaults. Each pair's RoPE score is multiplied
by zeta_i^((n - m)/B) <= 1: a decay with the distance n - m >= 0, fastest for the high-frequency pairs (small i).
For m > n the factor grows without bound, so xPos is defined for causal attention only: ``causal_only`` makes
validation refuse it in the encoder and in cross-attention in one line (``model.decoder_pe.attention=xpos`` puts
it in decoder self-attention).

Reference followed: microsoft/torchscale, ``torchscale/component/xpos_relative_position.py`` (class ``XPOS``,
``scale_base=512``; its buffer ``scale = (arange(0, d, 2) + 0.4 d) / (1.4 d)`` is zeta above), as its
``MultiheadAttention`` calls it: keys with ``downscale=True`` (zeta^(-m/B)), queries without (zeta^(n/B)). Two
differences, neither changing a score (tests/test_xpos.py holds them to a transcription of that arithmetic):

- Layout. torchscale rotates interleaved pairs (2i, 2i + 1) (``rotate_every_two``, ``duplicate_interleave``);
  this repository rotates halves, pair i = dims (i, i + d/2), with RoPE's own ``apply_rotary`` and
  ``rotate_half``. The two are one fixed permutation of each head's dims (interleaved 2i <- i,
  2i + 1 <- i + d/2), absorbed by the learned q/k projections; dot products are unchanged.
- Centering. torchscale's exponent is n - ceil(N/2) for a sequence of N positions (N = the cached length plus
  one while decoding; rotary-embedding-torch's ``use_xpos`` uses n - floor(N/2)), which keeps zeta^(+-n/B) near
  1 for long N and cancels in q~_n . k~_m. torchscale caches keys unrotated and rotates all of them again at
  every step; this repository caches keys already rotated (``models/attention.py``), so a center that moves
  with N would leave the cached keys' scale stale. Positions are therefore not centered (center 0): the same
  scores, and a factor at most zeta_0^(-m/B) = 3.5^(m/B) on keys (1.87 at m = 256, 12.25 at m = 1024 with
  B = 512; the factor alone overflows fp16 past about 4.5e3 positions, fp32 and bf16 past about 3.6e4).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from pydantic import Field

from models.positional.base import F64, AttentionKind, AttentionPE, Share, Use, name_at
from models.positional.rotary import apply_rotary, rope_angles, rope_inv_freq
from utils.schema import ConfigError, Section

if TYPE_CHECKING:
    from models.transformer_config import Experiment as Config
    from models.transformer_config import TransformerConfig as ModelConfig  # the composed class is one


class XposConfig(Section):
    """xPos (Sun et al. 2022): RoPE with a per-pair scale zeta_i^(n/B) on queries, zeta_i^(-m/B) on keys."""

    theta: float = Field(10000.0, gt=1, le=1e12, description="RoPE's base: pair i rotates by position * theta^(-2i/d).")
    gamma: float = Field(0.4, ge=1e-3, le=1e6, description="zeta_i = (i / (d/2) + gamma) / (1 + gamma): the larger "
                         "gamma, the slower the scores decay with distance.")
    scale_base: float = Field(512.0, ge=1, le=1e9, description="B: the score of pair i between positions n and m is "
                              "scaled by zeta_i^((n - m) / B).")


def xpos_zeta(dim: int, gamma: float) -> torch.Tensor:
    """zeta_i = (i / (dim/2) + gamma) / (1 + gamma), i = 0 .. dim/2 - 1 -> ``[dim/2]`` float64, in (0, 1]."""
    return (torch.arange(0, dim, 2, dtype=torch.float64) / dim + gamma) / (1 + gamma)


def xpos_tables(
    positions: torch.Tensor, inv_freq: torch.Tensor, zeta: torch.Tensor, scale_base: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """positions ``[T]``, theta_i and zeta_i ``[d/2]`` -> (cos_q, sin_q, cos_k, sin_k), each ``[T, d]`` float32 in
    the rotate-half layout: RoPE's cos/sin of n * theta_i times zeta_i^(n/B) (queries) or zeta_i^(-n/B) (keys)."""
    cos, sin = rope_angles(positions, inv_freq, 1.0)
    power = positions.to(torch.float64)[:, None] / scale_base  # [T, 1]
    up = zeta.to(power.device)[None, :] ** power  # zeta_i^(n/B), [T, d/2]
    up = torch.cat((up, up), dim=-1)
    down = up.reciprocal()
    return (cos * up).float(), (sin * up).float(), (cos * down).float(), (sin * down).float()


class XposPE(AttentionPE):
    """xPos on q and k of decoder self-attention (causal only)."""

    positions = "real"  # RoPE angles and zeta^(n/B) of any real position
    shift_invariant = True  # q_n . k_m depends on n - m only

    settings = ("xpos", XposConfig)
    causal_only = True

    title = "xPos"
    summary = (
        "RoPE whose rotated pairs are also scaled: the query at n by ζ^(n/B), the key at m by ζ^(-m/B), so each "
        "pair's score decays as ζ^((n-m)/B) with the distance, fastest for the high-frequency pairs. Defined for "
        "causal (decoder) self-attention only: for keys after the query the factor grows without bound."
    )
    paper = ("Yutao Sun, Li Dong, Barun Patra, Shuming Ma, Shaohan Huang, Alon Benhaim, Vishrav Chaudhary, Xia Song, "
             "Furu Wei (2023). A Length-Extrapolatable Transformer. ACL 2023, arXiv:2212.10554.")
    formula = (r"\tilde q_n = \zeta^{\,n/B} R_n q, \qquad \tilde k_m = \zeta^{-m/B} R_m k, \qquad "
               r"\zeta_i = \frac{i/(d/2) + \gamma}{1 + \gamma} \in (0, 1]")
    notes = (
        "R_n is RoPE's rotation of pair i by n·θ^(-2i/d), θ = `model.xpos.theta`; γ = `model.xpos.gamma` (0.4) and "
        "B = `model.xpos.scale_base` (512) are microsoft/torchscale's defaults, which this follows (rotate-half "
        "layout, positions not centred: the same scores). Put it in the decoder with "
        "`model.decoder_pe.attention=xpos`."
    )

    def __init__(self, cfg: ModelConfig, kind: AttentionKind) -> None:
        super().__init__(cfg, kind)
        x = cfg.xpos
        self.register_buffer("inv_freq", rope_inv_freq(self.head_dim, x.theta), persistent=False)
        self.register_buffer("zeta", xpos_zeta(self.head_dim, x.gamma), persistent=False)
        self.scale_base = x.scale_base

    @classmethod
    def memory(cls, cfg: ModelConfig, kind: AttentionKind, use: Use) -> Share:
        """theta_i and zeta_i (float64); per forward four ``[T, Dh]`` tables (float64 steps, float32 kept in the
        model's memo of a few positions tensors)."""
        head_dim = cfg.d_model // cfg.n_heads
        return Share(buffers=F64 * head_dim, working=200 * use.length * head_dim, key="data.max_len")

    @classmethod
    def check(cls, cfg: Config, key: str) -> None:
        m = cfg.model
        head_dim = m.d_model // m.n_heads
        if head_dim % 2:
            raise ConfigError(f"{key}={name_at(cfg, key)} rotates pairs of dimensions, but the head dimension "
                              f"model.d_model/model.n_heads = {m.d_model}/{m.n_heads} = {head_dim} is odd")

    def decay(self) -> dict[str, Any]:
        """The xPos score of all-ones q, k over distance and the scales zeta_i^(k/B) (``decay_curves``)."""
        return {"xpos_dim": self.head_dim, "xpos": self.cfg.xpos}

    @classmethod
    def ct2_refusal(cls, cfg: Config, key: str, kind: AttentionKind) -> str | None:
        return (f"{key}={name_at(cfg, key)}: CTranslate2's rotary embedding has no xPos scale "
                "(zeta^(n/B) on queries, zeta^(-m/B) on keys)")

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """positions ``[T]`` -> (cos_q, sin_q, cos_k, sin_k), each ``[T, head_dim]`` (see ``xpos_tables``).

        Computed once per positions tensor and shared through ``self.shared`` by every layer of the model (one
        ``model.xpos``, one head dim)."""
        x = self.cfg.xpos
        return self.shared.get(positions, ("xpos", self.head_dim, x.theta, x.gamma, x.scale_base),
                               lambda: xpos_tables(positions, self.inv_freq, self.zeta, self.scale_base))

    def rotate(
        self, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q ``[B, H, Tq, Dh]`` at ``q_pos`` ``[Tq]``, k ``[B, H, Tk, Dh]`` at ``k_pos`` ``[Tk]`` -> the same shapes:
        zeta^(n/B) R_n q and zeta^(-m/B) R_m k."""
        cos_q, sin_q, cos_k, sin_k = self.tables(q_pos)
        if k_pos is not q_pos:
            _, _, cos_k, sin_k = self.tables(k_pos)
        return apply_rotary(q, cos_q, sin_q), apply_rotary(k, cos_k, sin_k)
