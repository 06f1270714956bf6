"""Serve a trained run or a CTranslate2 export over HTTP: translations, attention maps and a demo page.

    python inference.py --serve --model_path runs/demo_latest [--host 127.0.0.1] [--port 8000]

Endpoints (JSON in and out; every error is ``{"error": "<one line>"}`` with a 4xx or 503 status):

- ``POST /translate`` ``{"text": "..." | ["...", ...], "beam": 5, "nbest": 1, "lenpen": 0.6}``: the n-best list
  of each line with its length-penalised score and summed log-probability, as ``inference.py`` gives them.
- ``POST /attention`` ``{"text": "...", "target": "..."?, "kind": "cross", "layer": -1}``: the tokens and the
  attention weights of one layer (head mean and each head) of the greedy translation, or of ``target``
  teacher-forced, computed as ``visualize.py`` does; a CTranslate2 export: the last layer's cross-attention,
  head mean only (``heads`` null).
- ``GET /model``: the run's encoding, size, tokenizer, training summary, where decoding runs, the attention
  ``/attention`` draws, decoding defaults and limits.
- ``GET /health``: ``{"status": "ok"}``, the batching counters and a PyTorch run's decoding process.
  ``GET /``: the demo page. ``GET /openapi.json``: the OpenAPI schema of all of these, with this server's limits and
  defaults (request and answer models in ``utils/serve/schema.py``; requests are still checked here, by hand, for
  their statuses and one-line errors); no Swagger UI (``/docs``), whose scripts come from a CDN.

One decoding worker owns the model: requests wait in a bounded queue (full: 503), and those that arrive
together are decoded together (micro-batching: up to ``max_batch`` sentences, after a wait of at most
``max_wait_ms`` for more), in one thread, so the event loop keeps serving slow or gone clients meanwhile.

No ``from __future__ import annotations`` here: FastAPI reads the endpoints' ``Request`` annotations at runtime.
"""

import asyncio
import itertools
import json
import logging
import math
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from fastapi import FastAPI

    from utils.config import Config, DecodeConfig
    from utils.translation.engines import Engine
    from utils.translation.translate import Translation

log = logging.getLogger("server")

PAGE = Path(__file__).resolve().parent / "static" / "index.html"
KINDS = ("cross", "encoder", "decoder")


