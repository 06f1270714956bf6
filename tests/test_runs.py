"""Run directories: created atomically, ``_latest`` moved atomically and only to a run with a checkpoint."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from utils.config import Config, ConfigError
from utils.run.layout import RunDir
from utils.run.load import resolve_checkpoint
from utils.run.store import (
    check_runs_root,
    create_run_dir,
    discard_if_untrained,
    latest_link,
    make_view,
    point_latest,
)


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
    assert link.is_symlink() and RunDir(link).root.resolve() in {r.resolve() for r in runs}
    assert not list((tmp_path / "runs").glob(".*tmp"))  # no temporary links left behind


def test_tensorboard_finds_each_run_once_through_the_latest_link(tmp_path: Path) -> None:
    """``tensorboard --logdir runs`` follows links: ``<name>_latest`` must not show a run a second time, while the
    paths users give through it (``--model_path runs/demo_latest``, ``runs/demo_latest/checkpoints/best.pt``,
    ``--resume``) reach the run."""
    from tensorboard.backend.event_processing import io_wrapper

    root = tmp_path / "runs"
    old, new = (create_run_dir(Config(name="demo"), root) for _ in range(2))
    for run in (old, new):
        (run / "tb").mkdir()
        (run / "tb" / "events.out.tfevents.1.host.1.0").write_bytes(b"")
        (run / "checkpoints" / "best.pt").write_bytes(run.name.encode())
        point_latest(run)
    latest = root / "demo_latest"
    found = sorted(Path(d).relative_to(root).as_posix() for d in io_wrapper.GetLogdirSubdirectories(str(root)))
    assert found == sorted([f"{old.name}/tb", f"{new.name}/tb"])  # each run once, none under demo_latest/
    assert (latest / "checkpoints" / "best.pt").read_bytes() == new.name.encode()
    assert (latest / "config.yaml").read_text() == (new / "config.yaml").read_text()
    assert RunDir(latest).root.resolve() == new.resolve() and RunDir(latest).tb == RunDir(new).tb
    assert resolve_checkpoint(latest) == (new.resolve(), (new / "checkpoints" / "best.pt").resolve())
    # Results written later (test scores, figures) are seen through the link; the summary once training ends.
    (new / "eval" / "test.best.beam5.json").write_text("{}")
    assert (latest / "eval" / "test.best.beam5.json").read_text() == "{}" and (latest / "visualize").is_dir()
    RunDir(new).write_summary({"steps": 1})
    assert not (latest / "summary.json").exists()
    make_view(new, create=False)
    assert (latest / "summary.json").read_text() == (new / "summary.json").read_text()
    assert make_view(root / "demo_19990101_000000", create=False) is None  # not made where there is none
    # The views are in runs/.latest/, not in the run folders: a run copied or zipped holds no link, and no view
    # holds a link to nothing.
    assert not [p for p in new.rglob("*") if p.is_symlink()]
    views = [p for p in (root / ".latest").rglob("*") if p.is_symlink()]
    assert views and all(p.exists() for p in views)


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
