"""The HTTP API reference (docs/reference_http.py, docs/pages/reference/http.md): generated from the server's OpenAPI
schema, it lists every endpoint the app serves and no other (no ``/info``) and every request field; the schema's
request fields, types, defaults and limits are exactly what the server's hand checks accept (probed in-process with
an engine that needs no model, on a server with its own limits); its answers are what the schema says."""

from __future__ import annotations

import http.client
import json
import re
from contextlib import AbstractContextManager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import ROOT, serving_app

from docs import reference_http
from utils.config import from_dict
from utils.serve import schema as api
from utils.serve.app import Limits, NoModel, create_app, openapi_schema

PAGE = ROOT / "docs" / "pages" / "reference" / "http.md"
LIMITS = Limits(max_lines=3, max_chars=20, max_beam=4, max_wait_ms=0)


class FakeEngine:
    """Translates instantly (each text upper-cased, ``nbest`` hypotheses); draws attention as a CTranslate2 export
    would (every kind and layer of a one-layer model offered); takes every decoding mode but details (which need a
    model); with ``run``, described as a PyTorch run is."""

    modes = ("prefix", "constraints", "sample", "mbr")

    def __init__(self, run: Any = None, decoder: Any = None) -> None:
        self.cfg = from_dict({"name": "fake", "model": {"encoder_layers": 1, "decoder_layers": 1},
                              "decode": {"beam": 3, "nbest": 1, "lenpen": 0.8}})
        self.attention_layers = {kind: [0] for kind in api.KINDS}
        self.tokenizer = SimpleNamespace(vocab_size=9, id_to_token=lambda ids: [f"t{i}" for i in ids])
        if run is not None:
            self.run = run
        if decoder is not None:
            self.decoder = decoder

    def translate(self, texts: list[str], decode: Any, on_done: Any = None, guides: Any = None) -> list[list[Any]]:
        from utils.translation.translate import Translation

        return [[Translation(t.upper(), -1.0 - k, -2.0 - k, []) for k in range(decode.nbest)] for t in texts]

    def cross_attention(self, text: str, target: str | None, decode: Any) -> tuple:
        import torch

        return [1, 2, 3], [4, 5], target or "T4 T5", torch.full((3, 3), 1 / 3)


def serving(engine: Any, model_path: str = "") -> AbstractContextManager[int]:
    """The app on a free port in a thread of this process (uvicorn, as --serve runs it) -> the port."""
    return serving_app(create_app(engine, LIMITS, model_path))


