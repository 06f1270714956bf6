"""The positional-encoding reference, generated from the registry: ``reference/encodings/index.md`` (every name),
one page per registry name (``reference/encodings/<name>.md``, with its figure ``<name>.png``) and one for the
training-time augmentation methods (``augment.md``).

Everything on a page comes from the code: the text from the class's ``title``/``summary``/``paper``/``formula``/
``notes``/``ct2_export`` (``models/positional/base.py``, ``Reference``), the settings from its ``settings`` Section's
pydantic fields, the hooks from the methods it overrides, where it is allowed, which augmentation it takes and
whether it exports from the project's own validation (``utils.config.validate``) and export check
(``utils.translation.export.check_exportable``) run on a config holding the encoding, and the figure from
``utils.figures.maps.position_figures`` (what ``visualize.py`` draws) on a small untrained model.
"""

from __future__ import annotations

import ast
import functools
import inspect
import io
import re
import textwrap
import tokenize
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, get_args, get_origin

import torch
from pydantic import BaseModel

from models.config import model_config_class
from models.positional import REGISTRY
from models.positional.augment import AugmentConfig, CapeConfig, RandomizedConfig, ShapeConfig
from models.positional.base import AttentionPE
from models.transformer_config import TransformerConfig
from utils.config import Config, ConfigError, validate

FOLDER = "reference/encodings"
SEED = 0
#: The small model every figure is drawn from: untrained, its weights as ``torch.manual_seed(SEED)`` leaves them.
FIGURE_MODEL: dict[str, Any] = dict(d_model=256, n_heads=4, encoder_layers=1, decoder_layers=1, d_ff=64, dropout=0.0)
FIGURE_VOCAB = 16
FIGURE_LENGTH = 32  # positions of input tables
BIAS_LENGTH = 16  # positions of bias matrices and of the augmentation figures
DPI = 80
HOOKS = ("rotate", "bias", "logits_bias", "values")
METHODS = {"shape": ShapeConfig, "randomized": RandomizedConfig, "cape": CapeConfig}
KIND_TITLES = {"encoder": "encoder self-attention", "decoder": "decoder self-attention", "cross": "cross-attention"}


# ---------------------------------------------------------------------------------------------- configs


def _model_class() -> type[TransformerConfig]:
    """``ModelConfig`` of the registry as it is now (a test may have registered an encoding since import)."""
    return _model_class_of(tuple((level, name, cls) for level, names in REGISTRY.items()
                                 for name, cls in names.items()))


@functools.lru_cache(maxsize=8)
def _model_class_of(registry: tuple[tuple[str, str, type | None], ...]) -> type[TransformerConfig]:
    out: dict[str, dict[str, type | None]] = {}
    for level, name, cls in registry:
        out.setdefault(level, {})[name] = cls
    return model_config_class(out)


def _config(**model: Any) -> Config:
    """A whole default config whose model has ``model`` (not validated: ``validate`` is what is being asked)."""
    return Config.model_construct(model=_model_class()(**model))


def _refusal(**model: Any) -> str | None:
    """The one-line refusal of the project's validation for this model config, or None if it is accepted."""
    try:
        validate(_config(**model))
    except ConfigError as err:
        return str(err)
    return None


def _export_refusal(**model: Any) -> str | None:
    """Why a model of this config cannot be exported to CTranslate2 (one line), or None if it can."""
    from utils.translation.export import ExportError, check_exportable

    try:
        check_exportable(_config(**model))
    except ExportError as err:
        return str(err)
    return None


def _shortest_randomized_length() -> int:
    """The smallest ``model.augment.randomized.max_length`` validation accepts: a training sentence and its eos."""
    return Config().data.max_len + 1


# ---------------------------------------------------------------------------------------------- one encoding


@dataclass
class Place:
    """One place an encoding can be put: its label, the setting that puts it there, and the model config."""

    label: str
    setting: str
    model: dict[str, Any]
    refusal: str | None = None  # validation's, None: allowed


