"""The PyTorch server's decoding process: the run's model loaded again in a process of its own, which decodes the
server's batches. Python beam search holds the GIL for most of a step; in the server's process it takes turns
with the HTTP and JSON work of every request, in its own process both run at once (CTranslate2 releases the GIL
while it decodes and needs no such process)."""

from __future__ import annotations

import logging
import multiprocessing as mp
import signal
import threading
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from utils.translation.translate import OnDone

log = logging.getLogger("serve")


class DecoderError(RuntimeError):
    """The decoding process could not start, ended, or holds other weights than the server's."""


def _decode_forever(conn: Connection, model_path: str, config: str | None, overrides: list[str], device: str,
                    average: int | None) -> None:
    """The child: load the run, answer ("ok", (checkpoint, step)) or ("error", ...), then translate every (texts,
    decode) received until the pipe closes (the server's end goes when the server does): ("done", (i, nbest)) for
    each text as soon as its list is final, then ("ok", None). A failed batch answers ("error", (exception class
    name, message, traceback))."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the server handles it
    try:
        from utils.run.load import load_run
        from utils.translation.translate import translate

        run = load_run(model_path, config, overrides, device, average=average)
    except Exception as err:  # noqa: BLE001 - the parent reports it in one line
        conn.send(("error", (type(err).__name__, str(err), traceback.format_exc())))
        return
    conn.send(("ok", (str(run.checkpoint), run.step)))
    while True:
        try:
            texts, decode = conn.recv()
        except (EOFError, OSError):
            return
        try:
            translate(run.model, run.tokenizer, texts, decode, strict=False,
                      on_done=lambda i, nbest: conn.send(("done", (i, nbest))))
            conn.send(("ok", None))
        except Exception as err:  # noqa: BLE001 - fails this batch's requests, not the process
            conn.send(("error", (type(err).__name__, str(err), traceback.format_exc())))


class ProcessDecoder:
    """``translate(texts, decode)`` answered by a child process holding its own copy of the run's model: the
    checkpoint the server loaded (checked when the child starts), so the same translations; twice the model's
    memory. A child that has ended is started again at the next call; the call that finds it ending mid-batch
    fails (``DecoderError``) rather than feed the same batch to a new one."""

    def __init__(self, checkpoint: Path | str, step: int, config: Path | str | None, overrides: list[str],
                 device: str, average: int | None = None, run_dir: Path | str | None = None) -> None:
        """``checkpoint`` and ``step``: what the server loaded (``LoadedRun``); with ``average`` the child averages
        ``run_dir``'s last checkpoints again and must reach the same ``checkpoint`` name (its steps)."""
        source = str(run_dir) if average else str(checkpoint)
        self._args = (source, None if config is None else str(config), list(overrides), device, average)
        self._expected = (str(Path(checkpoint).resolve()), step)
        self._lock = threading.Lock()
        self.restarts = 0
        self._start()

    def _start(self) -> None:
        ctx = mp.get_context("spawn")  # a fresh interpreter: no forked torch thread pools
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_decode_forever, name="fr2en-decode", daemon=True, args=(child, *self._args))
        self._proc.start()
        child.close()
        try:
            status, payload = self._receive()
        except DecoderError:
            self.close()
            raise
        if status != "ok":
            self.close()
            raise DecoderError(f"the decoding process could not load the run: {payload[0]}: {payload[1]}")
        loaded = (str(Path(payload[0]).resolve()), payload[1])
        if loaded != self._expected:
            self.close()
            raise DecoderError(f"the decoding process loaded {loaded[0]} (step {loaded[1]}), not the server's "
                               f"{self._expected[0]} (step {self._expected[1]}): the run changed; restart the server")

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    def _ended(self) -> DecoderError:
        self._proc.join(timeout=1)  # reaped, so that its exit code is known
        return DecoderError(f"the decoding process ended (exit code {self._proc.exitcode})")

    def _receive(self) -> tuple[str, Any]:
        try:
            return self._conn.recv()
        except (EOFError, OSError):
            raise self._ended() from None

    def translate(self, texts: list[str], decode: Any, on_done: OnDone | None = None) -> list[list[Any]]:
        """The n-best lists of ``texts``, ``on_done(i, nbest)`` called for each as the child finishes it. Errors of
        the batch come back as the server's own would: an input the model cannot take as ``InputError`` /
        ``PositionLimitError`` (422), anything else ``RuntimeError``."""
        with self._lock:
            # Between batches the pipe holds nothing: readable means its other end closed, the child has ended
            # (is_alive alone can miss that when something else in the process reaped the child).
            if not self._proc.is_alive() or self._conn.poll():
                self.close()
                self.restarts += 1
                log.warning("the decoding process had ended (exit code %s); starting a new one", self._proc.exitcode)
                self._start()
            try:
                self._conn.send((texts, decode))
            except OSError:  # BrokenPipeError among them
                raise self._ended() from None
            results: list[Any] = [None] * len(texts)
            while (reply := self._receive())[0] == "done":
                i, nbest = reply[1]
                results[i] = nbest
                if on_done is not None:
                    on_done(i, nbest)
            status, result = reply
        if status == "ok":
            return results
        name, message, trace = result
        log.error("decoding failed in the decoding process:\n%s", trace.rstrip())
        from models.positional import PositionLimitError
        from utils.translation.translate import InputError

        known = {"InputError": InputError, "PositionLimitError": PositionLimitError}
        raise known.get(name, RuntimeError)(message if name in known else f"{name}: {message}")

    def close(self) -> None:
        """Close the pipe (the child then returns) and wait for the child briefly."""
        self._conn.close()
        self._proc.join(timeout=10)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(timeout=10)
