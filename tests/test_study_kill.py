"""A study killed with SIGKILL: its train.py child dies with it (saving last.pt), a rerun never removes or trains
in a directory another process writes, and the resumed study ends exactly where an uninterrupted one does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from conftest import ROOT

from utils.run.checkpoint import load_checkpoint


def study_cmd(runs: Path, cache: Path) -> list[str]:
    return [sys.executable, "bench/study.py", "--config", "configs/demo.yaml", "--grid", "model.attention_pe=rope",
            "--set", "model.input_pe=none", "--set", f"data.cache_dir={cache}", "--set", "model.d_model=32",
            "--set", "model.d_ff=64", "--set", "model.encoder_layers=1", "--set", "model.decoder_layers=1",
            "--set", "train.log_every=1", "--set", "train.valid_bleu_sentences=4", "--seeds", "1", "--steps", "24",
            "--eval-every", "12", "--name", "k",
            "--runs", str(runs), "--train-only"]


def children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.is_file() and stat.read_text().split(")")[-1].split()[0] == "Z")


def test_a_killed_study_takes_its_child_along_and_resumes_to_the_same_weights(tmp_path: Path) -> None:
    straight = subprocess.run(study_cmd(tmp_path / "a", tmp_path / "c"), cwd=ROOT, capture_output=True, text=True,
                              timeout=900)
    assert straight.returncode == 0, straight.stdout + straight.stderr

    study = subprocess.Popen(study_cmd(tmp_path / "b", tmp_path / "c"), cwd=ROOT, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    log = tmp_path / "b" / "study_k" / "runs" / "attention_pe_rope" / "seed1" / "study.log"
    deadline = time.monotonic() + 600
    while not (log.is_file() and " step 3 " in log.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    child = children(study.pid)
    assert len(child) == 1, log.read_text() if log.is_file() else "no log"
    study.send_signal(signal.SIGKILL)
    study.wait()
    deadline = time.monotonic() + 120
    while alive(child[0]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(child[0])  # the child died with the study (it used to train on as an orphan)
    text = log.read_text()
    assert "SIGTERM received" in text and "Traceback" not in text

    resumed = subprocess.run(study_cmd(tmp_path / "b", tmp_path / "c"), cwd=ROOT, capture_output=True, text=True,
                             timeout=900)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "1 runs, 0 trained, 1 to train" in resumed.stdout and "--resume" in resumed.stdout
    a, b = (next((tmp_path / x / "study_k" / "runs" / "attention_pe_rope" / "seed1").glob("demo_*"))
            for x in ("a", "b"))
    wa, wb = (load_checkpoint(r / "checkpoints" / "last.pt") for r in (a, b))
    assert wa["trainer"]["iteration"] == wb["trainer"]["iteration"] == 24
    assert all(torch.equal(wa["model"][k], wb["model"][k]) for k in wa["model"])
    assert "Traceback" not in log.read_text()


def test_ctrl_c_on_a_study_stops_its_run_once_and_saves_last_pt(tmp_path: Path) -> None:
    """Ctrl-C (SIGINT to the study's process group) reaches its train.py twice: from the terminal, and as the death
    signal of the study when it exits. That is one stop: the step is finished and last.pt saved (it used to abort
    without saving, losing everything since the last checkpoint). The child is held (SIGSTOP) until the study has
    died, so both signals are pending when it resumes, whatever the step's length; they may arrive in either order."""
    # Its own group, as in a terminal, and Ctrl-C's default action: a suite started in the background (`cmd &`
    # in a shell without job control) inherits SIGINT ignored, which would make the study deaf to it.
    study = subprocess.Popen(study_cmd(tmp_path / "b", tmp_path / "c"), cwd=ROOT, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    log = tmp_path / "b" / "study_k" / "runs" / "attention_pe_rope" / "seed1" / "study.log"
    deadline = time.monotonic() + 600
    while not (log.is_file() and " step 3 " in log.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    (child,) = children(study.pid)
    os.kill(child, signal.SIGSTOP)
    os.killpg(study.pid, signal.SIGINT)  # Ctrl-C
    assert study.wait(timeout=120) == 130  # "interrupted"
    os.kill(child, signal.SIGCONT)  # now holding SIGINT and the study's death signal (SIGTERM)
    deadline = time.monotonic() + 120
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    text = log.read_text()
    # The two pending signals reach the process in either order (a worker thread may take one first): whichever comes
    # second is recognised as the dead parent's and absorbed, not taken as "again to abort".
    first = [s for s in ("SIGINT", "SIGTERM") if f"{s} received: finishing this step" in text]
    assert len(first) == 1, text[-2000:]
    second = "SIGTERM" if first == ["SIGINT"] else "SIGINT"
    assert f"{second}: the parent process ended; still finishing this step" in text, text[-2000:]
    assert "Engine run is terminating due to exception" not in text, text[-2000:]
    stopped = [line for line in text.splitlines() if "stop requested by a signal" in line]
    assert len(stopped) == 1, text[-2000:]
    step = int(stopped[0].split("stopping at step ")[1].split(":")[0])
    run = next((tmp_path / "b" / "study_k" / "runs" / "attention_pe_rope" / "seed1").glob("demo_*"))
    assert step >= 3 and load_checkpoint(run / "checkpoints" / "last.pt")["trainer"]["iteration"] == step


def test_a_second_signal_aborts_unless_it_is_the_dying_parents() -> None:
    from utils.training.guards import StopRequest

    def aborts(sig: signal.Signals) -> bool:
        try:
            os.kill(os.getpid(), sig)
        except KeyboardInterrupt:
            return True
        return False

    with StopRequest() as stop:  # Ctrl-C twice on train.py: the second aborts
        assert not aborts(signal.SIGINT) and stop.reason == "SIGINT"
        assert aborts(signal.SIGINT)
    with StopRequest() as stop:
        assert not aborts(signal.SIGINT)
        stop._parent = -1  # the parent has died since the start: its death signal is the same stop, once
        assert not aborts(signal.SIGTERM) and stop.reason == "SIGINT"
        assert aborts(signal.SIGINT)  # asked again after that: stop now
    with StopRequest() as stop:  # the same two signals in the other order (the kill's SIGTERM reached it first)
        assert not aborts(signal.SIGTERM)
        stop._parent = -1
        assert not aborts(signal.SIGINT) and stop.reason == "SIGTERM"
        assert aborts(signal.SIGTERM)
