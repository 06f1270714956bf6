"""The base of every config section, a leaf that imports nothing of ours (models/, data/, tokenizer/, utils/ use it).

A ``Section`` is a pydantic model that forbids unknown keys and reads values as people type them in YAML or
``--set``: numeric strings (``7e-4``, ``1_000``) in number fields, a number in a text field, one value where a
list is expected; ``${VAR}`` / ``${VAR:-default}`` are expanded in text fields. Ranges are ``Field(ge=, gt=, lt=)``
(a finite number), closed sets ``Literal``. ``config_error`` turns pydantic's ValidationError into a ConfigError of
one line naming the dotted key and what is allowed.
"""

from __future__ import annotations

import math
import os
import re
import types
import typing
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator


class ConfigError(ValueError):
    """A config problem, reported as one line naming the offending key."""


class _Bad(ValueError):
    """A bad value; ``rest`` follows the field's dotted key (``": expected an integer, got 'x'"``)."""

    def __init__(self, rest: str, out_of_range: bool = False) -> None:
        super().__init__(rest)
        self.rest, self.out_of_range = rest, out_of_range


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


# A number however users type it. YAML 1.1 (PyYAML) reads 7e-4, 1E3 and 5e+2 as strings; number fields accept them.
_NUMBER = re.compile(r"[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)?")


def _as_number(value: Any) -> Any:
    """``value``, or the float a numeric string spells (``"7e-4"`` -> 0.0007)."""
    if isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
        return float(value.strip().replace("_", ""))
    return value


def _coerce(value: Any, tp: Any, where: str = "") -> Any:
    """``value`` as the annotated type ``tp``; a bad value raises ``_Bad`` (``where`` is a list index suffix)."""
    origin = get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = get_args(tp)
        if value is None and type(None) in options:
            return None
        errors = []
        for opt in options:
            if opt is type(None):
                continue
            try:
                return _coerce(value, opt, where)
            except _Bad as e:
                errors.append(e)
        raise errors[0] if errors else _Bad(f"{where}: bad value {value!r}")
    if origin is Literal:
        allowed = get_args(tp)
        if value not in allowed:
            raise _Bad(f"{where}: {value!r} is not one of: {', '.join(map(str, allowed))}")
        return value
    if origin is list:
        (item_tp,) = get_args(tp)
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            value = [value]
        if not isinstance(value, list):
            raise _Bad(f"{where}: expected a list, got {value!r}")
        return [_coerce(v, item_tp, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        if not isinstance(value, (dict, tp)):
            raise _Bad(f"{where}: expected a mapping of {tp.__name__} keys, got {value!r}")
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise _Bad(f"{where}: expected true or false, got {value!r}")
    if tp is int:
        value = _as_number(value)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise _Bad(f"{where}: expected an integer, got {value!r}")
    if tp is float:
        value = _as_number(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise _Bad(f"{where}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return expand_env(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise _Bad(f"{where}: expected a string, got {value!r}")
    return value


def _show(value: float, bound: bool = False) -> str:
    """A value (or a ``bound``) as people write it: integers in full up to 16 digits, a value's float as typed, a
    bound's as ``%g``, and anything larger as ``%g`` (1e+300, not 301 digits)."""
    if isinstance(value, int) and abs(value) < 10**16:
        return str(value)
    if isinstance(value, float) and abs(value) < 1e16 and not bound:
        return repr(value)
    return f"{float(value):g}"


def _check_range(value: Any, metadata: list[Any]) -> None:
    """A finite number within the field's ``ge``/``gt``/``le``/``lt`` bounds, else ``_Bad`` stating them all."""
    bounds = {b: next((getattr(m, b) for m in metadata if getattr(m, b, None) is not None), None)
              for b in ("ge", "gt", "le", "lt")}
    if all(v is None for v in bounds.values()) or not isinstance(value, (int, float)) or isinstance(value, bool):
        return
    ops = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
    parts = [f"{ops[b]} {_show(v, bound=True)}" for b, v in bounds.items() if v is not None]
    ge, gt, le, lt = bounds.values()
    ok = math.isfinite(value) and (ge is None or value >= ge) and (gt is None or value > gt) \
        and (le is None or value <= le) and (lt is None or value < lt)
    if not ok:
        raise _Bad(f": must be {' and '.join(parts)}, got {_show(value)}", out_of_range=True)


class Section(BaseModel):
    """A config section: unknown keys are refused, values are read as typed in YAML (see the module doc)."""

    model_config = ConfigDict(extra="forbid")

    @field_validator("*", mode="before")
    @classmethod
    def _read(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields[info.field_name]
        value = _coerce(value, field.annotation)
        _check_range(value, field.metadata)
        return value

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dicts and lists, in declaration order (what run directories and checkpoints store)."""
        return self.model_dump()


def _section_at(root: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel]:
    """The section class that ``loc`` (a path of field names) leads to from ``root``."""
    cls = root
    for part in loc:
        tp = cls.model_fields[part].annotation
        if not (isinstance(tp, type) and issubclass(tp, BaseModel)):
            break
        cls = tp
    return cls


def _reading_order(e: Any, root: type[BaseModel], raw: Any) -> tuple[tuple[int, int], ...]:
    """Where error ``e`` lies as ``raw`` is read: in each section its unknown keys, then its values in ``raw``'s
    order (nested sections whole), then its ranges in declaration order."""
    order, node, loc = [], raw, e["loc"]
    for i, part in enumerate(loc):
        keys = list(node) if isinstance(node, dict) else []
        index = keys.index(part) if part in keys else len(keys)
        if i == len(loc) - 1 and e["type"] == "extra_forbidden":
            order.append((0, index))
        elif i == len(loc) - 1 and getattr((e.get("ctx") or {}).get("error"), "out_of_range", False):
            order.append((2, list(_section_at(root, loc[:-1]).model_fields).index(part)))
        else:
            order.append((1, index))
        node = node.get(part) if isinstance(node, dict) else None
    return tuple(order)


def config_error(err: ValidationError, root: type[BaseModel], raw: Any = None, prefix: str = "") -> ConfigError:
    """The first error met reading ``raw`` (the mapping validated) as one line naming the dotted key (``prefix``
    names ``root`` when it is nested): unknown keys in a section before its values, values in ``raw``'s order."""
    e = min(err.errors(include_url=False), key=lambda e: _reading_order(e, root, raw))
    loc = tuple(str(p) for p in e["loc"])
    key = prefix + ".".join(loc)
    if e["type"] == "extra_forbidden":
        section = prefix + ".".join(loc[:-1])
        allowed = ", ".join(_section_at(root, loc[:-1]).model_fields)
        return ConfigError(f"unknown config key {key}; allowed keys in {section or 'the top level'}: {allowed}")
    cause = (e.get("ctx") or {}).get("error")
    if isinstance(cause, _Bad):
        return ConfigError(f"{key}{cause.rest}")
    if isinstance(cause, ConfigError):
        return cause
    if e["type"] == "model_type" or e["type"] == "dict_type":
        return ConfigError(f"{key or 'the top level'}: expected a mapping, got {e['input']!r}")
    return ConfigError(f"{key}: {e['msg']}, got {e['input']!r}".replace("\n", " "))
