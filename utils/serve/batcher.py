"""The server's decoding worker: one queue of requests in front of the model, batching, and abandoned work dropped.

Requests wait in a bounded queue (full: 503) for one worker, which hands them to the engine in one of two ways, each a
``Batcher``:

- ``StaticBatcher``: translation requests that wait together are decoded in one ``translate`` call per group of
  requests that decode alike (``decode_key``: every decoding setting, and whether they carry target prefixes and
  constraints), up to ``max_batch`` sentences;
- ``ContinuousBatcher`` (a PyTorch run's decoding process, ``utils/serve/worker.py``): each request is handed to the
  decoding in flight as soon as it fits under ``max_batch`` sentences, and joins it between two decoder steps
  (``utils/translation/continuous.py``).

Other work (attention maps) runs alone. The blocking calls run in one thread of their own, so the server's model is
only ever used by that thread, and the event loop keeps serving meanwhile.

A request whose client hung up is cancelled (``utils/serve/app.py`` watches each connection): its job leaves the
queue at once. Once every request of a static batch is answered or gone, the batch stops: in a PyTorch run's
decoding process at its next decoder step (``ProcessDecoder.cancel``), elsewhere at its next finished sentence (the
engine's ``on_done`` raises ``Abandoned``). With continuous batching the request leaves the decoding in flight at the
next decoder step (its batch stops once no other request is left in it). ``/health`` counts such requests
(``abandoned``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from utils.serve.limits import Limits, RequestError

if TYPE_CHECKING:
    from utils.config import DecodeConfig
    from utils.serve.engine import Served
    from utils.serve.worker import ProcessDecoder
    from utils.translation.translate import Guide, Translation


log = logging.getLogger("server")


class Abandoned(Exception):
    """Raised by a static batch's ``on_done`` once nobody waits for the rest of the batch: the engine stops."""


class Batcher(Protocol):
    """What the app asks of its decoding worker, whichever way it batches."""

    def start(self) -> None:
        """Start the worker (in the running event loop)."""

    async def stop(self) -> None:
        """Stop the worker; work in its thread is left to end."""

    @property
    def waiting(self) -> int:
        """Requests waiting for the worker now."""

    def snapshot(self) -> dict[str, Any]:
        """The counters now (``Counters``, ``busy_s`` with the call in progress up to now)."""

    async def translate(self, texts: list[str], decode: DecodeConfig, guides: list[Guide] | None = None,
                        details: bool = False) -> list[list[Translation]]:
        """The n-best lists of ``texts`` (``guides``: each one's target prefix and constraints, or None; ``details``:
        the engine gives each hypothesis its details), decoded with other requests that decode alike. Cancelling
        this (the client hung up) drops the request's work."""

    async def call(self, fn: Callable[[], Any]) -> Any:
        """``fn()`` in the decoding thread, between batches (anything else that uses the model); cancelled before it
        starts, it never runs."""


def batcher_for(engine: Served, limits: Limits) -> Batcher:
    """Continuous batching for an engine whose decoding process takes requests into the decoding in flight
    (``engine.continuous``), static batching otherwise."""
    if engine.continuous and engine.decoder is not None:
        return ContinuousBatcher(engine, engine.decoder, limits)
    return StaticBatcher(engine, limits)


def decode_key(decode: DecodeConfig, guides: list[Guide] | None, details: bool = False) -> tuple:
    """What makes two translation requests decode alike (one ``translate`` call): every decoding setting, whether
    they have target prefixes, whether they have constraints, and whether the engine is to give details."""
    prefixed = any(g.prefix for g in guides or [])
    constrained = any(g.constraints for g in guides or [])
    return (*sorted(decode.model_dump().items()), ("prefix", prefixed), ("constraints", constrained),
            ("details", details))


@dataclass(eq=False)
class _Job:
    """A request in the queue: its future, and the texts of a translation (none for a call)."""

    future: asyncio.Future
    texts: list[str] = field(default_factory=list)


@dataclass(eq=False)
class _Call(_Job):
    fn: Callable[[], Any] = lambda: None


@dataclass(eq=False)
class _Translation(_Job):
    decode: DecodeConfig | None = None
    guides: list[Guide] | None = None  # each text's target prefix and constraints, or None
    details: bool = False  # the engine gives each hypothesis its details (a CTranslate2 export's ``details``)
    answered: bool = False  # its n-best lists were handed over (counted once)
    parts: list[Any] = field(default_factory=list)  # continuous batching: the n-best lists received so far
    left: int = 0  # continuous batching: sentences not received yet
    handle: Any = None  # continuous batching: the decoding process's id of the job, to cancel it

    @property
    def key(self) -> tuple:
        assert self.decode is not None
        return decode_key(self.decode, self.guides, self.details)


