"""The base of every config section, a leaf that imports nothing of ours (models/, data/, tokenizer/, utils/ use it).

A ``Section`` is a pydantic model that forbids unknown keys and reads values as people type them in YAML or
``--set``, by pydantic's lax mode (numeric strings such as ``7e-4`` or ``1_000`` in number fields, a number in a
text field) plus what YAML needs beside it (exponent notation in integer fields, one value where a list is
expected); ``${VAR}`` / ``${VAR:-default}`` are expanded in text fields. Ranges are ``Field(ge=, gt=, lt=)``
(a finite number), closed sets ``Literal``. ``config_error`` turns pydantic's ValidationError into a ConfigError of
one line naming the dotted key and what is allowed.
"""

from __future__ import annotations

import os
import re
import types
import typing
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator


class ConfigError(ValueError):
    """A config problem, reported as one line naming the offending key."""


_ENV = re.compile(r"\$\$\{|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def expand_env(value: str) -> str:
    """Expand ``${VAR}`` and ``${VAR:-default}``; an unset variable without default is an error. ``$${`` is a
    literal ``${`` (how ``escape_env`` saves a value, so that it is expanded once, when first read)."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$${":
            return "${"
        name, default = m.group(1), m.group(2)
        if name in os.environ:
            return os.environ[name]
        if default is not None:
            return default
        raise ConfigError(f"environment variable {name} is not set (referenced as {m.group(0)})")

    return _ENV.sub(sub, value)


def escape_env(value: Any) -> Any:
    """``value`` (a string, or lists and mappings of them) with every ``${`` written ``$${``: what ``expand_env``
    reads back as the same text. A resolved config is saved so: a value whose expansion holds ``${X}`` stays
    literal at every later load instead of being expanded again."""
    if isinstance(value, str):
        return value.replace("${", "$${")
    if isinstance(value, dict):
        return {k: escape_env(v) for k, v in value.items()}
    if isinstance(value, list):
        return [escape_env(v) for v in value]
    return value


# ---------------------------------------------------------------------------------------------------------- reading
# Pydantic's lax mode does the coercion (``"7e-4"`` and ``"1_000"`` in number fields, ``3.0`` in an integer field,
# a number in a text field through ``coerce_numbers_to_str``, ranges and finiteness through ``Field`` and
# ``allow_inf_nan=False``). What it has no setting for, ``Section`` adds before and after it: one value where a list is
# expected, exponent notation in integer fields (YAML 1.1 reads ``1.5e6`` as text and pydantic's integer parser
# takes digits only), and ``${VAR}`` in text.

_EXPONENT = re.compile(r"[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9][0-9_]*)[eE][-+]?[0-9]+")
_RANGE = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<=",
          "finite_number": ""}
_EXPECTED = {"int": "an integer", "float": "a number", "bool": "true or false", "string": "a string",
             "list": "a list", "model": "a mapping", "dict": "a mapping"}


def _options(tp: Any) -> tuple[Any, ...]:
    """The types a field's annotation allows, ``None`` left out (``int | None`` -> ``(int,)``)."""
    if get_origin(tp) in (typing.Union, types.UnionType):
        return tuple(a for a in get_args(tp) if a is not type(None))
    return (tp,)


def _lists(tp: Any) -> bool:
    return any(get_origin(o) is list for o in _options(tp))


def _integers(tp: Any) -> bool:
    return any(o is int or (get_origin(o) is list and get_args(o) == (int,)) for o in _options(tp))


class Section(BaseModel):
    """A config section: unknown keys are refused, values are read as typed in YAML (see the module doc)."""

    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _as_typed(cls, value: Any, info: ValidationInfo) -> Any:
        tp = cls.model_fields[info.field_name].annotation
        if _lists(tp) and isinstance(value, (str, int, float)) and not isinstance(value, bool):
            value = [value]
        if _integers(tp):
            spelled = (lambda v: float(v) if isinstance(v, str) and _EXPONENT.fullmatch(v.strip()) else v)
            value = [spelled(v) for v in value] if isinstance(value, list) else spelled(value)
        return value

    @field_validator("*", mode="after")
    @classmethod
    def _expanded(cls, value: Any) -> Any:
        if isinstance(value, str):
            return expand_env(value)
        if isinstance(value, list):
            return [expand_env(v) if isinstance(v, str) else v for v in value]
        return value

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dicts and lists, in declaration order (what run directories and checkpoints store)."""
        return self.model_dump()


def _show(value: Any, as_float: bool = False, bound: bool = False) -> str:
    """A value (or a ``bound``, as declared) as people write it: integers in full up to 16 digits, a float field's
    value as its float (``-7e-4`` -> -0.0007), a float bound as ``%g``, anything larger as ``%g`` (1e+300, not 301
    digits)."""
    if not bound:
        try:
            value = float(value) if as_float or not isinstance(value, int) else value
        except (TypeError, ValueError):
            return repr(value)
        if isinstance(value, float) and value.is_integer() and not as_float and abs(value) < 10**16:
            value = int(value)
    if isinstance(value, int) and abs(value) < 10**16:
        return str(value)
    if abs(value) < 1e16 and not bound:
        return repr(value)
    return f"{float(value):g}"


def _field_at(root: type[BaseModel], loc: tuple[Any, ...]) -> tuple[type[BaseModel], Any, tuple[str, ...], str]:
    """Where error location ``loc`` leads from ``root``: the section holding its last key, that key's field (``None``
    for an unknown key or a whole section), the keys walked, and a list item's index as ``[i]`` (the tags pydantic
    gives a union's members are left out)."""
    section, names, index, leaf = root, [], "", None
    for part in loc:
        if isinstance(part, int) and leaf is not None:
            index += f"[{part}]"
        elif isinstance(part, str) and leaf is None:
            names.append(part)
            field = section.model_fields.get(part)
            tp = field.annotation if field is not None else None
            if isinstance(tp, type) and issubclass(tp, BaseModel):
                section = tp
            else:
                leaf = field if field is not None else False
    return section, leaf or None, tuple(names), index


def _range(field: Any, value: Any) -> str:
    """``must be >= 0 and < 1, got 1.5``: every bound of ``field``, and the value as the field reads it."""
    bounds = [(op, getattr(m, b)) for b, op in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))
              for m in field.metadata if getattr(m, b, None) is not None]
    as_float = float in _options(field.annotation)
    if not bounds:
        return f"must be a finite number, got {_show(value, as_float)}"
    return f"must be {' and '.join(f'{op} {_show(v, bound=True)}' for op, v in bounds)}, " \
           f"got {_show(value, as_float)}"


