"""Rotary position embedding, RoPE (Su et al. 2021, "RoFormer", eq. 34).

Each pair of dimensions (j, j + d/2) of q and k at position m is rotated by the angle m * theta_j with
theta_j = base^(-2j/d) (the "rotate-half" layout, a fixed permutation of the paper's interleaved
pairs). Then <R_m q, R_n k> depends on m and n only through m - n. With ``model.rope.dim`` only the
first ``dim`` dimensions of each head rotate (partial rotary, as in GPT-NeoX); the rest pass through.

Length extension (``model.rope.scaling``, factor s, original length L), all parameter-free, so a
trained model can use them at inference:

- ``linear``: position interpolation (Chen et al. 2023): theta_j / s, i.e. positions m -> m / s.
- ``ntk``: NTK-aware base scaling (bloc97 2023): base' = base * s^(d / (d - 2)).
- ``yarn``: NTK-by-parts with attention temperature (Peng et al. 2023, eqs. 17-22), as the authors'
  code and Hugging Face compute it: the pair index where dim j makes r rotations over L,
  j(r) = d ln(L / (2 pi r)) / (2 ln base), gives the correction range lo = floor(j(beta_fast)),
  hi = ceil(j(beta_slow)) (clipped to 0 .. d-1); the ramp is linear in the pair index,
  gamma_j = 1 - clamp((j - lo) / (hi - lo), 0, 1) (1 = keep theta_j, 0 = interpolate), and
  theta'_j = (1 - gamma_j) theta_j / s + gamma_j theta_j; q and k are scaled by sqrt(1/t) = 0.1 ln(s) + 1.
  (The paper states the ramp in rotations r; the reference code ramps in j, which differs between lo
  and hi. Trained models and published results follow the code, so this does too.)
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Literal

import torch
from pydantic import Field

from models.positional.base import F64, AttentionKind, AttentionPE, Plot, Settings, Share, Use
from utils.schema import ConfigError

if TYPE_CHECKING:
    from models.transformer_config import Experiment as Config
    from models.transformer_config import TransformerConfig as ModelConfig  # the composed class is one


class RopeConfig(Settings):
    """Rotary position embedding (Su et al. 2021) and its length-extension scalings.

    ``scaling``/``factor``/``original_max_len``/``beta_*`` change no parameter: set them at inference
    (``--set model.rope.scaling=yarn``) to run a trained model on longer inputs without retraining.
    """

    inference_only = ("scaling", "factor", "original_max_len", "beta_fast", "beta_slow")

    theta: float = Field(10000.0, gt=1, le=1e12, description="The base: dimension pair j rotates by position * "
                         "theta^(-2j/d).")
    dim: int | None = Field(None, ge=2, le=65536, description="Rotate only the first `dim` dimensions of each head "
                            "(partial rotary): even, at most the head dimension; null: all of them.")
    scaling: Literal["none", "linear", "ntk", "yarn"] = Field(
        "none", description="Length extension, settable on a trained model: `linear` position interpolation (Chen "
        "et al. 2023), `ntk` NTK-aware scaling of the base, `yarn` YaRN (Peng et al. 2023: NTK-by-parts with an "
        "attention temperature); `none`: plain RoPE.")
    factor: float = Field(1.0, ge=1, le=1e4, description="s: how many times longer than `original_max_len` the inputs "
                          "the scaling prepares for.")
    original_max_len: int = Field(128, ge=1, le=1_000_000, description="L: the training length in tokens that the "
                                  "scaling starts from.")
    beta_fast: float = Field(32.0, ge=1e-3, le=1e6, description="YaRN: dimensions that rotate more than beta_fast "
                             "times over L positions are left unchanged; must exceed `beta_slow`.")
    beta_slow: float = Field(1.0, ge=1e-3, le=1e6, description="YaRN: dimensions that rotate fewer than beta_slow "
                             "times over L positions are fully interpolated; those in between, partly.")

    def check(self, model: ModelConfig) -> None:
        """YaRN's two thresholds in order; a partial rotary ``dim`` even and within the head."""
        head_dim = model.d_model // model.n_heads
        if self.beta_fast <= self.beta_slow:
            raise ConfigError("model.rope.beta_fast: must be larger than model.rope.beta_slow")
        if self.dim is not None and (self.dim % 2 or not 0 < self.dim <= head_dim):
            raise ConfigError(f"model.rope.dim: must be even and in 2..{head_dim} (the head dim), got {self.dim}")


