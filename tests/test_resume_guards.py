"""--resume: validated first and written last, a finished run says so, one process per run directory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_script

from utils.cli import StopError
from utils.config import ConfigError, load_config
from utils.run.checkpoint import load_checkpoint
from utils.run.environment import read_environment
from utils.run.store import RunLockedError, create_run_dir, lock_run, run_locked_by, unlock_run
from utils.training.loop import train

ROOT = Path(__file__).resolve().parents[1]


def run_py(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.fixture
def trained(tmp_path: Path, tiny_config) -> Path:
    cfg = tiny_config(tmp_path, max_steps=4, eval_every=2)
    run = create_run_dir(cfg, tmp_path / "runs")
    train(cfg, run)
    return run


def test_resuming_a_finished_run_says_so_and_changes_nothing(trained: Path) -> None:
    cfg = load_config(trained / "config.yaml")
    before = (trained / "checkpoints" / "last.pt").read_bytes()
    with pytest.raises(StopError, match=r"has finished: train.max_steps=4 is reached at step 4; nothing to train"):
        train(cfg, trained, resume=True)
    assert (trained / "checkpoints" / "last.pt").read_bytes() == before
    raised = load_config(trained / "config.yaml", ["train.max_steps=6"])  # a raised budget trains on
    train(raised, trained, resume=True)
    assert load_checkpoint(trained / "checkpoints" / "last.pt")["trainer"]["iteration"] == 6


def test_each_training_call_records_what_trained_it_in_environment_json(trained: Path, caplog) -> None:
    import logging
    import platform

    import torch

    [first] = read_environment(trained)
    assert first["resumed_from_step"] is None and first["device"] == "cpu" and first["gpus"] == []
    assert first["python"] == platform.python_version() and first["cpu"]
    assert first["packages"]["torch"] == torch.__version__ and "sacrebleu" in first["packages"]
    assert list(first["packages"]) == sorted(first["packages"])
    with pytest.raises(StopError):  # a refused resume trains nothing and records nothing
        train(load_config(trained / "config.yaml"), trained, resume=True)
    assert len(read_environment(trained)) == 1
    with caplog.at_level(logging.INFO):
        train(load_config(trained / "config.yaml", ["train.max_steps=6"]), trained, resume=True)
    entries = read_environment(trained)
    assert [e["resumed_from_step"] for e in entries] == [None, 4] and entries[1]["started"] >= first["started"]
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("environment: ")]
    assert said == [f"environment: python {platform.python_version()}, torch {torch.__version__}, {first['cpu']} (cpu)"]
    legacy = trained.parent / "legacy"
    legacy.mkdir()
    assert read_environment(legacy) == []  # a run trained before the file existed


def test_resuming_a_run_whose_epochs_are_done_does_not_start_again_from_step_1(tmp_path: Path, tiny_config) -> None:
    cfg = tiny_config(tmp_path, epochs=1)
    run = create_run_dir(cfg, tmp_path / "runs")
    train(cfg, run)
    steps = load_checkpoint(run / "checkpoints" / "last.pt")["trainer"]["iteration"]
    with pytest.raises(StopError, match=rf"has finished: all train.epochs=1 are done at step {steps}"):
        train(cfg, run, resume=True)
    assert load_checkpoint(run / "checkpoints" / "last.pt")["trainer"]["iteration"] == steps


def test_a_bad_resume_value_writes_nothing_and_a_run_trains_in_one_process_at_a_time(trained: Path) -> None:
    config = (trained / "config.yaml").read_text()
    bad = run_script("train.py", "--resume", str(trained), "--set", "train.max_steps=6",
                 "--set", "data.source=text", "--set", f"data.path={trained / 'nosuch'}")
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].startswith("error: ")
    assert (trained / "config.yaml").read_text() == config  # the next --resume is not blocked by it
    lock_run(trained)  # this process now trains in it
    try:
        assert run_locked_by(trained) is None  # our own lock
        second = run_py("train.py", "--resume", str(trained), "--set", "train.max_steps=6")  # another process
        assert second.returncode == 2
        assert second.stderr.strip().splitlines()[-1] == \
            f"error: {trained.resolve()} is being trained by another process (pid {__import__('os').getpid()}); " \
            "wait for it to end"
    finally:
        unlock_run(trained)
    ok = run_script("train.py", "--resume", str(trained), "--set", "train.max_steps=6")
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert "max_steps: 6" in (trained / "config.yaml").read_text()
    assert load_checkpoint(trained / "checkpoints" / "last.pt")["trainer"]["iteration"] == 6


def test_a_locked_run_cannot_be_locked_again_or_discarded(tmp_path: Path, tiny_config) -> None:
    run = create_run_dir(tiny_config(tmp_path), tmp_path / "runs", lock=True)  # as train.py makes it
    holder = subprocess.Popen([sys.executable, "-c", "import sys,time; sys.path.insert(0, sys.argv[1]); "
                               "from utils.run.store import lock_run; lock_run(sys.argv[2]); print('ok', flush=True); "
                               "time.sleep(60)", str(ROOT), str(run)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == ""  # refused: it exits with RunLockedError
    finally:
        holder.kill()
        holder.wait()
    unlock_run(run)
    holder = subprocess.Popen([sys.executable, "-c", "import sys,time; sys.path.insert(0, sys.argv[1]); "
                               "from utils.run.store import lock_run; lock_run(sys.argv[2]); print('ok', flush=True); "
                               "time.sleep(60)", str(ROOT), str(run)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "ok\n"
        assert run_locked_by(run) == holder.pid
        with pytest.raises(RunLockedError, match=rf"pid {holder.pid}"):
            lock_run(run)
        from utils.run.store import discard_if_untrained

        assert not discard_if_untrained(run) and run.is_dir()  # untrained, but another process writes it
    finally:
        holder.kill()
        holder.wait()
    assert run_locked_by(run) is None  # kill -9 released it
    assert isinstance(RunLockedError("x"), ConfigError)
