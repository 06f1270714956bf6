"""A POST's body, read before FastAPI validates it: its ``Content-Type`` (415 unless JSON), its size as it streams
in (413 past ``Limits.max_body``), and its JSON, parsed so that a huge integer is kept as its size (``HugeNumber``)
and never converted. Every refusal is a ``RequestError``: 400 for what is not JSON or not UTF-8, 422 for JSON that is
not an object. ``body_route`` gives the routes that read their body so; ``json_type`` names a JSON value's type in a
refusal without echoing it.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

from utils.serve.limits import Limits, RequestError

if TYPE_CHECKING:
    from fastapi.routing import APIRoute
    from starlette.requests import Request


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
    """``a number``, ``a string``, ``null``...: what a JSON value is, in a refusal."""
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "an array",
             dict: "an object", type(None): "null", HugeNumber: "a number"}
    return names.get(type(value), type(value).__name__)


#: What a body over its limit is told: the limit follows from two flags.
BODY_HINT = (" (what --max-lines lines of --max-chars characters allow): send fewer or shorter lines, or start the "
             "server with larger ones")


async def read_body(request: Request, limits: Limits) -> bytes:
    """The bytes of a POST's body: 415 unless it says it is JSON, 413 as soon as it is over ``limits.max_body``, 400
    if its client leaves before it is whole."""
    from starlette.requests import ClientDisconnect

    kind = request.headers.get("content-type")
    if kind is None or kind.split(";")[0].strip().lower() != "application/json":
        got = "none" if kind is None else json.dumps(kind[:60])
        raise RequestError(415, f"send the body as JSON with the header Content-Type: application/json (got {got})")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limits.max_body:
        raise RequestError(413, f"the request body has {declared} bytes, over the limit of {limits.max_body}"
                                f"{BODY_HINT}")
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limits.max_body:
                raise RequestError(413, f"the request body is over the limit of {limits.max_body} bytes{BODY_HINT}")
            chunks.append(chunk)
    except ClientDisconnect:  # nobody is left to answer: no traceback in the log either
        raise RequestError(400, "the client disconnected before its request was complete") from None
    return b"".join(chunks)


def body_route(limits: Limits) -> type[APIRoute]:
    """The route class of an app whose POST bodies are JSON objects within ``limits``: a route with a body reads it
    (``read_body``, ``parse_json``) before FastAPI validates it against the endpoint's request model; the endpoint
    gets the request with that body."""
    from fastapi.routing import APIRoute
    from starlette.requests import Request

    class Parsed(Request):
        """A request whose body was read and parsed already (what FastAPI's ``body()`` and ``json()`` then give)."""

        def __init__(self, request: Request, raw: bytes, parsed: dict[str, Any]) -> None:
            super().__init__(request.scope, request.receive)
            self.raw, self.parsed = raw, parsed

        async def body(self) -> bytes:
            return self.raw

        async def json(self) -> Any:
            return self.parsed

    class BodyRoute(APIRoute):
        def get_route_handler(self):  # noqa: ANN202 - FastAPI's own type
            handler = super().get_route_handler()
            if self.body_field is None:
                return handler

            async def read_then_handle(request: Request):  # noqa: ANN202
                raw = await read_body(request, limits)
                return await handler(Parsed(request, raw, parse_json(raw)))

            return read_then_handle

    return BodyRoute
