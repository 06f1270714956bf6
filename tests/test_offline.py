"""IWSLT2017 without the Hub: ``train.py`` stops in seconds with one line naming the local sources."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _train(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """``train.py ARGS`` with the Hub endpoint on a closed port of 127.0.0.1, HF_HUB_OFFLINE unset, an empty
    Hugging Face cache and no proxy: (the finished process, its wall seconds)."""
    with socket.socket() as s:  # a port nothing listens on: connections are refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items()
           if k != "HF_HUB_OFFLINE" and not k.lower().endswith("_proxy")}
    env.update(HF_ENDPOINT=f"http://127.0.0.1:{port}", HF_HOME=str(tmp_path / "hf_home"),
               NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "train.py", "--runs", str(tmp_path / "runs"), *args], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    return res, time.monotonic() - t0


def test_iwslt2017_without_the_hub_fails_fast_in_one_line(tmp_path: Path) -> None:
    # The same start stopping at once on a missing config: what any error costs on this machine (imports).
    base, base_s = _train(tmp_path, "--config", str(tmp_path / "missing.yaml"))
    assert base.returncode == 2 and base.stderr.startswith("error: config file not found")
    res, seconds = _train(tmp_path, "--config", "configs/iwslt2017_rope.yaml")
    assert res.returncode != 0
    lines = res.stderr.splitlines()
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1, res.stderr
    assert "IWSLT2017" in errors[0] and "unreachable" in errors[0]
    assert "data.source=wit3" in errors[0] and "data.path=" in errors[0] and "data.source=text" in errors[0]
    assert "Traceback" not in res.stderr and "Retrying" not in res.stderr
    assert len(lines) - 1 < 3, res.stderr  # no warning per retry
    # Before: about 24 retry lines over 30-45 s (the Hub client waits 1+2+4+8+8 s between its tries).
    assert seconds < max(10.0, base_s + 5.0), (seconds, base_s)
    assert not (tmp_path / "runs").exists()  # nothing written
