"""The published studies (bench/studies/<name>): study_report.py recomputes each report exactly from its
results.json and hypotheses, and the site's study pages show them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import ROOT

from utils.study.report import published_folders

#: Every published study folder, a sequential study's looks included (``extrapolation-sequential/looks/look-1``):
#: each is recomputed below (one published later joins without an edit, and needs its own checks below).
PUBLISHED = [p.relative_to(ROOT / "bench" / "studies").as_posix()
             for p in published_folders(ROOT / "bench" / "studies")]
#: The largest, 320,000 hypotheses and more each (about 100 s of one core apiece, the second study's looks 140 s,
#: most of it sacreBLEU's sentence statistics; its natural-length arm's look has half as many): here their primary
#: tests are recomputed from the hypotheses the family reads (a sixth of them); the whole recomputation is
#: ``python bench/study_report.py --check``, run whenever a study is published or utils/study changes (docs:
#: contributing). Every other study, candidates included, is recomputed whole here.
WHOLE_BY_COMMAND = ("extrapolation", "extrapolation-2700",
                    *(n for n in PUBLISHED if n.startswith("extrapolation-sequential/looks/")))


@pytest.mark.parametrize("name", [n for n in PUBLISHED if n not in WHOLE_BY_COMMAND])
def test_the_published_reports_are_what_study_report_recomputes(name: str, tmp_path: Path) -> None:
    """bench/studies/<name>: study_report.py on a copy of the published results.json (and hypotheses/, with the
    references of the corpus, where published) gives the same report and the same primary tests (seed-test and
    bootstrap p-values included) and its declared family; all-encodings keeps learnable and RoPE in the seed
    table's family (one verdict per contrast on the same runs)."""
    from conftest import SHARED_DATA

    from utils.study.report import reanalyse

    published = ROOT / "bench" / "studies" / name
    copy = tmp_path / name
    copy.mkdir(parents=True)
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


@pytest.mark.parametrize("name", WHOLE_BY_COMMAND)
def test_the_largest_studies_recompute_their_primary_tests(name: str, tmp_path: Path) -> None:
    """extrapolation, its continuation and the second study's looks, from the hypotheses their family reads: the
    same primary family (6 contrasts x 2 sets x (chrF, drop), Holm over 24, each at its own budget; the natural-length
    arm's 4 contrasts, 16 tests, trained on pairs of every length and tested once), each test's seed-test, Holm and
    bootstrap p, and its verdict; a look with its place in the group-sequential design and the alpha spent there."""
    from conftest import SHARED_DATA

    from utils.study.report import reanalyse

    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA} (set FR2EN_SHARED_DATA): the references")
    published = ROOT / "bench" / "studies" / name
    shutil.copy(published / "results.json", tmp_path / "results.json")
    shutil.copytree(published / "hypotheses", tmp_path / "hypotheses")
    results = reanalyse(tmp_path, primary_only=True)
    assert not (tmp_path / "report.md").exists() and results["decoders"] == ["beam5"]
    assert results["exploratory"] == [] and results["attention_tests"] == {}  # the primary tests alone
    assert results["splits"] == ["test.tatoeba", "test.tatoeba.x4", "test.multi30k-2016", "test.multi30k-2016.x4"]
    before = json.loads((published / "results.json").read_text(encoding="utf-8"))
    assert [(t["system"], t["label"]) for t in results["primary"]["tests"]] == [
        (t["system"], t["label"]) for t in before["primary"]["tests"]]
    for new, old in zip(results["primary"]["tests"], before["primary"]["tests"], strict=True):
        assert new["seed_test"]["p_value"] == pytest.approx(old["seed_test"]["p_value"], rel=1e-9)
        assert new["seed_test"]["p_holm"] == pytest.approx(old["seed_test"]["p_holm"], rel=1e-9)
        assert new["bootstrap"]["p_value"] == pytest.approx(old["bootstrap"]["p_value"], rel=1e-9)
        assert new["resolved"] == old["resolved"]
    family = results["primary"]["family"]
    natural = name.endswith("/looks/natural")  # the second study's natural-length arm: no test-time RoPE variants
    assert {t["system"] for t in results["primary"]["tests"]} == {"learnable", "rope", "alibi", "t5"} | (
        set() if natural else {"rope+ntk", "rope+yarn"})
    assert results["primary"]["size"] == (16 if natural else 24)
    assert family["splits"] == ["test.tatoeba.x4", "test.multi30k-2016.x4"] and family["decoder"] == "beam5"
    assert family["drops"] == {"test.tatoeba.x4": "test.tatoeba", "test.multi30k-2016.x4": "test.multi30k-2016"}
    assert family["smallest_effect"] == 1.0 and before["bootstrap_samples"] == 10000
    resolved, steps = {"extrapolation": (11, 2250), "extrapolation-2700": (4, 2700),
                       "extrapolation-sequential/looks/look-1": (16, 900),
                       "extrapolation-sequential/looks/natural": (6, 900)}[name]  # a look published: its line here
    assert sum(t["resolved"] for t in before["primary"]["tests"]) == resolved
    assert before["spec"]["steps"] == steps
    if natural:  # its own family, tested once at seeds 1-3 (the whole alpha), every run without the 16-token cap
        assert results["primary"]["design"] == {"kind": "fixed", "look": 1, "of": 1, "seeds": 3, "alpha": 0.05,
                                                "alpha_spent": 0.05}
        assert results["seeds"] == [1, 2, 3] and "data.max_train_len=null" in before["spec"]["overrides"]
    elif "/looks/" in name:  # the design's looks at 6, 12, 17 seeds; O'Brien-Fleming spending of 0.05
        look = int(name.rsplit("-", 1)[1])
        design = results["primary"]["design"]
        assert (design["kind"], design["looks"], design["look"], design["of"]) == (
            "group-sequential", [6, 12, 17], look, 3)
        assert design["seeds"] == len(results["seeds"]) == design["looks"][look - 1]
        assert design["alpha_spent"] == pytest.approx(before["primary"]["design"]["alpha_spent"], rel=1e-12)