@dataclass
class Limits:
    """What one request may ask for, and how requests are batched and queued."""

    max_lines: int = 64  # lines in one /translate request
    max_chars: int = 2000  # characters in one line
    max_beam: int = 32
    max_batch: int = 64  # sentences decoded together
    max_wait_ms: float = 2.0  # how long the worker waits for more requests to join a batch
    max_queue: int = 256  # requests waiting for the worker; one more is answered 503

    HELP: ClassVar[dict[str, str]] = {
        "max_lines": "most lines in one /translate request", "max_chars": "most characters in one line",
        "max_beam": "largest beam a request may ask for", "max_batch": "most sentences decoded together",
        "max_wait_ms": "milliseconds the worker waits for more requests to join a batch",
        "max_queue": "requests that may wait for the worker; more are answered 503"}

    def check(self) -> None:
        """ValueError, one line, for a limit that cannot work."""
        for name in ("max_lines", "max_chars", "max_beam", "max_batch", "max_queue"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.max_wait_ms <= 1000:
            raise ValueError(f"--max-wait-ms must be in 0..1000, got {self.max_wait_ms}")

    @property
    def max_body(self) -> int:
        """Bytes a request body may have: every line at its limit, JSON-escaped, and room for the options."""
        return 6 * self.max_lines * self.max_chars + 4096


class RequestError(Exception):
    """A request the server refuses: an HTTP status and one readable line."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


# ---------------------------------------------------------------------------------------------- the worker


@dataclass
class _Job:
    future: asyncio.Future
    texts: list[str]
    key: tuple[int, int, float] | None = None  # (beam, nbest, lenpen) of a translation; None: ``call``
    call: Callable[[], Any] | None = None
    answered: bool = False  # a translation's n-best lists were handed over (counted once)
    parts: list[Any] | None = None  # continuous batching: the n-best lists received so far
    left: int = 0  # continuous batching: sentences not received yet


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


class Batcher:
    """One decoding worker fed by a bounded queue. Static batching: translation requests that wait together are
    decoded in one ``translate`` call (grouped by beam, n-best and length penalty). Continuous batching (an engine
    with ``continuous`` set: a PyTorch run's decoding process): each request is handed to the decoding in flight
    (``engine.submit``) as soon as it fits under ``max_batch`` sentences, and joins it between two decoder steps
    (``utils/translation/continuous.py``). Other work (attention maps) runs alone. The blocking calls run in one
    thread of their own, so the server's model is only ever used by that thread."""

    def __init__(self, engine: "Engine", limits: Limits) -> None:
        self.engine, self.limits = engine, limits
        self.continuous = bool(getattr(engine, "continuous", False))
        self._in_flight = 0  # continuous batching: sentences handed to the decoder and not answered
        self._room = asyncio.Event()  # set when sentences in flight are answered
        self.counters = Counters()
        self._queue: asyncio.Queue[_Job] = asyncio.Queue(limits.max_queue)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="decode")
        self._task: asyncio.Task | None = None
        self._held: _Job | None = None
        self._joining: _Job | None = None  # continuous batching: taken from the queue, waiting for room
        self._busy_since: float | None = None  # when the engine call in progress began

    def snapshot(self) -> dict[str, Any]:
        """The counters now, ``busy_s`` with the call in progress up to now (its requests may be answered already)."""
        out = asdict(self.counters)
        if self._busy_since is not None:
            out["busy_s"] += time.perf_counter() - self._busy_since
        if self.continuous:
            out["batches"], out["steps"], out["step_sentences"] = self.engine.stats  # type: ignore[attr-defined]
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
        return self._queue.qsize() + (self._held is not None) + (self._joining is not None)

    def _submit(self, job: _Job) -> asyncio.Future:
        try:
            self._queue.put_nowait(job)
        except asyncio.QueueFull:
            self.counters.rejected += 1
            raise RequestError(503, f"the server is busy ({self.limits.max_queue} requests waiting); "
                                    "try again shortly") from None
        return job.future

    async def translate(self, texts: list[str], decode: "DecodeConfig") -> list[list["Translation"]]:
        """The n-best lists of ``texts``, decoded with whatever other requests wait at the same time."""
        future = asyncio.get_running_loop().create_future()
        return await self._submit(_Job(future, texts, key=(decode.beam, decode.nbest, decode.lenpen)))

    async def call(self, fn: Callable[[], Any]) -> Any:
        """``fn()`` in the decoding thread, between batches (anything else that uses the model)."""
        return await self._submit(_Job(asyncio.get_running_loop().create_future(), [], call=fn))

    async def _run(self) -> None:
        while True:
            job, self._held = (self._held, None) if self._held is not None else (await self._queue.get(), None)
            if job.call is not None:
                if not job.future.done():
                    await self._execute([job], lambda job=job: job.call())
                continue
            if self.continuous:
                await self._join(job)
                continue
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
                if nxt.call is not None or size + len(nxt.texts) > self.limits.max_batch:
                    self._held = nxt  # the next batch starts with it
                    break
                jobs.append(nxt)
                size += len(nxt.texts)
            jobs = [j for j in jobs if not j.future.done()]  # clients that went away while waiting
            groups: dict[tuple[int, int, float], list[_Job]] = {}
            for j in jobs:
                groups.setdefault(j.key, []).append(j)  # type: ignore[arg-type]
            for (beam, nbest, lenpen), group in groups.items():
                decode = self.engine.cfg.decode.model_copy(update=dict(beam=beam, nbest=nbest, lenpen=lenpen))
                texts = [t for j in group for t in j.texts]
                self.counters.batches += 1
                self.counters.largest_batch = max(self.counters.largest_batch, len(texts))
                await self._execute(group, lambda on_done, texts=texts, decode=decode:
                                    self.engine.translate(texts, decode, on_done))

    async def _join(self, job: _Job) -> None:
        """Continuous batching: hand ``job`` to the decoding in flight once it fits under ``max_batch`` sentences; its
        n-best lists come back one by one (``_received``) from the decoder's reader thread."""
        self._joining = job  # still waiting (/health)
        while self._in_flight and self._in_flight + len(job.texts) > self.limits.max_batch:
            self._room.clear()
            await self._room.wait()
        self._joining = None
        if job.future.done():  # its client went away while it waited
            return
        loop = asyncio.get_running_loop()
        beam, nbest, lenpen = job.key  # type: ignore[misc]
        decode = self.engine.cfg.decode.model_copy(update=dict(beam=beam, nbest=nbest, lenpen=lenpen))
        job.parts, job.left = [None] * len(job.texts), len(job.texts)
        if not self._in_flight:
            self._busy_since = time.perf_counter()
        self._in_flight += job.left
        self.counters.largest_batch = max(self.counters.largest_batch, self._in_flight)

        def submit() -> None:  # in the decoding thread: a decoding process that ended is started again there
            self.engine.submit(job.texts, decode,  # type: ignore[attr-defined]
                               lambda i, nbest: loop.call_soon_threadsafe(self._received, job, i, nbest),
                               lambda err: loop.call_soon_threadsafe(self._received, job, None, err))
        try:
            await loop.run_in_executor(self._pool, submit)
        except Exception as err:  # noqa: BLE001 - the request fails, not the worker
            self._received(job, None, err)

    def _received(self, job: _Job, i: int | None, result: Any) -> None:
        """In the event loop: sentence ``i`` of a continuously batched job is final (``result`` its n-best list), or
        the job failed (``i`` None, ``result`` the exception)."""
        if job.left == 0:  # failed before, or answered
            return
        done = job.left if i is None else 1
        job.left -= done
        self._in_flight -= done
        if not self._in_flight and self._busy_since is not None:
            self.counters.busy_s += time.perf_counter() - self._busy_since
            self._busy_since = None
        self._room.set()
        if i is None:
            job.left = 0
            if not job.future.done():
                job.future.set_exception(result)
            return
        job.parts[i] = result  # type: ignore[index]
        if job.left == 0:
            self._answer(job, job.parts)  # type: ignore[arg-type]

    async def _execute(self, group: list[_Job], fn: Callable[..., Any]) -> None:
        """Run ``fn`` in the decoding thread; hand each job its share of the result (or the error). A translation's
        ``fn(on_done)`` reports each sentence as the engine finishes it: a job is answered as soon as all of its
        sentences are, while the rest of the batch decodes (its client can send the next request meanwhile)."""
        loop = asyncio.get_running_loop()
        began = time.perf_counter()
        # Continuous batching counts the time sentences are in flight (_join); a call beside them is not added again.
        counted = not self.continuous
        if counted:
            self._busy_since = began
        if group[0].call is not None:
            call = fn
        else:
            owner = [k for k, j in enumerate(group) for _ in j.texts]  # the job of each sentence of the batch
            first = [0, *itertools.accumulate(len(j.texts) for j in group)]
            parts: list[Any] = [None] * first[-1]
            left = [len(j.texts) for j in group]

            def on_done(i: int, nbest: Any) -> None:  # in the decoding thread
                parts[i] = nbest
                k = owner[i]
                left[k] -= 1
                if left[k] == 0:
                    loop.call_soon_threadsafe(self._answer, group[k], parts[first[k]:first[k + 1]])

            def call() -> Any:
                return fn(on_done)
        try:
            result = await loop.run_in_executor(self._pool, call)
        except Exception as err:  # a failed decode fails the requests it held (those not answered yet), not the worker
            for j in group:
                if not j.future.done():
                    j.future.set_exception(err)
            return
        finally:
            if counted:
                self.counters.busy_s += time.perf_counter() - began
                self._busy_since = None
        if group[0].call is not None:
            if not group[0].future.done():
                group[0].future.set_result(result)
            return
        start = 0
        for j in group:  # the engine reported every sentence; a job it did not (none should) is answered here
            if not j.answered:
                self._answer(j, result[start : start + len(j.texts)])
            start += len(j.texts)

    def _answer(self, job: _Job, nbest: list[Any]) -> None:
        """In the event loop: a translation job's n-best lists are all final."""
        if job.answered:
            return
        job.answered = True
        self.counters.requests += 1
        self.counters.sentences += len(job.texts)
        if not job.future.done():  # its client may have gone
            job.future.set_result(nbest)


# ---------------------------------------------------------------------------------------------- requests


class HugeNumber(float):
    """A JSON integer of more than ``HugeNumber.DIGITS`` digits, as ``parse_json`` gives it: never converted (a number
    of 5,000 digits is past ``int()``'s limit, one of 400 too big for a float), it is a float of the right sign
    (+-inf) that remembers how many digits it had, so that an answer names its size instead of echoing it."""

    DIGITS = 20  # no field takes a number this long

    digits: int

    def __new__(cls, digits: int, negative: bool) -> "HugeNumber":
        number = super().__new__(cls, -math.inf if negative else math.inf)
        number.digits = digits
        return number


def _parse_int(s: str) -> int | HugeNumber:
    digits = len(s.lstrip("-"))
    return int(s) if digits <= HugeNumber.DIGITS else HugeNumber(digits, s.startswith("-"))


def parse_json(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object; RequestError (400/422) naming what is wrong."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RequestError(400, f"the request body is not valid UTF-8 (byte {e.start}); send UTF-8 JSON") from None
    if not text.strip():
        raise RequestError(400, 'the request body is empty; send JSON such as {"text": "Bonjour."}')
    try:
        body = json.loads(text, parse_int=_parse_int)
    except json.JSONDecodeError as e:
        raise RequestError(400, f"invalid JSON: {e.msg} (line {e.lineno}, column {e.colno})") from None
    except RecursionError:
        raise RequestError(400, "invalid JSON: nested too deeply") from None
    except ValueError as e:  # anything else the decoder cannot take: one line, never echoed at length
        raise RequestError(400, f"invalid JSON: {str(e).splitlines()[0][:200] if str(e) else type(e).__name__}") \
            from None
    if not isinstance(body, dict):
        raise RequestError(422, f'the body must be a JSON object such as {{"text": "Bonjour."}}, '
                                f"not {_json_type(body)}")
    return body


def _json_type(value: Any) -> str:
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "an array",
             dict: "an object", type(None): "null", HugeNumber: "a number"}
    return names.get(type(value), type(value).__name__)


def check_fields(body: dict[str, Any], allowed: tuple[str, ...]) -> None:
    unknown = [k for k in body if k not in allowed]
    if unknown:
        raise RequestError(422, f"unknown field {unknown[0]!r} (fields: {', '.join(allowed)})")


def int_field(body: dict[str, Any], name: str, default: int, low: int, high: int) -> int:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, HugeNumber):
        raise RequestError(422, f"{name} must be between {low} and {high}, got a number with {value.digits} digits")
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(422, f"{name} must be an integer, not {_json_type(value)}")
    if not low <= value <= high:
        raise RequestError(422, f"{name} must be between {low} and {high}, got {value}")
    return value


