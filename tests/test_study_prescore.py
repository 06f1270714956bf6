"""bench/study_prescore.sh: scores a study's finished runs while a core idles, with the scoring worktree's test.py."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from conftest import ROOT

SCRIPT = ROOT / "bench" / "study_prescore.sh"


def run_dir(seed: Path, finished: bool) -> Path:
    run = seed / "bench_short_20261126_000000"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "last.pt").write_bytes(b"")
    log = "12:00:00 train: epoch 6 step 2250 | loss 2.3\n"
    if finished:
        log += "12:00:09 train: stopping at step 2250: train.max_steps=2250 reached\n"
    (run / "train.log").write_text(log)
    (seed / "bench_short_latest").symlink_to(run.name)
    return run


def fake_training(path: Path) -> subprocess.Popen:
    """A process whose command line is a study's train.py on ``path`` (what the script looks for)."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "train.py", "--resume", str(path)])


def wait_for(predicate, timeout: float = 30.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_prescoring_scores_finished_runs_only_while_a_core_idles(tmp_path: Path) -> None:
    study = tmp_path / "study_x"
    done = run_dir(study / "runs" / "a" / "seed1", finished=True)
    run_dir(study / "runs" / "a" / "seed2", finished=False)  # still short of its budget
    busy = run_dir(study / "runs" / "c" / "seed1", finished=True)  # its log says finished, but train.py holds it
    other = run_dir(tmp_path / "other" / "runs" / "b" / "seed1", finished=True)
    (study / "runs" / "b").mkdir()
    (study / "runs" / "b" / "seed1").symlink_to(other.parent)  # linked from another study: its scores are there
    score_wt = tmp_path / "score-wt"
    (score_wt / ".venv" / "bin").mkdir(parents=True)
    calls = tmp_path / "calls.txt"
    python = score_wt / ".venv" / "bin" / "python"
    python.write_text(f'#!/bin/sh\necho "$PWD|$OMP_NUM_THREADS|$*" >> {calls}\necho scored\n')
    python.chmod(0o755)

    trainers = [fake_training(busy / "x"), fake_training(study / "runs" / "d" / "seed1")]  # two train: no core idles
    assert wait_for(lambda: subprocess.run(["pgrep", "-fc", f"train\\.py .*{study}/runs/"], capture_output=True,
                                           text=True).stdout.strip() == "2")  # both exec'd before the script looks
    step = subprocess.Popen(["sleep", "120"])  # the training step the script runs beside
    env = {**os.environ, "PRESCORE_POLL": "0.05"}
    script = subprocess.Popen(["bash", str(SCRIPT), str(study), str(step.pid), str(score_wt)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert wait_for(lambda: (study / "prescored.txt").is_file())
        time.sleep(1.0)  # twenty polls with both cores training
        assert not calls.exists()
        trainers.pop().kill()  # one run left training: a core idles
        assert wait_for(calls.exists)
        time.sleep(0.5)  # more polls: nothing else is scored
        assert calls.read_text().splitlines() == [
            f"{score_wt}|1|test.py --model_path {done}/checkpoints/last.pt --beam 5 1"]
        assert (study / "prescored.txt").read_text().splitlines() == [str(done)]
        assert "scored" in (done.parent / "study.log").read_text()
        assert script.poll() is None  # it goes on while the step lives
        step.kill()
        step.wait()
        out, _ = script.communicate(timeout=30)
        assert script.returncode == 0
        assert f"prescoring {done} (a core is idle while the last runs train)" in out
    finally:
        for p in (*trainers, step, script):
            p.kill()

    # Resumed (a new session): a run tried before is not run again; the held one, now free, is.
    for p in trainers:
        p.wait()
    step = subprocess.Popen(["sleep", "120"])
    script = subprocess.Popen(["bash", str(SCRIPT), str(study), str(step.pid), str(score_wt)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert wait_for(lambda: len(calls.read_text().splitlines()) == 2)
        time.sleep(0.5)
        second = f"{score_wt}|1|test.py --model_path {busy}/checkpoints/last.pt --beam 5 1"
        assert calls.read_text().splitlines()[1] == second
        assert len(calls.read_text().splitlines()) == 2
    finally:
        step.kill()
        step.wait()
        script.communicate(timeout=30)
