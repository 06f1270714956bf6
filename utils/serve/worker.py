"""The PyTorch server's decoding process: the run's model loaded again in a process of its own, which decodes the
server's batches. Python beam search holds the GIL for most of a step; in the server's process it takes turns
with the HTTP and JSON work of every request, in its own process both run at once (CTranslate2 releases the GIL
while it decodes and needs no such process)."""

from __future__ import annotations

import multiprocessing as mp
import signal
import threading
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any


class DecoderError(RuntimeError):
    """The decoding process failed to start or ended."""


def _decode_forever(conn: Connection, model_path: str, config: str | None, overrides: list[str], device: str,
                    average: int | None) -> None:
    """The child: load the run, answer ("ok", None) or ("error", line), then translate every (texts, decode)
    received until the pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the server, which then closes the pipe
    try:
        from utils.run.load import load_run
        from utils.translation.translate import translate

        run = load_run(model_path, config, overrides, device, average=average)
    except Exception as err:  # noqa: BLE001 - the parent reports it in one line
        conn.send(("error", f"{type(err).__name__}: {err}"))
        return
    conn.send(("ok", None))
    while True:
        try:
            texts, decode = conn.recv()
        except (EOFError, OSError):
            return
        try:
            conn.send(("ok", translate(run.model, run.tokenizer, texts, decode, strict=False)))
        except Exception as err:  # noqa: BLE001 - fails this batch's requests, not the process
            conn.send(("error", f"{type(err).__name__}: {err}"))


class ProcessDecoder:
    """``translate(texts, decode)`` answered by a child process holding its own copy of the run's model (the
    same weights, so the same translations; twice the model's memory). One call at a time."""

    def __init__(self, model_path: Path | str, config: Path | str | None, overrides: list[str], device: str,
                 average: int | None = None) -> None:
        self._args = (str(model_path), None if config is None else str(config), list(overrides), device, average)
        self._lock = threading.Lock()
        self.restarts = 0
        self._start()

    def _start(self) -> None:
        ctx = mp.get_context("spawn")  # a fresh interpreter: no forked torch thread pools
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_decode_forever, name="fr2en-decode", daemon=True, args=(child, *self._args))
        self._proc.start()
        child.close()
        status, message = self._receive()
        if status != "ok":
            self.close()
            raise DecoderError(f"the decoding process could not load the run: {message}")

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    def _receive(self) -> tuple[str, Any]:
        try:
            return self._conn.recv()
        except (EOFError, OSError):
            raise DecoderError(f"the decoding process ended (exit code {self._proc.exitcode})") from None

    def _call(self, texts: list[str], decode: Any) -> tuple[str, Any]:
        try:
            self._conn.send((texts, decode))
        except OSError:  # BrokenPipeError among them
            raise DecoderError(f"the decoding process ended (exit code {self._proc.exitcode})") from None
        return self._receive()

    def translate(self, texts: list[str], decode: Any) -> list[list[Any]]:
        """The n-best lists of ``texts``; a decoding process that has ended is started again (once per call)."""
        with self._lock:
            try:
                status, result = self._call(texts, decode)
            except DecoderError:
                self.close()
                self.restarts += 1
                self._start()
                status, result = self._call(texts, decode)
        if status != "ok":
            raise DecoderError(f"decoding failed: {result}")
        return result

    def close(self) -> None:
        """Close the pipe (the child then returns) and wait for the child briefly."""
        self._conn.close()
        self._proc.join(timeout=10)
        if self._proc.is_alive():
            self._proc.kill()