def rope_inv_freq(dim: int, base: float) -> torch.Tensor:
    """theta_j = base^(-2j/dim), j = 0 .. dim/2 - 1 -> [dim/2] (float64 for exact angles)."""
    return base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)


def ntk_base(theta: float, factor: float, dim: int) -> float:
    """NTK-aware scaling's base for ``dim`` rotated dimensions at ``factor``: theta * s^(d / (d - 2)) (bloc97 2023)."""
    return theta * factor ** (dim / (dim - 2))


def scaled_inv_freq(rope: RopeConfig, dim: int) -> tuple[torch.Tensor, float]:
    """(theta'_j [dim/2] float64, q/k scale) for ``rope.scaling`` at ``rope.factor``."""
    s = rope.factor
    inv = rope_inv_freq(dim, rope.theta)
    if rope.scaling == "none":
        return inv, 1.0
    if rope.scaling == "linear":
        return inv / s, 1.0
    if rope.scaling == "ntk":
        return rope_inv_freq(dim, ntk_base(rope.theta, s, dim)), 1.0
    lo, hi = yarn_correction_range(rope.beta_fast, rope.beta_slow, dim, rope.theta, rope.original_max_len)
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - lo) / max(hi - lo, 1e-3)).clamp(0.0, 1.0)
    gamma = 1.0 - ramp  # 1: dims fast enough to keep, 0: slow dims fully interpolated
    return (1 - gamma) * inv / s + gamma * inv, 0.1 * math.log(s) + 1.0


def yarn_correction_range(beta_fast: float, beta_slow: float, dim: int, base: float, length: int) -> tuple[int, int]:
    """Pair indices (lo, hi) between which YaRN's ramp runs: where dims make beta_fast and beta_slow
    rotations over ``length`` positions, floored and ceiled, clipped to 0 .. dim - 1."""

    def pair_index(rotations: float) -> float:
        return dim * math.log(length / (rotations * 2 * math.pi)) / (2 * math.log(base))

    return max(math.floor(pair_index(beta_fast)), 0), min(math.ceil(pair_index(beta_slow)), dim - 1)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) on the last dim split in halves."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x ``[B, H, T, Dh]``; cos/sin ``[T, R]`` with R <= Dh even; rotates the first R dims."""
    rot = cos.shape[-1]
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    x_rot = x_rot * cos.to(x.dtype) + rotate_half(x_rot) * sin.to(x.dtype)
    return torch.cat((x_rot, x_pass), dim=-1) if x_pass.shape[-1] else x_rot


def rope_angles(positions: torch.Tensor, inv_freq: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """positions ``[T]``, theta ``[R/2]`` -> (cos, sin) of m * theta_j in the rotate-half layout, each ``[T, R]``
    float32, times ``scale`` (YaRN's sqrt(1/t); 1 otherwise)."""
    freqs = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * scale).float(), (emb.sin() * scale).float()


