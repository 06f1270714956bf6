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
  defaults; no Swagger UI (``/docs``), whose scripts come from a CDN.

Each POST body is read first (``utils/serve/body.py``: its type, size and JSON), then FastAPI checks it against its
request model (``utils/serve/schema.py``, which the OpenAPI schema shows); a refusal is the one line
``utils/serve/refusals.py`` makes of pydantic's first error. The engine is read once (``utils/serve/engine.py``).

One decoding worker owns the model (``utils/serve/batcher.py``): requests wait in a bounded queue (full: 503), and
those that arrive together are decoded together (continuous batching in a PyTorch run's decoding process, else
micro-batches of up to ``max_batch`` sentences after a wait of at most ``max_wait_ms``), in one thread, so the event
loop keeps serving slow or gone clients meanwhile. A request whose client hangs up is cancelled and its work dropped.

What the server takes is bounded (``utils/serve/limits.py``: lines, characters, tokens, beam x tokens, attention
weights, body), who it answers is checked (``utils/serve/access.py``: ``Host``, ``Origin``, and a POST's
``Content-Type: application/json``), and so are its connections (``utils/serve/connection.py``: how many, header
bytes, a deadline for each request to arrive and for its answer to be read).

No ``from __future__ import annotations`` here: FastAPI reads the endpoints' annotations (``Request``, the request
models) at runtime.
"""

import asyncio
import json
import logging
import socket
import time
from collections.abc import Awaitable
from contextlib import asynccontextmanager
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from utils.serve import modes
from utils.serve.access import Access
from utils.serve.batcher import Batcher, batcher_for
from utils.serve.engine import Served
from utils.serve.limits import Limits, RequestError, check_attention, check_lines, source_tokens, target_tokens

if TYPE_CHECKING:
    from fastapi import FastAPI, Request

    from utils.config import Config, DecodeConfig
    from utils.run.load import LoadedRun
    from utils.translation.engines import Engine
    from utils.translation.translate import Guide, Translation

log = logging.getLogger("server")

PAGE = Path(__file__).resolve().parent / "static" / "index.html"
KINDS = ("cross", "encoder", "decoder")


# ---------------------------------------------------------------------------------------------- requests


def check_guides(engine: Served, guides: "list[Guide] | None", single: bool, limits: Limits) -> None:
    """413 for a line whose prefix and constraint phrases hold more than ``max_tokens`` target tokens (bos
    included); for a PyTorch run, 422 (``InputError``, ``encode_guides``) for those over the model's positions."""
    if guides is None:
        return
    for i, guide in enumerate(guides):
        if guide.prefix or guide.constraints:
            tokens = sum(target_tokens(engine, t) - 1 for t in (guide.prefix, *guide.constraints) if t) + 1
            name = "the prefix and constraints of " + ("text" if single else f"text[{i}]")
            check_lines([tokens], [name], 1, limits)
    if engine.run is not None:
        from utils.translation.translate import encode_guides

        encode_guides(engine.run.tokenizer, guides, engine.run.model.max_length)


def line_answer(source: str, nbest: list["Translation"], guide: "Guide | None") -> dict[str, Any]:
    """One line of a ``/translate`` answer (without details)."""
    return {"source": source, "translation": nbest[0].text,
            "nbest": [modes.hypothesis_answer(h, guide) for h in nbest]}


# ---------------------------------------------------------------------------------------------- attention


def attention_run(engine: Served) -> "LoadedRun | None":
    """The PyTorch run whose attention ``/attention`` draws: the engine's, an ensemble's first model; None for an
    export."""
    return engine.ensemble.members[0] if engine.ensemble is not None else engine.run


def attention_layers(engine: Served) -> dict[str, list[int]]:
    """The attention an engine can draw, kind -> layers: every kind and layer of a PyTorch run (of an ensemble's
    first model); an export's CTranslate2 gives the last decoder layer's cross-attention (exports made before that
    gives nothing)."""
    run = attention_run(engine)
    if run is None:
        return dict(engine.attention_layers)
    m = run.cfg.model
    return {kind: list(range(m.encoder_layers if kind == "encoder" else m.decoder_layers)) for kind in KINDS}


