"""``train.py --name NAME``: the run folder ``runs/NAME_<stamp>/`` and the link ``runs/NAME_latest``; bad names
refused in one line; the link used as a run (``--model_path``, ``--resume``, paths through it) while TensorBoard,
walking the runs folder, finds each run's event folder once."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import TINY_CLI, run_script

from utils.config import ConfigError, from_dict, load_config, save_config
from utils.run.layout import RunDir, check_run_name
from utils.run.store import create_run_dir, latest_link


def _train(tmp_path: Path, *args: str, sets: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """``train.py`` on the demo config shrunk to seconds (``TINY_CLI``), runs under ``tmp_path/runs``."""
    overrides = [a for s in [*TINY_CLI, f"data.cache_dir={tmp_path / 'cache'}", *sets] for a in ("--set", s)]
    return run_script("train.py", "--runs", str(tmp_path / "runs"), *args, *overrides)


def _tensorboard_runs(logdir: Path) -> list[str]:
    """The run folders TensorBoard lists for ``--logdir logdir`` (its own walker, as its multiplexer calls it),
    relative to ``logdir``, sorted."""
    from tensorboard.backend.event_processing import io_wrapper

    return sorted(str(Path(d).relative_to(logdir)) for d in io_wrapper.GetLogdirSubdirectories(str(logdir)))


@pytest.mark.parametrize("name", ["my-run", "rope.seed2", "abl_A+B", "été"])
def test_good_names_pass(name: str) -> None:
    assert check_run_name(name) == name


@pytest.mark.parametrize(("name", "why"), [
    ("", "empty"), ("   ", "empty"), ("a/b", "separator"), ("..", "'..'"), ("../up", "separator"),
    ("a..b", "'..'"), (".hidden", "'.'"), ("a\\b", "separator"), ("tab\there", "control"), ("x" * 201, "longer"),
])
def test_bad_names_are_refused_in_one_line(name: str, why: str) -> None:
    with pytest.raises(ConfigError) as info:
        check_run_name(name)
    assert why in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(("name", "how"), [("../escaped", "--name"), ("", "--name"), ("../../direct", "--set"),
                                           ("/tmp/absolute", "--set")])
def test_train_refuses_a_bad_name_before_anything_is_written(tmp_path: Path, name: str, how: str) -> None:
    """From ``--name`` or ``--set name=...``: one line, exit 2, and no folder made inside or outside ``--runs``."""
    args = ("--name", name) if how == "--name" else ()
    res = _train(tmp_path / "a" / "b", "--config", "configs/demo.yaml", *args,
                 sets=(f"name={name}",) if how == "--set" else ())
    assert res.returncode == 2
    assert res.stderr.startswith(f"error: run name {name!r}: ") and len(res.stderr.splitlines()) == 1, res.stderr
    assert not (tmp_path / "a" / "b" / "runs").exists() and not list(tmp_path.rglob("*escaped*")) \
        and not list(tmp_path.rglob("direct*")) and not list(Path("/tmp").glob("absolute_2*"))


def test_an_expanded_value_is_saved_literally_and_never_expanded_again(tmp_path: Path, monkeypatch) -> None:
    """``${OUTER}`` whose value holds ``${INNER_UNSET}``: expanded once; the saved config reloads to the same text,
    however often, and a ``$${`` written by hand is a literal ``${``."""
    monkeypatch.setenv("OUTER", "x${INNER_UNSET}")
    monkeypatch.delenv("INNER_UNSET", raising=False)
    cfg = from_dict({"name": "${OUTER}", "data": {"path": "$${HOME}/corpus"}})
    assert cfg.name == "x${INNER_UNSET}" and cfg.data.path == "${HOME}/corpus"
    save_config(cfg, tmp_path / "config.yaml")
    assert "name: x$${INNER_UNSET}" in (tmp_path / "config.yaml").read_text()
    again = load_config(tmp_path / "config.yaml")
    assert again.to_dict() == cfg.to_dict()
    save_config(again, tmp_path / "again.yaml")
    assert (tmp_path / "again.yaml").read_text() == (tmp_path / "config.yaml").read_text()
    with pytest.raises(ConfigError, match="environment variable INNER_UNSET is not set"):
        from_dict({"name": "x${INNER_UNSET}"})
    run = create_run_dir(cfg, tmp_path / "runs")  # train.py's start: the folder, then its link's name reloaded
    assert run.name.startswith("x${INNER_UNSET}_") and latest_link(run).name == "x${INNER_UNSET}_latest"


def test_a_named_run_its_latest_link_and_tensorboard_seeing_it_once(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    res = _train(tmp_path, "--config", "configs/demo.yaml", "--name", "my-run")
    assert res.returncode == 0, res.stderr[-3000:]
    (run,) = runs.glob("my-run_2*")  # runs/NAME_<YYYYmmdd_HHMMSS>
    assert run.is_dir() and not run.is_symlink() and not list(runs.glob("demo_*"))
    assert yaml.safe_load((run / "config.yaml").read_text())["name"] == "my-run"
    latest = runs / "my-run_latest"
    assert latest.is_symlink() and RunDir(latest).root.resolve() == run.resolve()
    # The documented paths through the link reach the run's files.
    assert (latest / "checkpoints" / "best.pt").resolve() == (run / "checkpoints" / "best.pt").resolve()
    assert (latest / "config.yaml").read_text() == (run / "config.yaml").read_text()
    assert not (latest / "tb").exists() and (run / "tb").is_dir()
    # TensorBoard's walker (the one `tensorboard --logdir runs` uses) finds the run's event folder once.
    assert _tensorboard_runs(runs) == [f"{run.name}/tb"]

    res = run_script("inference.py", "--model_path", str(latest), "--src_text", "Bonjour.", "--beam", "1", "--threads",
                     "1")
    assert res.returncode == 0 and res.stdout.startswith("source: Bonjour."), res.stderr[-2000:]

    res = _train(tmp_path, "--resume", str(latest), "--name", "other")
    assert res.returncode == 2 and "--name names a new run" in res.stderr
    res = _train(tmp_path, "--resume", str(latest), sets=("train.max_steps=4",))
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"run directory: {run.resolve()}" in res.stdout  # resumed in the run itself, not in the link's folder
    assert RunDir(run).summary()["run_steps"] == 4 and RunDir(run).summary()["resumed_from_step"] == 3
    assert sorted(p.name for p in runs.iterdir()) == sorted([run.name, "my-run_latest", ".latest"])
    assert (latest / "summary.json").is_file()  # linked once training ended
    assert _tensorboard_runs(runs) == [f"{run.name}/tb"]
