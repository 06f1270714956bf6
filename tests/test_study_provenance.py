"""Seeds that accumulate across machines: each run a study trains records its commit and config hash, raising
``--seeds`` trains only the new seeds, and ``--merge`` takes in runs trained elsewhere whose config is this study's,
refusing another config in one line that names the key. bench/study.py runs in this process with its commands
replaced by stand-in runs (a config and a checkpoint at the budget): nothing is trained."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from conftest import ROOT

from utils.cli import run_main
from utils.config import load_config, save_config
from utils.run.environment import describe, read_environment, record_environment
from utils.run.layout import RunDir
from utils.study import stages
from utils.study.cli import main
from utils.study.files import slug
from utils.study.lock import unlock_study
from utils.study.plan import Job
from utils.study.provenance import config_sha256, first_difference, git_commit
from utils.study.report import run_provenance
from utils.study.sections import provenance_lines
from utils.study.spec import Variant

HEAD = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()


STAMPS = itertools.count(1)  # a run name's time: every run its own, as train.py names them


def _stand_in(trained: list[str]) -> Callable[..., None]:
    """``run_commands`` that makes each train.py command's run at once (its config, last.pt at the budget, and
    environment.json as train.py records it)."""
    entry = describe("cpu", [])
    def run_commands(commands: list, devices: int, poll: float = 2.0, jobs: int = 1, progress=None,
                     launcher=None) -> None:
        for label, cmd, _ in commands:
            trained.append(label)
            sets = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--set"]
            cfg = load_config(cmd[cmd.index("--config") + 1], sets)
            run = Path(cmd[cmd.index("--runs") + 1]) / f"demo_20260101_{next(STAMPS):06d}"  # train.py's names
            (run / "checkpoints").mkdir(parents=True)
            save_config(cfg, RunDir(run).config)
            torch.save({"trainer": {"iteration": cfg.train.max_steps}}, RunDir(run).last)
            record_environment(run, entry)
        if progress is not None:
            progress.close()
    return run_commands


@pytest.fixture
def study_cli(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Callable[..., list[str]]:
    """``study_cli(folder, *flags)``: bench/study.py --train-only on a two-variant grid of the demo config, study
    ``folder/study_t``; returns the labels of the commands it ran."""
    used: list[Path] = []

    def run(runs: Path, *flags: str, seeds: int = 2) -> list[str]:
        trained: list[str] = []
        monkeypatch.setattr(stages, "run_commands", _stand_in(trained))
        monkeypatch.setattr(sys, "argv", ["bench/study.py", "--config", "configs/demo.yaml", "--grid",
                                          "model.attention_pe=none,rope", "--set", "model.input_pe=none",
                                          "--seeds", str(seeds), "--steps", "8", "--name", "t", "--runs", str(runs),
                                          "--train-only", *flags])
        used.append(runs / "study_t")
        main()
        return trained

    yield run
    for folder in used:
        unlock_study(folder)


def test_a_config_hash_leaves_out_the_seed_and_where_and_how_the_run_executes() -> None:
    cfg = load_config(ROOT / "configs" / "demo.yaml").to_dict()
    moved = json.loads(json.dumps(cfg)) | {"seed": 7, "name": "elsewhere"}
    moved["data"] |= {"cache_dir": "/other/cache", "path": "/other/data", "num_proc": 16}
    moved["train"] |= {"device": "cuda", "compile": True}  # how it executes, not what it learns
    assert config_sha256(moved) == config_sha256(cfg) and first_difference(cfg, moved) is None
    other = json.loads(json.dumps(cfg))
    other["model"]["d_ff"] = 64
    assert config_sha256(other) != config_sha256(cfg)
    assert first_difference(cfg, other) == "model.d_ff (64 there, 512 here)"


def test_outside_git_the_commit_is_unknown(tmp_path: Path) -> None:
    assert git_commit(tmp_path) == ("unknown", False)


def test_each_run_records_its_commit_and_hash_and_more_seeds_train_only_the_new(
        study_cli: Callable[..., list[str]], tmp_path: Path) -> None:
    assert study_cli(tmp_path) == [f"train attention_pe={pe} seed {k}" for pe in ("none", "rope") for k in (1, 2)]
    assert study_cli(tmp_path, seeds=3) == ["train attention_pe=none seed 3", "train attention_pe=rope seed 3"]
    assert study_cli(tmp_path, seeds=3) == []
    runs = sorted((tmp_path / "study_t" / "runs").glob("*/seed*/demo_*"))
    assert len(runs) == 6
    hashes = {}
    for run in runs:
        doc = json.loads(RunDir(run).provenance.read_text())
        assert doc["trained_by"] == [{"commit": HEAD, "uncommitted_changes": doc["trained_by"][0][
            "uncommitted_changes"]}] and len(HEAD) == 40
        assert doc["config_sha256"] == config_sha256(load_config(RunDir(run).config).to_dict())
        hashes.setdefault(run.parent.parent.name, set()).add(doc["config_sha256"])
    assert [len(h) for h in hashes.values()] == [1, 1] and len(set.union(*hashes.values())) == 2  # one per variant


def test_merge_takes_matching_runs_and_refuses_another_config_in_one_line(
        study_cli: Callable[..., list[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    here, there, wrong = tmp_path / "here", tmp_path / "there", tmp_path / "wrong"
    study_cli(here)
    # Another machine, its data cache elsewhere, trained 3 seeds: the same config (location keys aside).
    assert len(study_cli(there, "--set", "data.cache_dir=/elsewhere/cache", seeds=3)) == 6
    # A third trained with another FFN width: not this study's runs.
    assert len(study_cli(wrong, "--set", "model.d_ff=64", seeds=3)) == 6
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        run_main(lambda: study_cli(here, "--merge", str(wrong / "study_t"), seeds=3))
    first = sorted((wrong / "study_t" / "runs").glob("attention_pe_none/seed1/demo_*"))[0]
    assert exit_.value.code == 2 and capsys.readouterr().err == (
        f"error: --merge: {first}: not attention_pe=none seed 1 of this study: its config differs in model.d_ff "
        "(64 there, 512 here); nothing was merged\n")
    assert not list((here / "study_t" / "runs").glob("*/seed3"))
    # The matching runs: seed 3 copied in, this study's own seeds 1 and 2 kept; nothing left to train.
    assert study_cli(here, "--merge", str(there / "study_t"), seeds=3) == []
    said = capsys.readouterr().out
    assert f"attention_pe=rope seed 3: merged from {(there / 'study_t' / 'runs' / 'attention_pe_rope' / 'seed3')}" \
        f" ({HEAD[:7]}" in said
    assert ("--merge: attention_pe=none seed 1, attention_pe=none seed 2, attention_pe=rope seed 1, attention_pe=rope "
            f"seed 2: this study holds its own run of the same seed, kept; the one in {there / 'study_t'} is left "
            "there") in said
    merged = sorted((here / "study_t" / "runs").glob("*/seed3/demo_*"))
    assert [p.name for p in merged] == [p.name for p in sorted((there / "study_t" / "runs").glob("*/seed3/demo_*"))]
    assert all(RunDir(p).last.is_file() and RunDir(p).provenance.is_file() for p in merged)
    # The report lists the commits; two commits are said plainly.
    jobs = [Job(Variant(pe, []), k, here / "study_t" / "runs" / slug(pe) / f"seed{k}")
            for pe in ("attention_pe=none", "attention_pe=rope") for k in (1, 2, 3)]
    found = {j.key: sorted(j.root.glob("demo_*"))[-1] for j in jobs}
    provenance = run_provenance(jobs, found)
    assert provenance_lines({"provenance": provenance})[0] == (
        f"Provenance: every run was trained by commit {HEAD[:7]}"
        + (" with uncommitted changes" if git_commit(ROOT)[1] else "")
        + "; each system's runs share one config hash (each run's provenance.json).")
    for key in ("attention_pe=none seed 3", "attention_pe=rope seed 3"):
        provenance["runs"][key]["trained_by"] = [{"commit": "f" * 40, "uncommitted_changes": False}]
    line = provenance_lines({"provenance": provenance})[0]
    assert line.startswith("Provenance: **the runs come from 2 commits, not one**: ")
    assert "ffffff (attention_pe=none seed 3; attention_pe=rope seed 3)" in line
    # No run recorded its CPU: nothing said of CPUs. Each recorded its packages (train.py's environment.json).
    packages = read_environment(found["attention_pe=rope seed 3"])[-1]["packages"]
    assert provenance_lines({"provenance": provenance})[2:] == [
        "Packages of the environments that trained the runs (each kept run's packages.txt or environment.json): "
        f"all {len(packages)} at one version in the 6 runs that record them (torch {torch.__version__}).", ""]
    # The CPU each kept run recorded (keep_runs' cpu.txt in its seed folder, its model name and a hash of its
    # instruction-set flags): one seed split across two CPUs is named, and so is one whose CPUs share a model name
    # but not their instructions (virtual machines).
    import hashlib

    def flags(text: str) -> str:
        return hashlib.sha256(text.encode()).hexdigest()[:8]

    for job in jobs:
        cpu = "Intel(R) Xeon(R) Platinum 8488C" if job.key == "attention_pe=rope seed 3" else "AMD EPYC 9R14"
        (job.root / "cpu.txt").write_text(f"Model name:                           {cpu}\nFlags: vme fpu\n"
                                          "Host: a\nKept: 2026-11-30T20:00:00Z\n")
    (jobs[0].root / "cpu.txt").write_text("Flags: fpu\n")  # no model name: not recorded
    (jobs[1].root / "cpu.txt").write_text("Model name: AMD EPYC 9R14\nFlags: fpu vme avx512_bf16\nHost: b\n")
    cpus = run_provenance(jobs, found)
    epyc = f"AMD EPYC 9R14, flags {flags('fpu vme')}"
    assert cpus["runs"]["attention_pe=none seed 3"]["cpu"] == epyc
    assert cpus["runs"]["attention_pe=none seed 2"]["cpu"] == f"AMD EPYC 9R14, flags {flags('avx512_bf16 fpu vme')}"
    assert "cpu" not in cpus["runs"]["attention_pe=none seed 1"]
    lines = provenance_lines({"provenance": cpus})[2:]
    assert lines[0].startswith("CPUs that trained the runs (each kept run's cpu.txt): ") and lines[1] == ""
    assert f"{epyc} (3 runs)" in lines[0] and "Intel(R) Xeon(R) Platinum 8488C, flags" in lines[0]
    assert "not recorded for 1 run. **Seeds 2, 3: their systems were trained on more than one CPU**" in lines[0]
    # A kept run's packages.txt (keep_runs' pip freeze) comes before its environment.json: one version differs.
    (jobs[1].root / "packages.txt").write_text("\n".join(
        f"{name}=={'0.0.1' if name == 'tokenizers' else v}" for name, v in packages.items()) + "\n")
    lines = provenance_lines({"provenance": run_provenance(jobs, found)})[4:]
    assert lines == [f"Packages of the environments that trained the runs (each kept run's packages.txt or "
                     f"environment.json): {len(packages) - 1} of {len(packages)} at one version in the 6 runs that "
                     f"record them; **these differ**: tokenizers 0.0.1 (1 run), {packages['tokenizers']} (5 runs).",
                     ""]