@dataclass
class Encoding:
    """Everything a page says of one registry name at one level."""

    name: str
    level: str
    cls: type | None
    places: list[Place] = field(default_factory=list)
    augment: dict[str, str | None] = field(default_factory=dict)  # method -> refusal (None: taken)
    export: list[tuple[str, str | None]] = field(default_factory=list)  # (where, refusal)
    parameters: list[tuple[str, int]] = field(default_factory=list)  # (where, learned parameters)

    @property
    def allowed(self) -> list[Place]:
        return [p for p in self.places if p.refusal is None]

    @property
    def exports(self) -> bool:
        """Whether the encoding exports where it matters most: the input, or self-attention."""
        return bool(self.export) and self.export[0][1] is None


def _places(name: str, level: str) -> list[Place]:
    if level == "input":
        return [Place("encoder input", f"model.encoder_pe.input={name}", {"encoder_pe": {"input": name}}),
                Place("decoder input", f"model.decoder_pe.input={name}", {"decoder_pe": {"input": name}})]
    return [Place(KIND_TITLES["encoder"], f"model.encoder_pe.attention={name}",
                  {"input_pe": "none", "encoder_pe": {"attention": name}}),
            Place(KIND_TITLES["decoder"], f"model.decoder_pe.attention={name}",
                  {"input_pe": "none", "decoder_pe": {"attention": name}}),
            Place(KIND_TITLES["cross"], f"model.cross_attention_pe={name}", {"cross_attention_pe": name})]


def _alone(name: str, level: str, cls: type | None) -> dict[str, Any]:
    """The model config with this encoding alone where it is meant to be (no other encoding anywhere)."""
    if level == "input":
        return {"input_pe": name, "attention_pe": "none"}
    if cls is not None and cls.causal_only:
        return {"input_pe": "none", "decoder_pe": {"attention": name}}
    return {"input_pe": "none", "attention_pe": name}


def _parameters(enc: Encoding) -> list[tuple[str, int]]:
    """Learned parameters of the encoding's module at the default model size: per stack (input) or per layer."""
    if enc.cls is None:
        return []
    cfg = _model_class()()
    count = lambda module: sum(p.numel() for p in module.parameters())  # noqa: E731
    if enc.level == "input":
        return [("each stack", count(enc.cls(cfg)))]
    kinds = {"encoder self-attention": "encoder", "decoder self-attention": "decoder", "cross-attention": "cross"}
    return [(p.label, count(enc.cls(cfg, kinds[p.label]))) for p in enc.allowed]


def describe(name: str, level: str) -> Encoding:
    """What the code says of registry ``name`` at ``level``: where validation allows it, which augmentation it
    takes alone, whether it exports, and its parameters."""
    cls = REGISTRY[level][name]
    enc = Encoding(name, level, cls, _places(name, level))
    for place in enc.places:
        place.refusal = _refusal(**place.model)
    alone = _alone(name, level, cls)
    shortest = _shortest_randomized_length()
    for method in METHODS:
        enc.augment[method] = _refusal(**alone, augment={"method": method, "randomized": {"max_length": shortest}})
    if _refusal(**alone) is None:
        where = "input (both stacks)" if level == "input" else (
            "decoder self-attention" if cls is not None and cls.causal_only else "self-attention (both stacks)")
        enc.export.append((where, _export_refusal(**alone)))
    cross = enc.places[-1] if level == "attention" else None
    if cross is not None and cross.refusal is None:
        enc.export.append((KIND_TITLES["cross"], _export_refusal(**cross.model)))
    enc.parameters = _parameters(enc)
    return enc


# ---------------------------------------------------------------------------------------------- figures


@functools.cache
def _figure(name: str, level: str, cls: type | None) -> tuple[bytes, str] | tuple[None, str]:
    """(PNG bytes, the figure's tag) of the encoding on the small untrained model, or (None, why: the notes of
    ``position_figures``). Cached by class: the bytes depend on nothing else."""
    from models.transformer import Seq2SeqTransformer
    from utils.figures.maps import close_figures, position_figures

    model_cfg = _model_class()(**FIGURE_MODEL, **_alone(name, level, cls))
    torch.manual_seed(SEED)
    model = Seq2SeqTransformer(model_cfg, FIGURE_VOCAB, 0).eval()
    figs, notes = position_figures(model, model_cfg, length=FIGURE_LENGTH, bias_length=BIAS_LENGTH)
    try:
        if not figs:  # the notes on this encoding, not on the empty places around it
            return None, "; ".join(n for n in notes if re.search(rf"\b{re.escape(name)}\b", n))
        wanted = getattr(cls, "figure", None)
        tag = wanted if wanted in figs else next(iter(figs))
        return _png(figs[tag]), tag
    finally:
        close_figures(figs)


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    return buf.getvalue()


