"""Hostile numbers: a request whose beam, nbest, lenpen or layer is a huge JSON integer (past Python's 4300-digit
parsing limit, or just too big for a float), a NaN/Infinity literal or a float that overflows to inf is refused with
one short line (422, or 400 for a body that is not JSON), and the server answers /health after; ``--join`` and
``--max-wait-ms`` of ``inference.py --serve`` take only a finite number in their range, refused by argparse before a
model loads. The server runs in-process on 127.0.0.1 with the fake engine of test_docs_http (no model)."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import ROOT, run_script
from test_docs_http import FakeEngine

from utils.serve.app import Limits, create_app

HUGE = "1" + "0" * 5000  # 5,001 digits: past int()'s default limit of 4,300
BIG = "1" + "0" * 399  # 400 digits: parsed, but too big for a float


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    """The app with the default limits (a body of 5,000 digits fits) on a free port, uvicorn in a thread."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_app(FakeEngine(), Limits(max_wait_ms=0)), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    yield sock.getsockname()[1]
    server.should_exit = True
    thread.join(10)


def post(port: int, path: str, raw: bytes) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", path, body=raw, headers={"Content-Type": "application/json"})
        res = conn.getresponse()
        return res.status, json.loads(res.read())
    finally:
        conn.close()


def health(port: int) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", "/health")
        return conn.getresponse().status
    finally:
        conn.close()


CASES = [  # (path, field, raw JSON value, what the one line must say)
    ("/translate", "beam", HUGE, "beam must be between 1 and 32, got a number with 5001 digits"),
    ("/translate", "beam", "-" + HUGE, "beam must be between 1 and 32, got a number with 5001 digits"),
    ("/translate", "beam", BIG, "beam must be between 1 and 32, got a number with 400 digits"),
    ("/translate", "nbest", HUGE, "nbest must be between 1 and 32, got a number with 5001 digits"),
    ("/translate", "lenpen", HUGE, "lenpen must be between 0.0 and 10.0, got a number with 5001 digits"),
    ("/translate", "lenpen", BIG, "lenpen must be between 0.0 and 10.0, got a number with 400 digits"),
    ("/translate", "lenpen", "NaN", "lenpen must be between 0.0 and 10.0, got nan"),
    ("/translate", "lenpen", "Infinity", "lenpen must be between 0.0 and 10.0, got inf"),
    ("/translate", "lenpen", "-Infinity", "lenpen must be between 0.0 and 10.0, got -inf"),
    ("/translate", "lenpen", "1e400", "lenpen must be between 0.0 and 10.0, got inf"),
    ("/translate", "lenpen", HUGE + ".5", "lenpen must be between 0.0 and 10.0, got inf"),
    ("/translate", "text", HUGE, "text must be a string or a list of strings, not a number"),
    ("/translate", "text", f"[{HUGE}]", "text[0] must be a string, not a number"),
    ("/attention", "layer", HUGE, "layer must be between -2147483648 and 2147483648, got a number with 5001 digits"),
]


@pytest.mark.parametrize(("path", "field", "value", "message"), CASES, ids=[f"{c[1]}={c[2][:12]}" for c in CASES])
def test_a_huge_or_non_finite_number_is_refused_in_one_short_line(port: int, path: str, field: str, value: str,
                                                                   message: str) -> None:
    raw = f'{{"text": "Oui.", "{field}": {value}}}' if field != "text" else f'{{"text": {value}}}'
    status, answer = post(port, path, raw.encode())
    assert status == 422, answer
    assert list(answer) == ["error"] and answer["error"] == message
    assert "\n" not in answer["error"] and len(answer["error"]) < 300
    assert health(port) == 200


def test_a_huge_number_in_a_body_that_is_not_json_is_a_400_in_one_line(port: int) -> None:
    status, answer = post(port, "/translate", f'{{"text": "Oui.", "beam": {HUGE},}}'.encode())
    assert status == 400 and list(answer) == ["error"] and answer["error"].startswith("invalid JSON")
    assert "\n" not in answer["error"] and len(answer["error"]) < 300
    assert health(port) == 200


@pytest.mark.parametrize(("flag", "value"), [("--join", "nan"), ("--join", "inf"), ("--join", "-1"),
                                             ("--max-wait-ms", "nan"), ("--max-wait-ms", "inf"),
                                             ("--max-wait-ms", "1001")])
def test_a_serve_float_flag_must_be_finite_and_in_range_before_the_model_loads(flag: str, value: str) -> None:
    res = run_script("inference.py", "--serve", "--model_path", str(ROOT / "no-such-model"), "--port", "0", flag,
                     value)
    assert res.returncode == 2, (res.stdout, res.stderr)
    errors = [line for line in res.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and f"argument {flag}" in errors[0] and value in errors[0], res.stderr
    assert "Traceback" not in res.stderr and "no-such-model" not in res.stderr
