"""Load on the translation server (``inference.py --serve``) next to the CLI's batch throughput on the same sentences.

    python bench/serve_load.py --model_path RUN_DIR [--ct2 EXPORT_DIR] [--sentences 200] [--clients 1 8 32]
        [--beam 5] [--threads N] [--out runs/serve_load]

For each engine (the PyTorch run; the CTranslate2 export with ``--ct2``, or ``--ct2 auto`` to export the run
into ``<out>/ct2`` first):

- the CLI: ``inference.py --model_path M --input FILE --beam B``, its own ``sentences/s`` line (decoding only,
  model loading excluded) on the first ``--sentences`` non-empty lines of ``--input`` (default data/demo/test.fr,
  repeated up to that number);
- the server: a fresh ``inference.py --serve`` process, one warm-up request, then for each number of concurrent
  clients every sentence sent once as its own ``POST /translate`` (one line per request; each client a thread
  with one keep-alive connection): requests/s over the wall time, p50 and p99 latency, and the server's
  batches and mean batch (sentences per engine call with static batching; with continuous batching, the default
  for a PyTorch run, the sentences decoding at each decoder step).

Every server answer is checked against the CLI's output line for the same sentence (counted as ``same``).
Prints one Markdown table (ratios against the CLI of the same engine, measured in the same run) and writes
``<out>/serve_load.md`` and ``<out>/serve_load.json``. Each engine runs in its own processes (CTranslate2 and
PyTorch thread pools in one CPU process slow each other down).
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import json
import math
import os
import re
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as bench/serve_load.py: the repository root first

from bench.common import ROOT, cpu_model, project_command  # noqa: E402


class ServerFailed(RuntimeError):
    """The server process exited or never said where it listens."""


@dataclass
class Server:
    """A running ``inference.py --serve`` process and its address."""

    process: subprocess.Popen
    host: str
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM (as Ctrl-C), wait; the exit status."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def on_cpus(cpus: set[int] | None) -> Callable[[], None] | None:
    """A ``preexec_fn`` running the child (and whatever it starts) on ``cpus`` only; None: where it may."""
    return None if cpus is None else (lambda: os.sched_setaffinity(0, cpus))


def start_server(model_path: str | Path, log: Path, *flags: str, timeout: float = 120.0,
                 env: dict[str, str] | None = None, cpus: set[int] | None = None) -> Server:
    """Start ``inference.py --serve --port 0`` (any free port on 127.0.0.1) and wait for its ``serving ... on
    http://HOST:PORT`` line; its standard error goes to ``log``; on ``cpus`` only if given."""
    log.parent.mkdir(parents=True, exist_ok=True)
    err = open(log, "w")  # noqa: SIM115 - the process owns it until it exits
    cmd = project_command("inference.py", "--serve", "--model_path", model_path, "--port", "0", *flags)
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True, env=env,
                            preexec_fn=on_cpus(cpus))
    err.close()
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if ready:
            line = proc.stdout.readline()
            match = re.search(r"serving .* on http://([^\s:]+):(\d+)", line)
            if match:
                return Server(proc, match.group(1), int(match.group(2)), log)
        if proc.poll() is not None:
            break
    proc.kill()
    proc.wait()
    tail = log.read_text(errors="replace").strip().splitlines()[-3:]
    raise ServerFailed(f"the server did not start ({' | '.join(tail) or 'no output'})")


def post(conn: http.client.HTTPConnection, path: str, body: object) -> tuple[int, dict]:
    """POST JSON on a keep-alive connection -> (status, decoded JSON answer)."""
    data = json.dumps(body).encode()
    conn.request("POST", path, body=data, headers={"Content-Type": "application/json"})
    res = conn.getresponse()
    return res.status, json.loads(res.read())


def get(url: str, path: str, timeout: float = 30.0) -> tuple[int, dict]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request("GET", path)
        res = conn.getresponse()
        return res.status, json.loads(res.read())
    finally:
        conn.close()


