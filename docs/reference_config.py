"""The config reference page, ``reference/config.md``, generated from the pydantic sections of the config.

Every key comes from walking ``utils.config.Config`` through pydantic's ``model_fields``: its type and allowed values
from the annotation (``Literal`` choices, ``Field(ge=, gt=, le=, lt=)`` ranges, the registry's encoding names for the
keys that name an encoding), its default, and its meaning from the field's ``description``. Which encoding reads a
settings section (``model.rope``, ...) comes from the registry, ``models.positional.REGISTRY``. Nothing is listed by
hand, so the page cannot drift from the code (``tests/test_docs_config.py`` checks it).
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal, get_args, get_origin

from markdown.extensions.toc import slugify
from pydantic import BaseModel

PAGE = "reference/config.md"


@dataclass(frozen=True)
class Row:
    """One config key as the reference table shows it (markdown in each cell but ``key``)."""

    key: str  # dotted, e.g. "train.label_smoothing"
    type: str  # "number", "integer or null", ...
    default: str  # as typed in YAML: "0.1", "null", "[0.9, 0.98]"
    allowed: str  # "≥ 0, < 1", "`stop`, `skip`", "any" (text), "see meaning" (checked with other keys, if at all)
    meaning: str  # the field's description


def _is_section(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def format_value(value: Any) -> str:
    """``value`` as one would type it in a YAML config: ``null``, ``true``, ``0.0005``, ``[10, 20]``, ``demo``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(format_value(v) for v in value) + "]"
    if isinstance(value, str) and value == "":
        return '""'
    return str(value)


def _number(x: Any) -> str:
    return format(x, "g") if isinstance(x, float) else str(x)


def _members(tp: Any) -> list[Any]:
    """The alternatives of a union annotation (``int | None`` -> [int, NoneType]), else [tp]."""
    if get_origin(tp) in (typing.Union, types.UnionType):
        return [m for arg in get_args(tp) for m in _members(arg)]
    return [tp]


_NAMES = {int: "integer", float: "number", bool: "boolean", str: "string", type(None): "null"}


def _type_name(tp: Any) -> str:
    names: list[str] = []
    for m in _members(tp):
        if get_origin(m) is Literal:
            name = _NAMES.get(type(get_args(m)[0]), "value")
        elif get_origin(m) is list:
            name = f"list of {_type_name(get_args(m)[0])}s"
        else:
            name = _NAMES.get(m, getattr(m, "__name__", str(m)))
        if name not in names:
            names.append(name)
    if "null" in names:  # last: "integer or null"
        names = [n for n in names if n != "null"] + ["null"]
    return " or ".join(names)


def _range(metadata: list[Any]) -> str:
    """``≥ 0, < 1`` from a field's ``ge``/``gt``/``le``/``lt`` constraints ("" without any)."""
    signs = {"ge": "≥", "gt": ">", "le": "≤", "lt": "<"}
    parts = [f"{sign} {_number(getattr(m, bound))}" for bound, sign in signs.items() for m in metadata
             if getattr(m, bound, None) is not None]
    return ", ".join(parts)


def _encoding_choices() -> dict[str, list[str]]:
    """The keys that name a positional encoding -> the registry names they accept (as validation checks them)."""
    from utils.config import registry_choices

    return registry_choices()


def _allowed(key: str, field: Any) -> str:
    choices = _encoding_choices().get(key)
    values: list[str] = []
    if choices is not None:
        values = [f"`{c}`" for c in choices]
    for m in _members(field.annotation):
        if get_origin(m) is Literal:
            values += [f"`{format_value(v)}`" for v in get_args(m)]
        elif m is bool:
            values += ["`true`", "`false`"]
        elif m in (int, float):
            values.append(_range(field.metadata) or "see meaning")
        elif m is type(None):
            values.append("`null`")
        elif str in (m, *get_args(m)) and choices is None:  # text, or a list of texts
            values.append("any")
        elif choices is None:
            values.append("see meaning")
    return ", ".join(dict.fromkeys(values))