@functools.cache
def _augment_figure(method: str) -> bytes:
    """The ``position/augment`` figure of ``visualize.py`` for one method (seeded draws)."""
    from utils.figures.maps import augment_plot, close_figures, draw

    model_cfg = _model_class()(augment={"method": method, "randomized": {"max_length": 4 * BIAS_LENGTH}})
    plot = augment_plot(model_cfg, BIAS_LENGTH)
    assert plot is not None
    fig = draw(plot)
    try:
        return _png(fig)
    finally:
        close_figures({"augment": fig})


# ---------------------------------------------------------------------------------------------- settings


def field_comments(section: type) -> dict[str, str]:
    """The comment at the end of each field's line in ``section``'s source (``dim: int = 128  # d', even``)."""
    try:
        source = textwrap.dedent(inspect.getsource(section))
    except (OSError, TypeError):
        return {}
    comments = {tok.start[0]: tok.string.lstrip("#").strip()
                for tok in tokenize.generate_tokens(io.StringIO(source).readline) if tok.type == tokenize.COMMENT}
    node = ast.parse(source).body[0]
    out = {}
    for stmt in getattr(node, "body", []):
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            lines = [comments[n] for n in range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1) if n in comments]
            if lines:
                out[stmt.target.id] = " ".join(lines)
    return out


