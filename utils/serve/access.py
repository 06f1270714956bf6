"""Who the server answers: the ``Host`` a request names and the page (``Origin``) that sent it.

A web page in any browser can send requests to a server on the machine it runs on. Two checks keep such pages out:

- ``Host``: a page whose name an attacker points at 127.0.0.1 (DNS rebinding) sends its own name. By default only
  this machine's names (``localhost``, ``*.localhost``, loopback addresses) and IP addresses (which no page can
  rebind) are answered; ``--allow-host NAME`` adds a name, ``--allow-host '*'`` any.
- ``Origin``, when a request has one (browsers send it with every POST and with cross-origin requests): only the
  server's own page (the origin's host is the ``Host`` asked for) and pages on this machine are answered;
  ``--allow-origin ORIGIN`` adds one (with the CORS headers a browser needs to let that page read the answers),
  ``--allow-origin '*'`` any. ``Origin: null`` (a ``file://`` page, a sandboxed frame) is refused.

Every refusal is 403 with one line saying which flag allows it. Headers larger than ``--max-header-bytes`` in all
are refused with 431 here too (the connection layer, ``utils/serve/connection.py``, stops reading them earlier).
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass(frozen=True)
class Access:
    """The ``Host`` names and page origins answered besides this machine's own (``*``: any)."""

    hosts: tuple[str, ...] = ()  # --allow-host
    origins: tuple[str, ...] = ()  # --allow-origin

    def __post_init__(self) -> None:
        object.__setattr__(self, "hosts", tuple(host_name(h) if h != "*" else h for h in self.hosts))
        object.__setattr__(self, "origins", tuple(o.strip().lower().rstrip("/") for o in self.origins))

    def host_allowed(self, host: str) -> bool:
        """Whether a request naming ``host`` (a ``Host`` header's value) is answered."""
        name = host_name(host)
        return "*" in self.hosts or name in self.hosts or is_local(name) or is_address(name)

    def origin_allowed(self, origin: str, host: str) -> bool:
        """Whether a request from the page at ``origin`` to ``host`` (its ``Host`` header) is answered."""
        origin = origin.strip().lower().rstrip("/")
        if "*" in self.origins or origin in self.origins:
            return True
        scheme, sep, authority = origin.partition("://")
        if not sep or scheme not in ("http", "https") or not authority:
            return False  # "null" (a file:// page, a sandboxed frame) and anything that is not a web origin
        name = host_name(authority)
        return is_local(name) or name == host_name(host)


def host_name(value: str) -> str:
    """The host of a ``Host`` header or an origin's authority: lowercase, without its port, IPv6 brackets or a
    trailing dot."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        return value[1:end] if end > 0 else value
    name, sep, port = value.rpartition(":")
    if sep and port.isdigit() and ":" not in name:
        value = name
    return value.rstrip(".")


def is_local(name: str) -> bool:
    """``localhost``, a name under it, or a loopback address (127.0.0.0/8, ::1)."""
    return name == "localhost" or name.endswith(".localhost") or (is_address(name) and
                                                                  ipaddress.ip_address(name).is_loopback)


def is_address(name: str) -> bool:
    """An IP address written out (no page can rebind one to another machine)."""
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _shown(value: str) -> str:
    """A header value in an error line: quoted, at most 80 characters."""
    return json.dumps(value if len(value) <= 80 else value[:77] + "...", ensure_ascii=True)


def refusal(scope: Scope, access: Access, max_header_bytes: int) -> tuple[int, str] | None:
    """(status, one line) for a request this server does not answer, else None."""
    headers = scope.get("headers", [])
    target = scope.get("raw_path") or scope.get("path", "").encode("utf-8")
    query = scope.get("query_string") or b""
    line = len(scope.get("method", "")) + 1 + len(target) + (1 + len(query) if query else 0) + 11  # HTTP/1.1\r\n
    size = line + sum(len(k) + len(v) + 4 for k, v in headers)  # the request line counts, as uvicorn reads it
    if size > max_header_bytes:
        return 431, (f"the request's line and headers have {size} bytes, over the limit of {max_header_bytes} "
                     "(--max-header-bytes; a server started with a larger one takes them)")
    values = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in headers}
    host = values.get("host")
    if host is not None and not access.host_allowed(host):
        return 403, (f"this server does not answer requests for the host {_shown(host_name(host))}: start it with "
                     "--allow-host NAME to answer that name (--allow-host '*': any)")
    origin = values.get("origin")
    if origin is not None and not access.origin_allowed(origin, host or ""):
        return 403, (f"requests from the page at {_shown(origin)} are refused (only this server's own page and pages "
                     "on this machine may call it): start the server with --allow-origin ORIGIN to allow that page "
                     "(--allow-origin '*': any)")
    return None


class AccessMiddleware:
    """ASGI middleware: a request ``refusal`` names is answered ``{"error": "..."}`` with its status and goes no
    further; every other goes on to the app."""

    def __init__(self, app: ASGIApp, access: Access, max_header_bytes: int) -> None:
        self.app, self.access, self.max_header_bytes = app, access, max_header_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        refused = refusal(scope, self.access, self.max_header_bytes) if scope["type"] == "http" else None
        if refused is None:
            await self.app(scope, receive, send)
            return
        status, message = refused
        body = json.dumps({"error": message}).encode()
        await send({"type": "http.response.start", "status": status, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