def _cell(text: str) -> str:
    """Text safe inside a markdown table cell: no line breaks, ``|`` escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def config_rows(section: type[BaseModel], prefix: str = "") -> list[Row]:
    """One row per key of ``section`` itself (nested sections are ``config_sections``' own entries), in declaration
    order; ``prefix`` is the section's dotted name (``"train"``; ``""`` at the top level)."""
    rows = []
    for name, field in section.model_fields.items():
        if _is_section(field.annotation):
            continue
        key = f"{prefix}.{name}" if prefix else name
        default = field.default_factory() if field.default_factory is not None else field.default
        rows.append(Row(key, _type_name(field.annotation), format_value(default), _allowed(key, field),
                        field.description or ""))
    return rows


def config_sections(root: type[BaseModel], prefix: str = "") -> list[tuple[str, type[BaseModel]]]:
    """``root`` and every section nested in it, depth first in declaration order: (dotted name, class)."""
    out = [(prefix, root)]
    for name, field in root.model_fields.items():
        if _is_section(field.annotation):
            out += config_sections(field.annotation, f"{prefix}.{name}" if prefix else name)
    return out


def _doc(cls: type) -> str:
    """The class docstring as markdown paragraphs (``code`` -> `code`), or ""."""
    doc = cls.__dict__.get("__doc__")
    if not doc:
        return ""
    paragraphs = [" ".join(p.split()) for p in inspect.cleandoc(doc).split("\n\n")]
    return "\n\n".join(re.sub(r"``([^`]+)``", r"`\1`", p) for p in paragraphs if p)


def _owners(key: str) -> list[tuple[str, str, type]]:
    """(level, registry name, class) of every encoding whose settings section is ``model.<key>``."""
    from models.positional import REGISTRY

    return [(level, name, cls) for level, entries in REGISTRY.items() for name, cls in entries.items()
            if cls is not None and cls.settings is not None and cls.settings[0] == key]


_PLACES = {"input": "`model.input_pe`, `model.encoder_pe.input` or `model.decoder_pe.input`",
           "attention": "`model.attention_pe`, `model.encoder_pe.attention`, `model.decoder_pe.attention` or "
                        "`model.cross_attention_pe`"}


def applies_only(name: str, root: type[BaseModel]) -> str:
    """When the keys of section ``name`` are read, if only under some other setting ("" otherwise): an encoding's
    settings section is read only where that encoding is chosen (from the registry); a subsection named after one
    value of a sibling ``Literal`` key (``model.augment.shape``) only with that value."""
    parent, _, last = name.rpartition(".")
    if parent == "model":
        owners = _owners(last)
        if owners:
            links = " or ".join(f"[`{n}`](encodings/{n}.md)" for _, n, _ in owners)
            levels = {level for level, _, _ in owners}
            if all(getattr(cls, "causal_only", False) for _, _, cls in owners):
                where = "decoder self-attention only: `model.decoder_pe.attention`"
            else:
                where = "; ".join(_PLACES[level] for level in sorted(levels))
            return (f"Read only where the {links} encoding is in use ({where}); elsewhere these keys change "
                    "nothing, and a `--set` of one says so in a warning.")
    if parent:
        section = dict(config_sections(root))[parent]
        for key, field in section.model_fields.items():
            for m in _members(field.annotation):
                if get_origin(m) is Literal and last in get_args(m):
                    return f"Read only with `{parent}.{key}={last}`."
    return ""


def anchor(heading: str) -> str:
    """The anchor mkdocs gives a heading (``model.rope`` -> ``modelrope``), as its ``toc`` extension slugifies."""
    return slugify(heading, "-")


def _error(overrides: list[str]) -> str:
    """The one line a config with ``overrides`` is refused with (as the commands print it)."""
    from utils.config import ConfigError, from_dict

    try:
        from_dict({}, overrides)
    except ConfigError as e:
        return f"error: {e}"
    raise AssertionError(f"{overrides} was accepted")


def render(root: type[BaseModel]) -> str:
    """The reference of ``root``'s keys: per section (heading = its dotted name) its description and a table."""
    out = []
    for name, section in config_sections(root):
        level = min(2 + name.count("."), 6) if name else 2
        out.append(f"{'#' * level} {name or 'Top level'}\n")
        doc = _doc(section)
        if doc:
            out.append(doc + "\n")
        only = applies_only(name, root) if name else ""
        if only:
            out.append(f"!!! note \"Applies only with\"\n    {only}\n")
        rows = config_rows(section, name)
        nested = [f"{name}.{key}" if name else key for key, field in section.model_fields.items()
                  if _is_section(field.annotation)]
        if any(r.key in _encoding_choices() for r in rows):
            out.append("The encodings these keys name are described in [Positional encodings](encodings/index.md).\n")
        if rows:
            out.append("| Key | Type | Default | Allowed | Meaning |\n|---|---|---|---|---|")
            out += [f"| `{r.key}` | {r.type} | `{r.default}` | {_cell(r.allowed)} | {_cell(r.meaning)} |"
                    for r in rows]
            out.append("")
        if nested:
            out.append("Sections: " + ", ".join(f"[`{n}`](#{anchor(n)})" for n in nested) + ".\n")
    return "\n".join(out)


INTRO = """\
# Config keys

Every key a config can set: its type, default, allowed values and meaning, section by section. This page is
generated from the config's declaration in the code, so it lists exactly what the code accepts.

**How keys are set.** A config is a YAML file of sections (`data`, `model`, `train`, ...); a key left out keeps its
default. A file may start from another with `base: OTHER.yaml` (a path relative to its own folder): the base is
read first and this file's keys override it, mappings merged key by key, lists and values replaced. On the
command line `--set key=value` (repeatable) overrides any key after the file is read, the value read as YAML:
`--set train.lr=3e-4`, `--set model.attention_pe=rope`, `--set "data.test=[tst2010]"`, `--set
train.max_steps=null`. Text values may name environment variables, `${VAR}` or `${VAR:-default}`. Numbers may be
written in any notation (`7e-4`, `1_000`, `1e3` in an integer key when it is a whole number), and one value stands
for a one-item list. The run directory keeps the resolved config as `config.yaml`. See
[Configs](../guide/configs.md) for the shipped configs and their families.

**Errors.** An unknown key, a value of the wrong type or one outside the allowed values stops the command with one
line naming the key and what is allowed, and exit status 2, for example:

```text
{errors}
```

A `--set` that the rest of the config makes inert (a `model.rope.*` key without RoPE in the model) is reported as
a warning; one that another key overrides (`train.warmup_steps` while `train.warmup_tokens` is set) is refused.

"""


def pages() -> dict[str, str]:
    """``{"reference/config.md": the page}`` for the config of ``utils.config``."""
    from utils.config import Config

    errors = "\n".join(_error([s]) for s in ("model.attention_pe=rpoe", "train.label_smoothing=1.5"))
    return {PAGE: INTRO.replace("{errors}", errors) + render(Config)}
