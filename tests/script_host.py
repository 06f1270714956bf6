"""Run a project script (``python SCRIPT ARGS`` from the project root) as ``__main__`` in an interpreter that
has already imported torch: ``run_here`` in the calling process, or ``main`` as a kept helper process that runs the
scripts it is sent one after another (what tests/conftest.py's ``run_script`` uses for a command given a CTranslate2
export, whose thread pool and PyTorch's fight in one process: a process of their own, started once per test
worker instead of once per command)."""

from __future__ import annotations

import io
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_here(script: str, args: list[str], stdin: str | None, fds: bool = False) -> tuple[int, str, str]:
    """Run ``script`` with ``args`` in this process: ``(exit status, standard output, standard error)``. What the
    script changes in the process is put back: argv, standard streams, working directory, environment, torch's
    thread count, signal handlers, logging handlers and levels, warning filters. ``fds``: capture at the file
    descriptors, so that what C code writes (CTranslate2's warnings) is kept in order with Python's output."""
    import logging
    import runpy
    import signal
    import traceback
    import warnings

    import torch

    saved_streams, saved_argv, saved_cwd = (sys.stdin, sys.stdout, sys.stderr), sys.argv, os.getcwd()
    saved_path = list(sys.path)
    saved_env, saved_threads = dict(os.environ), torch.get_num_threads()
    saved_signals = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1,
                                                      signal.SIGUSR2)}
    loggers = [logging.getLogger(), *(x for x in logging.Logger.manager.loggerDict.values()
                                      if isinstance(x, logging.Logger))]
    saved_logs = {id(x): (x, list(x.handlers), x.level) for x in loggers}
    out, err = (tempfile.TemporaryFile() for _ in range(2)) if fds else (io.BytesIO(), io.BytesIO())
    saved_fds = (os.dup(1), os.dup(2)) if fds else ()
    if fds:  # what C code writes to the standard streams lands in the same files, in order
        sys.stdout.flush(), sys.stderr.flush()
        os.dup2(out.fileno(), 1), os.dup2(err.fileno(), 2)
    stdout, stderr = (io.TextIOWrapper(io.FileIO(fd, "w", closefd=False) if fds else buf, encoding="utf-8",
                                       write_through=True) for fd, buf in ((1, out), (2, err)))
    code = 0
    try:
        with warnings.catch_warnings():
            sys.argv = [script, *args]
            sys.stdin = io.TextIOWrapper(io.BytesIO((stdin or "").encode("utf-8")), encoding="utf-8")
            sys.stdout, sys.stderr = stdout, stderr
            os.chdir(ROOT)
            sys.path.insert(0, str((ROOT / script).parent))  # as ``python SCRIPT`` has it
            try:
                runpy.run_path(str(ROOT / script), run_name="__main__")
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                if e.code is not None and not isinstance(e.code, int):
                    print(e.code, file=sys.stderr)
            except BaseException:  # what the interpreter does with an uncaught exception
                traceback.print_exc(file=stderr)
                code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None and not stream.closed:
                stream.flush()
        sys.stdin, sys.stdout, sys.stderr = saved_streams
        for fd, saved in zip((1, 2), saved_fds, strict=False):  # none without fds
            os.dup2(saved, fd)
            os.close(saved)
        sys.argv, sys.path[:] = saved_argv, saved_path
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        torch.set_num_threads(saved_threads)
        for sig, handler in saved_signals.items():
            signal.signal(sig, handler)
        for x in [logging.getLogger(), *(x for x in logging.Logger.manager.loggerDict.values()
                                         if isinstance(x, logging.Logger))]:
            own, handlers, level = saved_logs.get(id(x), (x, [], logging.NOTSET))
            for h in x.handlers:
                if h not in handlers:
                    h.close()
            x.handlers[:] = handlers
            x.setLevel(level)
    texts = []
    for buf in (out, err):
        if fds:
            buf.seek(0)
        texts.append((buf.read() if fds else buf.getvalue()).decode("utf-8", "replace"))
        buf.close()
    return code, texts[0], texts[1]


def main() -> None:
    """Serve ``run_here`` over the standard streams: one JSON line ``{"script", "args", "stdin", "env"}`` in, one
    ``{"code", "stdout", "stderr"}`` out, until standard input ends. The script runs under the sender's
    environment; what it writes to the standard streams, at any level, is captured and never reaches the replies."""
    sys.path.insert(0, str(ROOT))
    requests, replies = sys.stdin, os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # stray output between requests goes to standard error, never into a reply
    for line in requests:
        request = json.loads(line)
        os.environ.clear()
        os.environ.update(request["env"])
        code, out, err = run_here(request["script"], request["args"], request["stdin"], fds=True)
        replies.write(json.dumps({"code": code, "stdout": out, "stderr": err}) + "\n")
        replies.flush()


if __name__ == "__main__":
    main()