@dataclass
class Load:
    """What ``load`` measured: each answer, its latency and the wall time."""

    clients: int
    answers: list[str | None]  # best translation per sentence (None: not answered with 200)
    latencies: list[float]  # seconds, per request
    seconds: float
    errors: list[str] = field(default_factory=list)

    @property
    def requests_per_s(self) -> float:
        return len(self.latencies) / max(self.seconds, 1e-9)

    def percentile(self, q: float) -> float:
        """Latency at quantile ``q`` (nearest rank), seconds."""
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def load(url: str, sentences: list[str], clients: int, extra: dict | None = None, timeout: float = 300.0) -> Load:
    """Send every sentence once as its own ``POST /translate``, from ``clients`` threads at once."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    answers: list[str | None] = [None] * len(sentences)
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    next_index = iter(range(len(sentences)))

    def client() -> None:
        conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
        try:
            while True:
                with lock:
                    i = next(next_index, None)
                if i is None:
                    return
                began = time.perf_counter()
                try:
                    status, body = post(conn, "/translate", {"text": sentences[i], **(extra or {})})
                except (OSError, http.client.HTTPException, ValueError) as e:
                    conn.close()
                    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
                    status, body = 0, {"error": f"{type(e).__name__}: {e}"}
                took = time.perf_counter() - began
                with lock:
                    latencies.append(took)
                    if status == 200:
                        answers[i] = body["translations"][0]["translation"]
                    else:
                        errors.append(f"{status}: {body.get('error')}")
        finally:
            conn.close()

    threads = [threading.Thread(target=client) for _ in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return Load(clients, answers, latencies, time.perf_counter() - start, errors)


def read_sentences(path: Path, n: int) -> list[str]:
    """The first ``n`` non-empty lines of ``path`` (gzipped if it ends in .gz), the file repeated if it has fewer."""
    text = gzip.decompress(path.read_bytes()).decode("utf-8") if path.suffix == ".gz" else path.read_text("utf-8")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return [lines[i % len(lines)] for i in range(n)]


def cli_speed(model_path: str | Path, source: Path, beam: int, env: dict[str, str] | None = None,
              cpus: set[int] | None = None) -> tuple[list[str], float]:
    """``inference.py --input``: its output lines and its own sentences/s (decoding, without model loading)."""
    res = subprocess.run(project_command("inference.py", "--model_path", model_path, "--input", source, "--beam",
                                         str(beam)), cwd=ROOT, capture_output=True, text=True, check=True, env=env,
                         preexec_fn=on_cpus(cpus))
    return res.stdout.split("\n")[:-1], cli_rate(res.stderr)


def cli_rate(stderr: str) -> float:
    """The sentences/s of ``inference.py --input``'s closing line, "translated N sentences in Xs (Y sentences/s[, T
    threads])" (not of a progress line, "N lines translated (Y sentences/s)"); RuntimeError without one."""
    speed = re.search(r"^translated \d+ sentences in [\d.]+s \(([\d.]+) sentences/s", stderr, re.M)
    if speed is None:
        raise RuntimeError(f"no speed line from inference.py: {stderr.strip()[-300:]}")
    return float(speed.group(1))


def measure(name: str, model_path: str | Path, sentences: list[str], clients: list[int], beam: int,
            out: Path, env: dict[str, str] | None = None, flags: tuple[str, ...] = (),
            cpus: set[int] | None = None) -> dict:
    """CLI then server (fresh processes, environment ``env``, server ``flags``; both on ``cpus`` if given) for
    one engine."""
    source = out / "sentences.fr"
    source.write_text("\n".join(sentences) + "\n", encoding="utf-8")
    expected, cli_rate = cli_speed(model_path, source, beam, env, cpus)
    result: dict = {"engine": name, "model_path": str(model_path), "cli_sentences_per_s": cli_rate, "loads": []}
    log_name = re.sub(r"[^\w.-]+", "-", name)  # "pytorch, in server" -> "pytorch-in-server"
    server = start_server(model_path, out / f"server.{log_name}.log", "--beam", str(beam), *flags, env=env,
                          cpus=cpus)
    try:
        load(server.url, sentences[:4], 1)  # warm-up
        for n in clients:
            before = get(server.url, "/health")[1]
            got = load(server.url, sentences, n)
            after = get(server.url, "/health")[1]
            same = sum(a == b for a, b in zip(got.answers, expected, strict=True))
            result["loads"].append({
                "clients": n, "requests": len(got.latencies), "answered": sum(a is not None for a in got.answers),
                "same_as_cli": same, "requests_per_s": round(got.requests_per_s, 2),
                "p50_ms": round(1000 * got.percentile(0.50), 1), "p99_ms": round(1000 * got.percentile(0.99), 1),
                "batches": after["batches"] - before["batches"],
                "mean_batch": mean_batch(before, after),
                "engine_busy": round((after["busy_s"] - before["busy_s"]) / max(got.seconds, 1e-9), 3),
                "ratio_to_cli": round(got.requests_per_s / cli_rate, 3), "errors": got.errors[:3]})
            print(f"{name}: {n} clients, {got.requests_per_s:.1f} requests/s", file=sys.stderr, flush=True)
    finally:
        server.stop()
    return result


def mean_batch(before: dict, after: dict) -> float:
    """Sentences decoded together, between two ``/health`` readings: per engine call (static batching), or per
    decoder step, the sentences decoding at that step (continuous batching)."""
    steps = after.get("steps", 0) - before.get("steps", 0)
    if steps > 0:
        return round((after["step_sentences"] - before["step_sentences"]) / steps, 1)
    return round((after["sentences"] - before["sentences"]) / max(1, after["batches"] - before["batches"]), 1)


