"""bench/study.py --decode-only: everything that needs a run's weights (every decoder and split, each floor of the
length-controlled decoder, the attention statistics) done right after training, so a study can drop its checkpoints
(or lose its machine) between looks and still be scored and reported from its files. test.py is stood in for while
decoding (it writes what test.py writes, from the references): what is checked is what the study asks of it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, run_study

import utils.study.stages as stages
from utils.run.checkpoint import load_checkpoint
from utils.study.length_control import GRID

DECODERS = ("--decoders", "beam5,greedy,beam5-minlen")


def _fake_test_py(asked: list[list[str]], references: dict[str, list[str]]) -> Any:
    """A stand-in for utils.study.plan.run_commands: train.py commands run; each test.py command is recorded in
    ``asked`` and its score files written as test.py would (every split asked, or the config's ``test``; each
    beam; the tag; the ``--set`` overrides; the checkpoint's step), with the references as hypotheses."""
    real = stages.run_commands
    import test as test_py
    from utils.run.layout import RunDir

    def run(commands: list[tuple[str, list[str], Path]], *args: Any, **kwargs: Any) -> None:
        real([c for c in commands if "test.py" not in " ".join(map(str, c[1]))], *args, **kwargs)
        for _, argv, _ in commands:
            argv = [str(x) for x in argv]
            if "test.py" not in " ".join(argv):
                continue
            asked.append(argv)
            model = Path(argv[argv.index("--model_path") + 1])
            step = load_checkpoint(model)["trainer"]["iteration"]
            beams = []
            for x in argv[argv.index("--beam") + 1:]:
                if not x.isdigit():
                    break
                beams.append(int(x))
            tag = argv[argv.index("--tag") + 1] if "--tag" in argv else None
            sets = [argv[i + 1] for i, x in enumerate(argv) if x == "--set"]
            for split in [argv[i + 1] for i, x in enumerate(argv) if x == "--split"] or ["test"]:
                for beam in beams:
                    entry = {"n_sentences": 12, "overrides": sets, "step": step, "bleu_signature": "nrefs:1",
                             "chrf_signature": "nc:6"}
                    test_py.write_scores(RunDir(model.parents[1]).eval_file(split, "best", beam, tag), entry,
                                         references[split][:12])

    return run


def test_decode_only_leaves_nothing_that_needs_the_weights(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         study_in_process: None) -> None:
    from data.sources import load_corpus
    from utils.config import load_config

    root = tmp_path / "study_t"
    one = run_study(tmp_path, "--seeds", "1", "--decode-only", *DECODERS)  # one seed: allowed, but not trained
    assert one.returncode == 2 and one.stderr.strip().splitlines()[-1].startswith(
        "error: --decode-only: 2 of 2 runs are not trained to the budget"), one.stderr
    scoring = run_study(tmp_path, "--seeds", "1", "--score-only")
    assert scoring.returncode == 2 and "scoring and the report need --seeds 2 or more" in scoring.stderr
    refused = run_study(tmp_path, "--decode-only", *DECODERS)
    assert refused.returncode == 2 and refused.stderr.strip().splitlines()[-1].startswith(
        "error: --decode-only: 4 of 4 runs are not trained to the budget"), refused.stderr
    assert run_study(tmp_path, "--train-only").returncode == 0
    corpus = load_corpus(load_config(ROOT / "configs" / "demo.yaml").data)
    asked: list[list[str]] = []
    real = stages.run_commands
    monkeypatch.setattr(stages, "run_commands", _fake_test_py(asked, {s: list(corpus[s]["tgt"]) for s in corpus}))
    decoded = run_study(tmp_path, "--decode-only", *DECODERS)
    assert decoded.returncode == 0, decoded.stdout + decoded.stderr
    assert "--decode-only: no statistics, no report); its attention cached" in decoded.stdout
    assert not (root / "results.json").exists() and not (root / "report.md").exists()
    runs = sorted(root.glob("runs/*/seed*/demo_2*"))
    assert len(runs) == 4 and len(asked) == 4 * (1 + len(GRID) + len(GRID) - 1)  # beams; validation; test sets
    floors = {f"minlen{a:g}" for a in GRID if a}
    for run in runs:
        mine = [a for a in asked if a[a.index("--model_path") + 1].startswith(str(run))]
        assert sorted(a[a.index("--beam") + 1] for a in mine) == ["5"] * (len(GRID) * 2 - 1) + ["5"]
        names = {p.name for p in (run / "eval").glob("*.json")}
        assert {"test.best.beam5.n12.json", "test.best.beam1.n12.json", "validation.best.beam5.n12.json",
                "attention_stats.best.n6.json"} <= names  # the attention statistics are real: computed here
        for split in ("validation", "test"):
            assert {n[n.index("minlen"):-5] for n in names if n.startswith(f"{split}.") and "minlen" in n} == floors
    again = run_study(tmp_path, "--decode-only", *DECODERS)
    assert again.returncode == 0 and len(asked) == 4 * 2 * len(GRID)  # nothing decoded twice
    monkeypatch.setattr(stages, "run_commands", real)

    # The weights go (or stay behind on a lost machine): the study is scored and reported from its files alone,
    # the attention statistics and every floor the rule reads included, and nothing is decoded. Kept runs leave out
    # their TensorBoard events too: the validation curves come from train.log then (BLEU to two decimals).
    from utils.study.files import slug
    from utils.study.runs import valid_curve

    curves = {(run.parents[1].name, run.parent.name): valid_curve(run) for run in runs}
    assert all(len(c) == 2 for c in curves.values())  # the study's two validations
    for pt in root.glob("runs/*/seed*/demo_2*/checkpoints/*.pt"):
        pt.unlink()
    for run in runs:
        shutil.rmtree(run / "tb")
    reported = run_study(tmp_path, "--score-only", *DECODERS)
    assert reported.returncode == 0, reported.stdout + reported.stderr
    assert "no checkpoint" not in reported.stdout and "  test " not in reported.stdout
    results = json.loads((root / "results.json").read_text())
    assert results["seeds"] == [1, 2] and set(results["length_control"]["systems"]) == {
        "attention_pe=none", "attention_pe=rope"}
    assert all(len(e["attention"]) == 2 for e in results["systems"].values())  # both seeds' statistics
    for label, entry in results["systems"].items():
        assert [[tuple(point) for point in curve] for curve in entry["valid_bleu"]] == [
            [(step, pytest.approx(value, abs=0.005)) for step, value in curves[slug(label), f"seed{k}"]]
            for k in (1, 2)]


def test_only_trains_and_decodes_the_runs_it_names_and_the_study_is_scored_from_them_all(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, study_in_process: None) -> None:
    """--only: a study trained and decoded a few runs at a time (each then kept without its weights), scored once
    every run is decoded, as if trained and decoded at once."""
    from data.sources import load_corpus
    from utils.config import load_config

    root = tmp_path / "study_t"
    for flags, line in (
            (["--only", "attention_pe=rope:1"], "--only trains or decodes some runs (--train-only or --decode-only); "
                                                "statistics and a report read every run of the study"),
            (["--train-only", "--only", "rope:1"], "--only 'rope:1': not LABEL:SEED with a label of the study's "
                                                   "variants (attention_pe=none, attention_pe=rope)"),
            (["--train-only", "--only", "attention_pe=rope:3"], "--only 'attention_pe=rope:3': the seed must be "
                                                                "one of 1..2 (--seeds 2)")):
        refused = run_study(tmp_path, *flags)
        assert refused.returncode == 2 and refused.stderr.strip().splitlines()[-1] == f"study.py: error: {line}", \
            refused.stderr
    assert not root.exists()  # refused before anything was written

    first = run_study(tmp_path, "--train-only", "--only", "attention_pe=rope:2")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "4 runs" not in first.stdout and "1 runs (--only 1 of its 4), 0 trained, 1 to train" in first.stdout
    assert [p.relative_to(root).parts[:3] for p in root.glob("runs/*/seed*/demo_2*")] == [
        ("runs", "attention_pe_rope", "seed2")]
    rest = "attention_pe=none:1,attention_pe=none:2,attention_pe=rope:1"
    assert run_study(tmp_path, "--train-only", "--only", rest).returncode == 0
    assert len(list(root.glob("runs/*/seed*/demo_2*"))) == 4

    corpus = load_corpus(load_config(ROOT / "configs" / "demo.yaml").data)
    asked: list[list[str]] = []
    monkeypatch.setattr(stages, "run_commands", _fake_test_py(asked, {s: list(corpus[s]["tgt"]) for s in corpus}))
    one = run_study(tmp_path, "--decode-only", "--only", "attention_pe=rope:2", *DECODERS)
    assert one.returncode == 0, one.stdout + one.stderr
    [run] = root.glob("runs/attention_pe_rope/seed2/demo_2*")
    per_run = 1 + len(GRID) + len(GRID) - 1  # the beams; each floor on validation; each floor but 0 on the test set
    assert len(asked) == per_run and all(a[a.index("--model_path") + 1].startswith(str(run)) for a in asked)
    assert [p.parent.parent.parent.name for p in root.glob("runs/*/seed*/demo_2*/eval/attention_stats*")] == [
        "seed2"]  # the attention statistics of the named run alone
    assert run_study(tmp_path, "--decode-only", "--only", rest, *DECODERS).returncode == 0
    assert len(asked) == 4 * per_run  # the other three, nothing decoded twice
    assert run_study(tmp_path, "--decode-only", *DECODERS).returncode == 0 and len(asked) == 4 * per_run

    for pt in root.glob("runs/*/seed*/demo_2*/checkpoints/*.pt"):
        pt.unlink()
    reported = run_study(tmp_path, "--score-only", *DECODERS)
    assert reported.returncode == 0, reported.stdout + reported.stderr
    results = json.loads((root / "results.json").read_text())
    assert results["seeds"] == [1, 2] and all(len(e["attention"]) == 2 for e in results["systems"].values())
