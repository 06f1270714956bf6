"""Run directories: created atomically, ``_latest`` moved atomically and only to a run with a checkpoint."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from utils.config import Config, ConfigError
from utils.run.store import check_runs_root, create_run_dir, discard_if_untrained, latest_link, point_latest


def test_runs_started_at_the_same_moment_get_their_own_directories(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("utils.run.store.time.strftime", lambda fmt: "20260101_000000")  # one shared timestamp
    start = threading.Barrier(8)

    def make(_: int) -> Path:
        start.wait()
        return create_run_dir(Config(name="demo"), tmp_path / "runs")

    with ThreadPoolExecutor(8) as pool:
        runs = list(pool.map(make, range(8)))
    assert len({r.name for r in runs}) == 8
    assert sorted(r.name for r in runs) == sorted(["demo_20260101_000000"] +
                                                  [f"demo_20260101_000000_{n}" for n in range(2, 9)])
    assert all((r / "config.yaml").is_file() and (r / "checkpoints").is_dir() for r in runs)
    assert not (tmp_path / "runs" / "demo_latest").exists()  # no checkpoint yet: _latest is not moved


def test_a_directory_made_between_the_check_and_mkdir_is_not_reused(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The race of two processes, made deterministic: the name looks free but another run takes it first."""
    monkeypatch.setattr("utils.run.store.time.strftime", lambda fmt: "20260101_000000")
    taken = tmp_path / "runs" / "demo_20260101_000000"
    taken.mkdir(parents=True)
    (taken / "mine").write_text("another run's file")
    monkeypatch.setattr(Path, "exists", lambda self: False)
    run = create_run_dir(Config(name="demo"), tmp_path / "runs")
    assert run.name == "demo_20260101_000000_2" and (taken / "mine").is_file()


def test_latest_moves_atomically_under_concurrent_updates(tmp_path: Path) -> None:
    runs = [create_run_dir(Config(name="demo"), tmp_path / "runs") for _ in range(2)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: point_latest(runs[i % 2]), range(200)))
    link = latest_link(runs[0])
    assert link.is_symlink() and link.resolve() in {r.resolve() for r in runs}
    assert not list((tmp_path / "runs").glob(".*tmp"))  # no temporary links left behind


def test_untrained_run_is_discarded_and_a_trained_one_kept(tmp_path: Path) -> None:
    run = create_run_dir(Config(name="demo"), tmp_path / "runs")
    kept = create_run_dir(Config(name="demo"), tmp_path / "runs")
    (kept / "checkpoints" / "last.pt").write_bytes(b"x")
    assert discard_if_untrained(run) and not run.exists()
    assert not discard_if_untrained(kept) and kept.is_dir()
    # A scored run whose checkpoints were deleted (to save disk, or fetched from another machine without them) is
    # kept: its scores are what a study reports from.
    scored = create_run_dir(Config(name="demo"), tmp_path / "runs")
    (scored / "eval").mkdir()
    (scored / "eval" / "test.last.beam5.json").write_text('{"step": 8}')
    assert not discard_if_untrained(scored) and (scored / "eval" / "test.last.beam5.json").is_file()


def test_runs_root_that_cannot_hold_runs_is_one_line(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    for root in (afile, afile / "sub"):
        with pytest.raises(ConfigError, match="exists and is not a folder"):
            check_runs_root(root)
    assert check_runs_root(tmp_path / "new" / "runs") == tmp_path / "new" / "runs"
    assert not (tmp_path / "new").exists()  # checking creates nothing
