"""The positional-encoding interface: one registry, two levels, five hooks.

An *input-level* encoding acts once, on the scaled token embeddings (hook ``embed``). An
*attention-level* encoding acts inside every attention layer it applies to, through up to four
hooks: ``rotate`` (transform q and k, e.g. RoPE), ``bias`` (additive scores given to
``scaled_dot_product_attention`` as a float mask, e.g. ALiBi/T5), ``logits_bias`` (additive scores too, in the
same float mask, computed from q *and* k, the positions and the attention mask, e.g. CoPE's gates on q.k) and
``values`` (an extra term added to the attention output, which needs the explicit attention path, e.g. Shaw et
al.'s a_V).

Positions are explicit ``LongTensor [T]`` (shared by the batch: padding is on the right), so a
KV-cached decoding step passes its true offset and the same code serves training and inference. In training,
``model.augment`` may give other positions: shifted or sparse integers, or (CAPE) a float64 tensor of real
positions to the encodings that declare ``positions = "real"``.

Beyond the forward hooks, an encoding describes itself to the layers above (which never switch on names):
``plots`` returns ``Plot`` specs that ``utils.figures.maps`` draws, ``ct2_refusal`` / ``ct2_token_weight``
/ ``ct2_stack`` / ``ct2_fill`` map it onto a CTranslate2 spec (ctranslate2 is imported lazily, inside), and
``memory`` states the memory it takes (``Share``), which ``models.memory`` adds up before anything is built.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch
from torch import nn

from utils.schema import ConfigError, Section

if TYPE_CHECKING:  # models.config composes ModelConfig from this registry
    from models.transformer_config import Experiment as Config
    from models.transformer_config import TransformerConfig as ModelConfig  # the composed class is one

AttentionKind = Literal["encoder", "decoder", "cross"]


@dataclass
class Plot:
    """One figure an encoding asks for: ``utils.figures.plots.<draw>(*args, **kwargs)`` saved under ``tag``.

    Encodings describe their figures this way (models/ does not draw); ``utils.figures.maps`` draws them.
    """

    tag: str
    draw: str  # the name of a function in utils.figures.plots, e.g. "pe_heatmap", "bias_grid"
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Use:
    """What one training step gives the encodings, for their memory estimate (``models.memory``): sequences of at
    most ``length`` tokens (bos/eos included), positions below ``positions`` (more than ``length`` under
    ``model.augment``; ``positions_key`` is the setting that sets them) and ``tokens`` tokens per batch (sequences
    times their padded length)."""

    length: int
    positions: int
    tokens: int
    positions_key: str = "data.max_len"


@dataclass(frozen=True)
class Share:
    """The memory of one encoding (one instance: the model holds one per attention layer it serves), in bytes:
    learned ``parameters`` (training holds them five times: with their gradients, AdamW's two moments and its
    step's temporaries, ``models.memory.TRAINING_COPIES``), ``buffers`` it keeps, and the
    ``working`` memory it computes while it is built or in one training forward (what it keeps for the backward
    pass included); ``key`` is the setting that sizes it most, e.g. ``model.cope.npos_max`` ("" if none)."""

    parameters: int = 0
    buffers: int = 0
    working: int = 0
    key: str = ""


#: Bytes of a float32 and of a float64 / int64 element.
F32, F64 = 4, 8


def largest(*terms: tuple[str, int]) -> str:
    """The key of the largest of ``terms`` (setting, bytes it sizes): which one a ``Share`` names."""
    return max(terms, key=lambda term: term[1])[0]


def meta_share(build: Callable[[], nn.Module], working: int = 0, key: str = "") -> Share:
    """The parameters and buffers of the module ``build()`` makes, built on the meta device (no memory is taken,
    no value computed): the default ``memory`` of an encoding that states none."""
    with torch.device("meta"):
        module = build()
    return Share(sum(p.numel() * p.element_size() for p in module.parameters()),
                 sum(b.numel() * b.element_size() for b in module.buffers()), working, key)


class SharedPositions:
    """Per-forward position data (e.g. RoPE's cos/sin) computed once and shared by every layer holding this memo.

    An entry is keyed on the positions tensor *object* (a stack makes one per forward or decoding step,
    ``torch.arange``) and a hashable ``key`` naming what was computed from it. The last ``size`` entries are kept
    with strong references to their positions, so an object id is never reused while its entry lives.
    """

    def __init__(self, size: int = 4) -> None:
        self.size = size
        self.entries: list[tuple[torch.Tensor, Hashable, Any]] = []

    def get(self, positions: torch.Tensor, key: Hashable, compute: Callable[[], Any]) -> Any:
        """``compute()`` for (``positions``, ``key``), computed on the first ask of a forward; inside a compiled
        graph always computed (the compiler shares the work itself, and a cache list there is guarded state that
        would recompile the graph at every step)."""
        if torch.compiler.is_compiling():
            return compute()
        for pos, k, value in self.entries:
            if pos is positions and k == key:
                return value
        value = compute()
        self.entries = [(positions, key, value), *self.entries[: self.size - 1]]
        return value


class Settings(Section):
    """An encoding's own settings section (``model.<key>``, the ``settings`` of its class), with the rules that tie
    its keys to each other and to the Transformer's fields (``check``): validation applies them to every config,
    whether or not the encoding is in use, as it applies each field's bounds."""

    #: Its keys that shape no parameter, so a trained model may be run with other values (e.g. RoPE's length
    #: scalings, ``--set model.rope.scaling=yarn``): a checkpoint's model fingerprint leaves them out.
    inference_only: ClassVar[tuple[str, ...]] = ()

    def check(self, model: ModelConfig) -> None:
        """ConfigError, one line naming the key, where this section's values do not go together or with ``model``'s
        (e.g. ``model.rope.dim`` beyond the head dimension). Nothing by default."""


class Reference:
    """What an encoding says of itself beyond its hooks: its reference page (``docs/reference_encodings.py`` writes
    one page per registry name from these and from the rest of the class: settings, hooks, where it is allowed,
    export, figure), its description in logs (``describe``) and the Transformer keys that act through it alone
    (``owns``)."""

    #: Its name for people, e.g. "RoPE" (the page is titled "RoPE (`rope`)").
    title: ClassVar[str] = ""
    #: What it does, in two or three sentences (markdown).
    summary: ClassVar[str] = ""
    #: The paper it comes from: "Authors (year). Title. Venue, arXiv:id."; "" for none.
    paper: ClassVar[str] = ""
    #: Its equation (LaTeX, shown as display math).
    formula: ClassVar[str] = ""
    #: More for its page (markdown, may be ""): variants, length extension, where it departs from the paper.
    notes: ClassVar[str] = ""
    #: The Transformer's own ``model.*`` keys it reads beside its ``settings``, e.g. ("max_positions",).
    reads: ClassVar[tuple[str, ...]] = ()
    #: How it is written into a CTranslate2 model where it exports, one sentence ("" where ``ct2_refusal`` refuses).
    ct2_export: ClassVar[str] = ""
    #: The tag of the figure its page shows (None: the first that ``utils.figures.maps.position_figures`` draws).
    figure: ClassVar[str | None] = None
    #: The Transformer's own ``model.*`` keys that act only where this encoding (or another that owns them too) is in
    #: use, e.g. ("gaussian_sigma",): a ``--set`` of one with none of them in use is reported as having no effect, as
    #: a ``--set`` of its ``settings`` is.
    owns: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def describe(cls, cfg: ModelConfig, name: str) -> str:
        """The encoding named ``name`` in a few words, for logs and the server
        (``TransformerConfig.describe_encodings``): the name, and what its settings change, e.g. ``rope (ntk x4)``."""
        return name


def name_at(cfg: Config, key: str) -> Any:
    """The value a dotted ``key`` holds, e.g. an encoding name (``model.attention_pe``, ``model.decoder_pe.attention``;
    None for a stack key left to the shorthand)."""
    value: Any = cfg
    for part in key.split("."):
        value = getattr(value, part)
    return value


class InputPE(Reference, nn.Module):
    """Input-level encoding: ``embed(x [B, T, D], positions [T]) -> [B, T, D]``."""

    ct2_export = ("Written as CTranslate2's additive position table (the encoding of every position, "
                  "exact for x + P[i]).")
    level: ClassVar[str] = "input"
    #: The encoding's own settings: (key under ``model``, its Section), e.g. ("rope", RopeConfig) for
    #: ``model.rope.*``; ``models.config.ModelConfig`` gains one such section per key in the registry.
    settings: ClassVar[tuple[str, type[Section]] | None] = None
    #: Longest sequence the encoding can represent (None: unbounded).
    max_length: int | None = None
    #: The positions ``embed`` takes: "integer" (indices, the safe default) or "real" (any real number, e.g.
    #: sinusoids). Training-time augmentation (``models/positional/augment.py``) is validated against it: CAPE
    #: draws real positions.
    positions: ClassVar[Literal["integer", "real"]] = "integer"

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg

    @classmethod
    def length_limit(cls, cfg: ModelConfig) -> tuple[int, str] | None:
        """(positions the encoding represents, the key that sets them) for ``cfg``, or None if unbounded."""
        return None

    @classmethod
    def check(cls, cfg: Config, key: str = "model.input_pe") -> None:
        """ConfigError, one line, for settings this encoding cannot train with where ``key`` (model.input_pe or
        model.<stack>_pe.input) puts it (validation calls it): by default, a length limit below the longest
        training sequence (``data.max_len`` tokens and eos/bos)."""
        limit = cls.length_limit(cfg.model)
        need = cfg.data.max_len + 1
        if limit is not None and limit[0] < need:
            raise ConfigError(f"{key}={name_at(cfg, key)} represents {limit[0]} positions ({limit[1]}), "
                              f"fewer than the {need} of a data.max_len={cfg.data.max_len} sentence with its eos")

    @classmethod
    def memory(cls, cfg: ModelConfig, use: Use) -> Share:
        """The memory one instance (one stack's) takes in training (``Use``), before it is built. By default its
        parameters and buffers as built on the meta device, no working memory: override where the config sizes a
        table, a build or a per-forward tensor."""
        return meta_share(lambda: cls(cfg))

    @classmethod
    def plot_memory(cls, cfg: ModelConfig, length: int) -> int:
        """Bytes its figures (``plots``) take at ``length`` positions (visualize.py refuses a ``--length`` beyond
        the machine). By default: its table at the positions it represents, and for each table drawn (one per side
        for a learned table) the similarity matrices between positions, cosine and MDS, ~96 bytes a pair."""
        limit = cls.length_limit(cfg)
        n = min(length, limit[0]) if limit is not None else length
        share = cls.memory(cfg, Use(n, n, n))
        return share.buffers + share.working + (2 if share.parameters else 1) * 96 * n * n

    def embed(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.embed(x, positions)

    def table(self, length: int) -> torch.Tensor | None:
        """The ``[length, D]`` table added to embeddings, for plots; None if it has none."""
        return None

    # ------------------------------------------------------------------ plots (drawn by utils.figures.maps)

    def plots(self, name: str, length: int, sides: dict[str, InputPE]) -> tuple[list[Plot], list[str]]:
        """(figures, one-line notes) for this encoding at ``length`` positions; ``name`` is its registry name,
        ``sides`` the encoder and decoder instances (learned tables are separate parameters per side).

        Default: nothing (with a note) without a table; a fixed table's heatmap and cosine similarity; a learned
        one's heatmap, cosine and classical MDS per side.
        """
        what = f"input_pe={name}"
        table = self.table(length)
        if table is None:
            return [], [f"{what}: no input positional encoding to plot"]
        if not any(True for _ in self.parameters()):
            return [Plot("position/input/heatmap", "pe_heatmap", (table, f"{what}, first {length} positions")),
                    Plot("position/input/cosine", "pe_cosine",
                         (table, f"{what}: cosine similarity between positions"))], []
        out: list[Plot] = []
        for side, pe in sides.items():
            t = pe.table(length)
            assert t is not None
            tag = f"position/input/{side}"
            out += [Plot(f"{tag}/heatmap", "pe_heatmap", (t, f"{what}, {side} table, first {length} positions")),
                    Plot(f"{tag}/cosine", "pe_cosine", (t, f"{what}, {side}: cosine between positions")),
                    Plot(f"{tag}/mds", "pe_mds", (t, f"{what}, {side}: classical MDS of positions"))]
        return out, []

    def decay(self) -> dict[str, Any]:
        """Arguments of ``utils.figures.plots.decay_curves`` it gives (sinusoids: ``d_model``); {} for none."""
        return {}

    # ------------------------------------------------------------------ CTranslate2 export (utils.translation.export)

    @classmethod
    def ct2_refusal(cls, cfg: Config) -> str | None:
        """Why CTranslate2 cannot compute this encoding exactly (one line), or None. By default None: the export
        writes ``embed(0, positions)`` as CTranslate2's additive position table, exact for ``x + P[pos]``."""
        return None

    def ct2_token_weight(self, weight: torch.Tensor, scale: float) -> torch.Tensor:
        """The token table ``[V, D]`` CTranslate2 should hold for ours (``weight``, scaled by ``scale`` in the
        model), so that ``scale * table + P[pos]`` equals ``embed(scale * E, pos)``. Identity by default."""
        return weight


class AttentionPE(Reference, nn.Module):
    """Attention-level encoding, built once per attention layer it applies to.

    ``kind`` says which attention it serves (encoder self, decoder self, or cross), so a scheme can be
    bidirectional in the encoder and causal in the decoder.
    """

    level: ClassVar[str] = "attention"
    #: Defined for causal (decoder) self-attention only, e.g. xPos, CoPE: validation refuses it in the encoder
    #: and in cross-attention, in one line.
    causal_only: ClassVar[bool] = False
    #: The encoding's own settings: (key under ``model``, its Section), e.g. ("rope", RopeConfig) for
    #: ``model.rope.*``; ``models.config.ModelConfig`` gains one such section per key in the registry.
    settings: ClassVar[tuple[str, type[Section]] | None] = None
    #: Whether ``values`` is implemented (forces the explicit attention path).
    needs_explicit: ClassVar[bool] = False
    #: The positions the hooks take: "integer" (the safe default, e.g. bucketed or clipped distances) or "real"
    #: (any real number, e.g. RoPE's angles, ALiBi's distances); CAPE's augmentation needs "real".
    positions: ClassVar[Literal["integer", "real"]] = "integer"
    #: Whether the hooks depend on positions only through their differences i - j (adding one offset to every
    #: position changes nothing): validation refuses SHAPE where every encoding in use is.
    shift_invariant: ClassVar[bool] = False
    #: Whether the hooks depend on positions only through their order (e.g. CoPE: the causal test j <= i), which
    #: every ``model.augment`` method keeps: validation refuses a method where no other encoding in use reads them.
    order_only: ClassVar[bool] = False

    def __init__(self, cfg: ModelConfig, kind: AttentionKind) -> None:
        super().__init__()
        self.cfg = cfg
        self.kind = kind
        self.head_dim = cfg.d_model // cfg.n_heads
        #: Per-forward position data; the model gives all its layers one memo (``Seq2SeqTransformer``).
        self.shared = SharedPositions()

    @classmethod
    def check(cls, cfg: Config, key: str) -> None:
        """ConfigError, one line, for settings this encoding cannot run with; ``key`` names the setting that
        chose it (model.attention_pe or model.cross_attention_pe). Validation calls it."""

    @classmethod
    def memory(cls, cfg: ModelConfig, kind: AttentionKind, use: Use) -> Share:
        """The memory one instance (one layer's, in ``kind`` attention) takes in training (``Use``), before it is
        built. By default its parameters and buffers as built on the meta device, no working memory: override
        where the config sizes a table, a build or a per-forward tensor (e.g. a bias of every query and key)."""
        return meta_share(lambda: cls(cfg, kind))

    @classmethod
    def plot_memory(cls, cfg: ModelConfig, length: int) -> int:
        """Bytes its figures (``plots`` at ``length`` positions, ``model_plots``) take; by default a grid of
        ``length`` x ``length`` values per head, ~64 bytes each drawn."""
        return 64 * cfg.n_heads * length**2

    def rotate(
        self, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q ``[B, H, Tq, Dh]``, k ``[B, H, Tk, Dh]`` -> the same shapes. Identity by default."""
        return q, k

    def bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor, q: torch.Tensor | None = None) -> torch.Tensor | None:
        """Additive scores ``[1 or B, H, Tq, Tk]`` (added before softmax), or None."""
        return None

    def logits_bias(
        self, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor | None:
        """Additive scores ``[B, H, Tq, Tk]`` that need the keys (added before softmax, with ``bias``), or None.

        q ``[B, H, Tq, Dh]`` and k ``[B, H, Tk, Dh]`` after ``rotate``; in a cached decoding step k holds every
        cached key and q the one new query. ``mask`` is the boolean mask the scores get (True = may attend,
        broadcastable to ``[B, H, Tq, Tk]``, padding keys False) or None; it leaves out the causal part where that
        masks nothing (a cached step's query after all its keys), so compare ``q_pos`` and ``k_pos`` for order.
        Where ``mask`` is False the score becomes -inf whatever is returned. None by default.
        """
        return None

    def values(self, attn: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor | None:
        """Extra output term from weights ``[B, H, Tq, Tk]`` -> ``[B, H, Tq, Dh]``, or None."""
        return None

    # ------------------------------------------------------------------ plots (drawn by utils.figures.maps)

    def model_plots(self) -> list[Plot]:
        """Figures drawn once per model (the first layer that gives a tag wins); none by default."""
        return []

    def plots(self, what: str, length: int) -> list[Plot]:
        """Figures of this (first) layer's encoding, ``what`` naming it in titles, ``length`` positions; none by
        default (visualization then draws nothing for it)."""
        return []

    def decay(self) -> dict[str, Any]:
        """Arguments of ``utils.figures.plots.decay_curves`` it gives (RoPE: ``rope_dim``); {} for none."""
        return {}

    def bias_plot(self, what: str, length: int) -> Plot:
        """``position/bias/<kind>``: ``bias`` of positions 0..length-1 per head (for q-independent biases)."""
        tensor = next(iter(self.buffers()), None)
        tensor = tensor if tensor is not None else next(iter(self.parameters()), None)
        pos = torch.arange(length, device=tensor.device if tensor is not None else None)
        bias = self.bias(pos, pos)
        assert bias is not None, f"{type(self).__name__}.bias_plot needs a bias"
        return Plot(f"position/bias/{self.kind}", "bias_grid", (bias[0], f"{what}: bias added to the scores"),
                    {"causal": self.kind == "decoder"})

    # ------------------------------------------------------------------ CTranslate2 export (utils.translation.export)

    @classmethod
    def ct2_refusal(cls, cfg: Config, key: str, kind: AttentionKind) -> str | None:
        """Why CTranslate2 cannot compute this encoding exactly where ``key`` (model.attention_pe,
        model.<stack>_pe.attention or model.cross_attention_pe) puts it in ``kind`` attention, one line, or None.
        The default refuses cross-attention (CTranslate2's has no positional term), an input table beside it in
        the same stack (CTranslate2 drops it under a relative scheme), and any encoding that does not override
        ``ct2_stack``."""
        name = name_at(cfg, key)
        if kind == "cross":
            return f"{key}={name}: CTranslate2's cross-attention has no positional term"
        if cfg.model.pe(kind, "input") != "none":
            return (f"{cfg.model.pe_key(kind, 'input')}={cfg.model.pe(kind, 'input')} with {key}={name}: "
                    "CTranslate2 drops the position table when self-attention has a relative scheme")
        if cls.ct2_stack.__func__ is AttentionPE.ct2_stack.__func__:  # not overridden
            return f"{key}={name}: CTranslate2 has no equivalent of this encoding"
        return None

    @classmethod
    def ct2_stack(cls, cfg: ModelConfig, side: Literal["encoder", "decoder"]) -> dict[str, Any]:
        """Keyword arguments of ``ctranslate2.specs.Transformer{Encoder,Decoder}Spec`` for this self-attention
        encoding on ``side`` (import ctranslate2 lazily, inside). Not exportable by default."""
        raise NotImplementedError(f"{cls.__name__} has no CTranslate2 mapping")

    def ct2_fill(self, spec: Any, length: int) -> None:
        """Fill one layer's CTranslate2 self-attention ``spec`` with this encoding's weights (tables of numpy
        arrays) for sequences up to ``length``; nothing by default (e.g. RoPE is parameter-free)."""


class NoInputPE(InputPE):
    """No input-level position information (the encoder is then permutation-equivariant)."""

    positions = "real"  # reads none

    title = "No positional encoding"
    summary = (
        "Nothing is added to the token embeddings. With no attention-level encoding either, the encoder is "
        "permutation-equivariant: it sees a bag of tokens (the NoPE baseline). A causal decoder can still recover "
        "order from its mask alone (Kazemnejad et al. 2023), so `none` in the decoder is a real option."
    )
    paper = ("Amirhossein Kazemnejad, Inkit Padhi, Karthikeyan Natesan Ramamurthy, Payel Das, Siva Reddy (2023). "
             "The Impact of Positional Encoding on Length Generalization in Transformers. NeurIPS 2023, "
             "arXiv:2305.19466.")
    formula = r"h_i = x_i"
    notes = (
        "`none` is a name at both levels: `model.input_pe=none` adds nothing to the embeddings, and "
        "`model.attention_pe=none` (the default) or `model.cross_attention_pe=none` (the default) adds no "
        "attention-level term. Give one stack its own with `model.encoder_pe.*` / `model.decoder_pe.*`, e.g. RoPE in "
        "the encoder and no position at all in the decoder:\n\n"
        "```bash\n"
        "python train.py --config configs/demo.yaml --set model.input_pe=none --set model.attention_pe=rope \\\n"
        "    --set model.decoder_pe.attention=none\n"
        "```"
    )
    ct2_export = ("A table of zeros is written as CTranslate2's position table (without one, CTranslate2 would add "
                  "its own sinusoids).")

    @classmethod
    def memory(cls, cfg: ModelConfig, use: Use) -> Share:
        return Share()

    @classmethod
    def plot_memory(cls, cfg: ModelConfig, length: int) -> int:
        return 0

    def embed(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return x