def type_text(annotation: Any) -> str:
    """A field's type in words: ``integer``, ``number``, ``boolean``, ``one of `a`, `b` ``, ``integer or null``."""
    origin = get_origin(annotation)
    if origin is Literal:
        return "one of " + ", ".join(f"`{a}`" for a in get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        options = [a for a in get_args(annotation) if a is not type(None)]
        text = " or ".join(type_text(a) for a in options)
        return text + " or null" if len(options) < len(get_args(annotation)) else text
    if origin is list:
        return f"list of {type_text(get_args(annotation)[0])}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    return {int: "integer", float: "number", bool: "boolean", str: "string"}.get(annotation, str(annotation))


def _bounds(metadata: list[Any]) -> str:
    signs = {"ge": "≥", "gt": ">", "le": "≤", "lt": "<"}
    return ", ".join(f"{signs[b]} {getattr(m, b):g}" for m in metadata for b in signs if hasattr(m, b))


def _default(info: Any) -> str:
    if info.default_factory is not None:
        return "(section)"
    value = info.default
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value!r}`" if isinstance(value, float) else f"`{value}`"


def _cell(text: str) -> str:
    """Text safe in one markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|")


def settings_rows(prefix: str, section: type[BaseModel], only: tuple[str, ...] | None = None) -> list[str]:
    """Table rows ``| `prefix.key` | type | default | meaning |`` for the fields of ``section`` (or ``only`` those),
    read from pydantic's ``model_fields``; the meaning is the field's description, else its line's comment."""
    comments = field_comments(section)
    rows = []
    for key, info in section.model_fields.items():
        if only is not None and key not in only:
            continue
        kind = type_text(info.annotation)
        bounds = _bounds(info.metadata)
        meaning = info.description or comments.get(key, "")
        rows.append(f"| `{prefix}.{key}` | {_cell(kind + (f', {bounds}' if bounds else ''))} | {_default(info)} | "
                    f"{_cell(meaning)} |")
    return rows


# ---------------------------------------------------------------------------------------------- text


def _arxiv_links(text: str) -> str:
    return re.sub(r"arXiv:(\d{4}\.\d{4,5})", r"[arXiv:\1](https://arxiv.org/abs/\1)", text)


def short_paper(paper: str) -> str:
    """``Jianlin Su, Yu Lu, ... (2021). RoFormer...`` -> ``Su et al. 2021``; "" for no paper."""
    m = re.match(r"(.+?) \((\d{4})\)", paper)
    if not m:
        return ""
    authors = [a.strip() for a in m.group(1).split(",")]
    surname = lambda a: a.split()[-1]  # noqa: E731
    who = surname(authors[0]) if len(authors) == 1 else (
        f"{surname(authors[0])} and {surname(authors[1])}" if len(authors) == 2 else f"{surname(authors[0])} et al.")
    return f"{who} {m.group(2)}"


def _summary(cls: type) -> str:
    text = getattr(cls, "summary", "") or (inspect.getdoc(cls) or "").split("\n\n")[0]
    return " ".join(text.split())


def _title(name: str, cls: type | None) -> str:
    title = getattr(cls, "title", "")
    return f"# {title} (`{name}`)" if title else f"# `{name}`"


def _math(formula: str) -> list[str]:
    return ["$$", formula, "$$"] if formula else ["No formula given."]


def _where(enc: Encoding) -> str:
    """Where an encoding is allowed, in a few words (the index's column)."""
    allowed = [p.label for p in enc.allowed]
    if enc.level == "input":
        return ", ".join(a.replace(" input", "") for a in allowed) or "nowhere"
    short = {KIND_TITLES["encoder"]: "encoder self", KIND_TITLES["decoder"]: "decoder self",
             KIND_TITLES["cross"]: "cross"}
    text = ", ".join(short[a] for a in allowed) or "nowhere"
    return text + " only (causal)" if enc.cls is not None and enc.cls.causal_only else text


def _figure_lines(name: str, enc: Encoding, figure: tuple[bytes | None, str]) -> list[str]:
    png, tag_or_why = figure
    if png is None:
        return ["Nothing to plot: `visualize.py` draws no figure of this encoding "
                f"({tag_or_why or 'it describes none'})."]
    learned = sum(n for _, n in enc.parameters)
    m = FIGURE_MODEL
    state = ("it has no learned parameters, so a trained model's figure is the same" if not learned else
             "its learned parameters are at their initial values, so a trained model's figure differs")
    return [f"![{name}: {tag_or_why}]({name}.png)", "",
            f"*`{tag_or_why}` as `visualize.py` draws it, for an untrained model (seed {SEED}; d_model {m['d_model']}, "
            f"{m['n_heads']} heads, one layer per stack): {state}.*"]


def encoding_page(name: str, encs: list[Encoding], figure: tuple[bytes | None, str]) -> str:
    """The markdown page of registry ``name`` (one ``Encoding`` per level it is registered at)."""
    main = next((e for e in encs if e.cls is not None), encs[0])
    cls = main.cls
    lines = [_title(name, cls), ""]
    if cls is None:
        lines += [f"`{name}` is registered at the attention level without a class: no attention-level term.", ""]
        return "\n".join(lines)
    lines += [_summary(cls), ""]
    paper = getattr(cls, "paper", "")
    lines += [f"**Paper:** {_arxiv_links(paper)}" if paper else "**Paper:** none of its own.", ""]
    for enc in encs:
        if enc.cls is None:
            lines += [f"At the attention level, `{name}` is registered without a class: no attention-level term "
                      f"(`model.attention_pe={name}` and `model.cross_attention_pe={name}` are the defaults).", ""]
    lines += ["## Formula", "", *_math(getattr(cls, "formula", "")), ""]
    lines += _properties(main)
    lines += _settings(cls)
    lines += _allowed(main)
    lines += _augment(main)
    lines += _export(main)
    notes = getattr(cls, "notes", "")
    if notes:
        lines += ["## Notes", "", notes, ""]
    lines += ["## Figure", "", *_figure_lines(name, main, figure), ""]
    return "\n".join(lines)


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _properties(enc: Encoding) -> list[str]:
    cls = enc.cls
    assert cls is not None
    hooks = ["embed"] if enc.level == "input" else [h for h in HOOKS if getattr(cls, h) is not getattr(AttentionPE, h)]
    settings = [f"`{p.setting}`" for p in enc.allowed]
    if all(p.refusal is None for p in enc.places[:2]):  # both stacks: the shorthand too
        both = "`model.input_pe={}` (both stacks)" if enc.level == "input" else \
            "`model.attention_pe={}` (self-attention of both stacks)"
        settings.insert(0, both.format(enc.name))
    keys = ", ".join(settings) or "nowhere"
    rows = [("Level", enc.level), ("Set with", keys),
            ("Hooks", ", ".join(f"`{h}`" for h in hooks) or "none"),
            ("Positions it takes", "real numbers" if cls.positions == "real" else "integers only"),
            ("Depends on positions only through i − j (shift-invariant)", _yes(getattr(cls, "shift_invariant", False))),
            ("Reads only the order of positions", _yes(getattr(cls, "order_only", False))),
            ("Causal (decoder self-attention) only", _yes(getattr(cls, "causal_only", False)))]
    if enc.level == "input":
        limit = cls.length_limit(_model_class()())
        longest = f"{limit[0]} positions (`{limit[1]}`)" if limit else "unbounded"
        rows.append(("Longest input (default config)", longest))
    params = ", ".join(f"{n:,} ({where})" for where, n in enc.parameters)
    if not any(n for _, n in enc.parameters):
        params = "0: nothing learned"
    elif enc.level == "input":
        params = f"{enc.parameters[0][1]:,} in each stack"
    cfg = _model_class()()
    per = "per stack" if enc.level == "input" else "per layer"
    rows.append((f"Learned parameters {per} (default config: d_model {cfg.d_model}, {cfg.n_heads} heads)", params))
    return ["## At a glance", "", "| | |", "|---|---|", *(f"| {k} | {_cell(v)} |" for k, v in rows), ""]


def _settings(cls: type) -> list[str]:
    rows = []
    if cls.settings is not None:
        key, section = cls.settings
        rows += settings_rows(f"model.{key}", section)
    reads = getattr(cls, "reads", ())
    if reads:
        rows += settings_rows("model", TransformerConfig, reads)
    lines = ["## Settings", ""]
    if not rows:
        return [*lines, "None of its own.", ""]
    intro = (f"Its own section `model.{cls.settings[0]}`" if cls.settings is not None else "The keys it reads") + \
        ", as in a config file or `--set key=value`:"
    return [*lines, intro, "", "| Key | Type | Default | Meaning |", "|---|---|---|---|", *rows, ""]


def _allowed(enc: Encoding) -> list[str]:
    lines = ["## Where it is allowed", "",
             "What the config validation says of each place, this encoding there and default settings otherwise:", "",
             "| Place | Setting | Allowed |", "|---|---|---|"]
    for p in enc.places:
        lines.append(f"| {p.label} | `{p.setting}` | {'yes' if p.refusal is None else _cell('no: ' + p.refusal)} |")
    return [*lines, ""]


def _augment(enc: Encoding) -> list[str]:
    lines = ["## Training-time augmentation", "",
             f"Which [`model.augment.method`](augment.md) the config validation accepts with this encoding alone "
             f"(`model.augment.randomized.max_length` = {_shortest_randomized_length()}, the smallest allowed):", "",
             "| Method | Accepted |", "|---|---|"]
    for method, refusal in enc.augment.items():
        lines.append(f"| [`{method}`](augment.md#{method}) | {'yes' if refusal is None else _cell('no: ' + refusal)} |")
    return [*lines, ""]


def _export(enc: Encoding) -> list[str]:
    cls = enc.cls
    lines = ["## CTranslate2 export", ""]
    if not enc.export:
        return [*lines, "Not checked: validation refuses the encoding alone.", ""]
    how = getattr(cls, "ct2_export", "")
    if enc.exports and how:
        lines += [how, ""]
    lines += ["| Where | Export |", "|---|---|"]
    for where, refusal in enc.export:
        lines.append(f"| {where} | {'yes' if refusal is None else _cell('no: ' + refusal)} |")
    return [*lines, ""]


INDEX_INTRO = """\
# Positional encodings

Every encoding the registry holds (`models/positional/__init__.py`), each with its page: what it does, its paper and
formula, its settings, where it is allowed, which training-time augmentation it takes, how it exports to
CTranslate2, and a figure. The pages are generated from the code. The [guide](../../guide/encodings.md) explains
how to choose and combine them.

- **Input level** (`model.input_pe`, default `sinusoidal`): acts once, on the scaled token embeddings.
- **Attention level** (`model.attention_pe`, default `none`): acts inside every self-attention layer;
  `model.cross_attention_pe` (default `none`, as in the original Transformer) puts one in cross-attention.
- The two levels combine freely (`--set model.input_pe=none --set model.attention_pe=rope`), and each stack can
  have its own: `model.encoder_pe.{input,attention}` and `model.decoder_pe.{input,attention}` (null: the
  shorthand applies).
- A sentence longer than an encoding can represent is a one-line error naming the limit (`test.py` truncates
  instead, with a warning).
- [Training-time augmentation](augment.md) (`model.augment`: SHAPE, randomized positions, CAPE) changes the
  positions a stack sees while it trains.

Notation on the pages: x_i is the (scaled) token embedding at position i and h_i what the first layer reads;
q_i, k_j, v_j the query, key and value of one head, d_h the head dimension, H the number of heads (h = 1..H),
s_ij the score of query i for key j before the softmax, b_h(i, j) a term added to it. Hooks: `embed` changes the
embeddings, `rotate` transforms q and k, `bias` adds to the scores (possibly from q), `logits_bias` adds to the
scores from q and k together, `values` adds to the attention output.
"""


def index_page(encodings: dict[str, list[Encoding]]) -> str:
    lines = [INDEX_INTRO, "| Name | Level | Where it is allowed | Paper | CTranslate2 export | Augmentation |",
             "|---|---|---|---|---|---|"]
    for name, encs in encodings.items():
        for enc in encs:
            paper = short_paper(getattr(enc.cls, "paper", "")) if enc.cls is not None else ""
            methods = ", ".join(m for m, refusal in enc.augment.items() if refusal is None)
            lines.append(f"| [`{name}`]({name}.md) | {enc.level} | {_where(enc)} | {paper or '—'} | "
                         f"{'yes' if enc.exports else 'no'} | {methods or '—'} |")
    return "\n".join(lines) + "\n"


def augment_page(encodings: dict[str, list[Encoding]]) -> tuple[str, dict[str, bytes]]:
    """The page of the training-time augmentation methods, and its figures (one per method)."""
    lines = [f"# {AugmentConfig.title} (`model.augment`)", "", AugmentConfig.summary, "",
             "| Key | Type | Default | Meaning |", "|---|---|---|---|",
             *settings_rows("model.augment", AugmentConfig, ("method",)), "", AugmentConfig.notes, ""]
    figures = {}
    for method, section in METHODS.items():
        takes = [f"[`{name}`]({name}.md)" for name, encs in encodings.items() for e in encs
                 if e.cls is not None and e.augment[method] is None]
        lines += [f"## {section.title} (`{method}`) {{#{method}}}", "", section.summary, "",
                  f"**Paper:** {_arxiv_links(section.paper)}", "", *_math(section.formula), "",
                  "| Key | Type | Default | Meaning |", "|---|---|---|---|",
                  *settings_rows(f"model.augment.{method}", section), "",
                  f"Encodings the config validation accepts it with, alone: {', '.join(takes) or 'none'}.", ""]
        if section.notes:
            lines += [section.notes, ""]
        figures[f"{FOLDER}/augment_{method}.png"] = _augment_figure(method)
        length = f", `model.augment.randomized.max_length` = {4 * BIAS_LENGTH}" if method == "randomized" else ""
        lines += [f"![{method}: position/augment](augment_{method}.png)", "",
                  f"*`position/augment` as `visualize.py` draws it: the positions of a {BIAS_LENGTH}-token stack in "
                  f"200 seeded draws, default settings{length}.*", ""]
    return "\n".join(lines), figures


# ---------------------------------------------------------------------------------------------- pages


def pages() -> dict[str, str | bytes]:
    """Every page of the encodings reference, path relative to ``docs/pages/`` -> markdown or PNG bytes (the
    caller's random state untouched: modules are built to count and draw them)."""
    with torch.random.fork_rng(devices=[]):
        return _pages()


def _pages() -> dict[str, str | bytes]:
    encodings: dict[str, list[Encoding]] = {}
    for level in ("input", "attention"):
        for name in REGISTRY[level]:
            encodings.setdefault(name, []).append(describe(name, level))
    if "augment" in encodings or "index" in encodings:
        raise ValueError("an encoding named 'augment' or 'index' would overwrite a page of the reference")
    out: dict[str, str | bytes] = {f"{FOLDER}/index.md": index_page(encodings)}
    for name, encs in encodings.items():
        main = next((e for e in encs if e.cls is not None), encs[0])
        figure = _figure(name, main.level, main.cls) if main.cls is not None else (None, "")
        out[f"{FOLDER}/{name}.md"] = encoding_page(name, encs, figure)
        if figure[0] is not None:
            out[f"{FOLDER}/{name}.png"] = figure[0]
    text, figures = augment_page(encodings)
    out[f"{FOLDER}/augment.md"] = text
    out.update(figures)
    return out