def table(results: list[dict], sentences: int, beam: int) -> str:
    lines = [f"{sentences} sentences, one per request, beam {beam}:", "",
             "| engine | clients | requests/s | p50 ms | p99 ms | server / CLI | batches | mean batch | engine busy | "
             "same as CLI | CLI sentences/s |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        for x in r["loads"]:
            lines.append(f"| {r['engine']} | {x['clients']} | {x['requests_per_s']:.1f} | {x['p50_ms']:.1f} | "
                         f"{x['p99_ms']:.1f} | {x['ratio_to_cli']:.2f}x | {x['batches']} | {x['mean_batch']:.1f} | "
                         f"{100 * x['engine_busy']:.0f}% | "
                         f"{x['same_as_cli']}/{x['requests']} | {r['cli_sentences_per_s']:.1f} |")
    return "\n".join(lines) + "\n"


def cpu_name() -> str:
    name = cpu_model()
    return "unknown CPU" if name is None else name


def build_parser() -> argparse.ArgumentParser:
    """The command line of bench/serve_load.py."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model_path", "--model-path", required=True, help="run directory (PyTorch)")
    parser.add_argument("--ct2", help="a CTranslate2 export of the run to measure too ('auto': export it first)")
    parser.add_argument("--pin", action="store_true",
                        help="the load generator on half of the cores, the CLI and the server (with its decoding "
                             "process) on the other half: the server's own work compared with the CLI's alone")
    parser.add_argument("--in-server", "--in_server", action="store_true",
                        help="also measure the PyTorch server decoding in its own process (--decode-in-server)")
    parser.add_argument("--static", action="store_true",
                        help="also measure the PyTorch server with static batching (--batching static) beside its "
                             "default, continuous batching")
    parser.add_argument("--input", default=str(ROOT / "data" / "demo" / "test.fr"),
                        help="source sentences, one per line (.gz read as gzip)")
    parser.add_argument("--sentences", type=int, default=200, help="requests per load level (default 200)")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32], help="concurrent clients")
    parser.add_argument("--beam", type=int, default=5, help="beam size, CLI and server (default 5)")
    parser.add_argument("--out", default="runs/serve_load", help="folder for the report (default runs/serve_load)")
    parser.add_argument("--threads", type=int,
                        help="OMP_NUM_THREADS of the CLI and server processes (default: as set, else every core)")
    return parser


def main() -> int:
    parser = build_parser()
    args = parser.parse_args()
    if args.sentences < 1 or min(args.clients) < 1 or args.beam < 1:
        parser.error("--sentences, --clients and --beam must be >= 1")
    if args.pin and len(os.sched_getaffinity(0)) < 2:
        parser.error("--pin needs at least 2 cores (the load generator on half, the server on the other half)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sentences = read_sentences(Path(args.input), args.sentences)
    engines: list[tuple[str, str | Path, tuple[str, ...]]] = [("pytorch", args.model_path, ())]
    if args.static:
        engines.append(("pytorch, static", args.model_path, ("--batching", "static")))
    if args.in_server:
        engines.append(("pytorch, in server", args.model_path, ("--decode-in-server",)))
    if args.ct2 == "auto":
        subprocess.run(project_command("inference.py", "--model_path", args.model_path, "--export-ctranslate2",
                                       out / "ct2"), cwd=ROOT, check=True)
        engines.append(("ctranslate2", out / "ct2", ()))
    elif args.ct2:
        engines.append(("ctranslate2", args.ct2, ()))
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)} if args.threads else None
    server_cpus = None
    if args.pin:  # the clients on the first half of the cores, the CLI and the server on the other half
        cpus = sorted(os.sched_getaffinity(0))
        half = len(cpus) // 2
        server_cpus = set(cpus[half:])
        os.sched_setaffinity(0, set(cpus[:half]))
    results = [measure(name, path, sentences, args.clients, args.beam, out, env, flags, server_cpus)
               for name, path, flags in engines]
    cores = os.cpu_count()
    threads = args.threads or os.environ.get("OMP_NUM_THREADS") or "default"
    pinned = f", server and CLI on cores {sorted(server_cpus)}, clients on the others" if server_cpus else ""
    report = (f"CPU: {cpu_name()} ({cores} cores{pinned}), OMP_NUM_THREADS={threads}\n\n"
              + table(results, args.sentences, args.beam))
    print(report)
    (out / "serve_load.md").write_text(report)
    (out / "serve_load.json").write_text(json.dumps({"cpu": cpu_name(), "cores": cores, "threads": threads,
                                                     "beam": args.beam, "sentences": args.sentences,
                                                     "server_cpus": sorted(server_cpus) if server_cpus else None,
                                                     "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    from utils.cli import run_main

    run_main(main)
