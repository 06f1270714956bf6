"""The PyTorch server's decoding process: the run's model loaded again in a process of its own, which decodes the
server's batches. Python beam search holds the GIL for most of a step; in the server's process it takes turns
with the HTTP and JSON work of every request, in its own process both run at once (CTranslate2 releases the GIL
while it decodes and needs no such process). A job whose client hung up is cancelled there (``cancel``): it stops
at the next decoder step (a batch that holds other jobs too goes on for them). A job may carry each text's target
prefix and constraints (``Guide``), and decodes in every mode ``translate`` has (sampling, MBR); the process may
hold an ensemble (several runs, ``utils.run.ensemble``)."""

from __future__ import annotations

import itertools
import logging
import multiprocessing as mp
import signal
import threading
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from utils.translation.continuous import ContinuousDecoder, Request

if TYPE_CHECKING:
    from utils.translation.translate import Guide, OnDone

log = logging.getLogger("serve")


class DecoderError(RuntimeError):
    """The decoding process could not start, ended, or holds other weights than the server's."""


class Cancelled(Exception):
    """A job was cancelled (``ProcessDecoder.cancel``): what its ``on_error`` gets, and its ``translate`` raises."""


class _Stopped(Exception):
    """The static batch decoding in the child was cancelled."""


@dataclass(eq=False)
class _Cancellable(Request):
    """A request of the child's continuous decoder, which its job's cancel marks."""

    cancelled: bool = False


class CancellableDecoder(ContinuousDecoder):
    """A continuous decoder from which a request can be taken out (``cancel``): if it waits, at once; if it decodes,
    its batch is dropped as soon as every request in it is cancelled or done (a batch's rows cannot leave it one by
    one)."""

    def cancel(self, request: _Cancellable) -> None:
        request.cancelled = True
        self.waiting = [r for r in self.waiting if r is not request]
        self._drop_abandoned()

    def step(self) -> None:
        super().step()
        self._drop_abandoned()

    def _drop_abandoned(self) -> None:
        keep = []
        for search, owners in self.searches:
            if all(r.cancelled or not r.left for r in owners):
                self.in_flight -= sum(r.left for r in owners)  # each request's rows are all in one batch
            else:
                keep.append((search, owners))
        self.searches = keep


