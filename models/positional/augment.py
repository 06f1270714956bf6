"""Training-time position augmentation (``model.augment``): the positions a stack gives its encodings while
the model trains, in place of 0..T-1. Off in eval mode and in KV-cached decoding, so inference, validation
and every decoder see plain positions 0..T-1 (``Seq2SeqTransformer.positions`` is the one caller).

Three methods, each with the distribution of its paper:

- ``shape``, SHAPE (Kiyono et al. 2021, "SHAPE: Shifted Absolute Position Embedding for Transformers", EMNLP,
  sec. 3): every position of a sequence is shifted by one random offset,
  ``p_i = i + k``, ``k ~ U{0, ..., K}``, ``K = model.augment.shape.max_shift``.
  Encoder and decoder draw their offsets independently, as in the authors' released code
  (github.com/butsugiri/shape, ``onmt/modules/embeddings.py``: the encoder's and the decoder's embedding
  modules each call ``torch.randint`` for their own offsets). That code draws k in {0, ..., K-1} and, at
  inference, adds the table from row K on (offset K); here k includes K (U{0, ..., K}) and inference uses
  offset 0: a trained offset too, and the plain positions every other part of this project assumes.
- ``randomized``, randomized positional encodings (Ruoss et al. 2023, "Randomized Positional Encodings Boost
  Length Generalization of Transformers", ACL, sec. 3): the positions of a length-T sequence are a sorted
  random subset of size T of {0, ..., L-1}, ``p = sort(sample_without_replacement({0..L-1}, T))``,
  ``L = model.augment.randomized.max_length`` > the longest test input. The paper's Figure 1 gives each
  training example its own subset; the authors' code draws one per call, shared by the batch, as here
  (github.com/google-deepmind/randomized_positional_encodings, ``noisy_fixed_positional_encodings``:
  ``jrandom.choice(arange(L), shape=(T,), replace=False)``, sorted).
  That code also draws random positions at evaluation; here evaluation uses 0..T-1 (off at inference, as for
  every method): the model is then scored on unit gaps it met only when a draw happened to have them.
- ``cape``, CAPE (Likhomanenko et al. 2021, "CAPE: Encoding Relative Positions with Continuous Augmented
  Positional Embeddings", NeurIPS, sec. 3): real-valued positions with a global shift, a local jitter and a
  global scaling, ``p_i = lambda * (i + Delta + eps_i)``, ``Delta ~ U[-max_global_shift, max_global_shift]``,
  ``eps_i ~ U[-max_local_shift / 2, max_local_shift / 2]`` (one per position), ``log lambda ~
  U[-log max_global_scaling, log max_global_scaling]``, positions not mean-centred (the text setting). The
  order of the three and the jitter's width convention (``max_local_shift`` is the interval's width, so 1
  keeps positions in order) follow the PyTorch port ``gcambara/cape`` (``CAPE1d._augment_positions``), which
  states it follows the paper's code; its settings "for text" are the defaults here (5, 1, 1.03). Only for
  encodings defined on real positions (those declaring ``positions = "real"``: sinusoidal, RoPE, ALiBi, KERPLE, ...).

**One draw per batch, not per sequence.** Positions are one tensor ``[T]`` shared by the batch (padding is on
the right): the contract every encoding, the causal mask and the per-forward memo (``SharedPositions``) are
written for. So SHAPE's offset and CAPE's shift, jitter and scaling are drawn once per batch and stack, where
the papers draw them per sequence; randomized positions are drawn once per batch in Ruoss et al.'s code too. Each
sequence's positions still have the paper's distribution; what differs is that the sequences of one batch
share a draw, so a step averages its gradient over one draw instead of B: the same expectation with more
variance (with data-parallel training each rank draws its own). For a padded batch a shorter sentence takes
the first positions of the batch's draw (for ``randomized``, the first n of T sorted positions, which sit lower
in {0..L-1} than a draw of n would; batches are made of pairs sorted by source length, so a source's n is
close to T, a target's less so).

Draws come from torch's global CPU generator (seeded by train.py with ``seed + rank`` and saved in every
checkpoint), so a seed fixes them on every device and a resumed run draws what the uninterrupted one would.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch
from pydantic import Field

from models.positional.base import F64, Share
from utils.schema import ConfigError, Section

if TYPE_CHECKING:
    from models.transformer_config import Experiment as Config

Method = Literal["none", "shape", "randomized", "cape"]


class ShapeConfig(Section):
    """SHAPE (Kiyono et al. 2021): every position shifted by k ~ U{0..max_shift} per batch and stack."""

    # What the reference page of the method says (docs/reference_encodings.py), as on the encodings' classes.
    title: ClassVar[str] = "SHAPE"
    summary: ClassVar[str] = (
        "Every position of a stack is shifted by one random offset k, so an absolute encoding cannot rely on where "
        "a sentence starts and has to read position differences. For absolute encodings (`model.input_pe`); "
        "refused where every encoding in use already sees only i - j, since it would change nothing."
    )
    paper: ClassVar[str] = ("Shun Kiyono, Sosuke Kobayashi, Jun Suzuki, Kentaro Inui (2021). SHAPE: Shifted Absolute "
                            "Position Embedding for Transformers. EMNLP 2021, arXiv:2109.05644.")
    formula: ClassVar[str] = r"p_i = i + k, \qquad k \sim \mathcal{U}\{0, \dots, K\}"
    notes: ClassVar[str] = (
        "The encoder and the decoder draw their offsets independently, as in the authors' code. That code draws k "
        "below K and evaluates at offset K; here k goes up to K and evaluation uses offset 0 (also a trained offset). "
        "An input table must hold the longest training sentence with its end token plus K positions."
    )

    max_shift: int = Field(100, ge=1, le=1_000_000, description="K: the largest offset k added to every position of a "
                           "stack (k ~ U{0..K}, one draw per batch); the authors' released WMT configs use 10 to 500.")


class RandomizedConfig(Section):
    """Randomized positions (Ruoss et al. 2023): a sorted random subset of {0..max_length-1}."""

    title: ClassVar[str] = "Randomized positions"
    summary: ClassVar[str] = (
        "The positions of a T-token stack are a sorted random subset of size T of {0, ..., L-1}, with L above the "
        "longest input the model will be tested on: the model meets large positions in training, with gaps, and "
        "only their order is reliable."
    )
    paper: ClassVar[str] = ("Anian Ruoss, Grégoire Delétang, Tim Genewein, Jordi Grau-Moya, Róbert Csordás, Mehdi "
                            "Bennani, Shane Legg, Joel Veness (2023). Randomized Positional Encodings Boost Length "
                            "Generalization of Transformers. ACL 2023, arXiv:2305.16843.")
    formula: ClassVar[str] = (r"(p_1 < \dots < p_T) = \mathrm{sort}(S), \qquad S \subset \{0, \dots, L - 1\}, "
                              r"\quad |S| = T \text{ uniformly at random}")
    notes: ClassVar[str] = (
        "The authors' code also draws random positions at evaluation; here evaluation uses 0..T-1, so a model "
        "trained with L much larger than T is scored on unit gaps it rarely saw. An input table must hold L "
        "positions."
    )

    max_length: int | None = Field(None, ge=1, le=1_000_000, description="L: positions are drawn from 0..L-1; required "
                                   "with `model.augment.method=randomized`, set it above the longest input the model "
                                   "will be tested on.")


class CapeConfig(Section):
    """CAPE (Likhomanenko et al. 2021): real positions lambda (i + Delta + eps_i); defaults: the text setting."""

    title: ClassVar[str] = "CAPE"
    summary: ClassVar[str] = (
        "Positions become real numbers: shifted together by a random Δ, each jittered by its own ε_i, and all "
        "scaled by a random λ. Only for encodings defined on real positions (sinusoids, RoPE, ALiBi, ...), not for "
        "learned tables or buckets."
    )
    paper: ClassVar[str] = ("Tatiana Likhomanenko, Qiantong Xu, Gabriel Synnaeve, Ronan Collobert, Alex Rogozhnikov "
                            "(2021). CAPE: Encoding Relative Positions with Continuous Augmented Positional "
                            "Embeddings. NeurIPS 2021, arXiv:2106.03143.")
    formula: ClassVar[str] = (r"p_i = \lambda\,(i + \Delta + \varepsilon_i), \qquad \Delta \sim \mathcal{U}"
                              r"[-\Delta_{\max}, \Delta_{\max}], \quad \varepsilon_i \sim \mathcal{U}[-w/2, w/2], "
                              r"\quad \log\lambda \sim \mathcal{U}[-\log\lambda_{\max}, \log\lambda_{\max}]")
    notes: ClassVar[str] = (
        "The defaults (5, 1, 1.03) and the jitter's width convention (w is the interval's width, so w ≤ 1 keeps the "
        "positions in order) are the text setting of the PyTorch port `gcambara/cape`, not checked against the "
        "authors' code. Positions are not mean-centred."
    )

    max_global_shift: float = Field(5.0, ge=0, le=1e6, description="Largest global shift: Delta ~ U[-max_global_shift, "
                                    "max_global_shift], one per batch and stack.")
    max_local_shift: float = Field(1.0, ge=0, description="Width w of each position's own jitter, eps_i ~ U[-w/2, "
                                   "w/2]; at most 1 keeps the positions in order.")
    max_global_scaling: float = Field(1.03, ge=1, le=100, description="Largest global scaling s: log lambda ~ U[-log "
                                      "s, log s].")


class AugmentConfig(Section):
    """Training-time position augmentation (``model.augment``); none by default. Changes no parameter and
    nothing at inference."""

    title: ClassVar[str] = "Training-time position augmentation"
    summary: ClassVar[str] = (
        "`model.augment.method` gives each stack other positions than 0..T-1 while the model trains. Evaluation, "
        "validation and decoding with the cache use 0..T-1, so inference is unchanged: the setting shapes no "
        "parameter, and a trained model translates the same with or without it. The encoder and the decoder draw "
        "their own positions, one draw per batch (the positions are one tensor shared by the batch, where the "
        "papers draw per sequence): each sentence's positions keep the paper's distribution, with more variance "
        "per step. Any method is refused with a cross-attention encoding (it would relate two independent draws) "
        "and where no encoding in use reads more than the order of positions."
    )
    notes: ClassVar[str] = (
        "For example SHAPE on the sinusoids, or CAPE on RoPE:\n\n"
        "```bash\n"
        "python train.py --config configs/demo.yaml --set model.augment.method=shape "
        "--set model.augment.shape.max_shift=50\n"
        "python train.py --config configs/demo.yaml --set model.input_pe=none --set model.attention_pe=rope \\\n"
        "    --set model.augment.method=cape\n"
        "```"
    )

    method: Method = Field("none", description="The positions each stack gets while training, instead of 0..T-1: "
                           "`shape` shifts them all by a random offset (SHAPE, Kiyono et al. 2021), `randomized` "
                           "takes a sorted random subset of a longer range (Ruoss et al. 2023), `cape` shifts, "
                           "jitters and scales them as real numbers (CAPE, Likhomanenko et al. 2021); `none`: "
                           "0..T-1. Inference always uses 0..T-1.")
    shape: ShapeConfig = Field(default_factory=ShapeConfig, description="Settings of `shape`.")
    randomized: RandomizedConfig = Field(default_factory=RandomizedConfig, description="Settings of `randomized`.")
    cape: CapeConfig = Field(default_factory=CapeConfig, description="Settings of `cape`.")

    def positions(self, length: int) -> tuple[int, str]:
        """(the positions a training sequence of ``length`` tokens may take, all below it; the setting that sets it):
        ``length`` plus SHAPE's largest offset, randomized's L, or ``length`` (CAPE's real positions index no table)."""
        if self.method == "shape":
            return length + self.shape.max_shift, "model.augment.shape.max_shift"
        if self.method == "randomized" and self.randomized.max_length is not None:
            return max(length, self.randomized.max_length), "model.augment.randomized.max_length"
        return length, "data.max_len"

    def memory(self) -> Share:
        """What a draw takes: randomized permutes all of 0..L-1 (int64) to pick its subset; the others, a few
        positions."""
        if self.method == "randomized" and self.randomized.max_length is not None:
            return Share(working=F64 * self.randomized.max_length, key="model.augment.randomized.max_length")
        return Share()

    def describe(self) -> str:
        """``shape (k ~ U{0..100})``, ...: the method and its distribution in a few words; "" for none."""
        if self.method == "shape":
            return f"shape (k ~ U{{0..{self.shape.max_shift}}})"
        if self.method == "randomized":
            size = self.randomized.max_length
            return f"randomized (sorted subset of 0..{size - 1 if size else 'L-1'})"
        if self.method == "cape":
            c = self.cape
            return (f"cape (global shift {c.max_global_shift:g}, local shift {c.max_local_shift:g}, "
                    f"global scaling {c.max_global_scaling:g})")
        return ""

    @classmethod
    def effect_rules(cls) -> list[tuple[str, Callable[[Config], str | None]]]:
        """(key, why a ``--set`` of it would have no effect, or None): each method's section,
        ``model.augment.<method>``, acts only under ``model.augment.method=<method>``."""
        def unused(method: str) -> Callable[[Config], str | None]:
            return lambda c: None if c.model.augment.method == method else \
                f"model.augment.method={c.model.augment.method}"
        return [(f"model.augment.{method}", unused(method)) for method in cls.model_fields if method != "method"]


# ---------------------------------------------------------------------------------------------- the draws


def shape_positions(length: int, max_shift: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """SHAPE: ``k + arange(length)``, k ~ U{0, ..., max_shift} -> LongTensor ``[length]``."""
    k = int(torch.randint(0, max_shift + 1, (1,), generator=generator))
    return torch.arange(k, k + length)


def randomized_positions(length: int, max_length: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Ruoss et al.: a uniformly random subset of size ``length`` of {0..max_length-1}, sorted -> LongTensor."""
    if length > max_length:
        raise ValueError(f"a sequence of {length} tokens needs more positions than "
                         f"model.augment.randomized.max_length={max_length}")
    return torch.randperm(max_length, generator=generator)[:length].sort().values


def cape_positions(length: int, cape: CapeConfig, generator: torch.Generator | None = None) -> torch.Tensor:
    """CAPE: ``lambda * (arange(length) + Delta + eps)`` -> float64 ``[length]`` (float64: the gaps between
    neighbours can be tiny, and the decoder's causal mask compares positions)."""
    x = torch.arange(length, dtype=torch.float64)
    delta = (2 * torch.rand((), dtype=torch.float64, generator=generator) - 1) * cape.max_global_shift
    eps = (torch.rand(length, dtype=torch.float64, generator=generator) - 0.5) * cape.max_local_shift
    log_scale = (2 * torch.rand((), dtype=torch.float64, generator=generator) - 1) * math.log(cape.max_global_scaling)
    return (x + delta + eps) * torch.exp(log_scale)


def augmented_positions(cfg: AugmentConfig, length: int, device: torch.device | str | None = None,
                        generator: torch.Generator | None = None) -> torch.Tensor:
    """The positions ``[length]`` of one stack of one training batch under ``cfg.method`` (drawn on the CPU)."""
    if cfg.method == "shape":
        pos = shape_positions(length, cfg.shape.max_shift, generator)
    elif cfg.method == "randomized":
        assert cfg.randomized.max_length is not None, "validation requires model.augment.randomized.max_length"
        pos = randomized_positions(length, cfg.randomized.max_length, generator)
    elif cfg.method == "cape":
        pos = cape_positions(length, cfg.cape, generator)
    else:
        pos = torch.arange(length)
    return pos.to(device)


# ---------------------------------------------------------------------------------------------- validation


def check_augmentation(cfg: Config, registry: dict[str, dict[str, Any]]) -> None:
    """ConfigError, one line naming both keys, for a method an encoding in use cannot take: CAPE's real positions
    with an integer-only encoding (``positions = "integer"``: learned tables, T5 buckets, Shaw clipping...),
    positions beyond an input table (SHAPE's T + K, randomized's L), SHAPE where every encoding is shift-invariant
    (it would change nothing), any method with cross-attention positions or with no encoding reading positions."""
    from models.positional.base import NoInputPE

    m = cfg.model
    a = m.augment
    if a.method == "cape" and a.cape.max_local_shift > 1:
        raise ConfigError(f"model.augment.cape.max_local_shift: must be <= 1 (a jitter of at most half a position "
                          f"either way keeps positions in order, which the decoder's causal mask needs), "
                          f"got {a.cape.max_local_shift:g}")
    if a.method == "none":
        return
    what = f"model.augment.method={a.method}"
    if m.cross_attention_pe != "none":
        raise ConfigError(f"{what} with model.cross_attention_pe={m.cross_attention_pe}: cross-attention relates "
                          "target to source positions, which the augmentation draws apart for each stack; set "
                          "model.cross_attention_pe=none")
    places = [(m.pe_key(stack, level), m.pe(stack, level), level, registry[level][m.pe(stack, level)])
              for stack in ("encoder", "decoder") for level in ("input", "attention")]
    places = list({key: (key, name, level, cls) for key, name, level, cls in places}.values())  # shorthand once
    reading = [p for p in places if p[3] is not None and not issubclass(p[3], NoInputPE)]
    in_use = ", ".join(f"{key}={name}" for key, name, _, _ in places)
    order = [name for _, name, _, cls in reading if getattr(cls, "order_only", False)]  # CoPE: input PEs lack it
    reading = [p for p in reading if p[1] not in order]
    if not reading:
        raise ConfigError(f"{what}: no encoding in use reads positions ({in_use}"
                          + (f"; {', '.join(order)} reads only their order, which every method keeps" if order else "")
                          + ")")
    longest, cap = _training_length(cfg)
    if a.method == "cape":
        real = [n for level in ("input", "attention") for n, c in registry[level].items()
                if c is not None and not issubclass(c, NoInputPE) and c.positions == "real"]
        for key, name, _, cls in reading:
            if cls.positions != "real":
                raise ConfigError(f"{what} draws real-valued positions, but {key}={name} takes integer positions "
                                  f"only (CAPE needs encodings defined on real positions: {', '.join(real)})")
    elif a.method == "randomized":
        size = a.randomized.max_length
        if size is None:
            raise ConfigError(f"model.augment.randomized.max_length: required with {what} (L: positions are drawn "
                              "from 0..L-1; set it above the longest input the model will be tested on)")
        if size < longest:
            raise ConfigError(f"model.augment.randomized.max_length: {size} is fewer than the {longest} positions of "
                              f"a training sentence with its eos ({cap})")
        _check_limits(m, reading, size, f"model.augment.randomized.max_length={size} draws positions up to {size - 1}")
    elif a.method == "shape":
        if all(getattr(cls, "shift_invariant", False) for _, _, _, cls in reading):
            raise ConfigError(f"{what} changes nothing here: it adds one offset to every position of a sequence, "
                              f"and the encodings in use ({in_use}) depend on position differences only; SHAPE is "
                              "for absolute encodings (model.input_pe)")
        k = a.shape.max_shift
        _check_limits(m, reading, longest + k, f"model.augment.shape.max_shift={k} shifts positions up to "
                                               f"{longest + k - 1} ({cap}, plus {k})")


def _training_length(cfg: Config) -> tuple[int, str]:
    """(the most positions a training sequence takes, what sets it): data.max_len (or the stricter
    data.max_train_len) tokens and the eos/bos."""
    d = cfg.data
    if d.max_train_len is not None and d.max_train_len < d.max_len:
        return d.max_train_len + 1, f"data.max_train_len={d.max_train_len} and the eos"
    return d.max_len + 1, f"data.max_len={d.max_len} and the eos"


def _check_limits(m: Any, reading: list[tuple[str, str, str, Any]], need: int, what: str) -> None:
    for key, name, level, cls in reading:
        limit = cls.length_limit(m) if level == "input" else None
        if limit is not None and limit[0] < need:
            raise ConfigError(f"{what}, but {key}={name} represents {limit[0]} positions ({limit[1]})")
