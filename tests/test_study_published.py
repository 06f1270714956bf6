"""The published studies (bench/studies/<name>): study_report.py recomputes each report exactly from its
results.json and hypotheses, and the site's study pages show them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import ROOT

#: Every published study folder: each is recomputed below (one published later joins without an edit).
PUBLISHED = sorted(p.parent.name for p in (ROOT / "bench" / "studies").glob("*/results.json"))


@pytest.mark.parametrize("name", PUBLISHED)
def test_the_published_reports_are_what_study_report_recomputes(name: str, tmp_path: Path) -> None:
    """bench/studies/<name>: study_report.py on a copy of the published results.json (and hypotheses/, with the
    references of the corpus, where published) gives the same report and the same primary tests (seed-test and
    bootstrap p-values included) and its declared family; all-encodings keeps learnable and RoPE in the seed
    table's family (one verdict per contrast on the same runs)."""
    from conftest import SHARED_DATA

    from utils.study.report import reanalyse

    published = ROOT / "bench" / "studies" / name
    copy = tmp_path / name
    copy.mkdir()
    shutil.copy(published / "results.json", copy / "results.json")
    if (published / "hypotheses").is_dir():
        if not SHARED_DATA.is_dir():
            pytest.skip(f"shared data not found at {SHARED_DATA} (set FR2EN_SHARED_DATA): the references")
        shutil.copytree(published / "hypotheses", copy / "hypotheses")
    results = reanalyse(copy)
    published_results = json.loads((published / "results.json").read_text(encoding="utf-8"))
    before = published_results["primary"]
    assert [(t["system"], t["label"]) for t in results["primary"]["tests"]] == [
        (t["system"], t["label"]) for t in before["tests"]]
    for new, old in zip(results["primary"]["tests"], before["tests"], strict=True):
        assert new["seed_test"]["p_value"] == pytest.approx(old["seed_test"]["p_value"], rel=1e-9)
        assert new["seed_test"]["p_holm"] == pytest.approx(old["seed_test"]["p_holm"], rel=1e-9)
        assert (new["bootstrap"] is None) == (old["bootstrap"] is None)
        if new["bootstrap"] is not None:  # from the published hypotheses: the same resamples (seeded), the same p
            assert new["bootstrap"]["p_value"] == pytest.approx(old["bootstrap"]["p_value"], rel=1e-9)
    assert (copy / "report.md").read_text(encoding="utf-8") == (published / "report.md").read_text(encoding="utf-8")
    systems = {t["system"] for t in results["primary"]["tests"]}
    if name == "all-encodings":
        assert results["primary"]["family"]["elsewhere"] == {"learnable": "seed-table", "rope": "seed-table"}
        assert not systems & {"learnable", "rope"} and results["primary"]["size"] == 24
    elif name in ("extrapolation", "extrapolation-2700"):  # the pre-registration: 6 contrasts x 2 sets x
        # (chrF, drop), Holm over 24; the continuation scores the same family at its budget
        family = results["primary"]["family"]
        assert systems == {"learnable", "rope", "rope+ntk", "rope+yarn", "alibi", "t5"}
        assert results["primary"]["size"] == 24
        assert family["splits"] == ["test.tatoeba.x4", "test.multi30k-2016.x4"] and family["decoder"] == "beam5"
        assert family["drops"] == {"test.tatoeba.x4": "test.tatoeba", "test.multi30k-2016.x4": "test.multi30k-2016"}
        assert family["smallest_effect"] == 1.0 and results["bootstrap_samples"] == 10000
        resolved, steps = {"extrapolation": (11, 2250), "extrapolation-2700": (4, 2700)}[name]
        assert sum(t["resolved"] for t in results["primary"]["tests"]) == resolved
        assert published_results["spec"]["steps"] == steps
    elif name == "extrapolation-candidates":  # its own family, declared 2026-11-26; scored from beam 5 files
        assert systems == {"kerple_log", "fire", "decoder-nope", "sinusoidal+shape"}
        assert results["primary"]["size"] == 16 and results["bootstrap_samples"] == 10000
        assert results["decoders"] == ["beam5"] and len(results["splits"]) == 8
        assert results["primary"]["family"]["declared"].startswith("exploratory")
        assert [(t["system"], t["label"].split()[1]) for t in results["primary"]["tests"] if t["resolved"]] == [
            ("fire", "test.multi30k-2016.x4"), ("fire", "drop"), ("sinusoidal+shape", "drop"), ("fire", "drop"),
            ("sinusoidal+shape", "drop")]
    else:
        assert systems == {"learnable", "rope"} and results["primary"]["size"] == 6


def test_the_study_pages_show_the_published_reports() -> None:
    """Each study's page on the site (docs/pages/studies/<name>.md, generated) shows the report's per-seed tables
    digit for digit and the primary tests of its declared family with their verdicts; its robustness check (each
    contrast's own paired t over seeds, Holm over the family) keeps what the page says it keeps."""
    from utils.study.stats import holm

    # study, "±" rows, then for a declared family: its size, resolved, and (paired-t Holm kept, the page's text)
    extrapolation_2250 = ([("alibi", "test.tatoeba.x4", 0.0066), ("t5", "drop", 0.0418)],
                          "ALiBi on Tatoeba ×4 (Holm p 0.0066) and T5's drop on Multi30k (0.042)")
    extrapolation_2700 = ([("t5", "drop", 0.0326)], "T5's drop on Multi30k (Holm p 0.033)")
    for study_name, n, family in (
            ("seed-table", 3, None), ("all-encodings", 11, None),
            ("extrapolation", 8, (24, 11, extrapolation_2250)),
            ("extrapolation-2700", 8, (24, 4, extrapolation_2700)),
            ("extrapolation-candidates", 5, (16, 5, None))):
        page = (ROOT / "docs" / "pages" / "studies" / f"{study_name}.md").read_text(encoding="utf-8")
        folder = ROOT / "bench" / "studies" / study_name
        report = (folder / "report.md").read_text(encoding="utf-8").splitlines()
        rows = [line for line in report if line.startswith("| ") and "±" in line and "chrF" not in line]
        assert len([r for r in rows if r in page.splitlines()]) >= n, study_name
        if family is None:
            continue
        size, resolved, robustness = family
        primary = json.loads((folder / "results.json").read_text("utf-8"))["primary"]
        assert len(primary["tests"]) == size
        assert sum(t["resolved"] for t in primary["tests"]) == resolved
        assert f"**{resolved} of {size} tests resolved" in page, study_name
        power = primary["power"]  # the page's residual and detectable effect are the report's
        assert f"{power['pooled_residual_sd']:.2f} chrF" in page, study_name
        assert f"power needs a true difference of {power['detectable_at_80']:.2f}" in page, study_name
        if robustness is not None:
            adjusted = holm([t["paired_t"]["p_value"] for t in primary["tests"]])
            kept = [(t["system"], t["label"].split()[1], round(p, 4))
                    for t, p in zip(primary["tests"], adjusted, strict=True) if p < 0.05]
            assert kept == robustness[0] and robustness[1] in page, study_name