def _decode_forever(conn: Connection, model_paths: list[str], config: str | None, overrides: list[str], device: str,
                    average: int | None, join: float) -> None:
    """The child: load the run (several ``model_paths``: an ensemble), answer ("ok", [(checkpoint, step) of each
    model]) or ("error", ...), then decode every job received until the pipe closes (the server's end goes when the
    server does). A job is (kind, id, texts, decode, guides), guides None or one ``Guide`` per text: kind
    "translate" is decoded at once, alone, as ``translate`` does (static batches); kind "join" joins the decoding in
    flight (``ContinuousDecoder``: iteration-level batching), new jobs being read between decoder steps; kind
    "cancel" (texts, decode and guides None) drops the job of that id: not started, or out of the decoding in flight
    (its batch stops once it holds no other job), or, the static batch decoding now, at its next decoder step; kind
    "close" ends the child. Each text is reported as soon as its list is final: ("done", (id, i, nbest, stats)),
    stats the continuous decoder's (batches, steps, sentence-steps); a job that fails answers ("error", (id,
    exception class name, message, traceback)) instead of its remaining texts; a cancelled job answers nothing
    more."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the server handles it
    try:
        from utils.run.ensemble import load_ensemble
        from utils.translation.translate import encode_guides, encode_sources

        run = load_ensemble(model_paths, config, overrides, device, average=average)
    except Exception as err:  # noqa: BLE001 - the parent reports it in one line
        conn.send(("error", (type(err).__name__, str(err), traceback.format_exc())))
        return
    members = getattr(run, "members", None) or [run]
    conn.send(("ok", [(str(m.checkpoint), m.step) for m in members]))
    decoder = CancellableDecoder(run.model, run.tokenizer, join=join)
    pending: deque[tuple[str, int, Any, Any, Any]] = deque()  # jobs received, not started
    live: dict[int, Any] = {}  # "join" jobs in the decoder: id -> its request
    static: list[Any] = [None, False]  # the "translate" job decoding now, and whether it was cancelled

    def stats() -> tuple[int, int, int]:
        return decoder.batches, decoder.steps, decoder.sentence_steps

    def failed(job: int, err: BaseException, joined: bool = False) -> None:
        if joined and live.pop(job, None) is None:  # cancelled: nobody waits for its error
            return
        conn.send(("error", (job, type(err).__name__, str(err), "".join(traceback.format_exception(err)))))

    def take(message: tuple[str, int, Any, Any, Any]) -> None:
        kind, job = message[0], message[1]
        if kind == "close":
            raise EOFError
        if kind != "cancel":
            pending.append(message)
        elif job == static[0]:
            static[1] = True
        elif job in live:
            decoder.cancel(live.pop(job))
        else:  # not started yet (or finished: then it is nowhere)
            for queued in [m for m in pending if m[1] == job]:
                pending.remove(queued)

    def read(wait: bool) -> None:
        """Take the messages that have come (``wait``: at least one)."""
        if wait:
            take(conn.recv())
        while conn.poll():
            take(conn.recv())

    def stopped() -> bool:
        """Whether the "translate" job decoding now was cancelled (the messages that have come read)."""
        read(wait=False)
        return static[1]

    while True:
        try:
            read(wait=not pending and not decoder.busy)  # idle: wait for work; busy: take what has come
        except (EOFError, OSError):
            return
        joining = []
        while pending:
            kind, job, texts, decode, guides = pending.popleft()

            def done(i: int, nbest: Any, job: int = job, kind: str = kind) -> None:
                if kind == "join" and job not in live:  # cancelled while its batch goes on for others
                    return
                conn.send(("done", (job, i, nbest, stats())))
                if kind == "join" and not live[job].left:
                    live.pop(job)

            try:
                if kind == "translate":
                    static[:] = [job, False]
                    _translate(run, texts, decode, done, stopped, guides)
                    continue
                sources = encode_sources(run.tokenizer, texts, run.model.max_length, strict=False)
                ids = None if guides is None else encode_guides(run.tokenizer, guides, run.model.max_length)
            except _Stopped:
                continue
            except (EOFError, OSError):  # the server's end of the pipe is gone
                return
            except Exception as err:  # noqa: BLE001 - fails this job, not the process
                failed(job, err)
                continue
            finally:
                static[:] = [None, False]
            live[job] = _Cancellable(sources, decode, done, lambda err, job=job: failed(job, err, joined=True), ids)
            joining.append(live[job])
        decoder.add(joining)
        try:
            decoder.step()
        except (EOFError, OSError):
            return


def _translate(run: Any, texts: list[str], decode: Any, on_done: OnDone, stopped: Callable[[], bool],
               guides: list[Guide | None] | None = None) -> None:
    """``translate(run.model, run.tokenizer, texts, decode, strict=False, on_done=on_done, guides=guides)``: the same
    batches (the sources sorted by length, ``decode.batch_size`` at a time), each decoded as ``Search.run`` does, but
    ``_Stopped`` at the first decoder step after ``stopped()`` (the rest of the job is not decoded)."""
    import torch

    from utils.translation import translate as t

    sources = t.encode_sources(run.tokenizer, texts, run.model.max_length, strict=False)
    ids = None if guides is None else t.encode_guides(run.tokenizer, guides, run.model.max_length)
    todo = [i for i, src in enumerate(sources) if src]
    for i in (i for i, src in enumerate(sources) if not src):
        on_done(i, [t.Translation("", 0.0, 0.0, [])])
    run.model.eval()
    with torch.no_grad():
        for batch in t._batches([len(sources[i]) for i in todo], decode.batch_size):
            rows = [todo[j] for j in batch]
            search = t.make_search(run.model, run.tokenizer, [sources[i] for i in rows], decode,
                                   lambda r, hyps, rows=rows: on_done(rows[r], t.translations(run.tokenizer, hyps,
                                                                                              decode)),
                                   None if ids is None else [ids[i] for i in rows])
            while search.running:
                if stopped():
                    raise _Stopped
                search.advance(search.logits())


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
                 join: float = 0.5, members: list[tuple[Path | str, int, Path | str | None]] | None = None) -> None:
        """``checkpoint`` and ``step``: what the server loaded (``LoadedRun``); with ``average`` the child averages
        ``run_dir``'s last checkpoints again and must reach the same ``checkpoint`` name (its steps). ``members``: an
        ensemble's (checkpoint, step, run_dir) of each model, the first one ``checkpoint``'s (``LoadedEnsemble``):
        the child loads them all, and must reach the same checkpoints."""
        members = members or [(checkpoint, step, run_dir)]
        sources = [str(rd) if average else str(ckpt) for ckpt, _, rd in members]
        self._args = (sources, None if config is None else str(config), list(overrides), device, average, join)
        self._expected = [(str(Path(ckpt).resolve()), st) for ckpt, st, _ in members]
        self._lock = threading.RLock()  # close() takes it too, also from within submit()
        self._jobs: dict[int, _Job] = {}  # the current child's jobs in flight
        self._ended_child = threading.Event()  # set by the current child's reader when its pipe closes
        self._ids = itertools.count()
        #: The id of the job ``translate`` waits for now (None: none), for ``cancel``.
        self.translating: int | None = None
        self.restarts = 0
        self._ended_children = (0, 0, 0)  # the counts of the children that ended (``stats``)
        self._child_stats = (0, 0, 0)  # the current child's
        self._start()

    @property
    def stats(self) -> tuple[int, int, int]:
        """The continuous decoders' counts since this object started, every child's: (batches started, decoder
        steps, sentence-steps)."""
        (a, b, c), (x, y, z) = self._ended_children, self._child_stats
        return a + x, b + y, c + z

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
        loaded = [(str(Path(ckpt).resolve()), st) for ckpt, st in payload]
        for got, want in zip(loaded, self._expected, strict=True):
            if got != want:
                self.close()
                raise DecoderError(f"the decoding process loaded {got[0]} (step {got[1]}), not the server's "
                                   f"{want[0]} (step {want[1]}): the run changed; restart the server")
        self._ended_children, self._child_stats = self.stats, (0, 0, 0)  # a new child counts from zero
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
                job_id, i, nbest, self._child_stats = payload
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
               kind: str = "join", guides: list[Guide | None] | None = None) -> int | None:
        """Hand ``texts`` to the child: ``on_done(i, nbest)`` for each as it is final, or ``on_error(exception)``
        once if the job fails (errors as the server's own would be: an input the model cannot take as
        ``InputError`` / ``PositionLimitError`` (422), an ended child ``DecoderError``, else ``RuntimeError``).
        ``guides``: each text's target prefix and constraints (``Guide``), or None. Returns the job's id, for
        ``cancel`` (None: no texts, nothing to do)."""
        if not texts:
            return None
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
                self._conn.send((kind, job_id, texts, decode, guides))
            except OSError:  # BrokenPipeError among them: the reader fails the job when it sees the end
                pass
        return job_id

    def cancel(self, job_id: int) -> None:
        """Drop a job handed to ``submit``: the child stops decoding it (module docstring), its ``on_error`` gets
        ``Cancelled`` and its callbacks are not called again. A job that is over is left alone."""
        with self._lock:
            job = self._jobs.pop(job_id, None)
            if job is None:
                return
            try:
                self._conn.send(("cancel", job_id, None, None, None))
            except OSError:  # the child has ended: nothing decodes the job any more
                pass
        job.on_error(Cancelled(f"job {job_id} was cancelled"))

    def translate(self, texts: list[str], decode: Any, on_done: OnDone | None = None,
                  guides: list[Guide | None] | None = None) -> list[list[Any]]:
        """The n-best lists of ``texts`` decoded as one batch, alone (as ``translate`` does, ``guides`` too),
        ``on_done(i, nbest)`` called for each as the child finishes it; raises the job's error (``submit``). An
        ``on_done`` that raises stops the batch (the child drops the rest at its next step) and ``translate`` raises
        that; so does ``cancel(self.translating)``, with ``Cancelled``."""
        results: list[Any] = [None] * len(texts)
        finished = threading.Event()
        failure: list[BaseException] = []
        left = [len(texts)]

        def done(i: int, nbest: Any) -> None:  # in the reader thread: whatever on_done raises stays here
            if failure:
                return
            results[i] = nbest
            if on_done is not None:
                try:
                    on_done(i, nbest)
                except Exception as err:  # noqa: BLE001 - the caller's way to stop the batch
                    error(err)
                    return
            left[0] -= 1
            if left[0] == 0:
                finished.set()

        def error(err: BaseException) -> None:
            failure.append(err)
            finished.set()

        job_id = self.translating = self.submit(texts, decode, done, error, kind="translate", guides=guides)
        try:
            if texts:
                finished.wait()
        finally:
            self.translating = None
        if failure:
            if job_id is not None:
                self.cancel(job_id)
            raise failure[0]
        return results

    def close(self) -> None:
        """Ask the child to end, close the pipe (the child returns at either, at its next decoder step) and wait for
        the child briefly."""
        with self._lock:
            try:
                # the pipe's end alone is not seen while the reader reads
                self._conn.send(("close", -1, None, None, None))
            except OSError:  # the child has ended
                pass
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