@dataclass
class Counters:
    """What the worker has done (``GET /health``)."""

    requests: int = 0
    sentences: int = 0
    batches: int = 0  # calls to the engine's translate (continuous batching: batches started by the decoder)
    largest_batch: int = 0  # sentences in the largest of them (continuous batching: the most in flight at once)
    steps: int = 0  # continuous batching: decoder steps run
    step_sentences: int = 0  # continuous batching: over those steps, the sum of the sentences decoding
    busy_s: float = 0.0  # seconds the engine has spent in its calls (translations and attention maps), so far
    rejected: int = 0  # requests answered 503
    abandoned: int = 0  # requests whose client hung up before its answer: their work dropped or stopped


class _JobQueue(asyncio.Queue):
    """An ``asyncio.Queue`` of jobs from which a cancelled one can be taken out."""

    def discard(self, job: _Job) -> None:
        try:
            self._queue.remove(job)  # type: ignore[attr-defined] - asyncio.Queue keeps its items in a deque
        except ValueError:  # taken by the worker already
            pass


class _Worker(ABC):
    """What both ways of batching share: the bounded queue, the one decoding thread and its worker task, the
    counters, and calls (attention maps) run alone. A subclass takes each translation (``_take``)."""

    def __init__(self, engine: Served, limits: Limits) -> None:
        self.engine, self.limits = engine, limits
        self.counters = Counters()
        self._queue: _JobQueue = _JobQueue(self.limits.max_queue)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="decode")
        self._task: asyncio.Task | None = None
        self._held: _Job | None = None  # taken from the queue, to be taken next
        self._busy_since: float | None = None  # when the engine call in progress began

    def snapshot(self) -> dict[str, Any]:
        out = asdict(self.counters)
        if self._busy_since is not None:
            out["busy_s"] += time.perf_counter() - self._busy_since
        return out

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="decode-worker")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self._pool.shutdown(wait=False, cancel_futures=True)

    @property
    def waiting(self) -> int:
        return self._queue.qsize() + (self._held is not None)

    async def translate(self, texts: list[str], decode: DecodeConfig, guides: list[Guide] | None = None,
                        details: bool = False) -> list[list[Translation]]:
        future = asyncio.get_running_loop().create_future()
        return await self._submit(_Translation(future, texts, decode=decode, guides=guides, details=details))

    async def call(self, fn: Callable[[], Any]) -> Any:
        return await self._submit(_Call(asyncio.get_running_loop().create_future(), fn=fn))

    def _submit(self, job: _Job) -> asyncio.Future:
        try:
            self._queue.put_nowait(job)
        except asyncio.QueueFull:
            self.counters.rejected += 1
            raise RequestError(503, f"the server is busy ({self.limits.max_queue} requests waiting); "
                                    "try again shortly") from None
        job.future.add_done_callback(partial(self._gone, job))
        return job.future

    def _gone(self, job: _Job, future: asyncio.Future) -> None:
        """In the event loop, when a job's future is done: if it was cancelled (its client hung up), its work is
        dropped: out of the queue (here), out of the decoding in flight (``_dropped``)."""
        if not future.cancelled():
            return
        self.counters.abandoned += 1
        self._queue.discard(job)
        if isinstance(job, _Translation):
            self._dropped(job)

    @abstractmethod
    def _dropped(self, job: _Translation) -> None:
        """A translation whose client hung up, out of the queue: its work in flight stops (each way its own)."""

    async def _run(self) -> None:
        while True:
            job, self._held = (self._held, None) if self._held is not None else (await self._queue.get(), None)
            if job.future.done():  # its client went away while it waited
                continue
            try:
                if isinstance(job, _Call):
                    await self._call(job)
                else:
                    assert isinstance(job, _Translation)
                    await self._take(job)
            except Exception as err:  # a fault of the worker's own: that request fails (500), the worker goes on
                log.exception("the decoding worker failed on a request")
                if not job.future.done():
                    job.future.set_exception(err)

    @abstractmethod
    async def _take(self, job: _Translation) -> None:
        """Decode a translation request, each way of batching its own."""

    def _counts_calls(self) -> bool:
        """Whether a call's time is added to ``busy_s`` (continuous batching counts the time sentences are in
        flight, a call beside them not again)."""
        return True

    async def _call(self, job: _Call) -> None:
        """A call, alone in the decoding thread."""
        counted, began = self._counts_calls(), time.perf_counter()
        if counted:
            self._busy_since = began
        try:
            result = await asyncio.get_running_loop().run_in_executor(self._pool, job.fn)
        except Exception as err:  # noqa: BLE001 - the request fails, not the worker
            if not job.future.done():
                job.future.set_exception(err)
            return
        finally:
            if counted:
                self.counters.busy_s += time.perf_counter() - began
                self._busy_since = None
        if not job.future.done():
            job.future.set_result(result)

    def _answer(self, job: _Translation, nbest: list[Any]) -> None:
        """In the event loop: a translation job's n-best lists are all final."""
        if job.answered:
            return
        job.answered = True
        self.counters.requests += 1
        self.counters.sentences += len(job.texts)
        if not job.future.done():  # its client may have gone
            job.future.set_result(nbest)

    @staticmethod
    def _cancel(decoder: ProcessDecoder, handle: Any) -> None:
        """Tell the decoding process to drop a job (in a thread: its pipe is shared with ``submit``, under a lock)."""
        asyncio.get_running_loop().run_in_executor(None, decoder.cancel, handle)


