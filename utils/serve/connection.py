"""The server's connections bounded in number, size and time: uvicorn's HTTP protocols with a deadline.

uvicorn closes a connection that stays idle between two requests (``timeout_keep_alive``), but not one that opens
and sends nothing, nor one whose request head or body never ends: each holds a socket and its buffers for as long
as its client likes, and a few hundred of them exhaust the server. Here, per connection:

- a request must arrive whole (head and body) within ``--request-timeout`` seconds of its first byte (of the
  connection's opening, for the first): otherwise it is answered 408 and the connection closed;
- the request line and headers may hold ``--max-header-bytes`` in all: past that (give or take what one read
  brings) nothing more is buffered, the request is answered 431 and the connection closed;
- an answer the client does not read for ``--request-timeout`` seconds (its socket's buffer full) ends the
  connection, and the answer's memory with it;
- at most ``--max-connections`` connections are open at once: one more is answered 503 and closed at once.

Every refusal is ``{"error": "one line"}``. Both of uvicorn's HTTP/1.1 protocols are bounded so: httptools' (its C
parser; what uvicorn picks when httptools is installed, as the ``serve`` extra does) and h11's (pure Python).
``uvicorn_config`` builds the uvicorn configuration that uses them.
"""

from __future__ import annotations

import asyncio
import http
import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import uvicorn

    from utils.serve.limits import Limits


