"""The server against hostile clients, on a real uvicorn on 127.0.0.1 (in a thread of this process, with the
connection layer ``inference.py --serve`` uses): requests limited in tokens and in work (not only characters), a
POST only with ``Content-Type: application/json``, other hosts and web pages refused, stalled connections answered
408 and closed, huge headers 431 without being held, connections capped, and the work of clients that hung up
dropped: out of the queue, out of a static batch, out of the decoding process (which goes idle, so that the next
request is fast). A barely trained model (4 steps: its outputs run to the length cap, so long requests take long)."""

from __future__ import annotations

import http.client
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, serving_app, train_tiny_run, wait_for
from test_docs_http import FakeEngine

from utils.config import from_dict
from utils.serve.access import Access
from utils.serve.app import create_app
from utils.serve.batcher import Abandoned
from utils.serve.connection import uvicorn_config
from utils.serve.limits import Limits

LINES = (ROOT / "data" / "demo" / "test.fr").read_text(encoding="utf-8").splitlines()
LONG = [" ".join(LINES[i : i + 4]) for i in range(0, 32, 4)]  # 8 lines of about 90 characters
DECODE = ["decode.max_len_a=4", "decode.max_len_b=20"]  # an untrained model's outputs run to 4 x source + 20
QUICK = ["decode.max_len_a=1", "decode.max_len_b=4", "decode.beam=1"]  # the shared server: short outputs
# The shared server: small limits, so that each is reached cheaply.
LIMITS = Limits(max_tokens=64, max_beam_tokens=1000, max_attention_weights=10000, max_wait_ms=0,
                request_timeout=1.0, max_connections=6, max_header_bytes=8192)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny config (d 32, 1+1 layers, RoPE; byte fallback: an emoji is 4 tokens) trained 4 steps."""
    return train_tiny_run(tmp_path_factory.mktemp("hostile"), ["model.input_pe=none"], epochs=1, max_steps=4,
                          eval_every=1000)


@pytest.fixture(scope="module")
def run(run_dir: Path) -> Any:
    from utils.run.load import load_run

    return load_run(run_dir, None, DECODE, "cpu")


@pytest.fixture(scope="module")
def quick(run_dir: Path) -> Any:
    from utils.run.load import load_run

    return load_run(run_dir, None, QUICK, "cpu")


def serving(engine: Any, limits: Limits, access: Access | None = None,
            parser: str = "auto") -> AbstractContextManager[int]:
    """``engine`` behind uvicorn with the server's connection layer (``parser``: its HTTP parser), on a free port of
    127.0.0.1 -> the port."""
    return serving_app(create_app(engine, limits, "", access), lambda app: uvicorn_config(app, limits, parser))


@pytest.fixture(scope="module")
def port(quick: Any) -> Iterator[int]:
    """The run decoding in the server's process (greedy, short outputs), under ``LIMITS``."""
    from utils.translation.engines import TorchEngine

    with serving(TorchEngine(quick), LIMITS) as port:
        yield port


@pytest.fixture(scope="module", params=["httptools", "h11"])
def bare(request: pytest.FixtureRequest) -> Iterator[int]:
    """A server without a model under ``LIMITS``, with each of uvicorn's HTTP parsers: its connections' bounds."""
    with serving(FakeEngine(), LIMITS, parser=request.param) as port:
        yield port


def call(port: int, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None,
         kind: str | None = "application/json") -> tuple[int, dict[str, str], Any]:
    """-> (status, headers lowercased, JSON answer). ``kind``: the Content-Type of a body (None: none)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        data = None if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
        sent = {**({"Content-Type": kind} if kind and data is not None else {}), **(headers or {})}
        conn.request(method, path, body=data, headers=sent)
        res = conn.getresponse()
        raw = res.read()
        try:
            answer = json.loads(raw)
        except ValueError:  # not JSON (a CORS preflight's "OK")
            answer = raw
        return res.status, {k.lower(): v for k, v in res.getheaders()}, answer
    finally:
        conn.close()


def health(port: int) -> dict[str, Any]:
    status, _, answer = call(port, "GET", "/health")
    assert status == 200, answer
    return answer


def connect(port: int, data: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    if data:
        sock.sendall(data)
    return sock


def until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (a socket timeout fails the test)."""
    chunks = []
    try:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    except ConnectionResetError:
        pass
    finally:
        sock.close()
    return b"".join(chunks)


