"""Shared test fixtures: isolate Hugging Face caches and locate the shared data folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from script_host import run_here

from utils.config import Config, from_dict

ROOT = Path(__file__).resolve().parents[1]
T = TypeVar("T")

SHARED_DATA = Path(os.environ.get("FR2EN_SHARED_DATA", Path(__file__).resolve().parents[1] / ".." / "shared" / "data"))


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (``-n``), each worker and the processes it starts run on CPUs of their own, which no
    other worker uses: worker i gets every n-th of the allowed CPUs from the i-th on (n workers), so two workers
    on two cores never share one (training caps its threads at the CPUs it may use; two threads on one core only
    wait for each other). On machines with SMT, two such CPUs may be siblings of one core."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    cores = sorted(os.sched_getaffinity(0))
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if worker.startswith("gw") and 1 < workers <= len(cores):
        mine = [c for i, c in enumerate(cores) if i % workers == int(worker[2:]) % workers]
        os.sched_setaffinity(0, mine)
        os.environ["OMP_NUM_THREADS"] = str(len(mine))
        import torch

        torch.set_num_threads(len(mine))


#: Seconds each test took in CI (``pytest --durations=0`` on 2 idle cores, summed per test over its phases),
#: refreshed with ``python tests/durations.py LOG``: what orders the work below.
DURATIONS = Path(__file__).with_name("durations.json")


def work_unit(item: pytest.Item) -> str:
    """What one xdist worker runs as a whole: the test's file where the file's tests share a module- or
    class-scoped fixture (built once), else the test alone (any free worker can take it)."""
    shared = any(d.scope in ("module", "class", "package") for defs in item._fixtureinfo.name2fixturedefs.values()
                 for d in defs)
    return item.nodeid.split("::")[0] if shared else recorded(item.nodeid)


#: A work unit recorded at this many seconds or more is ``slow`` (``-m "not slow"``, the fast lane, leaves it out).
SLOW_SECONDS = 2.0


def _loadgroup(config: pytest.Config) -> bool:
    return config.getoption("dist", "no") == "loadgroup" or bool(getattr(config.option, "loadgroup", False))


def pytest_itemcollected(item: pytest.Item) -> None:
    """Under ``--dist loadgroup``, each test joins its work unit's group as it is collected, and its id names the
    group (``<id>@<group>``): pytest-xdist's scheduler sends a group to one worker whole. (pytest-xdist 3.8 writes
    that id to ``item._nodeid``, which pytest 9 no longer reads: the id is set here.)"""
    if _loadgroup(item.config) and os.environ.get("PYTEST_XDIST_WORKER"):
        from _pytest.nodeid import NodeId

        unit = work_unit(item)
        item.add_marker(pytest.mark.xdist_group(unit))
        if GROUP_MARK not in item.nodeid:
            item._id = NodeId.parse(f"{item.nodeid}@{unit}")


GROUP_MARK = "@tests/"  # a test id's pytest-xdist group suffix: "@" and the group, a test file or a test's id


def recorded(nodeid: str) -> str:
    """A test's id as tests/durations.json records it: without pytest-xdist's ``@<group>``."""
    return nodeid.split(GROUP_MARK, 1)[0]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test of a work unit recorded at ``SLOW_SECONDS`` or more (tests/durations.json) is marked ``slow``, as
    are those marked so by hand (new tests that train, start a server, a browser or a study). Under ``--dist
    loadgroup`` the units are queued longest first by their recorded time, so the long ones start at once and the
    short ones fill the end (the longest-processing-time rule; unknown tests count 1 s)."""
    seconds = json.loads(DURATIONS.read_text(encoding="utf-8")) if DURATIONS.is_file() else {}
    units: dict[str, float] = {}
    for item in items:
        unit = work_unit(item)
        units[unit] = units.get(unit, 0.0) + float(seconds.get(recorded(item.nodeid), 1.0))
    for item in items:
        if units[work_unit(item)] >= SLOW_SECONDS:
            item.add_marker(pytest.mark.slow)
    if _loadgroup(config):
        items.sort(key=lambda item: -units[work_unit(item)])  # stable: a file keeps its own order