class StaticBatcher(_Worker):
    """Static batching: the translation requests waiting together (up to ``max_batch`` sentences, after a wait of at
    most ``max_wait_ms``) decoded in one ``translate`` call per decoding setting."""

    def __init__(self, engine: Served, limits: Limits) -> None:
        super().__init__(engine, limits)
        self._executing: list[_Translation] | None = None  # the requests of the batch decoding now

    def _dropped(self, job: _Translation) -> None:
        group = self._executing
        if group is not None and job in group and all(j.future.done() for j in group):  # a batch nobody awaits
            decoder = self.engine.decoder
            if decoder is not None and decoder.translating is not None:  # a decoding process: stopped at its next step
                self._cancel(decoder, decoder.translating)

    async def _take(self, job: _Translation) -> None:
        """``job`` and the translation requests waiting behind it (up to ``max_batch`` sentences), decoded in one
        ``translate`` call per decoding setting."""
        jobs, size = [job], len(job.texts)
        waited = False
        while size < self.limits.max_batch:
            try:
                nxt = self._queue.get_nowait()
            except asyncio.QueueEmpty:
                if waited or self.limits.max_wait_ms <= 0:
                    break
                waited = True  # one short wait for requests sent at the same moment
                await asyncio.sleep(self.limits.max_wait_ms / 1000)
                continue
            if not isinstance(nxt, _Translation) or size + len(nxt.texts) > self.limits.max_batch:
                self._held = nxt  # the next batch starts with it
                break
            jobs.append(nxt)
            size += len(nxt.texts)
        groups: dict[tuple, list[_Translation]] = {}
        for j in jobs:
            if not j.future.done():  # clients that went away while waiting are left out
                groups.setdefault(j.key, []).append(j)
        for group in groups.values():
            if all(j.future.done() for j in group):  # gone while an earlier group decoded
                continue
            self.counters.batches += 1
            self.counters.largest_batch = max(self.counters.largest_batch, sum(len(j.texts) for j in group))
            await self._execute(group)

    def _translate(self, group: list[_Translation], on_done: Callable[[int, Any], None]) -> list[list[Translation]]:
        """In the decoding thread: the engine's ``translate`` of a group's texts (guides and details only when there
        are: an engine that takes none is never handed any; a decoding process takes guides itself)."""
        texts = [t for j in group for t in j.texts]
        extra: dict[str, Any] = {}
        if any(j.guides is not None for j in group):
            extra["guides"] = [g for j in group for g in (j.guides or [None] * len(j.texts))]
        if group[0].details:
            extra["details"] = True
        decoder, decode = self.engine.decoder, group[0].decode
        if "guides" in extra and decoder is not None:
            return decoder.translate(texts, decode, on_done, **extra)
        return self.engine.translate(texts, decode, on_done, **extra)

    async def _execute(self, group: list[_Translation]) -> None:
        """Decode a group in the decoding thread; hand each job its share of the result (or the error). The engine
        reports each sentence as it finishes it (``on_done``): a job is answered as soon as all of its sentences
        are, while the rest of the batch decodes (its client can send the next request meanwhile); once every job
        of the batch is answered or abandoned, ``on_done`` raises ``Abandoned`` and the engine stops."""
        loop = asyncio.get_running_loop()
        owner = [k for k, j in enumerate(group) for _ in j.texts]  # the job of each sentence of the batch
        first = [0, *itertools.accumulate(len(j.texts) for j in group)]
        parts: list[Any] = [None] * first[-1]
        left = [len(j.texts) for j in group]

        def on_done(i: int, nbest: Any) -> None:  # in the decoding thread
            if all(j.future.done() for j in group):  # nobody waits for the rest
                raise Abandoned
            parts[i] = nbest
            k = owner[i]
            left[k] -= 1
            if left[k] == 0:
                loop.call_soon_threadsafe(self._answer, group[k], parts[first[k]:first[k + 1]])

        began = self._busy_since = time.perf_counter()
        self._executing = group
        try:
            result = await loop.run_in_executor(self._pool, self._translate, group, on_done)
        except Exception as err:  # a failed decode fails the requests it held (those not answered yet), not the worker
            for j in group:
                if not j.future.done():
                    j.future.set_exception(err)
            return
        finally:
            self._executing = None
            self.counters.busy_s += time.perf_counter() - began
            self._busy_since = None
        for j, start in zip(group, first, strict=False):  # the engine reported every sentence; a job it did not
            if not j.answered:  # (none should) is answered here
                self._answer(j, result[start : start + len(j.texts)])


