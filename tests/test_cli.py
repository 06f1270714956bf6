"""inference.py and test.py on a checkpoint trained in the test; one-line errors for bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import ROOT, make_tiny_config

from utils.checkpoint import load_checkpoint, save_checkpoint
from utils.runs import create_run_dir
from utils.trainer import train


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("cli")
    cfg = make_tiny_config(tmp, max_steps=150, eval_every=75, lr=0.005)
    run = create_run_dir(cfg, tmp / "runs")
    train(cfg, run)
    return run


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=ROOT, input=stdin, capture_output=True, text=True, timeout=300)


def error_line(res: subprocess.CompletedProcess[str]) -> str:
    """The last stderr line; expected errors are one line with no traceback."""
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert "Traceback" not in res.stderr
    return res.stderr.strip().splitlines()[-1]


def test_inference_prints_greedy_and_nbest_with_scores(run_dir: Path) -> None:
    res = cli("inference.py", "--model_path", str(run_dir), "--src_text", "Bonjour le monde.", "--beam", "3")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == "source: Bonjour le monde."
    assert lines[1].startswith("greedy: ") and "(logprob -" in lines[1]
    assert lines[2] == "beam 3 (lenpen 0.6), 3-best:"
    scores = [float(line.split("score ")[1].split(",")[0]) for line in lines[3:6]]
    assert len(scores) == 3 and scores == sorted(scores, reverse=True)


def test_inference_accepts_both_option_spellings_and_a_checkpoint_file(run_dir: Path) -> None:
    config = run_dir / "config.yaml"
    res = cli("inference.py", "--config", str(config), "--model-path", str(run_dir / "checkpoints" / "last.pt"),
              "--src-text", "Merci beaucoup.", "--beam", "1")
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[1].startswith("greedy: ")
    assert "beam" not in res.stdout  # beam 1: greedy only


def test_inference_translates_a_file_and_stdin_line_by_line(run_dir: Path, tmp_path: Path) -> None:
    src = ["Bonjour.", "", "Le chat dort sur le canapé.", "Merci beaucoup."]
    path = tmp_path / "in.fr"
    path.write_text("\n".join(src) + "\n", encoding="utf-8")
    from_file = cli("inference.py", "--model_path", str(run_dir), "--input", str(path), "--batch_size", "2")
    from_stdin = cli("inference.py", "--model_path", str(run_dir), stdin="\n".join(src) + "\n")
    assert from_file.returncode == 0 and from_stdin.returncode == 0, from_file.stderr
    out = from_file.stdout.split("\n")[:-1]
    assert len(out) == 4 and out[1] == "" and all(out[i] for i in (0, 2, 3))
    assert from_stdin.stdout == from_file.stdout  # batching does not change results
    assert "1 empty input line" in from_file.stderr and "sentences/s" in from_file.stderr


def test_test_py_scores_and_writes_hypotheses_and_json(run_dir: Path) -> None:
    res = cli("test.py", "--config", str(run_dir / "config.yaml"), "--model_path", str(run_dir), "--beam", "2")
    assert res.returncode == 0, res.stderr
    assert "sacreBLEU" in res.stdout and "chrF" in res.stdout and "nltk BLEU-4" in res.stdout
    assert "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:" in res.stdout
    scores = json.loads((run_dir / "eval" / "test.best.beam2.json").read_text())
    hyps = (run_dir / "eval" / "test.best.beam2.hyp").read_text(encoding="utf-8").splitlines()
    assert scores["n_sentences"] == len(hyps) == 40
    for key in ("bleu", "chrf", "nltk_bleu4"):
        assert 0.0 <= scores[key] <= 100.0
    assert scores["bleu_signature"].startswith("nrefs:1") and scores["beam"] == 2
    assert sum(row["n"] for row in scores["by_source_length"]) == 40
    assert [row["bucket"] for row in scores["by_source_length"]] == ["0-9", "10-19", "20-29", "30-39", "40-59", "60+"]
    assert "by source length (tokens):  0-9: " in res.stdout
    greedy = cli("test.py", "--model_path", str(run_dir), "--beam", "1", "--split", "validation", "--buckets", "5,8")
    assert greedy.returncode == 0, greedy.stderr
    assert "validation: 40 sentences, greedy" in greedy.stdout
    by_length = json.loads((run_dir / "eval" / "validation.best.beam1.json").read_text())["by_source_length"]
    assert [row["bucket"] for row in by_length] == ["0-4", "5-7", "8+"]


def test_user_errors_are_one_line(run_dir: Path, tmp_path: Path) -> None:
    assert "checkpoint not found" in error_line(cli("inference.py", "--model_path", str(tmp_path / "x.pt"),
                                                    "--src_text", "Bonjour."))
    assert "--src_text is empty" in error_line(cli("inference.py", "--model_path", str(run_dir), "--src_text", " "))
    line = error_line(cli("inference.py", "--model_path", str(run_dir), "--src_text", "Oui.",
                          "--set", "decode.beem=2"))
    assert "unknown config key decode.beem; allowed keys in decode: beam," in line
    # A config describing another model than the checkpoint's.
    other = yaml.safe_load((run_dir / "config.yaml").read_text())
    other["model"]["d_model"] = 64
    path = tmp_path / "other.yaml"
    path.write_text(yaml.safe_dump(other))
    line = error_line(cli("inference.py", "--config", str(path), "--model_path", str(run_dir), "--src_text", "Oui."))
    assert "model.d_model=64 but the checkpoint was trained with 32" in line
    line = error_line(cli("test.py", "--model_path", str(run_dir), "--split", "nope"))
    assert "--split nope: no such split; available: train, validation, test" in line


def test_mismatched_checkpoint_weights_are_caught(run_dir: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    state = load_checkpoint(copy / "checkpoints" / "best.pt")
    state["meta"]["model_fingerprint"] = "0" * 16
    save_checkpoint(copy / "checkpoints" / "best.pt", state)
    assert "different model configuration" in error_line(
        cli("inference.py", "--model_path", str(copy), "--src_text", "Oui."))
    state["meta"].pop("model_fingerprint")
    state["model"]["src_embed.weight"] = torch.zeros(3, 3)
    save_checkpoint(copy / "checkpoints" / "best.pt", state)
    assert "does not fit the model" in error_line(cli("inference.py", "--model_path", str(copy), "--src_text", "Oui."))
    (copy / "checkpoints" / "best.pt").write_bytes(b"garbage")
    assert "cannot read checkpoint" in error_line(cli("inference.py", "--model_path", str(copy), "--src_text", "Oui."))