def attention_map(engine: Served, text: str, target: str | None, kind: str, layer: int) -> dict[str, Any]:
    """One layer's attention for a sentence, as visualize.py computes it: head mean and every head (a CTranslate2
    export: the head mean only, ``heads`` null), rounded to 1e-5; cross-attention rows are the target tokens
    being predicted, as in visualize.py's figures."""
    from utils.figures.maps import BOS_LABEL, attention_from_ids, encode_pair, predicted_labels

    run = attention_run(engine)
    if run is None:  # a CTranslate2 export: cross-attention of the last layer, mean over heads
        assert engine.cross_attention is not None  # an engine that draws (``attention_layers``) has it
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


def model_info(engine: Served, model_path: str, limits: Limits) -> dict[str, Any]:
    """What ``GET /model`` answers: the run's encoding, size, tokenizer, training summary, defaults and limits."""
    cfg = engine.cfg
    m = cfg.model
    run = engine.run
    if run is not None:  # a PyTorch run
        params = sum(p.numel() for p in run.model.parameters())
        training = training_summary(run.run_dir, run.checkpoint, run.step)
        vocab = run.tokenizer.vocab_size
    else:  # a CTranslate2 export: its marker says which run and checkpoint it came from
        from utils.translation.export import MARKER

        marker_file = Path(model_path) / MARKER
        marker = json.loads(marker_file.read_text()) if marker_file.is_file() else {}
        run_dir = Path(marker["run"]) if marker.get("run") else None
        params = None
        training = training_summary(run_dir if run_dir and run_dir.is_dir() else None, marker.get("checkpoint"),
                                    None)
        training["quantization"] = marker.get("quantization")
        vocab = engine.tokenizer.vocab_size if engine.tokenizer is not None else None
    decode = cfg.decode
    return {
        "name": cfg.name, "engine": engine.kind, "model_path": str(model_path),
        "decoding": "own process" if engine.decoder is not None else "server process",
        "batching": "continuous" if engine.continuous else "static",
        "attention": attention_layers(engine) or None,
        "encoding": {"name": encoding_name(cfg), "input_pe": m.input_pe, "attention_pe": m.attention_pe,
                     "cross_attention_pe": m.cross_attention_pe, "places": m.encodings()},
        "size": {"parameters": params, "d_model": m.d_model, "n_heads": m.n_heads, "d_ff": m.d_ff,
                 "encoder_layers": m.encoder_layers, "decoder_layers": m.decoder_layers, "norm": m.norm},
        "tokenizer": {"type": cfg.tokenizer.type, "vocab_size": vocab, "lowercase": cfg.tokenizer.lowercase},
        "training": training,
        "decode": {"beam": decode.beam, "nbest": decode.nbest, "lenpen": decode.lenpen,
                   "max_len_a": decode.max_len_a, "max_len_b": decode.max_len_b, "min_len_a": decode.min_len_a,
                   "min_len_b": decode.min_len_b, "no_repeat_ngram_size": decode.no_repeat_ngram_size,
                   "beam_stop": decode.beam_stop, "sample": decode.sample,
                   "temperature": decode.temperature, "top_k": decode.top_k, "top_p": decode.top_p,
                   "epsilon": decode.epsilon, "num_samples": decode.num_samples, "seed": decode.seed,
                   "mbr": decode.mbr, "mbr_utility": decode.mbr_utility},
        "modes": list(modes.engine_modes(engine)),
        **({"ensemble": engine.ensemble.describe()} if engine.ensemble is not None else {}),
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
server's own (its `--max-*` and decoding flags). A POST's body must be sent with `Content-Type: application/json` \
(415 otherwise). Requests naming another host than this machine's names, IP addresses and `--allow-host` names, or \
sent by a web page of another origin than the server's own, this machine's and `--allow-origin` ones, are refused \
(403). A request must arrive whole within `--request-timeout` seconds (408, connection closed), with headers of at \
most `--max-header-bytes` (431); at most `--max-connections` connections are open at once (503 for one more)."""


async def _disconnected(request: "Request") -> None:
    """Return once the client of ``request`` (whose body was read) has hung up."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_gone(request: "Request", work: Awaitable[Any]) -> Any:
    """``work``'s result; if the client hangs up first, ``work`` is cancelled (the worker drops what it asked for)
    and ``RequestError`` 400 raised (nobody reads it)."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:  # this endpoint cancelled too: nothing left behind
        gone.cancel()
        if not task.done():
            task.cancel()
    if task.done() and not task.cancelled():
        return task.result()
    raise RequestError(400, "the client hung up before its answer")


def create_app(engine: "Engine", limits: Limits | None = None, model_path: str = "",
               access: Access | None = None) -> "FastAPI":
    """The FastAPI application serving ``engine`` (one decoding worker, started with the app), answering the hosts
    and origins ``access`` allows (default: this machine's). Each POST body is read (``utils/serve/body.py``), then
    checked against its request model (``utils/serve/schema.py``) by FastAPI; a refusal is one line. Its OpenAPI
    schema (``app.openapi()``, served at ``GET /openapi.json``) describes every endpoint with this server's limits
    and decoding defaults; there is no Swagger UI (``/docs``), whose scripts come from a CDN."""
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.openapi.utils import get_openapi
    from fastapi.responses import HTMLResponse, JSONResponse, Response
    from fastapi.routing import APIRoute
    from starlette.exceptions import HTTPException
    from starlette.middleware.cors import CORSMiddleware

    from models.positional import PositionLimitError
    from utils.serve import schema
    from utils.serve.access import AccessMiddleware
    from utils.serve.body import body_route
    from utils.serve.refusals import refusal
    from utils.serve.worker import DecoderError
    from utils.translation.translate import InputError, outputs_per_sentence

    limits = limits or Limits()
    limits.check()
    served = Served.of(engine)
    info = model_info(served, model_path, limits)
    state: dict[str, Batcher] = {}
    TranslateRequest, AttentionRequest = schema.request_models(limits, served.cfg, info["attention"] or {})
    bodies = {"/translate": TranslateRequest, "/attention": AttentionRequest}

    @asynccontextmanager
    async def lifespan(app: FastAPI):  # noqa: ANN202
        state["batcher"] = batcher_for(served, limits)
        state["batcher"].start()
        yield
        await state["batcher"].stop()

    # No redirect_slashes: "GET /health/" would answer a redirect to whatever host its Host header names.
    app = FastAPI(title="fr2en-pe translation server", description=API_DESCRIPTION, version=_version(),
                  lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url="/openapi.json", redirect_slashes=False)
    app.router.route_class = body_route(limits)
    access = access or Access()
    if access.origins:  # pages of other origins allowed: the CORS headers that let a browser read the answers
        app.add_middleware(CORSMiddleware, allow_origins=["*"] if "*" in access.origins else list(access.origins),
                           allow_methods=["GET", "POST"], allow_headers=["Content-Type"], max_age=600)
    app.add_middleware(AccessMiddleware, access=access, max_header_bytes=limits.max_header_bytes)  # outermost

    def openapi() -> dict[str, Any]:
        """FastAPI's schema with each request body as pydantic writes it (FastAPI's copy leaves out null defaults,
        writes integer bounds as floats and sorts the examples' keys)."""
        if app.openapi_schema is None:
            out = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            for body in bodies.values():
                out["components"]["schemas"][body.__name__] = body.model_json_schema(
                    ref_template="#/components/schemas/{model}")
            app.openapi_schema = out
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign] - FastAPI's documented way to change the schema

    def endpoints() -> str:
        routes = [(m, r.path) for r in app.routes if isinstance(r, APIRoute) for m in sorted(r.methods)]
        return ", ".join(f"{m} {p}" for m, p in [*routes, ("GET", app.openapi_url)])

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": message}, status_code=status)

    @app.exception_handler(RequestError)
    async def _refused(request: Request, err: RequestError) -> JSONResponse:
        return error(err.status, err.message)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, err: RequestValidationError) -> JSONResponse:  # the body's first error
        refused = refusal(err.errors(), bodies.get(request.url.path))
        return error(refused.status, refused.message)

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

    @app.get("/", response_class=HTMLResponse, summary="The demo page",
             responses=responses("text/html", "one HTML page, its script and style inline (no external assets: it "
                                              "works offline)", {403: None}))
    async def page() -> HTMLResponse:
        """A text box, the n-best list with scores, and the attention map of the best translation (any kind and
        layer), drawn with the tokens on its axes; the run's encoding named at the top."""
        return HTMLResponse(PAGE.read_text(encoding="utf-8"))

    @app.get("/health", response_model=None, summary="Whether the server is up, and what it has done",
             responses=responses(schema.HealthAnswer, "the batching counters since the server started",
                                 {403: None, 405: None}))
    async def health() -> dict[str, Any]:
        """`status` ok, the requests and sentences decoded, how they were batched, how busy the model was, the
        requests waiting, those refused and those whose clients left; a PyTorch run's decoding process."""
        batcher = state["batcher"]
        decoder = served.decoder
        process = {} if decoder is None else {"decoder": {"pid": decoder.pid, "restarts": decoder.restarts}}
        return {"status": "ok", "engine": info["engine"], "waiting": batcher.waiting, **batcher.snapshot(),
                **process}

    @app.get("/model", response_model=None, summary="The model served",
             responses=responses(schema.ModelAnswer, "what the server loaded and how it decodes",
                                 {403: None, 405: None}))
    async def model() -> dict[str, Any]:
        """The run's name, engine, where decoding runs and how requests are batched, the attention `/attention`
        draws, the positional encodings, size, tokenizer, training summary, decoding defaults and limits."""
        return info

    @app.post("/translate", response_model=None, summary="Translate one sentence or a list", responses=responses(
        schema.TranslateAnswer, "the n-best list of each line", {
            400: None, 403: None, 405: None,
            413: "more lines than `--max-lines`, a line (or a prefix or phrase) of more than `--max-chars` "
                 "characters or `--max-tokens` tokens, more source tokens x beam (or samples) than "
                 "`--max-beam-tokens`, more constraint phrases a line than the schema allows, or a body over what "
                 "those allow",
            415: None,
            422: "the body is not a JSON object; a field is unknown, missing or of the wrong type; a blank line, "
                 "prefix or phrase, or an empty list; a field out of range, or `nbest` over `beam`; a `prefix` or "
                 "`constraints` list not aligned with `text`; fields that do not go together (a sampling setting "
                 "without `sample`, `mbr_utility` without `mbr`, constraints with greedy search, a prefix or "
                 "constraints with sampling, `mbr` over `beam` without sampling); a mode the engine does not do "
                 "(`GET /model` lists its `modes`); a sentence, or its prefix and constraints, longer than the "
                 "model's positions allow",
            500: None, 503: None}))
    async def translate(request: Request, body: TranslateRequest) -> dict[str, Any]:
        """Per line the best translation and its n-best list, with each hypothesis' length-penalised score and
        summed log-probability: the same texts and scores as `inference.py --input` with the same flags. Also as
        the command line can: a target prefix, terminology constraints, sampling, MBR, and per-token details
        (`inference.py --format jsonl`'s fields). Requests that arrive together and decode alike are decoded
        together."""
        lines, decode, guides, details = body.lines, body.settings(), body.guides(), bool(body.details)
        refused = [mode for mode in modes.modes_used(decode, guides, details) if mode not in info["modes"]]
        if refused:
            raise RequestError(422, modes.refusal(served, refused[0]))
        why = modes.engine_problem(served, decode, guides, details)  # e.g. a setting CTranslate2 lacks
        if why is not None:
            raise RequestError(422, why)
        run = served.run
        counts = await asyncio.to_thread(source_tokens, served, lines)
        modes.check_samples(counts, decode, limits)
        check_lines(counts, ["text"] if body.single else [f"text[{i}]" for i in range(len(lines))],
                    modes.rows_per_line(decode), limits)
        await asyncio.to_thread(check_guides, served, guides, body.single, limits)
        start = time.perf_counter()
        results = await unless_gone(request, state["batcher"].translate(
            lines, decode, guides, details=details and run is None))  # an export gives them itself
        out = [line_answer(src, nbest, guide)
               for src, nbest, guide in zip(lines, results, guides or [None] * len(lines), strict=True)]
        if details:
            if run is None:  # an export gave each hypothesis its alignment while decoding
                found = await asyncio.to_thread(modes.export_details, served, lines, results)
            else:  # one teacher-forced pass of the server's model for the alignments, between batches
                found = await unless_gone(request, state["batcher"].call(lambda: modes.line_details(
                    run.model, run.tokenizer, lines, results, decode.batch_size)))
            for line, (tokens, records) in zip(out, found, strict=True):
                line["source_tokens"] = tokens
                line["nbest"] = [{**hyp, **record} for hyp, record in zip(line["nbest"], records, strict=True)]
        return {"translations": out, "beam": decode.beam, "nbest": outputs_per_sentence(decode),
                "lenpen": decode.lenpen, **modes.settings_answer(decode, details),
                "seconds": round(time.perf_counter() - start, 4)}

    @app.post("/attention", response_model=None, summary="One layer's attention for a sentence", responses=responses(
        schema.AttentionAnswer, "the tokens and the attention weights", {
            400: None, 403: None, 405: None,
            413: "`text` or `target` of more than `--max-chars` characters or `--max-tokens` tokens, attention "
                 "weights over `--max-attention-weights`, or a body over the limit",
            415: None,
            422: "the body is not a JSON object; a field is unknown, missing, of the wrong type or blank; a `kind` "
                 "other than cross, encoder, decoder; a layer the model does not have, or one a CTranslate2 export "
                 "does not give",
            500: None, 501: None, 503: None}))
    async def attention(request: Request, body: AttentionRequest) -> Response:
        """The attention weights of one layer (mean over heads, and each head) for the greedy translation of
        `text`, or for `target` teacher-forced, computed as `visualize.py` does. A CTranslate2 export gives what
        CTranslate2 returns: the last layer's cross-attention, mean over heads (`heads` null)."""
        if not info["attention"]:
            raise RequestError(501, "this CTranslate2 export was made before exports kept attention: export the run "
                                    "again (inference.py --export-ctranslate2), or serve the run directory")
        (kind, layer), text, target = body.place(), body.text, body.target
        await asyncio.to_thread(check_attention, served, text, target, limits)
        answer = await unless_gone(request, state["batcher"].call(  # the JSON made in the decoding thread too
            lambda: json.dumps(attention_map(served, text, target, kind, layer)).encode()))
        return Response(answer, media_type="application/json")

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


def serve(engine: "Engine", model_path: str, sock: socket.socket, limits: Limits | None = None,
          access: Access | None = None) -> None:
    """Serve ``engine`` on the bound ``sock`` until Ctrl-C or SIGTERM, its connections bounded as ``limits`` says
    (``utils/serve/connection.py``); once the server accepts connections it prints ``serving ... on
    http://HOST:PORT`` (the real port when 0 was asked for)."""
    import uvicorn

    from utils.serve.connection import uvicorn_config

    limits = limits or Limits()
    app = create_app(engine, limits, model_path, access)
    what = "PyTorch" if Served.of(engine).run is not None else "CTranslate2"
    bound_host, bound_port = sock.getsockname()[:2]
    url = f"http://{f'[{bound_host}]' if ':' in bound_host else bound_host}:{bound_port}"

    class Announcing(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            print(f"serving {model_path} ({what}) on {url} (Ctrl-C to stop)", flush=True)

    Announcing(uvicorn_config(app, limits)).run(sockets=[sock])
