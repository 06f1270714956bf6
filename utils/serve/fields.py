"""Reading a request's JSON body by hand: the body as an object, each field checked for its type and range, and
every refusal a ``RequestError`` with its status (400 for what is not JSON or not text, 413 for what is too big, 422
for the rest) and one readable line that names the field and never echoes a long value."""

from __future__ import annotations

import json
import math
from typing import Any

from utils.serve.limits import Limits, RequestError


class HugeNumber(float):
    """A JSON integer of more than ``HugeNumber.DIGITS`` digits, as ``parse_json`` gives it: never converted (a number
    of 5,000 digits is past ``int()``'s limit, one of 400 too big for a float), it is a float of the right sign
    (+-inf) that remembers how many digits it had, so that an answer names its size instead of echoing it."""

    DIGITS = 20  # no field takes a number this long

    digits: int

    def __new__(cls, digits: int, negative: bool) -> HugeNumber:
        number = super().__new__(cls, -math.inf if negative else math.inf)
        number.digits = digits
        return number


def _parse_int(s: str) -> int | HugeNumber:
    digits = len(s.lstrip("-"))
    return int(s) if digits <= HugeNumber.DIGITS else HugeNumber(digits, s.startswith("-"))


def parse_json(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object; RequestError (400/422) naming what is wrong."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RequestError(400, f"the request body is not valid UTF-8 (byte {e.start}); send UTF-8 JSON") from None
    if not text.strip():
        raise RequestError(400, 'the request body is empty; send JSON such as {"text": "Bonjour."}')
    try:
        body = json.loads(text, parse_int=_parse_int)
    except json.JSONDecodeError as e:
        raise RequestError(400, f"invalid JSON: {e.msg} (line {e.lineno}, column {e.colno})") from None
    except RecursionError:
        raise RequestError(400, "invalid JSON: nested too deeply") from None
    except ValueError as e:  # anything else the decoder cannot take: one line, never echoed at length
        raise RequestError(400, f"invalid JSON: {str(e).splitlines()[0][:200] if str(e) else type(e).__name__}") \
            from None
    if not isinstance(body, dict):
        raise RequestError(422, f'the body must be a JSON object such as {{"text": "Bonjour."}}, '
                                f"not {json_type(body)}")
    return body


def json_type(value: Any) -> str:
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "an array",
             dict: "an object", type(None): "null", HugeNumber: "a number"}
    return names.get(type(value), type(value).__name__)


def check_fields(body: dict[str, Any], allowed: tuple[str, ...]) -> None:
    unknown = [k for k in body if k not in allowed]
    if unknown:
        raise RequestError(422, f"unknown field {unknown[0]!r} (fields: {', '.join(allowed)})")


def int_field(body: dict[str, Any], name: str, default: int, low: int, high: int) -> int:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, HugeNumber):
        raise RequestError(422, f"{name} must be between {low} and {high}, got a number with {value.digits} digits")
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(422, f"{name} must be an integer, not {json_type(value)}")
    if not low <= value <= high:
        raise RequestError(422, f"{name} must be between {low} and {high}, got {value}")
    return value


def float_field(body: dict[str, Any], name: str, default: float, low: float, high: float, low_open: bool = False,
                high_open: bool = False) -> float:
    """A number in ``low..high`` (each end included unless ``*_open``); ``default`` when absent or null."""
    value = body.get(name)
    if value is None:
        return default
    where = f"between {low} and {high}" if not (low_open or high_open) else (
        f"{'above' if low_open else 'at least'} {low} and {'below' if high_open else 'at most'} {high}")
    if isinstance(value, HugeNumber):
        raise RequestError(422, f"{name} must be {where}, got a number with {value.digits} digits")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RequestError(422, f"{name} must be a number, not {json_type(value)}")
    inside = (low < value if low_open else low <= value) and (value < high if high_open else value <= high)
    if not math.isfinite(value) or not inside:  # NaN, Infinity or a float past 1.8e308 (1e400): inf
        raise RequestError(422, f"{name} must be {where}, got {value}")
    return float(value)


def bool_field(body: dict[str, Any], name: str, default: bool) -> bool:
    """true or false; ``default`` when absent or null."""
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise RequestError(422, f"{name} must be true or false, not {json_type(value)}")
    return value


def choice_field(body: dict[str, Any], name: str, default: str, choices: tuple[str, ...]) -> str:
    """One of ``choices``; ``default`` when absent or null."""
    value = body.get(name)
    if value is None:
        return default
    if value not in choices:
        raise RequestError(422, f"{name} must be one of {', '.join(choices)}, got {json.dumps(value)[:60]}")
    return value


def check_text(text: Any, name: str, limits: Limits, empty: str | None = "give a sentence to translate") -> str:
    """One line of text: a string of valid Unicode within ``max_chars``, not blank (the refusal says ``empty``; None:
    a blank one is taken)."""
    if not isinstance(text, str):
        raise RequestError(422, f"{name} must be a string, not {json_type(text)}")
    if empty is not None and not text.strip():
        raise RequestError(422, f"{name} is empty: {empty}")
    if len(text) > limits.max_chars:
        raise RequestError(413, f"{name} has {len(text)} characters, over the limit of {limits.max_chars} "
                                "(--max-chars)")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise RequestError(400, f"{name} is not valid Unicode (a lone surrogate at character {e.start})") from None
    if "\x00" in text:
        raise RequestError(400, f"{name} holds a NUL character")
    return text
