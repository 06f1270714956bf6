"""The server's batching in this process, with engines that block until released: the bounded queue's 503 while
/health stays responsive, requests waiting together decoded together by decoding settings, a request answered when
its own sentences are done while its batch goes on, and an export without attention answering 501."""

from __future__ import annotations

import http.client
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from conftest import serving_app, wait_for

from bench.serve_load import Server, get, post
from utils.config import from_dict


class BlockingEngine:
    """An engine whose ``translate`` records each call and waits until released: the queue can be filled."""

    def __init__(self) -> None:
        self.cfg = from_dict({"decode": {"beam": 2}})
        self.calls: list[tuple[list[str], int]] = []
        self.entered = threading.Event()
        self.release = threading.Event()

    def translate(self, texts: list[str], decode: object, on_done: object = None) -> list[list[object]]:
        """Reports nothing to ``on_done`` (as an engine that cannot): the batch is answered at its end."""
        from utils.translation.translate import Translation

        self.calls.append((list(texts), decode.beam))  # type: ignore[attr-defined]
        self.entered.set()
        assert self.release.wait(30)
        return [[Translation(t.upper(), -1.0, -2.0, [])] for t in texts]


class EarlyEngine(BlockingEngine):
    """Reports a batch's first text as finished at once, the others when that call's gate opens (long sentences)."""

    def __init__(self) -> None:
        super().__init__()
        self.gates = [threading.Event() for _ in range(4)]  # one per call
        self.started = [threading.Event() for _ in range(4)]

    def translate(self, texts: list[str], decode: object, on_done: object = None) -> list[list[object]]:
        from utils.translation.translate import Translation

        call = len(self.calls)
        result = [[Translation(t.upper(), -1.0, -2.0, [])] for t in texts]
        self.calls.append((list(texts), decode.beam))  # type: ignore[attr-defined]
        on_done(0, result[0])  # type: ignore[operator]
        self.started[call].set()
        assert self.gates[call].wait(30)
        for i in range(1, len(texts)):
            on_done(i, result[i])  # type: ignore[operator]
        return result


@contextmanager
def serving(engine: BlockingEngine, **limits: float) -> Iterator[Server]:
    """The app on a free port in a thread of this process (uvicorn, as --serve runs it)."""
    from utils.serve.app import Limits, create_app

    try:
        with serving_app(create_app(engine, Limits(**limits))) as port:
            yield Server(None, "127.0.0.1", port, Path(os.devnull))  # type: ignore[arg-type]
    finally:
        engine.release.set()


def in_thread(fn, *args) -> tuple[threading.Thread, list]:  # noqa: ANN001
    out: list = []
    thread = threading.Thread(target=lambda: out.append(fn(*args)))
    thread.start()
    return thread, out


def send(server: Server, body: dict) -> tuple[int, dict]:
    conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
    try:
        return post(conn, "/translate", body)
    finally:
        conn.close()


def test_a_full_queue_answers_503_while_health_stays_responsive() -> None:
    engine = BlockingEngine()
    with serving(engine, max_queue=2, max_batch=1, max_wait_ms=0) as srv:
        first = in_thread(send, srv, {"text": "un"})
        assert engine.entered.wait(10)  # the worker holds "un"; the event loop still answers
        waiting = [in_thread(send, srv, {"text": t}) for t in ("deux", "trois")]
        wait_for(lambda: get(srv.url, "/health")[1]["waiting"] == 2)
        status, answer = send(srv, {"text": "quatre"})
        assert status == 503 and answer == {"error": "the server is busy (2 requests waiting); try again shortly"}
        engine.release.set()
        for thread, out in [first, *waiting]:
            thread.join(10)
            assert out[0][0] == 200
        assert [out[0][1]["translations"][0]["translation"] for _, out in [first, *waiting]] == ["UN", "DEUX", "TROIS"]
        health = get(srv.url, "/health")[1]
        assert (health["rejected"], health["requests"], health["batches"]) == (1, 3, 3)


def test_requests_waiting_together_are_decoded_together_by_decoding_settings() -> None:
    engine = BlockingEngine()
    with serving(engine, max_batch=4, max_wait_ms=0) as srv:
        first = in_thread(send, srv, {"text": "un"})
        assert engine.entered.wait(10)
        bodies = [{"text": ["a", "b"]}, {"text": "c", "beam": 3}, {"text": "d"}, {"text": ["e", "f"]}]
        threads = []
        for body in bodies:  # queued in this order while "un" decodes
            threads.append(in_thread(send, srv, body))
            n = len(threads)
            wait_for(lambda n=n: get(srv.url, "/health")[1]["waiting"] == n)
        engine.release.set()
        for thread, out in [first, *threads]:
            thread.join(10)
            assert out[0][0] == 200
    # a batch takes waiting requests up to 4 sentences (a b, c, d; then e f), one translate call per beam size
    assert engine.calls == [(["un"], 2), (["a", "b", "d"], 2), (["c"], 3), (["e", "f"], 2)]
    assert [out[0][1]["translations"][0]["translation"] for _, out in threads] == ["A", "C", "D", "E"]


def test_a_request_is_answered_when_its_sentences_are_done_while_the_batch_goes_on() -> None:
    engine = EarlyEngine()
    with serving(engine, max_batch=8, max_wait_ms=0) as srv:
        blocker = in_thread(send, srv, {"text": "zéro"})
        assert engine.started[0].wait(10)  # the worker holds "zéro" (reported, its call still running)
        short = in_thread(send, srv, {"text": "un"})
        wait_for(lambda: get(srv.url, "/health")[1]["waiting"] == 1)
        long = in_thread(send, srv, {"text": ["deux", "trois"]})
        wait_for(lambda: get(srv.url, "/health")[1]["waiting"] == 2)
        engine.gates[0].set()  # "un" and "deux trois" make the next batch, where "un" finishes first
        assert engine.started[1].wait(10)
        short[0].join(10)  # answered while its batch still decodes "deux trois"
        assert short[1][0][0] == 200 and short[1][0][1]["translations"][0]["translation"] == "UN"
        assert long[0].is_alive() and get(srv.url, "/health")[1]["requests"] == 2
        busy = get(srv.url, "/health")[1]["busy_s"]
        time.sleep(0.2)  # the call in progress counts in busy_s up to now, its answered requests or not
        assert 0.2 <= get(srv.url, "/health")[1]["busy_s"] - busy < 5
        engine.gates[1].set()
        for thread, _ in (long, blocker):
            thread.join(10)
        assert [t["translation"] for t in long[1][0][1]["translations"]] == ["DEUX", "TROIS"]
        assert blocker[1][0][0] == 200 and get(srv.url, "/health")[1]["requests"] == 3
    assert engine.calls == [(["zéro"], 2), (["un", "deux", "trois"], 2)]


def test_an_export_without_attention_answers_501_and_the_model_says_so() -> None:
    engine = BlockingEngine()  # like an export made before exports kept attention: no run, no attention layers
    with serving(engine) as srv:
        conn = http.client.HTTPConnection(srv.host, srv.port, timeout=30)
        status, answer = post(conn, "/attention", {"text": "un"})
        conn.close()
    assert status == 501 and answer["error"].startswith("this CTranslate2 export was made before exports kept "
                                                        "attention: export the run again")
    assert engine.calls == []
