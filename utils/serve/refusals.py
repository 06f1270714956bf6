"""How a refused request reads: pydantic's first error about a body as the one line ``{"error": ...}`` the server
answers, with its status.

The request models (``utils/serve/schema.py``) are pydantic's types and limits, which FastAPI checks before an
endpoint runs. ``refusal`` words the first error: it names the field as sent (``text[1]``, ``constraints[0][2]``),
never echoes a long value, and answers 413 for what is over a size limit, 400 for text that is not valid Unicode or
holds a NUL character, 422 for the rest. Where pydantic's words would not do (a blank line, a list outside its
limits, a value of none of a field's shapes), the field's own type raises ``refused`` with the whole line, built from
the pieces here: ``line``, ``items`` and ``by_shape``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Annotated, Any, ClassVar

from annotated_types import Ge, Gt, Le, Lt
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    TypeAdapter,
    WrapValidator,
)
from pydantic_core import PydanticCustomError

from utils.serve.body import HugeNumber, json_type
from utils.serve.limits import RequestError

#: In a line ``refused`` raises, where the field's name as sent goes (``text[1]``).
NAME = "{name}"


class RequestBody(BaseModel):
    """A request body: no field but its own, each of its own type (no ``"5"`` for 5, no 1 for true)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    #: What a required field left out holds, by field (the refusal says it).
    missing: ClassVar[dict[str, str]] = {}


def refused(line: str, status: int = 422) -> PydanticCustomError:
    """A refusal a field's type raises: ``line`` whole (``NAME`` where the field's name goes) and its status."""
    return PydanticCustomError("refused", line, {"status": status})


# ---------------------------------------------------------------------------------------------- field types


def line(max_chars: int, empty: str | None) -> Any:
    """One line of text: a string of at most ``max_chars`` characters, without NUL; not blank unless ``empty`` is
    None (a blank one is refused with ``empty``, what to send instead)."""

    def not_blank(value: Any) -> Any:
        if isinstance(value, str) and not value.strip():
            raise refused(f"{NAME} is empty: {empty}")
        return value

    def no_nul(value: str) -> str:
        if "\x00" in value:
            raise refused(f"{NAME} holds a NUL character", 400)
        return value

    text = Annotated[str, StringConstraints(min_length=1 if empty is not None else None, max_length=max_chars),
                     AfterValidator(no_nul)]
    return text if empty is None else Annotated[text, BeforeValidator(not_blank)]


def items(item: Any, low: int | None, high: int, empty: str, too_many: str) -> Any:
    """A list of ``low`` to ``high`` ``item``s (``low`` None: none needed), as the schema states it; an empty one is
    refused with ``empty`` (what to send instead), a longer one 413 with ``too_many`` (``{n}``: its length,
    ``{limit}``: ``high``; ``NAME``: the field)."""

    def sized(value: Any) -> Any:
        if isinstance(value, list) and low and len(value) < low:
            raise refused(f"{NAME} is an empty list: {empty}")
        if isinstance(value, list) and len(value) > high:
            raise refused(too_many.format(n=len(value), limit=high, name=NAME), 413)
        return value

    return Annotated[list[item], Field(min_length=low, max_length=high), BeforeValidator(sized)]


def by_shape(pick: Callable[[Any], int | str], *shapes: Any, null: bool = False) -> WrapValidator:
    """A field of several ``shapes`` (a string or a list, a list or a list of lists) read as the one its value has:
    ``pick(value)`` gives that shape's index, or the line that says why the value has none (``NAME`` where the
    field's name goes). Its errors are then that shape's alone, not every shape's. ``null``: null stays null."""
    adapters = [TypeAdapter(shape, config=ConfigDict(strict=True)) for shape in shapes]

    def validate(value: Any, handler: Any) -> Any:
        if value is None and null:
            return None
        shape = pick(value)
        if isinstance(shape, str):
            raise refused(shape)
        return adapters[shape].validate_python(value)

    return WrapValidator(validate)


# ---------------------------------------------------------------------------------------------- the one line


def refusal(errors: Sequence[dict[str, Any]], model: type[RequestBody] | None) -> RequestError:
    """The first of pydantic's ``errors`` about a request body (FastAPI's, ``loc`` from ``body``) as a refusal of
    ``model``'s: an unknown field first, as the body reads, then the others in the order of the fields."""
    error = min(errors, key=lambda e: e["type"] != "extra_forbidden")
    loc = list(error["loc"])[1:] if error["loc"] and error["loc"][0] == "body" else list(error["loc"])
    field = str(loc[0]) if loc else ""
    name = field + "".join(f"[{p}]" for p in loc[1:] if isinstance(p, int))
    kind, value, ctx = error["type"], error.get("input"), error.get("ctx") or {}
    if kind == "refused":
        return RequestError(ctx["status"], error["msg"].replace(NAME, name))
    if kind in ("value_error", "assertion_error") and "error" in ctx:  # a model validator's own line
        return RequestError(422, str(ctx["error"]))
    if kind == "extra_forbidden":
        fields = ", ".join(model.model_fields) if model is not None else ""
        return RequestError(422, f"unknown field {field!r} (fields: {fields})")
    if kind == "missing":
        what = model.missing.get(field) if model is not None else None
        return RequestError(422, f'missing field "{name}"' + (f": {what}" if what else ""))
    if kind in RANGE or (kind == "int_type" and isinstance(value, HugeNumber)):
        got = f"a number with {value.digits} digits" if isinstance(value, HugeNumber) else value
        return RequestError(422, f"{name} must be {within(model, field)}, got {got}")
    if kind in TYPES:
        return RequestError(422, f"{name} must be {TYPES[kind]}, not {json_type(value)}")
    if kind == "literal_error":
        choices = ", ".join(re.findall(r"'([^']*)'", ctx.get("expected", "")))
        return RequestError(422, f"{name} must be one of {choices}, got {json.dumps(value)[:60]}")
    if kind == "string_too_long":
        return RequestError(413, f"{name} has {len(value)} characters, over the limit of {ctx['max_length']} "
                                 "(--max-chars)")
    if kind == "string_unicode":
        try:
            value.encode("utf-8")
            where = ""
        except UnicodeEncodeError as e:
            where = f" at character {e.start}"
        return RequestError(400, f"{name} is not valid Unicode (a lone surrogate{where})")
    return RequestError(422, f"{name}: {error['msg']}" if name else error["msg"])  # pydantic's words


#: pydantic's errors of a value out of a field's range.
RANGE = ("greater_than", "greater_than_equal", "less_than", "less_than_equal")
#: pydantic's errors of a value of another type, and the type wanted.
TYPES = {"int_type": "an integer", "float_type": "a number", "bool_type": "true or false", "string_type": "a string"}


def within(model: type[BaseModel] | None, field: str) -> str:
    """A field's range in words, from its bounds: ``between 1 and 32`` (both ends in), ``above 0 and at most 1``..."""
    bounds = model.model_fields[field].metadata if model is not None and field in model.model_fields else []
    low, high = "at least", "at most"
    for bound in bounds:
        if isinstance(bound, Ge):
            low = f"at least {bound.ge}"
        elif isinstance(bound, Gt):
            low = f"above {bound.gt}"
        elif isinstance(bound, Le):
            high = f"at most {bound.le}"
        elif isinstance(bound, Lt):
            high = f"below {bound.lt}"
    if low.startswith("at least") and high.startswith("at most"):
        return f"between {low[9:]} and {high[8:]}"
    return f"{low} and {high}"