def answer_of(raw: bytes) -> tuple[int, Any]:
    """(status, JSON body) of a raw HTTP answer."""
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def post(port: int, body: dict[str, Any]) -> socket.socket:
    """A POST /translate sent on a raw socket, its answer not read (the client may hang up)."""
    data = json.dumps(body).encode()
    return connect(port, b"POST /translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(data), data))


# ---------------------------------------------------------------------------------------------- sizes


def test_attention_is_limited_in_tokens_and_weights_not_characters(port: int, quick: Any) -> None:
    tokens = lambda text: len(quick.tokenizer.encode_src([text])[0]) + 1  # noqa: E731 - eos included
    emoji = "\U0001f600" * 40  # 40 characters, 4 byte tokens each
    n = tokens(emoji)
    assert n > 160
    status, _, answer = call(port, "POST", "/attention", {"text": emoji, "kind": "encoder"})
    assert (status, answer) == (413, {"error": f"text has {n} tokens, over the limit of 64 (--max-tokens): send a "
                                               "shorter sentence, or start the server with a larger --max-tokens"})
    status, _, answer = call(port, "POST", "/attention", {"text": "Oui.", "target": emoji})
    target = len(quick.tokenizer.encode_tgt([emoji])[0]) + 1
    assert status == 413 and answer["error"].startswith(f"target has {target} tokens, over the limit of 64")
    # 2,000 emoji fit the character limit: refused at once, by tokens
    began = time.perf_counter()
    status, _, answer = call(port, "POST", "/attention", {"text": "\U0001f600" * 2000})
    n = tokens("\U0001f600" * 2000)
    assert n > 8000 and status == 413 and answer["error"].startswith(f"text has {n} tokens, over the limit of 64")
    assert time.perf_counter() - began < 5
    # under the token limit, over the weights: heads x (S^2 + T^2 + T x S), T the greedy translation at its longest
    text = " ".join(LINES[:3])[:140]
    s = tokens(text)
    assert 40 < s <= 64
    t = 1 * (s - 1) + 4 + 1
    status, _, answer = call(port, "POST", "/attention", {"text": text})
    assert (status, answer) == (413, {"error": f"the attention of this sentence takes {2 * (s * s + t * t + t * s)} "
                                               f"weights ({s} source tokens and a greedy translation of up to {t} "
                                               "tokens), over the limit of 10000 (--max-attention-weights): send a "
                                               "shorter sentence or a target, or start the server with a larger "
                                               "--max-attention-weights"})
    status, _, answer = call(port, "POST", "/attention", {"text": text, "target": "The cat sleeps.", "kind": "cross"})
    assert status == 200 and len(answer["columns"]) == s and len(answer["heads"]) == 2
    assert "Traceback" not in json.dumps(answer)


def test_a_translation_is_limited_in_tokens_per_line_and_in_tokens_x_beam(port: int, quick: Any) -> None:
    counts = [len(ids) + 1 for ids in quick.tokenizer.encode_src(LONG)]
    assert all(c <= 64 for c in counts) and sum(counts) * 8 > 1000
    status, _, answer = call(port, "POST", "/translate", {"text": LONG, "beam": 8})
    assert (status, answer) == (413, {"error": f"this request asks for {sum(counts) * 8} source tokens x beam (8 "
                                               f"line(s) of {sum(counts)} tokens in all, beam 8), over the limit of "
                                               "1000 (--max-beam-tokens): send fewer or shorter lines or a smaller "
                                               "beam, or start the server with a larger --max-beam-tokens"})
    status, _, answer = call(port, "POST", "/translate", {"text": ["Oui.", "\U0001f600" * 20]})
    n = len(quick.tokenizer.encode_src(["\U0001f600" * 20])[0]) + 1
    assert (status, answer["error"]) == (413, f"text[1] has {n} tokens, over the limit of 64 (--max-tokens): send a "
                                              "shorter sentence, or start the server with a larger --max-tokens")
    status, _, answer = call(port, "POST", "/translate", {"text": LINES[:2], "beam": 2})  # under the limits
    assert status == 200 and len(answer["translations"]) == 2


def test_the_limits_are_in_the_model_answer_the_schema_and_the_serve_flags(port: int,
                                                                         capsys: pytest.CaptureFixture) -> None:
    import inference

    limits = call(port, "GET", "/model")[2]["limits"]
    assert {k: limits[k] for k in ("max_tokens", "max_beam_tokens", "max_attention_weights", "max_connections",
                                   "max_header_bytes", "request_timeout")} == {
        "max_tokens": 64, "max_beam_tokens": 1000, "max_attention_weights": 10000, "max_connections": 6,
        "max_header_bytes": 8192, "request_timeout": 1.0}
    schema = call(port, "GET", "/openapi.json")[2]
    assert set(limits) == set(schema["components"]["schemas"]["LimitsInfo"]["properties"])
    assert "and 64 tokens (`--max-tokens`)" in schema["components"]["schemas"]["TranslateRequest"]["properties"][
        "text"]["description"]
    assert sorted(schema["paths"]["/translate"]["post"]["responses"]) == ["200", "400", "403", "405", "413", "415",
                                                                         "422", "500", "503"]
    args = inference.build_parser().parse_args([
        "--serve", "--model_path", "runs/x", "--max-tokens", "100", "--max-beam-tokens", "5000",
        "--max-attention-weights", "1000000", "--request-timeout", "2.5", "--max-connections", "10",
        "--max-header-bytes", "4096", "--allow-host", "mt.example", "--allow-origin", "https://app.example",
        "--allow-origin", "https://b.example"])
    assert (args.max_tokens, args.max_beam_tokens, args.max_attention_weights, args.request_timeout,
            args.max_connections, args.max_header_bytes) == (100, 5000, 1000000, 2.5, 10, 4096)
    assert (args.allow_host, args.allow_origin) == (["mt.example"], ["https://app.example", "https://b.example"])
    for flag, value, line in (("--request-timeout", "0", "must be a finite number in 0.1..3600, got 0"),
                              ("--request-timeout", "nan", "must be a finite number in 0.1..3600, got nan")):
        with pytest.raises(SystemExit):
            inference.build_parser().parse_args(["--serve", "--model_path", "runs/x", flag, value])
        errors = [e for e in capsys.readouterr().err.splitlines() if "error" in e]
        assert len(errors) == 1 and f"error: argument {flag}/" in errors[0] and errors[0].endswith(f": {line}")
    with pytest.raises(ValueError, match=r"^--max-header-bytes must be >= 1024, got 100$"):
        Limits(max_header_bytes=100).check()


# ---------------------------------------------------------------------------------------------- who is answered


def test_a_post_must_say_its_body_is_json(port: int) -> None:
    before = health(port)["requests"]
    for kind, shown in ((None, "none"), ("text/plain", '"text/plain"'),
                        ("application/x-www-form-urlencoded", '"application/x-www-form-urlencoded"')):
        status, _, answer = call(port, "POST", "/translate", {"text": "Oui."}, kind=kind)
        assert (status, answer) == (415, {"error": "send the body as JSON with the header Content-Type: "
                                                   f"application/json (got {shown})"})
    status, _, answer = call(port, "POST", "/translate", {"text": "Oui."}, kind="Application/JSON; charset=utf-8")
    assert status == 200 and health(port)["requests"] == before + 1  # the refused ones were not decoded


def test_other_hosts_and_other_pages_are_refused_and_no_redirect_names_them(port: int) -> None:
    own = f"http://127.0.0.1:{port}"
    status, headers, answer = call(port, "GET", "/health/", headers={"Host": "evil.example"})
    assert (status, answer) == (403, {"error": 'this server does not answer requests for the host "evil.example": '
                                               "start it with --allow-host NAME to answer that name "
                                               "(--allow-host '*': any)"})
    assert "location" not in headers
    status, headers, answer = call(port, "GET", "/health/")  # no redirect to /health, to whatever host was named
    assert status == 404 and "location" not in headers and answer["error"].startswith("no such endpoint: GET /health/")
    status, _, answer = call(port, "POST", "/translate", {"text": "Oui."}, headers={"Host": "evil.example:8000"})
    assert status == 403
    for origin in ("null", "http://evil.example", f"http://evil.example:{port}", "file://"):
        status, _, answer = call(port, "POST", "/translate", {"text": "Oui."}, headers={"Origin": origin})
        assert (status, answer) == (403, {"error": f"requests from the page at {json.dumps(origin)} are refused (only "
                                                   "this server's own page and pages on this machine may call it): "
                                                   "start the server with --allow-origin ORIGIN to allow that page "
                                                   "(--allow-origin '*': any)"})
    for host, origin in ((f"127.0.0.1:{port}", own), (f"localhost:{port}", "http://localhost:5173"),
                         ("[::1]", "http://[::1]:8000"), ("192.0.2.7:8000", "http://192.0.2.7:8000")):
        status, headers, answer = call(port, "POST", "/translate", {"text": "Oui."},
                                       headers={"Host": host, "Origin": origin})
        assert status == 200, (host, origin, answer)
        assert "access-control-allow-origin" not in headers  # no CORS: other pages cannot read the answers
    allowed = Access(hosts=("mt.example",), origins=("https://app.example",))
    with serving(FakeEngine(), Limits(max_wait_ms=0), allowed) as other:
        status, _, _ = call(other, "GET", "/health", headers={"Host": "MT.example:80"})
        assert status == 200
        status, headers, _ = call(other, "POST", "/translate", {"text": "Oui."},
                                  headers={"Host": "mt.example", "Origin": "https://app.example"})
        assert status == 200 and headers["access-control-allow-origin"] == "https://app.example"
        status, headers, _ = call(other, "OPTIONS", "/translate", headers={  # a browser's preflight
            "Host": "mt.example", "Origin": "https://app.example", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type"})
        assert status == 200 and headers["access-control-allow-origin"] == "https://app.example"
        assert "content-type" in headers["access-control-allow-headers"].lower()
        assert call(other, "GET", "/health", headers={"Origin": "https://other.example"})[0] == 403
        assert call(other, "GET", "/health", headers={"Host": "other.example"})[0] == 403


# ---------------------------------------------------------------------------------------------- connections


def test_stalled_requests_are_answered_408_and_closed_in_time_while_health_answers(bare: int) -> None:
    port = bare
    began = time.monotonic()
    stalled = [connect(port),  # says nothing
               connect(port, b"POST /translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-"),  # half its head
               connect(port, b"POST /translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                             b"Content-Length: 60\r\n\r\n{\"text\": ")]  # a third of its body
    for _ in range(3):
        assert health(port)["status"] == "ok" and time.monotonic() - began < 0.9  # answered meanwhile
    for sock in stalled:
        assert answer_of(until_closed(sock)) == (408, {"error": "the request did not arrive whole within 1 s "
                                                                "(--request-timeout); the connection is closed"})
    assert 0.9 < time.monotonic() - began < 3.0  # the 1 s deadline, and a margin


def test_headers_over_the_limit_are_refused_431_and_not_held(bare: int) -> None:
    port = bare
    sock = connect(port, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    line, sent = b"X-Junk: " + b"a" * 8182 + b"\r\n", 0
    try:
        for _ in range(4096):  # 32 MiB of headers, if the server kept reading them
            sock.sendall(line)
            sent += len(line)
    except (BrokenPipeError, ConnectionResetError):
        pass
    assert sent < 16 << 20  # the server stopped reading, and closed the connection
    raw = until_closed(sock)
    if raw:  # the answer, unless the connection was reset under it
        status, answer = answer_of(raw)
        assert status == 431 and answer["error"].startswith("the request's headers are over the limit of 8192 bytes")
    # headers over the limit that arrive at once: the same status
    status, _, answer = call(port, "GET", "/health", headers={"X-Junk": "a" * 9000})
    assert status == 431 and "over the limit of 8192" in answer["error"] and "--max-header-bytes" in answer["error"]
    # a long request line counts too: a query string over the limit, headers small, arriving at once
    status, _, answer = call(port, "GET", "/health?" + "a" * 9000)
    assert status == 431 and answer["error"].startswith("the request's line and headers have ") and \
        "over the limit of 8192" in answer["error"], answer
    assert health(port)["status"] == "ok"


def test_connections_are_capped_and_stalled_ones_free_their_place(bare: int) -> None:
    port = bare
    idle = [connect(port) for _ in range(6)]
    extra = connect(port, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert answer_of(until_closed(extra)) == (503, {"error": "the server has 6 connections open, its limit "
                                                             "(--max-connections); try again shortly"})
    for sock in idle:  # each closed at its deadline
        assert answer_of(until_closed(sock))[0] == 408
    assert health(port)["status"] == "ok"


# ---------------------------------------------------------------------------------------------- abandoned work


class GateEngine:
    """Translates each text once ``gate`` is open, reporting it to ``on_done`` as it goes (static batching)."""

    def __init__(self) -> None:
        self.cfg = from_dict({"decode": {"beam": 1}})
        self.entered, self.gate, self.ended = threading.Event(), threading.Event(), threading.Event()
        self.calls: list[list[str]] = []
        self.reported: list[str] = []

    def translate(self, texts: list[str], decode: Any, on_done: Any = None) -> list[list[Any]]:
        from utils.translation.translate import Translation

        self.calls.append(list(texts))
        self.entered.set()
        out = []
        try:
            for i, text in enumerate(texts):
                assert self.gate.wait(30)
                out.append([Translation(text.upper(), -1.0, -1.0, [])])
                on_done(i, out[-1])
                self.reported.append(text)
        finally:
            self.ended.set()
        return out


def test_a_queued_request_whose_client_hung_up_is_never_decoded() -> None:
    engine = GateEngine()
    with serving(engine, Limits(max_wait_ms=0)) as port:
        first = post(port, {"text": "un"})
        assert engine.entered.wait(10)  # the worker holds "un"
        gone = post(port, {"text": ["deux", "deux bis"]})
        wait_for(lambda: health(port)["waiting"] == 1)
        gone.close()
        wait_for(lambda: health(port)["abandoned"] == 1)
        assert health(port)["waiting"] == 0  # out of the queue at once
        third = post(port, {"text": "trois"})
        wait_for(lambda: health(port)["waiting"] == 1)
        engine.gate.set()
        for sock, text in ((first, "UN"), (third, "TROIS")):
            status, answer = answer_of(read_answer(sock))
            assert status == 200 and answer["translations"][0]["translation"] == text
    assert engine.calls == [["un"], ["trois"]]


def read_answer(sock: socket.socket) -> bytes:
    """An answer on a connection kept alive: read until its body (Content-Length) is whole, then close."""
    raw = b""
    while b"\r\n\r\n" not in raw or len(raw.partition(b"\r\n\r\n")[2]) < int(
            raw.lower().split(b"content-length: ")[1].split(b"\r\n")[0]):
        chunk = sock.recv(65536)
        assert chunk, raw
        raw += chunk
    sock.close()
    return raw


def test_a_static_batch_stops_at_its_next_sentence_once_its_client_hung_up() -> None:
    engine = GateEngine()
    with serving(engine, Limits(max_wait_ms=0)) as port:
        gone = post(port, {"text": ["a", "b", "c", "d"]})
        assert engine.entered.wait(10)  # decoding, before its first sentence is done
        gone.close()
        wait_for(lambda: health(port)["abandoned"] == 1)
        engine.gate.set()
        assert engine.ended.wait(10)
        assert engine.reported == []  # the first sentence done raised Abandoned: no more were decoded
        status, _, answer = call(port, "POST", "/translate", {"text": "e"})  # the worker goes on
        assert status == 200 and answer["translations"][0]["translation"] == "E"


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.fixture(scope="module")
def decoder(run: Any) -> Iterator[Any]:
    """The run's decoding process (as ``inference.py --serve`` starts it)."""
    from utils.serve.worker import ProcessDecoder

    decoder = ProcessDecoder(run.checkpoint, run.step, None, DECODE, "cpu")
    yield decoder
    decoder.close()


def test_the_decoding_process_drops_the_requests_of_clients_that_hung_up(run: Any, decoder: Any) -> None:
    """Two clients send 8 long lines at beam 16 each (about 20 s of decoding here) and hang up, a third hangs up at
    once: the decoding process drops them at its next step and goes idle, and the next request is as fast as
    alone."""
    from utils.translation.engines import TorchEngine

    engine = TorchEngine(run)
    engine.decoder, engine.continuous = decoder, True
    with serving(engine, Limits(max_beam_tokens=100000, max_wait_ms=0)) as port:
        began = time.perf_counter()
        status, _, alone = call(port, "POST", "/translate", {"text": LINES[0], "beam": 1})
        alone_s = time.perf_counter() - began
        assert status == 200
        gone = [post(port, {"text": LONG, "beam": 16}) for _ in range(2)]
        wait_for(lambda: health(port)["largest_batch"] >= 16)  # both decoding
        time.sleep(0.3)
        for sock in gone:
            sock.close()
        wait_for(lambda: health(port)["abandoned"] == 2, timeout=5)
        post(port, {"text": LONG, "beam": 16}).close()  # gone at once: before, while or after it is handed over
        time.sleep(0.5)
        pid = health(port)["decoder"]["pid"]
        cpu = cpu_seconds(pid)
        time.sleep(1.0)
        assert cpu_seconds(pid) - cpu < 0.15  # idle: nothing left to decode
        began = time.perf_counter()
        status, _, answer = call(port, "POST", "/translate", {"text": LINES[0], "beam": 1})
        took = time.perf_counter() - began
        assert status == 200 and answer["translations"] == alone["translations"]
        assert took < 2 * alone_s + 1.0, (took, alone_s)


def test_a_static_batch_in_the_decoding_process_stops_at_its_next_step(run: Any, decoder: Any) -> None:
    """``ProcessDecoder.translate`` (static batching) stopped from another thread (``cancel``, as the server does when
    nobody awaits the batch any more) or by its own ``on_done`` raising: it raises, the process drops the rest at
    once, and answers the next call."""
    from utils.serve.worker import Cancelled

    out: list[Any] = []

    def translate(texts: list[str], decode: Any, on_done: Any = None) -> None:
        try:
            decoder.translate(texts, decode, on_done)
        except Exception as err:  # noqa: BLE001 - what the test looks at
            out.append(err)

    thread = threading.Thread(target=translate, args=(LONG * 2, run.cfg.decode))  # 16 lines, beam 2: seconds
    thread.start()
    wait_for(lambda: decoder.translating is not None)
    cpu = cpu_seconds(decoder.pid)
    wait_for(lambda: cpu_seconds(decoder.pid) > cpu)  # decoding
    decoder.cancel(decoder.translating)
    thread.join(10)
    assert not thread.is_alive() and len(out) == 1 and isinstance(out[0], Cancelled)
    time.sleep(0.2)
    cpu = cpu_seconds(decoder.pid)
    time.sleep(1.0)
    assert cpu_seconds(decoder.pid) - cpu < 0.15  # the rest was dropped
    reported: list[int] = []

    def on_done(i: int, nbest: Any) -> None:
        reported.append(i)
        raise Abandoned

    short = run.cfg.decode.model_copy(update={"beam": 1, "max_len_a": 0, "max_len_b": 3, "batch_size": 1})
    thread = threading.Thread(target=translate, args=(LINES[:8], short, on_done))
    thread.start()
    thread.join(10)
    assert not thread.is_alive() and isinstance(out[1], Abandoned) and len(reported) == 1  # raised once, passed on
    assert len(decoder.translate(LINES[:2], short)) == 2 and decoder.restarts == 0
