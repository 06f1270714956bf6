"""RunDir: the run directory's layout spelled in one place, and the training summary read from it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from utils.run.layout import SUMMARY_MARK, RunDir, latest_link_path, read_summary

ROOT = Path(__file__).resolve().parents[1]
SUMMARY = {"steps": 6, "target_tokens": 1234, "train_seconds": 2.5, "eval_seconds": 1.0,
           "target_tokens_per_s": 493.6, "valid_ppl": 321.5, "peak_rss_mb": 400.2}


def log_line(summary: dict) -> str:
    """A closing line as train.py's log file holds it."""
    return (f"2026-01-01 00:00:00,000 INFO train: trained {summary['steps']} optimizer steps, ..."
            f"{SUMMARY_MARK}{json.dumps(summary)}\n")


def test_the_layout_is_the_one_old_runs_have(tmp_path: Path) -> None:
    rd = RunDir(tmp_path / "tiny_20260101_000000")
    r = rd.root
    assert (rd.config, rd.log, rd.tokenizer, rd.tb, rd.lock, rd.summary_json, rd.eval_dir) == (
        r / "config.yaml", r / "train.log", r / "tokenizer", r / "tb", r / "train.lock", r / "summary.json", r / "eval")
    assert (rd.best, rd.last, rd.periodic(40)) == (
        r / "checkpoints" / "best.pt", r / "checkpoints" / "last.pt", r / "checkpoints" / "step_40.pt")
    kept = [rd.periodic(20), rd.periodic(40)]
    assert rd.average(kept) == r / "checkpoints" / "average2_step_20-step_40.pt"
    assert rd.eval_file("test", "best", 5) == r / "eval" / "test.best.beam5.json"
    assert rd.eval_file("all", "last", 1, "n200", "hyp") == r / "eval" / "all.last.beam1.n200.hyp"
    assert rd.attention_stats("best", 64) == r / "eval" / "attention_stats.best.n64.json"
    assert rd.latest_link("tiny") == latest_link_path(tmp_path, "tiny") == tmp_path / "tiny_latest"
    assert RunDir(str(r)) == rd and rd.checkpoint("best") == rd.best


def test_summary_prefers_summary_json_and_falls_back_to_the_log(tmp_path: Path) -> None:
    rd = RunDir(tmp_path)
    with pytest.raises(ValueError):
        rd.summary()
    rd.log.write_text("2026-01-01 INFO train: run directory: x\n" + log_line(SUMMARY))  # a run before summary.json
    assert rd.summary() == read_summary(rd.log.read_text()) == SUMMARY
    newer = {**SUMMARY, "steps": 9}
    rd.write_summary(newer)
    assert json.loads(rd.summary_json.read_text()) == newer and rd.summary() == newer
    assert not list(tmp_path.glob(".*.tmp"))  # written atomically: no temporary left behind
    rd.summary_json.unlink()
    assert rd.summary() == SUMMARY


# File names of a run directory: spelled in utils/run/layout.py only (tests and docs may spell them).
LAYOUT_LITERALS = ['"checkpoints"', '"last.pt"', '"best.pt"', '"config.yaml"', '"train.log"', '"train.lock"',
                   '"summary.json"', '/ "eval"', '/ "tb"', '_latest"']
# Not run directories: bench/peers.py's own work folder holds the captured output of train.py and of Eole's
# training; utils/study/figures.py writes a study-level TensorBoard folder.
ALLOWED = {("bench/peers.py", '"train.log"'), ("utils/study/figures.py", '/ "tb"')}


def test_a_run_without_its_tensorboard_folder_has_no_scalars(tmp_path: Path) -> None:
    # A run copied without tb/ (its curves are then unknown): a study's report reads its curve as empty.
    assert RunDir(tmp_path).scalars("valid/bleu") == []


def test_the_layout_is_spelled_only_in_the_rundir_module() -> None:
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith((".venv/", "tests/", "runs/")) or rel == "utils/run/layout.py" or "/." in f"/{rel}":
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            code = re.sub(r"#.*$", "", line)
            found += [f"{rel}:{n}: {lit}" for lit in LAYOUT_LITERALS if lit in code and (rel, lit) not in ALLOWED]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("package", ["models", "data", "tokenizer"])
def test_lower_layers_do_not_import_the_run_directory(package: str) -> None:
    for path in (ROOT / package).rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        assert "utils.run" not in text, path
