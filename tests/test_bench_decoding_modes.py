"""bench/decoding_modes.py: the oracle terminology set, its coverage, and a real run of two modes on a tiny model."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import ROOT, run_script, train_tiny_run

sys.path.insert(0, str(ROOT / "bench"))

from decoding_modes import coverage, terms  # noqa: E402


def test_each_reference_gives_its_longest_word_of_five_letters_and_coverage_counts_sentences_with_one() -> None:
    refs = ["The cat sleeps on the sofa.", "Go!", "Élodie mange 12345 pommes", "abcde fghij"]
    assert terms(refs) == [["sleeps"], [], ["Élodie"], ["abcde"]]
    hyps = ["a cat sleeps", "go", "elodie eats", "abcde"]
    assert coverage(hyps, terms(refs)) == pytest.approx(100 * 2 / 3)  # the sentence without a term is not counted


def test_an_unknown_mode_is_one_line(tmp_path: Path) -> None:
    res = run_script("bench/decoding_modes.py", "--model_path", "x", "--src", "data/demo/test.fr", "--ref",
                     "data/demo/test.en", "--modes", "beam5,nucleus", "--out", str(tmp_path))
    assert res.returncode == 2 and res.stderr.strip().splitlines()[-1].endswith(
        "--modes: unknown nucleus (of: beam5, greedy, ensemble, sample, sample-eps, mbr16, mbr32, mbr32-eps, "
        "mbr-nbest, no-repeat3, prefix, constraints)")
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_a_run_scores_each_mode_and_keeps_every_term_under_constraints(tmp_path: Path) -> None:
    run = train_tiny_run(tmp_path, ["model.input_pe=none", "decode.max_len_a=0", "decode.max_len_b=12"],
                         max_steps=6, eval_every=1000)
    out = tmp_path / "out"
    res = run_script("bench/decoding_modes.py", "--model_path", str(run), "--src", "data/demo/test.fr", "--ref",
                     "data/demo/test.en", "--sentences", "3", "--modes", "constraints", "--out", str(out))
    assert res.returncode == 0, res.stderr
    rows = json.loads((out / "decoding_modes.json").read_text())["rows"]
    assert [r["mode"] for r in rows] == ["beam5-1", "constraints"]
    assert rows[1]["term_coverage"] == 100.0 and rows[0]["speed_vs_beam5"] == 1.0
    refs = (ROOT / "data" / "demo" / "test.en").read_text(encoding="utf-8").splitlines()[:3]
    hyps = (out / "constraints.en").read_text(encoding="utf-8").splitlines()
    assert all(t[0] in h for h, t in zip(hyps, terms(refs), strict=True) if t)
    report = (out / "report.md").read_text()
    assert "| beam 5, one reference term per sentence | `--constraints terms.jsonl` |" in report