def _reading_order(e: Any, root: type[BaseModel], raw: Any) -> tuple[tuple[int, int], ...]:
    """Where error ``e`` lies as ``raw`` is read: in each section its unknown keys, then its values in ``raw``'s
    order (nested sections whole), then its ranges in declaration order."""
    section, _, names, _ = _field_at(root, e["loc"])
    order, node = [], raw
    for i, part in enumerate(names):
        keys = list(node) if isinstance(node, dict) else []
        index = keys.index(part) if part in keys else len(keys)
        if i == len(names) - 1 and e["type"] == "extra_forbidden":
            order.append((0, index))
        elif i == len(names) - 1 and e["type"] in _RANGE and part in section.model_fields:
            order.append((2, list(section.model_fields).index(part)))
        else:
            order.append((1, index))
        node = node.get(part) if isinstance(node, dict) else None
    return tuple(order)


def config_error(err: ValidationError, root: type[BaseModel], raw: Any = None, prefix: str = "") -> ConfigError:
    """The first error met reading ``raw`` (the mapping validated) as one line naming the dotted key (``prefix``
    names ``root`` when it is nested): unknown keys in a section before its values, values in ``raw``'s order."""
    e = min(err.errors(include_url=False), key=lambda e: _reading_order(e, root, raw))
    section, field, names, index = _field_at(root, e["loc"])
    key = prefix + ".".join(names) + index
    cause = (e.get("ctx") or {}).get("error")
    if e["type"] == "extra_forbidden":
        where = prefix + ".".join(names[:-1])
        return ConfigError(f"unknown config key {key}; allowed keys in {where or 'the top level'}: "
                           f"{', '.join(section.model_fields)}")
    if isinstance(cause, ConfigError):
        return cause
    if e["type"] in _RANGE and field is not None:
        return ConfigError(f"{key}: {_range(field, e['input'])}")
    if e["type"] == "literal_error" and field is not None:
        allowed = next(get_args(o) for o in _options(field.annotation) if get_origin(o) is Literal)
        return ConfigError(f"{key}: {e['input']!r} is not one of: {', '.join(map(str, allowed))}")
    kind = e["type"].split("_")[0]
    if kind in _EXPECTED and e["type"] != "value_error":
        return ConfigError(f"{key or 'the top level'}: expected {_EXPECTED[kind]}, got {e['input']!r}")
    return ConfigError(f"{key}: {e['msg']}, got {e['input']!r}".replace("\n", " "))
