"""The PyTorch server's decoding process: the run's model loaded again in a process of its own, which decodes the
server's batches. Python beam search holds the GIL for most of a step; in the server's process it takes turns
with the HTTP and JSON work of every request, in its own process both run at once (CTranslate2 releases the GIL
while it decodes and needs no such process)."""

from __future__ import annotations

import itertools
import logging
import multiprocessing as mp
import signal
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from utils.translation.translate import OnDone

log = logging.getLogger("serve")


class DecoderError(RuntimeError):
    """The decoding process could not start, ended, or holds other weights than the server's."""


def _decode_forever(conn: Connection, model_path: str, config: str | None, overrides: list[str], device: str,
                    average: int | None, join: float) -> None:
    """The child: load the run, answer ("ok", (checkpoint, step)) or ("error", ...), then decode every job received
    until the pipe closes (the server's end goes when the server does). A job is (kind, id, texts, decode): kind
    "translate" is decoded at once, alone, as ``translate`` does (static batches); kind "join" joins the decoding in
    flight (``ContinuousDecoder``: iteration-level batching), new jobs being read between decoder steps. Each text
    is reported as soon as its list is final: ("done", (id, i, nbest, stats)), stats the continuous decoder's
    (batches, steps, sentence-steps); a job that fails answers ("error", (id, exception class name, message,
    traceback)) instead of its remaining texts."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the server handles it
    try:
        from utils.run.load import load_run
        from utils.translation.continuous import ContinuousDecoder, Request
        from utils.translation.translate import encode_sources, translate

        run = load_run(model_path, config, overrides, device, average=average)
    except Exception as err:  # noqa: BLE001 - the parent reports it in one line
        conn.send(("error", (type(err).__name__, str(err), traceback.format_exc())))
        return
    conn.send(("ok", (str(run.checkpoint), run.step)))
    decoder = ContinuousDecoder(run.model, run.tokenizer, join=join)

    def stats() -> tuple[int, int, int]:
        return decoder.batches, decoder.steps, decoder.sentence_steps

    def failed(job: int, err: BaseException) -> None:
        conn.send(("error", (job, type(err).__name__, str(err), "".join(traceback.format_exception(err)))))

    while True:
        try:
            jobs = [] if decoder.busy else [conn.recv()]  # idle: wait for work; busy: take what has come
            while conn.poll():
                jobs.append(conn.recv())
        except (EOFError, OSError):
            return
        joining = []
        for kind, job, texts, decode in jobs:
            def done(i: int, nbest: Any, job: int = job) -> None:
                conn.send(("done", (job, i, nbest, stats())))

            try:
                if kind == "translate":
                    translate(run.model, run.tokenizer, texts, decode, strict=False, on_done=done)
                    continue
                sources = encode_sources(run.tokenizer, texts, run.model.max_length, strict=False)
            except Exception as err:  # noqa: BLE001 - fails this job, not the process
                failed(job, err)
                continue
            joining.append(Request(sources, decode, done, lambda err, job=job: failed(job, err)))
        decoder.add(joining)
        decoder.step()


@dataclass
class _Job:
    on_done: OnDone
    on_error: Callable[[BaseException], None]
    left: int  # texts not reported yet


class ProcessDecoder:
    """Decoding in a child process holding its own copy of the run's model: the checkpoint the server loaded
    (checked when the child starts), so the same translations; twice the model's memory. ``submit`` hands it a
    job that joins the decoding in flight (iteration-level batching, ``join`` as ``ContinuousDecoder`` takes it);
    ``translate`` decodes one batch alone and waits for it. A child that has ended is started again at the next
    call; the jobs it held fail (``DecoderError``) rather than go to a new one."""

    def __init__(self, checkpoint: Path | str, step: int, config: Path | str | None, overrides: list[str],
                 device: str, average: int | None = None, run_dir: Path | str | None = None,
                 join: float = 0.5) -> None:
        """``checkpoint`` and ``step``: what the server loaded (``LoadedRun``); with ``average`` the child averages
        ``run_dir``'s last checkpoints again and must reach the same ``checkpoint`` name (its steps)."""
        source = str(run_dir) if average else str(checkpoint)
        self._args = (source, None if config is None else str(config), list(overrides), device, average, join)
        self._expected = (str(Path(checkpoint).resolve()), step)
        self._lock = threading.Lock()
        self._jobs: dict[int, _Job] = {}  # the current child's jobs in flight
        self._ended_child = threading.Event()  # set by the current child's reader when its pipe closes
        self._ids = itertools.count()
        self.restarts = 0
        #: The child's continuous decoder so far: (batches started, decoder steps, sentence-steps).
        self.stats = (0, 0, 0)
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
        self.stats = (0, 0, 0)  # a new child counts from zero
        self._jobs, self._ended_child = {}, threading.Event()
        threading.Thread(target=self._read, args=(self._conn, self._jobs, self._ended_child, self._proc),
                         name="fr2en-decode-reader", daemon=True).start()

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    def _ended(self, proc: Any = None) -> DecoderError:
        proc = proc or self._proc
        proc.join(timeout=1)  # reaped, so that its exit code is known
        return DecoderError(f"the decoding process ended (exit code {proc.exitcode})")

    def _receive(self) -> tuple[str, Any]:
        try:
            return self._conn.recv()
        except (EOFError, OSError):
            raise self._ended() from None

    def _read(self, conn: Connection, jobs: dict[int, _Job], ended: threading.Event, proc: Any) -> None:
        """A child's reader thread: hand each reply to its job's callbacks; when the child ends, fail the jobs it
        still held."""
        while True:
            try:
                status, payload = conn.recv()
            except (EOFError, OSError):
                break
            if status == "done":
                job_id, i, nbest, self.stats = payload
                job = jobs.get(job_id)
                if job is not None:
                    job.left -= 1
                    if job.left == 0:
                        jobs.pop(job_id, None)
                    job.on_done(i, nbest)
            else:
                job_id, name, message, trace = payload
                job = jobs.pop(job_id, None)
                if job is not None:
                    job.on_error(_error(name, message, trace))
        with self._lock:
            ended.set()
            held = list(jobs.values())
            jobs.clear()
        if held:
            err = self._ended(proc)
            for job in held:
                job.on_error(err)

    def submit(self, texts: list[str], decode: Any, on_done: OnDone, on_error: Callable[[BaseException], None],
               kind: str = "join") -> None:
        """Hand ``texts`` to the child: ``on_done(i, nbest)`` for each as it is final, or ``on_error(exception)``
        once if the job fails (errors as the server's own would be: an input the model cannot take as
        ``InputError`` / ``PositionLimitError`` (422), an ended child ``DecoderError``, else ``RuntimeError``)."""
        if not texts:
            return
        with self._lock:
            # is_alive alone can miss an end when something else in the process reaped the child: its pipe closed too
            if not self._proc.is_alive() or self._ended_child.is_set():
                self.close()
                self.restarts += 1
                log.warning("the decoding process had ended (exit code %s); starting a new one", self._proc.exitcode)
                self._start()
            job_id = next(self._ids)
            self._jobs[job_id] = _Job(on_done, on_error, len(texts))
            try:
                self._conn.send((kind, job_id, texts, decode))
            except OSError:  # BrokenPipeError among them: the reader fails the job when it sees the end
                pass

    def translate(self, texts: list[str], decode: Any, on_done: OnDone | None = None) -> list[list[Any]]:
        """The n-best lists of ``texts`` decoded as one batch, alone (as ``translate`` does), ``on_done(i, nbest)``
        called for each as the child finishes it; raises the job's error (``submit``)."""
        results: list[Any] = [None] * len(texts)
        finished = threading.Event()
        failure: list[BaseException] = []
        left = [len(texts)]

        def done(i: int, nbest: Any) -> None:
            results[i] = nbest
            if on_done is not None:
                on_done(i, nbest)
            left[0] -= 1
            if left[0] == 0:
                finished.set()

        def error(err: BaseException) -> None:
            failure.append(err)
            finished.set()

        self.submit(texts, decode, done, error, kind="translate")
        if texts:
            finished.wait()
        if failure:
            raise failure[0]
        return results

    def close(self) -> None:
        """Close the pipe (the child then returns) and wait for the child briefly."""
        self._conn.close()
        self._proc.join(timeout=10)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(timeout=10)


def _error(name: str, message: str, trace: str) -> Exception:
    """The child's failure as the server's own would be (``ProcessDecoder.submit``)."""
    log.error("decoding failed in the decoding process:\n%s", trace.rstrip())
    from models.positional import PositionLimitError
    from utils.translation.translate import InputError

    known = {"InputError": InputError, "PositionLimitError": PositionLimitError}
    return known.get(name, RuntimeError)(message if name in known else f"{name}: {message}")