@pytest.fixture(autouse=True)
def _isolated_hf_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Hub's cache (~/.cache/huggingface), where the iwslt2017 source looks for its archive: a temp dir."""
    home = tmp_path_factory.getbasetemp() / "hf_home"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", os.environ.get("HF_HUB_OFFLINE", "1"))


@pytest.fixture(autouse=True)
def _root_logging_put_back() -> Iterator[None]:
    """A script's ``main`` run in a test (``visualize.main()`` under ``capsys``) sets up logging for the process:
    the root logger's handlers and level are put back after each test, so none outlives the test into another's
    output."""
    import logging

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in root.handlers:
        if h not in handlers:
            h.close()
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture
def shared_data() -> Path:
    """The real data folder (../shared/data); tests needing it skip only where it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA} (set FR2EN_SHARED_DATA)")
    return SHARED_DATA.resolve()


_BUILT: dict[str, Any] = {}


def once(key: str, build: Callable[[], T]) -> T:
    """``build()``'s result, built once per worker process under ``key``: a module fixture that pytest-xdist tears
    down and sets up again (it does when a worker's queue runs dry between two tests of the file) gets the same
    trained run back instead of training it again."""
    if key not in _BUILT:
        _BUILT[key] = build()
    return _BUILT[key]


def f32_sum(values: list[float]) -> float:
    """The float32 running sum of ``values`` (the order and precision a search adds log-probabilities in)."""
    import torch

    total = torch.zeros((), dtype=torch.float32)
    for v in values:
        total = total + torch.tensor(v, dtype=torch.float32)
    return float(total)


def make_tiny_config(tmp: Path, **train_kw) -> Config:
    """The demo config shrunk to a model that trains in seconds; cache under ``tmp``."""
    raw = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    raw["name"] = "tiny"
    raw["data"].update(cache_dir=str(tmp / "cache"), max_tokens=300)
    raw["tokenizer"]["vocab_size"] = 400
    raw["model"].update(d_model=32, n_heads=2, encoder_layers=1, decoder_layers=1, d_ff=64, attention_pe="rope")
    raw["train"].update({"epochs": 3, "log_every": 2, "valid_bleu_sentences": 8, "warmup_steps": 10,
                         "keep_checkpoints": 0, "checkpoint_every": 0, **train_kw})  # periodic ones when asked
    raw["decode"].update(beam=2, batch_size=16)
    return from_dict(raw)


# configs/demo.yaml shrunk for the command line: a d 32 model, 3 optimizer steps, greedy, short outputs.
TINY_CLI = ["model.d_model=32", "model.n_heads=2", "model.encoder_layers=1", "model.decoder_layers=1",
            "model.d_ff=64", "tokenizer.vocab_size=400", "data.max_tokens=300", "train.max_steps=3",
            "train.eval_every=3", "train.valid_bleu_sentences=2", "train.log_attention_every=0",
            "train.num_threads=1", "decode.beam=1", "decode.max_len_a=0", "decode.max_len_b=8"]


def train_cli(tmp: Path, *sets: str) -> subprocess.CompletedProcess[str]:
    """``train.py --config configs/demo.yaml`` (in this process, ``run_script``) with ``TINY_CLI`` then ``sets``
    (``--set`` each), cache under
    ``tmp/cache``, runs under ``tmp/runs`` (the run: ``tmp/runs/demo_latest``)."""
    args = [a for s in [*TINY_CLI, f"data.cache_dir={tmp / 'cache'}", *sets] for a in ("--set", s)]
    return run_script("train.py", "--config", str(ROOT / "configs" / "demo.yaml"), "--runs", str(tmp / "runs"), *args)


def translate_cli(run: Path, sources: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    """``inference.py --model_path run --input - --threads 1`` (in this process) on ``sources``, one per line, with
    ``args`` (one
    thread: decoding beside other work is many times slower with two, README "Threads")."""
    return run_script("inference.py", "--model_path", str(run), "--input", "-", "--threads", "1", *args,
                      stdin="".join(f"{s}\n" for s in sources))


def run_script(script: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """``python SCRIPT ARGS`` (from the project root) run in this process, as its ``__main__``: its exit status,
    standard output and standard error, as ``subprocess.run(..., capture_output=True, text=True)`` gives them,
    without starting an interpreter and importing torch again (about 2 s a call). What a script changes in the
    process is put back: argv, standard streams, working directory, environment, torch's thread count, signal
    handlers, logging handlers and levels, warning filters. Behaviour of the process itself (closed streams,
    signals, exit at interpreter shutdown, child processes' environment) is tested with a real subprocess. A command
    given a CTranslate2 export runs in ``SCRIPT_HOST``, a process of its own (its thread pool and PyTorch's fight in
    one process)."""
    if any(_is_export(a) for a in args):
        return SCRIPT_HOST.run(script, list(args), stdin)
    code, out, err = run_here(script, list(args), stdin)
    return subprocess.CompletedProcess([sys.executable, script, *args], code, out, err)


def kept_run(seed_folder: Path, train_s: float, decode_s: float, stamp: str = "20261130_000000") -> Path:
    """A run as a kept record holds it, in ``seed_folder``: train.log's closing summary of ``train_s`` seconds on one
    thread, and a score file of ``last`` decoded in ``decode_s`` seconds on one."""
    run = seed_folder / f"bench_short_{stamp}"
    (run / "eval").mkdir(parents=True)
    summary = json.dumps({"steps": 900, "train_seconds": train_s, "eval_seconds": 0.0, "threads": 1})
    (run / "train.log").write_text("00:00:00 train: model: 0.10M parameters on cpu (world size 1); positions: rope\n"
                                   f"00:55:00 train: trained 900 optimizer steps, 1 target tokens in 1 s | stats "
                                   f"{summary}\n")
    (run / "eval" / "test.tatoeba.last.beam5.json").write_text(json.dumps({"seconds": decode_s, "threads": 1,
                                                                             "step": 900}))
    return run


def kept_run_archive(runs: Path, out: Path, study: str, system: str, seed: int, train_s: float,
                     decode_s: float) -> Path:
    """``OUT``, the archive ``bench/worktree.sh``'s ``keep_runs`` makes of one ``kept_run`` in
    ``RUNS/STUDY/runs/SYSTEM/seedN/``."""
    folder = f"{study}/runs/{system}/seed{seed}"
    kept_run(runs / folder, train_s, decode_s)
    res = subprocess.run(["bash", "-c", f'source {ROOT}/bench/worktree.sh\nkeep_runs "$1" "$2" "$3"', "-", str(runs),
                          str(out), folder], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and out.is_file(), res.stdout + res.stderr
    return out


PILOT_QUANTITIES = [("test.tatoeba.x4", "score"), ("test.tatoeba.x4", "drop"), ("test.multi30k-2016.x4", "score"),
                    ("test.multi30k-2016.x4", "drop")]  # the second study's primary family, as the pilot scores it


def pilot_arm(sd: float, chrf: float, pooled: float = 0.5, overrides: tuple[str, ...] = ()) -> dict:
    """A scored noise-pilot arm (its results.json: sinusoidal and RoPE) whose trained systems' residual SD is ``sd``:
    RoPE's per-seed differences from sinusoidal on each quantity have variance 2 sd^2 (six seeds); RoPE+NTK, a decoding
    of the same models, has none (it is left out); the ANOVA's pooled residual is ``pooled``. Every trained system
    scores ``chrf`` at x1 on both sets."""
    unit = [-1.0, 1.0, -1.0, 1.0, -2.0, 2.0]  # variance 2.4
    delta = [3.0 + x * sd * (2 / 2.4) ** 0.5 for x in unit]
    tests = [{"system": system, "against": "sinusoidal", "quantity": {"split": split, "kind": kind},
              "per_seed_delta": delta if system == "rope" else [1.0] * 6}
             for system in ("rope", "rope+ntk") for split, kind in PILOT_QUANTITIES]
    splits = {s: {"beam5": {"chrf": [chrf + d for d in (-0.5, 0.5, -0.25, 0.25, -1.0, 1.0)]}}
              for s in ("test.tatoeba", "test.multi30k-2016", "test.tatoeba.x4")}
    systems = ("sinusoidal", "rope")
    return {"spec": {"variants": [{"label": s} for s in systems], "overrides": ["train.num_threads=1", *overrides]},
            "seeds": [1, 2, 3, 4, 5, 6], "baseline": "sinusoidal",
            "systems": {**{s: {"splits": splits} for s in systems},
                        "rope+ntk": {"splits": {"test.tatoeba": {"beam5": {"chrf": [0.0] * 6}}}}},
            "primary": {"tests": tests, "power": {"pooled_residual_sd": pooled, "df": 15, "seeds": 6}}}


def results_doc(**keys: Any) -> dict[str, Any]:
    """A study's ``results.json`` made by hand: ``keys`` over the least every reader of one needs
    (``utils.study.files.RESULTS_KEYS``, each of the kind a study writes)."""
    return {"spec": {}, "systems": {}, "seeds": [], "splits": [], "baseline": "sinusoidal", **keys}


def _is_export(arg: str) -> bool:
    """Whether a command-line argument names a CTranslate2 export (a folder holding its marker file)."""
    try:
        return "\n" not in arg and Path(arg, "fr2en_ctranslate2.json").is_file()
    except OSError:  # not a path: too long a name, or one the system refuses
        return False


class ScriptHost:
    """One kept Python process (tests/script_host.py) that runs the scripts ``run_script`` gives a CTranslate2
    export, one after another: each in a process of its own kind (CTranslate2's thread pool and PyTorch's fight in
    one process), without an interpreter and a torch import per command. Started on first use; one that died (a
    crash, a timeout) is replaced for the next command."""

    def __init__(self) -> None:
        self.process: subprocess.Popen[str] | None = None

    def run(self, script: str, args: list[str], stdin: str | None,
            timeout: float = 600.0) -> subprocess.CompletedProcess[str]:
        import select

        if self.process is None or self.process.poll() is not None:
            self.process = subprocess.Popen([sys.executable, str(Path(__file__).with_name("script_host.py"))],
                                            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        proc = self.process
        assert proc.stdin is not None and proc.stdout is not None
        request = {"script": script, "args": args, "stdin": stdin, "env": dict(os.environ)}
        proc.stdin.write(json.dumps(request) + "\n")
        proc.stdin.flush()
        ready, _, _ = select.select([proc.stdout], [], [], timeout)
        line = proc.stdout.readline() if ready else ""
        if not line:  # it died, or hangs: a command that never ended, as subprocess.run reports it
            proc.kill()
            proc.wait()
            self.process = None
            if not ready:
                raise subprocess.TimeoutExpired([sys.executable, script, *args], timeout)
            return subprocess.CompletedProcess([sys.executable, script, *args], proc.returncode, "", "")
        reply = json.loads(line)
        return subprocess.CompletedProcess([sys.executable, script, *args], reply["code"], reply["stdout"],
                                           reply["stderr"])

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()


SCRIPT_HOST = ScriptHost()


@pytest.fixture(scope="session", autouse=True)
def _script_host_closed() -> Iterator[None]:
    yield
    SCRIPT_HOST.close()


@pytest.fixture
def tiny_config() -> Callable[..., Config]:
    return make_tiny_config


@pytest.fixture
def train_tiny(tmp_path: Path) -> Callable[..., dict]:
    """Train the tiny config with ``train`` overrides into ``tmp_path/runs_<label>``; its last weights."""

    def run(label: str, **train_kw) -> dict:
        from utils.run.checkpoint import load_checkpoint
        from utils.run.store import create_run_dir
        from utils.training.loop import train

        cfg = make_tiny_config(tmp_path, **train_kw)
        run_dir = create_run_dir(cfg, tmp_path / f"runs_{label}")
        train(cfg, run_dir)
        return load_checkpoint(run_dir / "checkpoints" / "last.pt")["model"]

    return run


def train_tiny_run(tmp: Path, sets: list[str], **train_kw) -> Path:
    """``make_tiny_config`` (``train`` keys ``train_kw``) with ``--set`` ``sets``, trained in this process on one
    thread into ``tmp/runs`` (the caller's thread count restored); the run directory."""
    import torch

    from utils.run.store import create_run_dir
    from utils.training.loop import train

    cfg = from_dict(make_tiny_config(tmp, num_threads=1, **train_kw).to_dict(), sets)
    run = create_run_dir(cfg, tmp / "runs")
    threads = torch.get_num_threads()
    try:
        train(cfg, run)
    finally:
        torch.set_num_threads(threads)
    return run


def assert_same_weights(a: dict, b: dict, rtol: float = 1e-4, atol: float = 1e-5) -> None:
    """Two trainings' weights equal up to float rounding. A key projection's bias has zero gradient in exact
    arithmetic and Adam scales its rounding noise to full steps: only its values' half is compared."""
    import torch

    assert a.keys() == b.keys()
    for name, tensor in b.items():
        other = a[name]
        if name.endswith("kv_proj.bias"):
            other, tensor = other.chunk(2)[1], tensor.chunk(2)[1]
        torch.testing.assert_close(other, tensor, rtol=rtol, atol=atol, msg=name)


@pytest.fixture
def study_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """bench/study.py's train.py and test.py commands run in this process (``run_script``), one at a time, each
    one's output appended to its log as the subprocess's would be and its progress said as usual: no interpreter
    and torch start-up per command. A failed command stops the study as a failed process does. Tests of the
    processes themselves (a killed study, progress while runs go on, the launchers) keep the real ones."""
    import utils.study.plan as plan

    def run(commands: list[tuple[str, list[str], Path]], devices: int, poll: float, jobs: int, progress: Any) -> None:
        for label, cmd, log in commands:
            log.parent.mkdir(parents=True, exist_ok=True)
            progress.say(f"  {label}: {' '.join(map(str, cmd[1:]))}")
            progress.started(label, log, resumed="--resume" in cmd)
            res = run_script(*map(str, cmd[1:]))
            with open(log, "a", encoding="utf-8") as f:
                f.write(res.stdout + res.stderr)
            progress.ended(label, ok=res.returncode == 0)
            if res.returncode != 0:
                raise SystemExit(f"study: {label} failed (exit {res.returncode}); see {log}")

    monkeypatch.setattr(plan, "_run_commands", run)


def run_study(tmp: Path, *extra: str, grid: str = "model.attention_pe=none,rope",
              name: str = "t", cache: Path | None = None, process: bool = False) -> subprocess.CompletedProcess[str]:
    """``bench/study.py`` on a tiny grid of the demo config (2 seeds of 8 steps, validation BLEU on 6 sentences, 12
    test sentences scored) under
    ``tmp`` (the study: ``tmp/study_<name>``), in this process unless ``process``."""
    cmd = ["bench/study.py", "--config", "configs/demo.yaml", "--grid",
           grid, "--set", "model.input_pe=none", "--set", "data.cache_dir=" + str(cache or tmp / "c"),
           "--set", "model.d_model=32", "--set", "model.d_ff=64", "--set", "model.encoder_layers=1",
           "--set", "model.decoder_layers=1", "--set", "train.valid_bleu_sentences=6", "--seeds", "2", "--steps", "8",
           "--eval-every", "4", "--name", name,
           "--runs", str(tmp), "--max-sentences", "12", "--attention-sentences", "6", "--bootstrap", "100", *extra]
    if process:  # its own process (e.g. to see a run this one locks as another's)
        return subprocess.run([sys.executable, *cmd], cwd=ROOT, capture_output=True, text=True, timeout=900)
    return run_script(*cmd)


def wait_for(condition: Callable[[], object], timeout: float = 15.0) -> None:
    """Poll ``condition`` every 10 ms until it is true; AssertionError after ``timeout`` seconds."""
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


@contextmanager
def serving_app(app: Any, config: Callable[[Any], Any] | None = None) -> Iterator[int]:
    """``app`` (``utils.serve.app.create_app``) behind uvicorn in a thread of this process, on a free port of
    127.0.0.1 -> the port. ``config``: the app -> its ``uvicorn.Config`` (default: uvicorn's, quiet)."""
    import socket
    import threading

    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(config(app) if config else uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_for(lambda: server.started)
    try:
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(10)