class _Bounded:
    """What both bounded protocols add to uvicorn's (mixed in before it): the deadlines and limits of the module
    docstring. The protocol says where a request begins (``_began``), when its head is whole (``_head_done``) and
    when all of it is (``_whole``); a read that leaves a request's head unfinished counts toward its limit (the
    parser holds it: at most the limit and one read), one that finishes it is checked whole by the app
    (``utils/serve/access.py``)."""

    request_timeout: float = 10.0
    max_header_bytes: int = 65536
    max_connections: int = 100

    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    connections: set[Any]
    cycle: Any

    def connection_made(self, transport: asyncio.Transport) -> None:
        self._deadline: asyncio.TimerHandle | None = None
        self._write_deadline: asyncio.TimerHandle | None = None
        self._in_head, self._head_bytes = True, 0  # reading a request's line and headers, and their bytes so far
        self._wholes = 0  # requests that have come whole
        super().connection_made(transport)  # type: ignore[misc]
        if len(self.connections) > self.max_connections:
            self._refuse(503, f"the server has {self.max_connections} connections open, its limit "
                              "(--max-connections); try again shortly")
            return
        self._arm()  # a connection that sends nothing is closed too

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._write_deadline is not None:
            self._write_deadline.cancel()
            self._write_deadline = None
        super().connection_lost(exc)  # type: ignore[misc]

    def data_received(self, data: bytes) -> None:
        wholes = self._wholes
        super().data_received(data)  # type: ignore[misc]
        if self.transport.is_closing():
            self._disarm()
            return
        self._parsed()
        if self._in_head and self._wholes == wholes:  # all of it went to an unfinished head
            self._count_head(len(data))

    def pause_writing(self) -> None:
        super().pause_writing()  # type: ignore[misc]
        if self._write_deadline is None:
            self._write_deadline = self.loop.call_later(self.request_timeout, self._not_reading)

    def resume_writing(self) -> None:
        super().resume_writing()  # type: ignore[misc]
        if self._write_deadline is not None:
            self._write_deadline.cancel()
            self._write_deadline = None

    # ------------------------------------------------------------------------------------------ the protocol's hooks

    def _parsed(self) -> None:
        """After the parser took a read: its state in the hooks below (a parser without callbacks)."""

    def _began(self) -> None:
        """A request's first byte has come."""
        self._arm()

    def _head_done(self) -> None:
        self._in_head = False

    def _whole(self) -> None:
        """The request has come whole: the next bytes begin another's head."""
        self._disarm()
        self._in_head, self._head_bytes = True, 0
        self._wholes += 1

    def _count_head(self, size: int) -> None:
        """``size`` more bytes of a request's head came: over the limit, the request is refused."""
        self._head_bytes += size
        if self._head_bytes > self.max_header_bytes:
            self._refuse_head()

    def _refuse_head(self) -> None:
        self._refuse(431, f"the request's headers are over the limit of {self.max_header_bytes} bytes "
                          "(--max-header-bytes; a server started with a larger one takes them)")

    def send_400_response(self, msg: str) -> None:
        """A request the parser cannot take: one JSON line."""
        self._refuse(400, "invalid HTTP request")

    # ------------------------------------------------------------------------------------------ deadlines

    def _arm(self) -> None:
        if self._deadline is None and not self.transport.is_closing():
            self._deadline = self.loop.call_later(self.request_timeout, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        """The request did not arrive whole in time."""
        self._deadline = None
        if self.transport.is_closing():
            return
        if not self._in_head and self.cycle is not None and self.cycle.response_started:
            self.transport.close()  # answered already (e.g. 413 on its declared length): no second answer
        else:
            self._refuse(408, f"the request did not arrive whole within {self.request_timeout:g} s "
                              "(--request-timeout); the connection is closed")

    def _not_reading(self) -> None:
        """The client has not read its answer for ``request_timeout`` seconds: the connection goes, its buffers
        with it."""
        self._write_deadline = None
        if not self.transport.is_closing():
            self.transport.abort()

    def _refuse(self, status: int, message: str) -> None:
        """Answer ``{"error": message}`` with ``status`` and close the connection, whatever the parser's state."""
        self._disarm()
        body = json.dumps({"error": message}).encode()
        head = (f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode()
        self.transport.write(head + body)
        self.transport.close()


def _httptools_protocol() -> type:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class BoundedHttpToolsProtocol(_Bounded, HttpToolsProtocol):
        """uvicorn's httptools protocol, bounded (``_Bounded``): its parser's callbacks say where a request is."""

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._began()

        def on_headers_complete(self) -> None:
            self._head_done()
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._whole()

    return BoundedHttpToolsProtocol


def _h11_protocol() -> type:
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class BoundedH11Protocol(_Bounded, H11Protocol):
        """uvicorn's h11 protocol, bounded (``_Bounded``); h11 itself stops buffering a head past
        ``max_incomplete_event_size`` (``uvicorn_config`` sets it to the header limit)."""

        def _parsed(self) -> None:
            state = self.conn.their_state
            if state is h11.IDLE:  # the head of a request still coming
                self._began()
            elif state is h11.SEND_BODY:
                self._head_done()
                self._began()
            else:  # whole (or the connection is done with)
                self._whole()

        def send_400_response(self, msg: str) -> None:
            """h11 refuses a head over ``max_incomplete_event_size`` as it refuses one that is not HTTP."""
            if len(self.conn.trailing_data[0]) > self.max_header_bytes:
                self._refuse_head()
            else:
                super().send_400_response(msg)

    return BoundedH11Protocol


def bounded_protocol(limits: Limits, parser: str = "auto") -> type:
    """uvicorn's HTTP protocol bounded by ``limits``' request timeout, header and connection limits: ``parser``
    httptools, h11, or auto (httptools when it is installed, as uvicorn chooses)."""
    if parser == "auto":
        try:
            import httptools  # noqa: F401
        except ImportError:
            parser = "h11"
        else:
            parser = "httptools"
    base = {"httptools": _httptools_protocol, "h11": _h11_protocol}[parser]()
    return type(base.__name__, (base,), {"request_timeout": limits.request_timeout,
                                         "max_header_bytes": limits.max_header_bytes,
                                         "max_connections": limits.max_connections})


def uvicorn_config(app: Any, limits: Limits, parser: str = "auto", **options: Any) -> uvicorn.Config:
    """The uvicorn configuration of ``app`` under ``limits`` (``bounded_protocol(limits, parser)``; ``options``:
    more ``uvicorn.Config`` arguments)."""
    import uvicorn

    return uvicorn.Config(app, http=bounded_protocol(limits, parser), timeout_keep_alive=5, log_level="warning",
                          access_log=False, h11_max_incomplete_event_size=limits.max_header_bytes, **options)
