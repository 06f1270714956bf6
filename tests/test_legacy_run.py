"""A run directory written before the issue-23 redesign (commit 1e1e0d0) keeps loading, scoring, resuming,
averaging and exporting with today's code.

``tests/data/legacy_run`` was made by that commit: a 60-step RoPE model on the demo corpus
(``train.keep_checkpoints=2``), then ``test.py --beam 2 --max_sentences 12`` and ``test.py --beam 1
--max_sentences 12 --average 2``, whose hypotheses are kept in its ``eval/``. Today's commands must
reproduce them token for token.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_script

ROOT = Path(__file__).resolve().parents[1]
LEGACY = ROOT / "tests" / "data" / "legacy_run"
ORIGINAL = LEGACY / "eval"


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """A writable copy of the legacy run (its eval/ moved aside, so every file there is written today)."""
    copy = tmp_path / "legacy_run"
    shutil.copytree(LEGACY, copy, ignore=shutil.ignore_patterns("eval"))
    return copy


def cli(script: str, *args: str, cache: Path) -> subprocess.CompletedProcess[str]:
    proc = run_script(script, *args, "--set", f"data.cache_dir={cache}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


def test_scores_as_the_commit_that_wrote_it(run: Path, tmp_path: Path) -> None:
    cli("test.py", "--model_path", str(run), "--beam", "2", "--max_sentences", "12", cache=tmp_path / "cache")
    name = "test.best.beam2.n12.hyp"
    assert (run / "eval" / name).read_text() == (ORIGINAL / "test.best.beam2.hyp").read_text()
    today = json.loads((run / "eval" / "test.best.beam2.n12.json").read_text())
    then = json.loads((ORIGINAL / "test.best.beam2.json").read_text())
    assert (today["bleu"], today["chrf"]) == (then["bleu"], then["chrf"])


def test_averages_its_periodic_checkpoints_as_then(run: Path, tmp_path: Path) -> None:
    cli("test.py", "--model_path", str(run), "--beam", "1", "--max_sentences", "12", "--average", "2",
        cache=tmp_path / "cache")
    [today] = (run / "eval").glob("test.average2_step_30-step_60.beam1*.hyp")
    assert today.read_text() == (ORIGINAL / "test.average2_step_30-step_60.beam1.hyp").read_text()


def test_resumes_with_a_raised_budget(run: Path, tmp_path: Path) -> None:
    cli("train.py", "--resume", str(run), "--set", "train.max_steps=64", "--set", "train.eval_every=2",
        cache=tmp_path / "cache")
    from utils.run.checkpoint import load_checkpoint

    state = load_checkpoint(run / "checkpoints" / "last.pt")
    assert state["trainer"]["iteration"] == 64
    assert json.loads((run / "summary.json").read_text())["steps"] == 4  # this process trained steps 61-64


def test_translates_and_exports(run: Path, tmp_path: Path) -> None:
    pytest.importorskip("ctranslate2")
    line = "Le chat dort sur le canapé."
    torch_out = cli("inference.py", "--model_path", str(run), "--src_text", line, "--beam", "1",
                    cache=tmp_path / "cache").stdout.strip()
    assert torch_out.startswith("source: Le chat") and "greedy: The" in torch_out
    export = tmp_path / "ct2"
    cli("inference.py", "--model_path", str(run), "--export-ctranslate2", str(export), cache=tmp_path / "cache")
    assert (export / "model.bin").is_file()
    ct2_out = cli("inference.py", "--model_path", str(export), "--src_text", line, "--beam", "1",
                  cache=tmp_path / "cache").stdout.strip()

    def text(out: str) -> str:  # the greedy hypothesis without its log-prob: this 60-step model runs to the
        return out.split("\t")[0]  # length cap, where the two count the forced end's probability differently

    assert text(ct2_out) == text(torch_out)


#: The kind of CPU that recorded the legacy weights, an AMD EPYC of family 25 (Zen 4) with AVX512-BF16: floating-point
#: kernels (oneDNN's AVX-512, AMX, ...) differ between kinds, and between generations with the same instruction sets
#: (a family-26 EPYC, Zen 5, rounds differently), so a CPU run repeats bit for bit only on a CPU of the same kind.
RECORDED_ON = {"vendor": "AuthenticAMD", "family": "25", "amx_bf16": False, "avx512_bf16": True}


def cpu_kind() -> dict[str, object]:
    """This machine's CPU vendor and family, and the instruction sets that change which kernels PyTorch runs."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""

    def field(name: str) -> str:
        return next((line.split(":", 1)[1].strip() for line in info.splitlines()
                     if line.split(":", 1)[0].strip() == name), "")

    flags = set(field("flags").split())
    return {"vendor": field("vendor_id"), "family": field("cpu family"), "amx_bf16": "amx_bf16" in flags,
            "avx512_bf16": "avx512_bf16" in flags}


def validation_lines(log: Path) -> list[str]:
    """The validation results a train.log records (loss, perplexity, accuracy, BLEU, chrF, the sample), no times."""
    return [line.split(" ", 1)[1] for line in log.read_text(encoding="utf-8").splitlines() if "| valid loss" in line]


def test_trains_the_same_weights_as_then(tmp_path: Path) -> None:
    """The legacy run's config trained again from scratch today (CPU, one thread, the loss computed as then:
    ``train.fused_loss=false``, since the fused loss sums in another order). On a CPU of the kind that recorded it:
    the same weights, bit for bit. On another kind, whose kernels round differently: the same validation results
    at every evaluation as then, and weights within a small distance of then's."""
    import torch
    import yaml

    from utils.run.checkpoint import load_checkpoint

    cfg = yaml.safe_load((LEGACY / "config.yaml").read_text())
    cfg["data"]["cache_dir"] = str(tmp_path / "cache")
    cfg["train"]["fused_loss"] = False
    cfg["train"]["device"] = "cpu"  # the recorded weights are CPU ones (a GPU machine would pick CUDA under auto)
    (tmp_path / "legacy.yaml").write_text(yaml.safe_dump(cfg))
    proc = subprocess.run([sys.executable, "train.py", "--config", str(tmp_path / "legacy.yaml"), "--runs",
                           str(tmp_path / "runs")], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = next(p for p in (tmp_path / "runs").iterdir() if p.name.startswith("legacy_2"))
    today = load_checkpoint(run / "checkpoints" / "last.pt")["model"]
    then = load_checkpoint(LEGACY / "checkpoints" / "last.pt")["model"]
    assert today.keys() == then.keys()
    if cpu_kind() == RECORDED_ON:
        assert all(torch.equal(today[k], then[k]) for k in then)
    else:
        then_lines = validation_lines(LEGACY / "train.log")
        assert len(then_lines) == 2 and validation_lines(run / "train.log") == then_lines
        assert max((today[k] - then[k]).abs().max().item() for k in then) < 0.05