class RotaryPE(AttentionPE):
    """RoPE on q and k of self-attention (and of cross-attention if asked for)."""

    settings = ("rope", RopeConfig)
    positions = "real"  # angles m * theta_j for any real m

    title = "RoPE"
    summary = (
        "Rotates each pair of dimensions of the queries and keys by an angle proportional to the position, at "
        "geometric frequencies. The dot product of a rotated query at m and a rotated key at n then depends on m - n "
        "only: a relative encoding with no parameters, applied inside every attention layer it is set for. "
        "`model.rope.dim` rotates only part of each head (partial rotary, as in GPT-NeoX)."
    )
    paper = ("Jianlin Su, Yu Lu, Shengfeng Pan, Ahmed Murtadha, Bo Wen, Yunfeng Liu (2021). RoFormer: Enhanced "
             "Transformer with Rotary Position Embedding. arXiv:2104.09864.")
    formula = (r"\begin{pmatrix} q'_j \\ q'_{j+d/2} \end{pmatrix} = \begin{pmatrix} \cos m\theta_j & "
               r"-\sin m\theta_j \\ \sin m\theta_j & \cos m\theta_j \end{pmatrix} "
               r"\begin{pmatrix} q_j \\ q_{j+d/2} \end{pmatrix}, \qquad \theta_j = b^{-2j/d}, \qquad "
               r"\langle R_m q, R_n k \rangle = g(q, k, m - n)")
    notes = (
        "Pairs are (j, j + d/2), the \"rotate-half\" layout of GPT-NeoX and Hugging Face: a fixed permutation of the "
        "paper's interleaved pairs, absorbed by the learned projections.\n\n"
        "**Length extension.** `model.rope.scaling` (with `factor` s and `original_max_len` L, the training length) "
        "changes no parameter, so it can be set on a trained model at inference:\n\n"
        "| `scaling` | what it does | from |\n"
        "|---|---|---|\n"
        "| `linear` | position interpolation: every angle divided by s (positions m → m/s) | Chen et al. 2023, "
        "arXiv:2306.15595 |\n"
        "| `ntk` | NTK-aware scaling: the base b becomes b·s^(d/(d-2)), so slow pairs are interpolated and fast "
        "ones barely change (NTK: the neural tangent kernel argument behind it) | bloc97 2023 (a forum post) |\n"
        "| `yarn` | NTK-by-parts: pairs making more than `beta_fast` rotations over L keep their frequency, those "
        "making fewer than `beta_slow` are interpolated like `linear`, a linear ramp in between; queries and keys "
        "are scaled by 0.1·ln(s) + 1 (an attention temperature) | Peng et al. 2023, YaRN, arXiv:2309.00071 |\n\n"
        "The YaRN ramp runs over the pair index between the floored and ceiled correction pairs, as the authors' "
        "code and Hugging Face compute it (the paper states it in rotations). For example, on a model trained on "
        "sentences of at most 16 tokens:\n\n"
        "```bash\n"
        "# after: python train.py --config configs/bench_short_rope.yaml\n"
        "python test.py --model_path runs/bench_short_rope_latest --split test.iwslt-tst2010 \\\n"
        "    --set model.rope.scaling=ntk --set model.rope.factor=4 --set model.rope.original_max_len=16\n"
        "```\n\n"
        "In cross-attention (`model.cross_attention_pe=rope`) queries are rotated by the target position and keys "
        "by the source position; the two are not aligned in translation, so treat it as an experiment."
    )
    ct2_export = ("CTranslate2's own rotary embedding (rotate-half layout, partial rotary kept); `linear` scaling "
                  "is native and `ntk` is folded into the base. `yarn` is refused.")
    shift_invariant = True  # <R_m q, R_n k> depends on m - n only

    def __init__(self, cfg: ModelConfig, kind: AttentionKind) -> None:
        super().__init__(cfg, kind)
        self.rot_dim = cfg.rope.dim or self.head_dim
        inv_freq, self.scale = scaled_inv_freq(cfg.rope, self.rot_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    @classmethod
    def memory(cls, cfg: ModelConfig, kind: AttentionKind, use: Use) -> Share:
        """No parameter; the angles' cos and sin ``[T, rot_dim]`` of each forward (float64 steps, float32 kept in the
        model's memo of a few positions tensors)."""
        rot = cfg.rope.dim or cfg.d_model // cfg.n_heads
        return Share(buffers=F64 * rot // 2, working=96 * use.length * rot, key="data.max_len")

    @classmethod
    def check(cls, cfg: Config, key: str) -> None:
        m = cfg.model
        rot = m.rope.dim or m.d_model // m.n_heads
        if rot % 2:
            raise ConfigError(f"{key}=rope rotates pairs of dimensions, but the head dimension model.d_model/"
                              f"model.n_heads = {m.d_model}/{m.n_heads} = {rot} is odd (or set an even model.rope.dim)")
        if m.rope.scaling == "ntk" and rot <= 2:
            raise ConfigError(f"model.rope.scaling=ntk needs more than 2 rotated dimensions, got {rot}")

    @classmethod
    def plot_memory(cls, cfg: ModelConfig, length: int) -> int:
        """``model_plots``' curves over 1.25 s L distances (float64 angles of each rotated pair, four lines)."""
        r = cfg.rope
        distances = int(1.25 * (r.factor if r.factor > 1 else 4.0) * r.original_max_len)
        return distances * (12 * (r.dim or cfg.d_model // cfg.n_heads) + 256) + super().plot_memory(cfg, length)

    def model_plots(self) -> list[Plot]:
        """``position/rope_scaling``: the length extension of ``model.rope`` (factor 4 shown when unscaled)."""
        r = self.cfg.rope
        factor = r.factor if r.factor > 1 else 4.0  # as in rope_scaling_curves
        return [Plot("position/rope_scaling", "rope_scaling_curves",
                     (r, self.head_dim, int(1.25 * factor * r.original_max_len)))]

    def decay(self) -> dict[str, Any]:
        return {"rope_dim": self.rot_dim, "rope_base": self.cfg.rope.theta}

    @classmethod
    def describe(cls, cfg: ModelConfig, name: str) -> str:
        """``rope``, or with its length extension: ``rope (ntk x4)``."""
        r = cfg.rope
        return name if r.scaling == "none" else f"{name} ({r.scaling} x{r.factor:g})"

    @classmethod
    def ct2_refusal(cls, cfg: Config, key: str, kind: AttentionKind) -> str | None:
        reason = super().ct2_refusal(cfg, key, kind)
        if reason is None and cfg.model.rope.scaling == "yarn":
            return "model.rope.scaling=yarn: CTranslate2 has no YaRN scaling (linear and ntk export)"
        return reason

    @classmethod
    def ct2_stack(cls, cfg: ModelConfig, side: Literal["encoder", "decoder"]) -> dict[str, Any]:
        """CTranslate2's rotary arguments: rotate-half layout; linear scaling native, NTK folded into the base."""
        from ctranslate2.specs import attention_spec

        r = cfg.rope
        head_dim = cfg.d_model // cfg.n_heads
        dim = r.dim or head_dim
        out: dict[str, Any] = {"rotary_dim": 0 if dim == head_dim else dim, "rotary_interleave": False,
                               "rotary_base": r.theta}
        if r.scaling == "linear":
            out.update(rotary_scaling_type=attention_spec.RotaryScalingType.Linear, rotary_scaling_factor=r.factor)
        elif r.scaling == "ntk":
            out["rotary_base"] = ntk_base(r.theta, r.factor, dim)
        return out

    def angles(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions ``[T]`` -> (cos, sin), each ``[T, rot_dim]``, times the YaRN scale (1 otherwise).

        Computed once per positions tensor and shared through ``self.shared`` by every layer of the model (all
        its RotaryPE have the same theta_j: one ``model.rope``)."""
        return self.shared.get(positions, ("rope", self.rot_dim, self.scale),
                               lambda: rope_angles(positions, self.inv_freq, self.scale))

    def rotate(
        self, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cos_q, sin_q = self.angles(q_pos)
        cos_k, sin_k = (cos_q, sin_q) if k_pos is q_pos else self.angles(k_pos)
        return apply_rotary(q, cos_q, sin_q), apply_rotary(k, cos_k, sin_k)