def call(port: int, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """-> (status, JSON answer)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path, body=None if body is None else json.dumps(body).encode(),
                     headers={} if body is None else {"Content-Type": "application/json"})
        res = conn.getresponse()
        return res.status, json.loads(res.read())
    finally:
        conn.close()


def sections(page: str) -> dict[str, str]:
    """``METHOD /path`` -> its section of the page."""
    parts = re.split(r"^## `([A-Z]+ \S+)`$", page, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def routes(app: Any) -> list[str]:
    """``METHOD /path`` of every route the app serves (HEAD, which Starlette adds to GET, left out)."""
    return [f"{m} {r.path}" for r in app.routes for m in sorted(r.methods - {"HEAD"})]


def branches(field: dict[str, Any]) -> list[dict[str, Any]]:
    return field.get("anyOf", [field])


# ---------------------------------------------------------------------------------------------- the page


def test_the_committed_page_is_what_the_schema_gives() -> None:
    assert PAGE.read_text(encoding="utf-8") == reference_http.pages()["reference/http.md"], (
        "run: python docs/generate.py")


def test_every_route_the_app_serves_is_on_the_page_and_no_other() -> None:
    page = reference_http.pages()["reference/http.md"]
    served = routes(create_app(NoModel()))
    assert set(served) == {"GET /", "GET /health", "GET /model", "POST /translate", "POST /attention",
                           "GET /openapi.json"}
    assert set(sections(page)) == set(served)  # "/" too: the page is a route
    for route in served:
        method, path = route.split()
        assert f"](#{reference_http._anchor(method, path)})" in page  # in the index, linked to its section
    assert "/info" not in page


def test_every_request_field_and_answer_field_of_the_schema_is_on_the_page() -> None:
    schema = openapi_schema()
    on_page = sections(reference_http.pages()["reference/http.md"])
    for path, item in schema["paths"].items():
        for method, op in item.items():
            section = on_page[f"{method.upper()} {path}"]
            fields = reference_http.request_fields(schema, op)
            for name in fields:
                assert re.search(rf"^\| `{name}` \|", section, flags=re.M), (path, name)
            assert bool(fields) == ("**Request**" in section)
            answer = op["responses"]["200"]["content"].get("application/json")
            if answer:
                for name, _, _ in reference_http.answer_rows(schema, answer["schema"]):
                    assert f"| `{name}` |" in section, (path, name)
            for status in op["responses"]:
                if status != "200":
                    assert f"| {status} |" in section, (path, status)
            assert f"curl -s 127.0.0.1:8000{path}" in section


def test_the_page_shows_the_defaults_and_limits_of_the_default_flags() -> None:
    translate = sections(reference_http.pages()["reference/http.md"])["POST /translate"]
    assert "| `beam` | integer or null | `5` | 1..32 |" in translate
    assert ("| `text` | string or array of string | required | string: 1..2000 characters; array: 1..64 items"
            in translate)
    assert "| `lenpen` | number or null | `0.6` | 0.0..10.0 |" in translate
    assert ("curl -s 127.0.0.1:8000/translate -H 'Content-Type: application/json' -d '{\"text\": [\"Bonjour.\", "
            "\"Merci beaucoup.\"], \"beam\": 5, \"nbest\": 2, \"lenpen\": 1.0}'") in translate


# ---------------------------------------------------------------------------------------------- the schema


#: What a request field needs beside it to be taken (the server refuses a sampling setting without sampling, an MBR
#: utility without MBR), and the fields whose lists go one item per line (the request's ``text`` then has as many).
NEEDS = {**{name: {"sample": True} for name in ("temperature", "top_k", "top_p", "epsilon", "num_samples", "seed")},
         "mbr_utility": {"mbr": 2}}
PER_LINE = ("prefix", "constraints")


def with_field(base: dict[str, Any], name: str, value: Any) -> dict[str, Any]:
    """``base`` with ``name`` set to ``value``, the fields it needs (``NEEDS``), and for a per-line list as many
    lines of text."""
    body = {**base, **NEEDS.get(name, {}), name: value}
    per_line = isinstance(value, list) and (name == "prefix" or any(isinstance(v, list) for v in value))
    if name in PER_LINE and per_line:
        body["text"] = ["Oui."] * len(value)
    return body


def probes(field: dict[str, Any]) -> tuple[list[Any], list[Any]]:
    """(values the schema of a request field accepts, values it refuses), from its types and limits alone."""
    good: list[Any] = []
    bad: list[Any] = [{"an": "object"}]
    kinds = {b.get("type") for b in branches(field)}
    (good if "null" in kinds else bad).append(None)
    if "string" not in kinds:
        bad.append("x")
    if "array" not in kinds:
        bad.append(["x"])
    if not kinds & {"integer", "number"}:
        bad.append(5)
    for b in branches(field):
        kind = b.get("type")
        if kind == "integer":
            low, high = b.get("minimum", -1), b.get("maximum", 0)
            good += [low, high]
            bad += [1.5, True, "1"]
            bad += [low - 1] if "minimum" in b else []
            bad += [high + 1] if "maximum" in b else []
        elif kind == "number":
            low, high = b.get("minimum", b.get("exclusiveMinimum")), b.get("maximum", b.get("exclusiveMaximum"))
            good += [(low + high) / 2] + [low] * ("minimum" in b) + [high] * ("maximum" in b)
            good += [int(high)] * ("maximum" in b)
            bad += [low - 0.5, high + 0.5, True, "1"]
            bad += [low] * ("exclusiveMinimum" in b) + [high] * ("exclusiveMaximum" in b)
        elif kind == "string" and "enum" in b:
            good += b["enum"]
            bad += ["sideways"]
        elif kind == "string":
            good += ["a" * b["minLength"], "a" * b["maxLength"]]
            bad += ["a" * (b["minLength"] - 1), "a" * (b["maxLength"] + 1)]
        elif kind == "array" and b["items"].get("type") == "array":  # a list of lists of strings
            inner = b["items"]
            phrase = "a" * inner["items"]["maxLength"]
            good += [[["a"]] * b["minItems"], [["a"]] * b["maxItems"], [["a"] * inner["maxItems"]], [[phrase]], [[]]]
            bad += [[], [["a"]] * (b["maxItems"] + 1), [["a"] * (inner["maxItems"] + 1)], [[phrase + "a"]], [[5]],
                    [["a", None]], [["a"], "a"]]
        elif kind == "array":
            item = b["items"]
            good += [["a"] * b["minItems"], ["a"] * b["maxItems"], ["a" * item["maxLength"]]]
            bad += [["a"] * (b["minItems"] - 1), ["a"] * (b["maxItems"] + 1), ["a" * (item["maxLength"] + 1)], [5],
                    ["a", None]]
    return good, bad


def test_the_schema_s_request_fields_types_and_limits_are_what_the_server_accepts() -> None:
    """The server checks requests by hand; its schema describes them. For each endpoint with a body: the fields its
    unknown-field error names are the schema's, in order; the required ones are; and every value the schema's
    types and limits allow is answered 200 (the settings echoed), every other one refused with one line (413 for
    what is too big, 422 for the rest)."""
    engine = FakeEngine()
    with serving(engine) as port:
        status, schema = call(port, "GET", "/openapi.json")  # the server's own schema: its limits and defaults
        assert status == 200
        bases = {"/translate": {"text": "Oui.", "beam": LIMITS.max_beam}, "/attention": {"text": "Oui."}}
        for path, base in bases.items():
            body = reference_http.resolve(schema, schema["paths"][path]["post"]["requestBody"]["content"][
                "application/json"]["schema"])
            fields = body["properties"]
            status, answer = call(port, "POST", path, {**base, "colour": "red"})
            named = re.fullmatch(r"unknown field 'colour' \(fields: (.*)\)", answer["error"])
            assert status == 422 and named and named.group(1).split(", ") == list(fields)
            status, answer = call(port, "POST", path, {})
            assert status == 422 and answer["error"].startswith('missing field "text"') and body["required"] == ["text"]
            for name, field in fields.items():
                good, bad = probes(field)
                assert good and bad
                for value in good:
                    status, answer = call(port, "POST", path, with_field(base, name, value))
                    assert status == 200, (path, name, value, answer)
                    if path == "/translate" and name not in ("text", *PER_LINE) and value is not None:
                        assert answer[name] == value
                for value in bad:
                    status, answer = call(port, "POST", path, with_field(base, name, value))
                    assert status in (413, 422) and list(answer) == ["error"], (path, name, value, status, answer)
        # the defaults: the server's decoding defaults (the engine's config), kind cross and the last layer
        fields = reference_http.resolve(schema, {"$ref": "#/components/schemas/TranslateRequest"})["properties"]
        assert [fields[k]["default"] for k in ("beam", "nbest", "lenpen")] == [3, 1, 0.8]
        status, answer = call(port, "POST", "/translate", {"text": "Oui."})
        assert status == 200 and (answer["beam"], answer["nbest"], answer["lenpen"]) == (3, 1, 0.8)
        status, answer = call(port, "POST", "/attention", {"text": "Oui."})
        fields = reference_http.resolve(schema, {"$ref": "#/components/schemas/AttentionRequest"})["properties"]
        assert (fields["kind"]["default"], fields["layer"]["default"]) == ("cross", -1)
        assert status == 200 and (answer["kind"], answer["layer"]) == ("cross", 0)
        # the limits are this server's: 3 lines of 20 characters, beam up to 4
        text = reference_http.resolve(schema, {"$ref": "#/components/schemas/TranslateRequest"})
        array = [b for b in text["properties"]["text"]["anyOf"] if b["type"] == "array"][0]
        assert (array["maxItems"], array["items"]["maxLength"]) == (3, 20)
        assert text["properties"]["beam"]["anyOf"][0]["maximum"] == 4


def test_only_real_endpoints_answer_and_an_unknown_one_names_them() -> None:
    page = reference_http.pages()["reference/http.md"]
    with serving(FakeEngine()) as port:
        for path in ("/info", "/docs", "/redoc"):
            status, answer = call(port, "GET", path)
            assert status == 404 and answer["error"].startswith(f"no such endpoint: GET {path} (endpoints: ")
        named = answer["error"].split("(endpoints: ", 1)[1].rstrip(")").split(", ")
        assert sorted(named) == sorted(sections(page))
        assert call(port, "GET", "/translate") == (405, {"error": "/translate does not take GET"})


def test_the_answers_are_what_the_schema_says(tmp_path: Path) -> None:
    """Each endpoint's answer validates against its answer model (no field missing, none unknown): a PyTorch run
    decoding in its own process, and a CTranslate2 export whose run wrote its summary."""
    import torch

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "summary.json").write_text(json.dumps({"steps": 10, "valid_ppl": 2.5}))
    (run_dir / "train.log").write_text("step 10 | valid loss 0.9 ppl 2.46 acc 0.8 BLEU 30.00 chrF 50.00 | 1.0s\n")
    run = SimpleNamespace(model=torch.nn.Linear(2, 3), run_dir=run_dir, checkpoint=run_dir / "best.pt", step=10,
                          tokenizer=SimpleNamespace(vocab_size=9))
    engine = FakeEngine(run=run, decoder=SimpleNamespace(pid=42, restarts=1))
    run.cfg = engine.cfg
    with serving(engine, str(run_dir)) as port:
        status, model = call(port, "GET", "/model")
        assert status == 200 and api.ModelAnswer.model_validate(model)
        assert model["size"]["parameters"] == 9 and model["training"]["summary"] == {"steps": 10, "valid_ppl": 2.5}
        status, health = call(port, "GET", "/health")
        assert status == 200 and api.HealthAnswer.model_validate(health) and health["decoder"]["restarts"] == 1
        status, answer = call(port, "POST", "/translate", {"text": ["Oui.", "Non."], "nbest": 2})
        assert status == 200 and api.TranslateAnswer.model_validate(answer)
        assert [len(t["nbest"]) for t in answer["translations"]] == [2, 2]

    from utils.translation.export import MARKER

    export = tmp_path / "export"
    export.mkdir()
    (export / MARKER).write_text(json.dumps({"run": str(run_dir), "checkpoint": "best.pt", "quantization": None}))
    with serving(FakeEngine(), str(export)) as port:
        status, model = call(port, "GET", "/model")
        assert status == 200 and api.ModelAnswer.model_validate(model)
        assert model["engine"] == "ctranslate2" and model["training"]["quantization"] is None
        assert model["training"]["last_validation"].startswith("valid loss 0.9")
        status, health = call(port, "GET", "/health")
        assert status == 200 and api.HealthAnswer.model_validate(health) and "decoder" not in health
        for body in ({"text": "Le chat."}, {"text": "Le chat.", "target": "The cat.", "kind": "encoder"}):
            status, answer = call(port, "POST", "/attention", body)
            assert status == 200 and api.AttentionAnswer.model_validate(answer) and answer["heads"] is None
        status, answer = call(port, "POST", "/translate", {"text": "a" * 21})
        assert status == 413 and api.ErrorAnswer.model_validate(answer)
    for model in (api.TranslateAnswer, api.HealthAnswer):  # the schema's examples are answers too
        for example in model.model_json_schema()["examples"]:
            model.model_validate(example)


def test_the_schema_can_be_built_without_a_model_and_says_where_each_error_comes_from() -> None:
    schema = openapi_schema(Limits(max_lines=5))
    assert schema["openapi"].startswith("3.") and set(schema["paths"]) == {"/", "/health", "/model", "/translate",
                                                                            "/attention"}
    text = schema["components"]["schemas"]["TranslateRequest"]["properties"]["text"]
    assert [b.get("maxItems") for b in text["anyOf"]] == [None, 5]
    translate = schema["paths"]["/translate"]["post"]["responses"]
    assert sorted(translate) == ["200", "400", "403", "405", "413", "415", "422", "500", "503"]
    assert sorted(schema["paths"]["/attention"]["post"]["responses"]) == ["200", "400", "403", "405", "413", "415",
                                                                          "422", "500", "501", "503"]
    error = {"$ref": "#/components/schemas/ErrorAnswer"}
    assert all(r["content"]["application/json"]["schema"] == error for s, r in translate.items() if s != "200")
    with pytest.raises(ValueError, match="--max-lines must be >= 1"):
        openapi_schema(Limits(max_lines=0))
