"""The HTTP API reference page, ``reference/http.md``, generated from the server's OpenAPI schema.

The schema is ``app.openapi()`` of the app ``inference.py --serve`` runs, built without a model
(``utils.serve.app.openapi_schema``: the default flags' limits and the default config's decoding defaults): per
endpoint its method and path, summary and description, the request fields (type, default, limits, meaning), the
answer fields, the error statuses and a curl example made from the schema's examples.
"""

from __future__ import annotations

import json
from typing import Any

BASE = "127.0.0.1:8000"
# Listed first: the endpoints a user calls most; the page and the schema come last.
ORDER = ("POST /translate", "POST /attention", "GET /model", "GET /health", "GET /")
SCHEMA_ROUTE = "GET /openapi.json"


def pages() -> dict[str, str]:
    """``reference/http.md`` -> its markdown."""
    from utils.serve.app import Limits, openapi_schema

    return {"reference/http.md": page(openapi_schema(Limits()), Limits())}


# ---------------------------------------------------------------------------------------------- the schema


def operations(schema: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(METHOD, path, operation) of every endpoint in the schema, in ``ORDER`` (others after, in schema order)."""
    ops = [(method.upper(), path, op) for path, item in schema["paths"].items() for method, op in item.items()]
    rank = {name: i for i, name in enumerate(ORDER)}
    return sorted(ops, key=lambda o: rank.get(f"{o[0]} {o[1]}", len(ORDER)))


def resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    """``node`` with a ``$ref`` replaced by the component it names (its own keys, e.g. a description, kept)."""
    if "$ref" not in node:
        return node
    target = schema["components"]["schemas"][node["$ref"].rsplit("/", 1)[-1]]
    return {**target, **{k: v for k, v in node.items() if k != "$ref"}}


def request_fields(schema: dict[str, Any], op: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The request body's fields of an operation (none: empty), name -> its schema, in order."""
    body = op.get("requestBody")
    if body is None:
        return {}
    return resolve(schema, body["content"]["application/json"]["schema"])["properties"]


def _branches(node: dict[str, Any]) -> list[dict[str, Any]]:
    return node.get("anyOf", [node])


def type_name(schema: dict[str, Any], node: dict[str, Any]) -> str:
    """A readable JSON type: ``string or array of string``, ``integer or null``, ``object``..."""
    if "anyOf" in node:
        return " or ".join(type_name(schema, b) for b in node["anyOf"])
    node = resolve(schema, node)
    kind = node.get("type", "any")
    if kind == "array":
        return f"array of {type_name(schema, node.get('items', {}))}"
    if kind == "object" and isinstance(node.get("additionalProperties"), dict):
        return f"object of {type_name(schema, node['additionalProperties'])}"
    return kind


def limits(node: dict[str, Any]) -> str:
    """What a request field's schema allows beyond its type: ranges, lengths, sizes, allowed values."""
    out = []
    for b in _branches(node):
        parts = []
        if "enum" in b:
            parts.append(", ".join(f"`{v}`" for v in b["enum"]))
        if "exclusiveMinimum" in b or "exclusiveMaximum" in b:  # an open end: (0, 1], [0, 1), (0, 100)
            low = f"({json.dumps(b['exclusiveMinimum'])}" if "exclusiveMinimum" in b else (
                f"[{json.dumps(b.get('minimum', '-inf'))}")
            high = f"{json.dumps(b['exclusiveMaximum'])})" if "exclusiveMaximum" in b else (
                f"{json.dumps(b.get('maximum', 'inf'))}]")
            parts.append(f"{low}, {high}")
        elif "minimum" in b or "maximum" in b:
            parts.append(f"{json.dumps(b.get('minimum', '-inf'))}..{json.dumps(b.get('maximum', 'inf'))}")
        if "minLength" in b or "maxLength" in b:
            parts.append(f"{b.get('minLength', 0)}..{b.get('maxLength', 'any')} characters")
        if "minItems" in b or "maxItems" in b:
            items = b.get("items", {})
            each = f" of {items.get('minLength', 0)}..{items.get('maxLength', 'any')} characters" if (
                "maxLength" in items) else ""
            parts.append(f"{b.get('minItems', 0)}..{b.get('maxItems', 'any')} items{each}")
        if parts:
            several = sum(x.get("type") != "null" for x in _branches(node)) > 1
            prefix = f"{b['type']}: " if several and "type" in b and "enum" not in b else ""
            out.append(prefix + "; ".join(parts))
    return "; ".join(out) or "-"


def answer_rows(schema: dict[str, Any], node: dict[str, Any], prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted name, type, meaning) of every field of an answer, nested objects flattened: ``translations[].nbest``.
    A field that may be absent says so."""
    node = resolve(schema, node)
    rows = []
    required = set(node.get("required", []))
    for name, field in node.get("properties", {}).items():
        meaning = field.get("description", "")
        kind = type_name(schema, field)
        values = field.get("enum", [field["const"]] if "const" in field else [])
        if values:
            kind += " (" + ", ".join(f"`{v}`" for v in values) + ")"
        if name not in required:
            kind += ", may be absent"
        rows.append((prefix + name, kind, meaning))
        inner = [resolve(schema, b) for b in _branches(field) if b.get("type") != "null"]
        for b in inner:
            if b.get("properties"):
                rows += answer_rows(schema, b, f"{prefix}{name}.")
            elif b.get("type") == "array" and resolve(schema, b.get("items", {})).get("properties"):
                rows += answer_rows(schema, b["items"], f"{prefix}{name}[].")
    return rows


def ordered(schema: dict[str, Any], value: Any, node: dict[str, Any]) -> Any:
    """An example ``value`` with its keys in the order of the schema's properties (the schema sorts them)."""
    node = resolve(schema, node)
    if isinstance(value, dict) and "properties" in node:
        props = node["properties"]
        keys = [k for k in props if k in value] + sorted(k for k in value if k not in props)
        return {k: ordered(schema, value[k], _object_branch(schema, props.get(k, {}))) for k in keys}
    if isinstance(value, list) and "items" in node:
        return [ordered(schema, v, node["items"]) for v in value]
    return value


def _object_branch(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    for b in _branches(node):
        b = resolve(schema, b)
        if b.get("type") in ("object", "array") or "properties" in b:
            return b
    return node


# ---------------------------------------------------------------------------------------------- the page


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    return [f"| {' | '.join(header)} |", "|" + "---|" * len(header),
            *(f"| {' | '.join(_cell(c) for c in row)} |" for row in rows)]


def _anchor(method: str, path: str) -> str:
    """The heading's anchor as mkdocs' toc makes it: lowercase, punctuation dropped, spaces to hyphens."""
    text = f"{method} {path}".lower()
    return "-".join("".join(c for c in text if c.isalnum() or c in " -_").split())


def curl(method: str, path: str, body: dict[str, Any] | None = None) -> str:
    """The curl command of a request (``-d``: curl sends a POST; the server takes it as JSON only with that
    ``Content-Type``)."""
    if body is None:
        return f"curl -s {BASE}{path}"
    data = json.dumps(body, ensure_ascii=False)
    if "'" in data:
        raise ValueError(f"an example body holds a single quote, which the shell line cannot: {data}")
    return f"curl -s {BASE}{path} -H 'Content-Type: application/json' -d '{data}'"


def endpoint(schema: dict[str, Any], method: str, path: str, op: dict[str, Any]) -> list[str]:
    """The section of one endpoint."""
    out = [f"## `{method} {path}`", "", f"**{op['summary']}.** {' '.join(op.get('description', '').split())}", ""]
    fields = request_fields(schema, op)
    body = None
    if fields:
        body = resolve(schema, op["requestBody"]["content"]["application/json"]["schema"])
        required = set(body.get("required", []))
        rows = [(f"`{name}`", type_name(schema, f), "required" if name in required else f"`{json.dumps(f['default'])}`",
                 limits(f), f.get("description", "")) for name, f in fields.items()]
        out += ["**Request** (a JSON object; any other field is refused):", "",
                *_table(("field", "type", "default", "limits", "meaning"), rows), ""]
    ok = op["responses"]["200"]
    media, content = next(iter(ok["content"].items()))
    if media == "application/json":
        answer = resolve(schema, content["schema"])
        out += [f"**Answer** (200, JSON): {ok['description']}.", "",
                *_table(("field", "type", "meaning"), [(f"`{n}`", t, m) for n, t, m in answer_rows(schema, answer)]),
                ""]
    else:
        answer = None
        out += [f"**Answer** (200, `{media}`): {ok['description']}.", ""]
    errors = [(f"{status}", r["description"]) for status, r in op["responses"].items() if status != "200"]
    if errors:
        out += ["**Errors** (`{\"error\": \"one line\"}`):", "", *_table(("status", "when"), errors), ""]
    examples = [ordered(schema, e, body) for e in body.get("examples", [])] if body else [None]
    out += ["**Example:**", "", "```bash", *(curl(method, path, e) for e in examples), "```", ""]
    if answer is not None and answer.get("examples"):
        shown = json.dumps(ordered(schema, answer["examples"][0], answer), ensure_ascii=False, indent=2)
        out += ["answers, for example:", "", "```json", shown, "```", ""]
    return out


def page(schema: dict[str, Any], limits_: Any) -> str:
    """The whole page from ``schema`` (built with ``limits_``, a ``utils.serve.app.Limits``)."""
    from utils.serve.schema import ERRORS

    ops = operations(schema)
    flags = ", ".join(f"`--{k.replace('_', '-')} {v}`" for k, v in vars(limits_).items())
    index = [(f"[`{m} {p}`](#{_anchor(m, p)})", op["summary"]) for m, p, op in ops]
    index.append((f"[`{SCHEMA_ROUTE}`](#{_anchor(*SCHEMA_ROUTE.split())})", "The OpenAPI schema of the server"))
    out = [
        "# HTTP API",
        "",
        "<!-- Generated by docs/reference_http.py from the server's OpenAPI schema (utils/serve/app.py, "
        "utils/serve/schema.py): edit those, then run python docs/generate.py. -->",
        "",
        "`python inference.py --serve --model_path runs/demo_latest` serves a run (or its CTranslate2 export) on "
        f"`http://{BASE}`: see [Serving and the demo page](../guide/serving.md) for how to start it, the flags, and "
        "how requests are batched, and for [what the server promises](../guide/serving.md#what-the-server-promises): "
        "its limits, the hosts and pages it answers, its timeouts. Requests and answers are JSON; a POST must say so "
        "(`Content-Type: application/json`, else 415).",
        "",
        f"**Defaults and limits on this page** are those of the default flags ({flags}) and of the default config's "
        "`decode` section (beam 5, n-best 1, length penalty 0.6). A server started with other `--max-*` flags, "
        "decoding flags (`--beam`, `--nbest`, `--lenpen`) or a run whose config decodes otherwise states its own in "
        "`GET /openapi.json` and `GET /model`.",
        "",
        *_table(("endpoint", "what it does"), index),
        "",
        "## Errors",
        "",
        "Every refusal is a JSON object with one field, `error`, one readable line (never a traceback), for example "
        "`{\"error\": \"unknown field 'colour' (fields: text, target, kind, layer)\"}` or "
        "`{\"error\": \"9 lines in one request, over the limit of 8 (--max-lines)\"}`. The statuses:",
        "",
        *_table(("status", "when"), [(str(s), m) for s, m in sorted(ERRORS.items())]),
        "",
    ]
    for method, path, op in ops:
        out += endpoint(schema, method, path, op)
    out += [
        f"## `{SCHEMA_ROUTE}`",
        "",
        "**The OpenAPI schema of the server** (OpenAPI 3.1, JSON), with that server's own limits and defaults: what "
        "this page is generated from, for API tools and client generators. The interactive pages FastAPI can add "
        "(Swagger UI at `/docs`, ReDoc at `/redoc`) are not served: they load their scripts from a CDN, and the "
        "server is meant to work offline (those paths answer 404).",
        "",
        "**Example:**",
        "",
        "```bash",
        curl("GET", SCHEMA_ROUTE.split()[1]),
        "```",
        "",
    ]
    return "\n".join(out)
