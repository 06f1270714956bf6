"""bench/study.py --decode-only: everything that needs a run's weights (every decoder and split, each floor of the
length-controlled decoder, the attention statistics) done right after training, so a study can drop its checkpoints
(or lose its machine) between looks and still be scored and reported from its files."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import run_study

from utils.study.length_control import GRID

DECODERS = ("--decoders", "beam5,greedy,beam5-minlen")


def test_decode_only_leaves_nothing_that_needs_the_weights(tmp_path: Path) -> None:
    root = tmp_path / "study_t"
    refused = run_study(tmp_path, "--seeds", "1", "--decode-only", *DECODERS)
    assert refused.returncode == 2 and refused.stderr.strip().splitlines()[-1].startswith(
        "error: --decode-only: 2 of 2 runs are not trained to the budget"), refused.stderr
    assert run_study(tmp_path, "--seeds", "1", "--train-only").returncode == 0
    decoded = run_study(tmp_path, "--seeds", "1", "--decode-only", *DECODERS)  # one seed: no statistics to refuse
    assert decoded.returncode == 0, decoded.stdout + decoded.stderr
    assert "--decode-only: no statistics, no report" in decoded.stdout
    assert not (root / "results.json").exists() and not (root / "report.md").exists()
    runs = sorted(root.glob("runs/*/seed1/demo_2*"))
    assert len(runs) == 2
    floors = {f"minlen{a:g}" for a in GRID if a}
    for run in runs:
        names = {p.name for p in (run / "eval").glob("*.json")}
        assert {"test.best.beam5.n12.json", "test.best.beam1.n12.json", "validation.best.beam5.n12.json",
                "attention_stats.best.n6.json"} <= names
        for split in ("validation", "test"):
            assert {n[n.index("minlen"):-5] for n in names if n.startswith(f"{split}.") and "minlen" in n} == floors
    again = run_study(tmp_path, "--seeds", "1", "--decode-only", *DECODERS)
    assert again.returncode == 0 and "  test " not in again.stdout  # nothing decoded twice

    # The weights go (or stay behind on a lost machine); seed 2 is trained and decoded later, and the study is
    # scored and reported: seed 1 from its files alone, attention statistics included, nothing of it decoded.
    for pt in root.glob("runs/*/seed1/demo_2*/checkpoints/*.pt"):
        pt.unlink()
    assert run_study(tmp_path, "--train-only").returncode == 0
    reported = run_study(tmp_path, "--score-only", *DECODERS)
    assert reported.returncode == 0, reported.stdout + reported.stderr
    assert "no checkpoint" not in reported.stdout and " seed 1 beam" not in reported.stdout
    results = json.loads((root / "results.json").read_text())
    assert results["seeds"] == [1, 2] and set(results["length_control"]["systems"]) == {
        "attention_pe=none", "attention_pe=rope"}
    assert all(len(e["attention"]) == 2 for e in results["systems"].values())  # both seeds' statistics