def float_field(body: dict[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, HugeNumber):
        raise RequestError(422, f"{name} must be between {low} and {high}, got a number with {value.digits} digits")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RequestError(422, f"{name} must be a number, not {_json_type(value)}")
    if not math.isfinite(value) or not low <= value <= high:  # NaN, Infinity or a float past 1.8e308 (1e400): inf
        raise RequestError(422, f"{name} must be between {low} and {high}, got {value}")
    return float(value)


def check_text(text: Any, name: str, limits: Limits) -> str:
    """One source line: a non-empty string of valid Unicode within ``max_chars``."""
    if not isinstance(text, str):
        raise RequestError(422, f"{name} must be a string, not {_json_type(text)}")
    if not text.strip():
        raise RequestError(422, f"{name} is empty: give a sentence to translate")
    if len(text) > limits.max_chars:
        raise RequestError(413, f"{name} has {len(text)} characters, over the limit of {limits.max_chars} "
                                "(--max-chars)")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise RequestError(400, f"{name} is not valid Unicode (a lone surrogate at character {e.start})") from None
    if "\x00" in text:
        raise RequestError(400, f"{name} holds a NUL character")
    return text


def translate_request(body: dict[str, Any], decode: "DecodeConfig",
                      limits: Limits) -> tuple[list[str], bool, "DecodeConfig"]:
    """-> (lines, whether one string was sent, the decoding settings of this request)."""
    check_fields(body, ("text", "beam", "nbest", "lenpen"))
    if "text" not in body:
        raise RequestError(422, 'missing field "text": a sentence or a list of sentences')
    text = body["text"]
    single = isinstance(text, str)
    if single:
        lines = [check_text(text, "text", limits)]
    elif isinstance(text, list):
        if not text:
            raise RequestError(422, "text is an empty list: give at least one sentence")
        if len(text) > limits.max_lines:
            raise RequestError(413, f"{len(text)} lines in one request, over the limit of {limits.max_lines} "
                                    "(--max-lines)")
        lines = [check_text(t, f"text[{i}]", limits) for i, t in enumerate(text)]
    else:
        raise RequestError(422, f"text must be a string or a list of strings, not {_json_type(text)}")
    beam = int_field(body, "beam", decode.beam, 1, limits.max_beam)
    nbest = int_field(body, "nbest", min(decode.nbest, beam), 1, limits.max_beam)
    if nbest > beam:
        raise RequestError(422, f"nbest ({nbest}) cannot exceed beam ({beam})")
    lenpen = float_field(body, "lenpen", decode.lenpen, 0.0, 10.0)
    return lines, single, decode.model_copy(update=dict(beam=beam, nbest=nbest, lenpen=lenpen))


def hypotheses(nbest: list["Translation"]) -> list[dict[str, Any]]:
    return [{"text": h.text, "score": h.score, "logprob": h.logprob} for h in nbest]


# ---------------------------------------------------------------------------------------------- attention


def attention_layers(engine: "Engine") -> dict[str, list[int]]:
    """The attention an engine can draw, kind -> layers: every kind and layer of a PyTorch run; an export's
    CTranslate2 gives the last decoder layer's cross-attention (exports made before that gives nothing)."""
    run = getattr(engine, "run", None)
    if run is None:
        return dict(getattr(engine, "attention_layers", {}))
    m = run.cfg.model
    return {kind: list(range(m.encoder_layers if kind == "encoder" else m.decoder_layers)) for kind in KINDS}


def attention_request(body: dict[str, Any], cfg: "Config", available: dict[str, list[int]],
                      limits: Limits) -> tuple[str, str | None, str, int]:
    """-> (source, target or None for the greedy translation, kind, layer); ``available``: ``attention_layers``."""
    check_fields(body, ("text", "target", "kind", "layer"))
    if "text" not in body:
        raise RequestError(422, 'missing field "text": the sentence whose attention is drawn')
    text = check_text(body["text"], "text", limits)
    target = body.get("target")
    if target is not None:
        target = check_text(target, "target", limits)
    kind = body.get("kind", "cross")
    if kind not in KINDS:
        raise RequestError(422, f"kind must be one of {', '.join(KINDS)}, got {json.dumps(kind)}")
    n = cfg.model.encoder_layers if kind == "encoder" else cfg.model.decoder_layers
    layer = int_field(body, "layer", -1, -(2**31), 2**31)
    if not -n <= layer < n:
        side = "encoder" if kind == "encoder" else "decoder"
        raise RequestError(422, f"layer {layer}: the {side} has {n} layers (0..{n - 1}, or -1 for the last)")
    if layer % n not in available.get(kind, []):
        what = ", ".join(f"{k} layer {' '.join(map(str, v))}" for k, v in available.items())
        raise RequestError(422, f"this CTranslate2 export gives only {what} (mean over heads): serve the run "
                                f"directory for {kind} layer {layer % n}")
    return text, target, kind, layer % n


def attention_map(engine: "Engine", text: str, target: str | None, kind: str, layer: int) -> dict[str, Any]:
    """One layer's attention for a sentence, as visualize.py computes it: head mean and every head (a CTranslate2
    export: the head mean only, ``heads`` null), rounded to 1e-5; cross-attention rows are the target tokens
    being predicted, as in visualize.py's figures."""
    from utils.figures.maps import BOS_LABEL, attention_from_ids, encode_pair, predicted_labels

    run = getattr(engine, "run", None)
    if run is None:  # a CTranslate2 export: cross-attention of the last layer, mean over heads
        src_ids, tgt_ids, target_text, mean = engine.cross_attention(text, target, engine.cfg.decode)
        src_tokens = engine.tokenizer.id_to_token(src_ids)
        tgt_tokens, heads = [BOS_LABEL, *engine.tokenizer.id_to_token(tgt_ids)], None
    else:
        src_ids, tgt_ids, target_text = encode_pair(run.model, run.tokenizer, text, target, run.cfg.decode)
        src_tokens, tgt_tokens, attention = attention_from_ids(run.model, run.tokenizer, src_ids, tgt_ids)
        heads = getattr(attention, kind)[layer][0]  # [H, Tq, Tk]
        mean = heads.mean(0)
    rows = {"cross": predicted_labels(tgt_tokens), "encoder": src_tokens, "decoder": tgt_tokens}[kind]
    columns = src_tokens if kind in ("cross", "encoder") else tgt_tokens
    rounded = lambda t: [[round(float(x), 5) for x in row] for row in t.tolist()]
    return {"source": text, "target": target_text, "mode": "greedy" if target is None else "teacher-forced",
            "kind": kind, "layer": layer, "rows": rows, "columns": columns, "weights": rounded(mean),
            "heads": None if heads is None else [rounded(h) for h in heads]}


# ---------------------------------------------------------------------------------------------- the model


def encoding_name(cfg: "Config") -> str:
    """``sinusoidal``, ``rope (ntk x4)``, ``sinusoidal + alibi``, ``none (no positions)``..."""
    return cfg.model.describe_encodings()


def training_summary(run_dir: Path | None, checkpoint: Path | str | None, step: int | None) -> dict[str, Any]:
    """The checkpoint and its step; from the run's ``last.pt`` the best validation BLEU (PyTorch runs); from its
    ``summary.json`` (else ``train.log``) the closing summary, and from the log the last validation line."""
    out: dict[str, Any] = {"run": str(run_dir) if run_dir else None,
                           "checkpoint": str(checkpoint) if checkpoint else None, "step": step}
    if run_dir is None:
        return out
    from utils.run.layout import RunDir

    rd = RunDir(run_dir)
    if step is not None and rd.last.is_file():
        from utils.run.checkpoint import CheckpointError, load_checkpoint

        try:
            saved = load_checkpoint(rd.last).get("best_checkpoint", {})
            out["best_valid_bleu"] = round(float(saved["_saved"][0][0]), 2)
        except (CheckpointError, KeyError, IndexError, TypeError, ValueError):
            pass
    try:
        out["summary"] = rd.summary()
    except (ValueError, OSError):  # still training, or stopped before its closing line
        pass
    if rd.log.is_file():
        text = rd.log.read_text(encoding="utf-8", errors="replace")
        valid = [line for line in text.splitlines() if "| valid loss " in line]
        if valid:
            out["last_validation"] = valid[-1].split(" | ", 1)[-1].split(" | ")[0].strip()
    return out


def model_info(engine: "Engine", model_path: str, limits: Limits) -> dict[str, Any]:
    """What ``GET /model`` answers: the run's encoding, size, tokenizer, training summary, defaults and limits."""
    cfg = engine.cfg
    m = cfg.model
    run = getattr(engine, "run", None)
    decoder = getattr(engine, "decoder", None)
    if run is not None:  # a PyTorch run
        kind, params = "pytorch", sum(p.numel() for p in run.model.parameters())
        training = training_summary(run.run_dir, run.checkpoint, run.step)
        vocab = run.tokenizer.vocab_size
    else:  # a CTranslate2 export: its marker says which run and checkpoint it came from
        from utils.translation.export import MARKER

        marker_file = Path(model_path) / MARKER
        marker = json.loads(marker_file.read_text()) if marker_file.is_file() else {}
        run_dir = Path(marker["run"]) if marker.get("run") else None
        kind, params = "ctranslate2", None
        training = training_summary(run_dir if run_dir and run_dir.is_dir() else None, marker.get("checkpoint"),
                                    None)
        training["quantization"] = marker.get("quantization")
        vocab = getattr(getattr(engine, "tokenizer", None), "vocab_size", None)
    decode = cfg.decode
    return {
        "name": cfg.name, "engine": kind, "model_path": str(model_path),
        "decoding": "own process" if decoder is not None else "server process",
        "batching": "continuous" if getattr(engine, "continuous", False) else "static",
        "attention": attention_layers(engine) or None,
        "encoding": {"name": encoding_name(cfg), "input_pe": m.input_pe, "attention_pe": m.attention_pe,
                     "cross_attention_pe": m.cross_attention_pe, "places": m.encodings()},
        "size": {"parameters": params, "d_model": m.d_model, "n_heads": m.n_heads, "d_ff": m.d_ff,
                 "encoder_layers": m.encoder_layers, "decoder_layers": m.decoder_layers, "norm": m.norm},
        "tokenizer": {"type": cfg.tokenizer.type, "vocab_size": vocab, "lowercase": cfg.tokenizer.lowercase},
        "training": training,
        "decode": {"beam": decode.beam, "nbest": decode.nbest, "lenpen": decode.lenpen,
                   "max_len_a": decode.max_len_a, "max_len_b": decode.max_len_b, "beam_stop": decode.beam_stop},
        "limits": asdict(limits),
    }


# ---------------------------------------------------------------------------------------------- the app


def responses(answer: Any, description: str, errors: dict[int, str | None]) -> dict[int | str, dict[str, Any]]:
    """The ``responses`` of an endpoint for its OpenAPI schema: ``answer`` (a model, or a media type string) on 200,
    and each error status with its meaning here (None: the general one, ``schema.ERRORS``)."""
    from utils.serve.schema import ERRORS, ErrorAnswer

    ok: dict[str, Any] = ({"content": {answer: {"schema": {"type": "string"}}}} if isinstance(answer, str)
                          else {"model": answer})
    out: dict[int | str, dict[str, Any]] = {200: {**ok, "description": description}}
    for status, meaning in errors.items():
        out[status] = {"model": ErrorAnswer, "description": meaning or ERRORS[status]}
    return out


API_DESCRIPTION = """\
Translations, attention maps and a description of the model served by `python inference.py --serve`. JSON in and \
out; every refusal is `{"error": "one line"}` with a 4xx or 5xx status. Limits and defaults in this schema are the \
server's own (its `--max-*` and decoding flags)."""


def create_app(engine: "Engine", limits: Limits | None = None, model_path: str = "") -> "FastAPI":
    """The FastAPI application serving ``engine`` (one decoding worker, started with the app). Its OpenAPI schema
    (``app.openapi()``, served at ``GET /openapi.json``) describes every endpoint with this server's limits and
    decoding defaults; there is no Swagger UI (``/docs``), whose scripts come from a CDN."""
    from fastapi import FastAPI, Request
    from fastapi.openapi.utils import get_openapi
    from fastapi.responses import HTMLResponse, JSONResponse
    from fastapi.routing import APIRoute
    from starlette.exceptions import HTTPException
    from starlette.requests import ClientDisconnect

    from models.positional import PositionLimitError
    from utils.serve import schema
    from utils.serve.worker import DecoderError
    from utils.translation.translate import InputError

    limits = limits or Limits()
    limits.check()
    info = model_info(engine, model_path, limits)
    state: dict[str, Batcher] = {}
    requests = schema.request_models(limits, engine.cfg.decode)

    @asynccontextmanager
    async def lifespan(app: FastAPI):  # noqa: ANN202
        state["batcher"] = Batcher(engine, limits)
        state["batcher"].start()
        yield
        await state["batcher"].stop()

    app = FastAPI(title="fr2en-pe translation server", description=API_DESCRIPTION, version=_version(),
                  lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url="/openapi.json")

    def openapi() -> dict[str, Any]:
        """FastAPI's schema, with the request bodies the endpoints read by hand (``schema.request_models``)."""
        if app.openapi_schema is None:
            out = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            for model in requests:
                out.setdefault("components", {}).setdefault("schemas", {})[model.__name__] = model.model_json_schema(
                    ref_template="#/components/schemas/{model}")
            app.openapi_schema = out
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    def body(model: Any) -> dict[str, Any]:
        return {"requestBody": {"required": True, "content": {"application/json": {
            "schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}}

    def endpoints() -> str:
        routes = [(m, r.path) for r in app.routes if isinstance(r, APIRoute) for m in sorted(r.methods)]
        return ", ".join(f"{m} {p}" for m, p in [*routes, ("GET", app.openapi_url)])

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": message}, status_code=status)

    @app.exception_handler(RequestError)
    async def _refused(request: Request, err: RequestError) -> JSONResponse:
        return error(err.status, err.message)

    @app.exception_handler(InputError)
    @app.exception_handler(PositionLimitError)
    async def _input(request: Request, err: Exception) -> JSONResponse:  # a sentence the model cannot take
        return error(422, str(err).strip().splitlines()[0])

    @app.exception_handler(HTTPException)
    async def _http(request: Request, err: HTTPException) -> JSONResponse:
        if err.status_code == 404:
            return error(404, f"no such endpoint: {request.method} {request.url.path} (endpoints: {endpoints()})")
        if err.status_code == 405:
            return error(405, f"{request.url.path} does not take {request.method}")
        return error(err.status_code, str(err.detail))

    @app.exception_handler(DecoderError)
    async def _decoder(request: Request, err: DecoderError) -> JSONResponse:  # its process failed or ended
        log.warning("request %s %s: %s", request.method, request.url.path, err)
        return error(503, f"{err}; try again")

    @app.exception_handler(Exception)
    async def _failed(request: Request, err: Exception) -> JSONResponse:
        log.exception("request %s %s failed", request.method, request.url.path)
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return error(500, f"internal error: {first}")

    async def read_body(request: Request) -> dict[str, Any]:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limits.max_body:
            raise RequestError(413, f"the request body has {declared} bytes, over the limit of {limits.max_body}")
        chunks, size = [], 0
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > limits.max_body:
                    raise RequestError(413, f"the request body is over the limit of {limits.max_body} bytes")
                chunks.append(chunk)
        except ClientDisconnect:  # nobody is left to answer: no traceback in the log either
            raise RequestError(400, "the client disconnected before its request was complete") from None
        return parse_json(b"".join(chunks))

    @app.get("/", response_class=HTMLResponse, summary="The demo page",
             responses=responses("text/html", "one HTML page, its script and style inline (no external assets: it "
                                              "works offline)", {}))
    async def page() -> HTMLResponse:
        """A text box, the n-best list with scores, and the attention map of the best translation (any kind and
        layer), drawn with the tokens on its axes; the run's encoding named at the top."""
        return HTMLResponse(PAGE.read_text(encoding="utf-8"))

    @app.get("/health", response_model=None, summary="Whether the server is up, and what it has done",
             responses=responses(schema.HealthAnswer, "the batching counters since the server started", {405: None}))
    async def health() -> dict[str, Any]:
        """`status` ok, the requests and sentences decoded, how they were batched, how busy the model was, the
        requests waiting and those refused; a PyTorch run's decoding process."""
        batcher = state["batcher"]
        decoder = getattr(engine, "decoder", None)
        process = {} if decoder is None else {"decoder": {"pid": decoder.pid, "restarts": decoder.restarts}}
        return {"status": "ok", "engine": info["engine"], "waiting": batcher.waiting, **batcher.snapshot(),
                **process}

    @app.get("/model", response_model=None, summary="The model served",
             responses=responses(schema.ModelAnswer, "what the server loaded and how it decodes", {405: None}))
    async def model() -> dict[str, Any]:
        """The run's name, engine, where decoding runs and how requests are batched, the attention `/attention`
        draws, the positional encodings, size, tokenizer, training summary, decoding defaults and limits."""
        return info

    @app.post("/translate", response_model=None, summary="Translate one sentence or a list", openapi_extra=body(
        requests[0]), responses=responses(schema.TranslateAnswer, "the n-best list of each line", {
            400: None, 405: None,
            413: "more lines than `--max-lines`, a line longer than `--max-chars`, or a body over what those allow",
            422: "the body is not a JSON object; a field is unknown, missing or of the wrong type; a blank line or "
                 "an empty list; `beam`, `nbest` or `lenpen` out of range, or `nbest` over `beam`; a sentence longer "
                 "than the model's positions allow",
            500: None, 503: None}))
    async def translate(request: Request) -> dict[str, Any]:
        """Per line the best translation and its n-best list, with each hypothesis' length-penalised score and
        summed log-probability: the same texts and scores as `inference.py --input` with the same flags. Requests
        that arrive together are decoded together."""
        lines, single, decode = translate_request(await read_body(request), engine.cfg.decode, limits)
        start = time.perf_counter()
        results = await state["batcher"].translate(lines, decode)
        out = [{"source": src, "translation": nbest[0].text, "nbest": hypotheses(nbest)}
               for src, nbest in zip(lines, results, strict=True)]
        return {"translations": out, "beam": decode.beam, "nbest": decode.nbest, "lenpen": decode.lenpen,
                "seconds": round(time.perf_counter() - start, 4)}

    @app.post("/attention", response_model=None, summary="One layer's attention for a sentence", openapi_extra=body(
        requests[1]), responses=responses(schema.AttentionAnswer, "the tokens and the attention weights", {
            400: None, 405: None,
            413: "`text` or `target` longer than `--max-chars`, or a body over the limit",
            422: "the body is not a JSON object; a field is unknown, missing, of the wrong type or blank; a `kind` "
                 "other than cross, encoder, decoder; a layer the model does not have, or one a CTranslate2 export "
                 "does not give",
            500: None, 501: None, 503: None}))
    async def attention(request: Request) -> dict[str, Any]:
        """The attention weights of one layer (mean over heads, and each head) for the greedy translation of
        `text`, or for `target` teacher-forced, computed as `visualize.py` does. A CTranslate2 export gives what
        CTranslate2 returns: the last layer's cross-attention, mean over heads (`heads` null)."""
        body = await read_body(request)
        if not info["attention"]:
            raise RequestError(501, "this CTranslate2 export was made before exports kept attention: export the run "
                                    "again (inference.py --export-ctranslate2), or serve the run directory")
        text, target, kind, layer = attention_request(body, engine.cfg, info["attention"], limits)
        return await state["batcher"].call(lambda: attention_map(engine, text, target, kind, layer))

    return app


def _version() -> str:
    """The installed project's version, else 0+unknown (a checkout that was not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fr2en-pe")
    except PackageNotFoundError:
        return "0+unknown"


class NoModel:
    """A stand-in engine without a model, to build the app for its OpenAPI schema (the documentation) without a
    checkpoint: the default config's decoding defaults; a translation is refused (503)."""

    def __init__(self) -> None:
        from utils.config import Config

        self.cfg = Config()

    def translate(self, texts: list[str], decode: "DecodeConfig", on_done: Any = None) -> list[list["Translation"]]:
        raise RequestError(503, "no model is loaded: this app was built for its schema only")


def openapi_schema(limits: Limits | None = None) -> dict[str, Any]:
    """The server's OpenAPI schema (what ``GET /openapi.json`` answers), built without a model: ``limits`` (default:
    the default flags') and the default config's decoding defaults."""
    return create_app(NoModel(), limits).openapi()


def bind(host: str = "127.0.0.1", port: int = 8000) -> socket.socket:
    """A socket bound to ``host:port`` (port 0: any free one); OSError, one line, if it cannot be."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as e:
        raise OSError(e.errno, f"cannot listen on {host}:{port} ({e.strerror})") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        raise OSError(e.errno, f"cannot listen on {host}:{port} ({e.strerror})") from None
    return sock


def serve(engine: "Engine", model_path: str, sock: socket.socket, limits: Limits | None = None) -> None:
    """Serve ``engine`` on the bound ``sock`` until Ctrl-C or SIGTERM; once the server accepts connections it
    prints ``serving ... on http://HOST:PORT`` (the real port when 0 was asked for)."""
    import uvicorn

    app = create_app(engine, limits, model_path)
    what = "PyTorch" if getattr(engine, "run", None) is not None else "CTranslate2"
    bound_host, bound_port = sock.getsockname()[:2]
    url = f"http://{f'[{bound_host}]' if ':' in bound_host else bound_host}:{bound_port}"

    class Announcing(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            print(f"serving {model_path} ({what}) on {url} (Ctrl-C to stop)", flush=True)

    config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_keep_alive=5)
    Announcing(config).run(sockets=[sock])