def test_the_published_folders_are_the_studies_and_their_looks(tmp_path: Path) -> None:
    """``published_folders``, what ``study_report.py --check`` recomputes when given no folder: each study holding a
    results.json, and each look of a group-sequential study holding one; nothing else."""
    for folder in ("a", "b/looks/look-1", "b/looks/look-2", "b/looks/natural"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "results.json").write_text("{}")
    for folder in ("b/records", "c/looks/look-1", "d"):
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
    (tmp_path / "b" / "records" / "results.json").write_text("{}")  # not a look
    assert published_folders(tmp_path) == [tmp_path / "a", tmp_path / "b/looks/look-1", tmp_path / "b/looks/look-2",
                                           tmp_path / "b/looks/natural"]


def test_study_report_check_compares_without_writing(tmp_path: Path) -> None:
    """``bench/study_report.py --check``: a published study recomputes exactly (exit 0, one line); a copy whose
    report.md was edited is named with its difference (exit 1); neither folder is written; bad use is one line."""
    from conftest import run_script

    published = ROOT / "bench" / "studies" / "seed-table"
    edited = tmp_path / "seed-table"
    shutil.copytree(published, edited, ignore=shutil.ignore_patterns("figures"))
    (edited / "report.md").write_text((published / "report.md").read_text(encoding="utf-8") + "\nedited\n",
                                      encoding="utf-8")
    files = {p: p.read_bytes() for p in [*published.rglob("*"), *edited.rglob("*")] if p.is_file()}
    res = run_script("bench/study_report.py", "--check", str(published), str(edited))
    assert res.returncode == 1, res.stderr
    assert res.stdout.splitlines() == [f"{published}: recomputes exactly (report.md and the primary tests)",
                                       f"{edited}: 1 differences", "  report.md differs from the recomputed one"]
    assert {p: p.read_bytes() for p in files} == files
    assert sorted(p for p in [*published.rglob("*"), *edited.rglob("*")] if p.is_file()) == sorted(files)
    for bad, message in ((["--check", "--bootstrap", "10", str(published)], "leave out --bootstrap"),
                         ([str(published), str(edited)], "one folder at a time (several only with --check)"),
                         ([], "the study folder is missing")):
        res = run_script("bench/study_report.py", *bad)
        assert res.returncode == 2 and res.stderr.strip().splitlines()[-1].endswith(message)


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