class ContinuousBatcher(_Worker):
    """Continuous batching: each translation request handed to the decoding process's decoding in flight once it
    fits under ``max_batch`` sentences; its n-best lists come back one by one from the process's reader thread."""

    def __init__(self, engine: Served, decoder: ProcessDecoder, limits: Limits) -> None:
        super().__init__(engine, limits)
        self.decoder = decoder
        self._in_flight = 0  # sentences handed to the decoder and not answered
        self._room = asyncio.Event()  # set when sentences in flight are answered, or a job waiting for room goes
        self._joining: _Translation | None = None  # taken from the queue, waiting for room

    def snapshot(self) -> dict[str, Any]:
        out = super().snapshot()
        out["batches"], out["steps"], out["step_sentences"] = self.decoder.stats
        return out

    @property
    def waiting(self) -> int:
        return super().waiting + (self._joining is not None)

    def _counts_calls(self) -> bool:
        return False

    def _dropped(self, job: _Translation) -> None:
        self._room.set()  # ``_take`` may be waiting for room for this very job
        if job.left:  # handed to the decoder, not all answered
            self._account(job.left)
            job.left = 0
            if job.handle is not None:
                self._cancel(self.decoder, job.handle)

    def _account(self, done: int) -> None:
        """``done`` sentences in flight are over (answered, failed or dropped)."""
        self._in_flight -= done
        if not self._in_flight and self._busy_since is not None:
            self.counters.busy_s += time.perf_counter() - self._busy_since
            self._busy_since = None
        self._room.set()

    async def _take(self, job: _Translation) -> None:
        """Hand ``job`` to the decoding in flight once it fits under ``max_batch`` sentences."""
        self._joining = job  # still waiting (/health)
        while (not job.future.done() and self._in_flight
               and self._in_flight + len(job.texts) > self.limits.max_batch):
            self._room.clear()
            await self._room.wait()
        self._joining = None
        if job.future.done():  # its client went away while it waited
            return
        loop = asyncio.get_running_loop()
        extra = {} if job.guides is None else {"guides": job.guides}  # a decoder that takes none is never handed any
        job.parts, job.left = [None] * len(job.texts), len(job.texts)
        if not self._in_flight:
            self._busy_since = time.perf_counter()
        self._in_flight += job.left
        self.counters.largest_batch = max(self.counters.largest_batch, self._in_flight)

        def on_done(i: int, nbest: Any) -> None:
            loop.call_soon_threadsafe(self._received, job, i, nbest)

        def on_error(err: BaseException) -> None:
            loop.call_soon_threadsafe(self._received, job, None, err)

        try:  # in the decoding thread: a decoding process that ended is started again there
            job.handle = await loop.run_in_executor(
                self._pool, partial(self.decoder.submit, job.texts, job.decode, on_done, on_error, **extra))
        except Exception as err:  # noqa: BLE001 - the request fails, not the worker
            self._received(job, None, err)
            return
        if job.future.cancelled() and job.handle is not None:  # its client left while it was handed over
            self._cancel(self.decoder, job.handle)

    def _received(self, job: _Translation, i: int | None, result: Any) -> None:
        """In the event loop: sentence ``i`` of a job is final (``result`` its n-best list), or the job failed (``i``
        None, ``result`` the exception)."""
        if job.left == 0:  # failed before, answered, or abandoned
            return
        done = job.left if i is None else 1
        job.left -= done
        self._account(done)
        if i is None:
            job.left = 0
            if not job.future.done():
                job.future.set_exception(result)
            return
        job.parts[i] = result
        if job.left == 0:
            self._answer(job, job.parts)
