"""A study report's descriptive length columns and its design: chrF precision and recall and BLEU's brevity penalty
beside every primary quantity (equal to sacreBLEU's own corpus-level numbers), and the look a group-sequential
design is at, with the alpha spent and each test's boundary (utils/study/sequential.py's)."""

from __future__ import annotations

import random
import statistics
from statistics import NormalDist
from typing import Any

import pytest
from sacrebleu.metrics import BLEU, CHRF

from utils.schema import ConfigError
from utils.study.analysis import Family
from utils.study.looks import Design, look_fractions
from utils.study.report import analyse
from utils.study.sections import design_lines, length_lines, primary_lines
from utils.study.sequential import efficacy_bounds, futility_bounds, nominal_p, spent

WORDS = ("the cat sat on a mat while his old dog slept near the warm fire and "
         "children played in green fields under a blue sky all day long").split()


def _corpus(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12))) for _ in range(n)]


def _hyps(refs: list[str], keep: float, seed: int) -> list[str]:
    """Each reference with words dropped or swapped: output about ``keep`` times as long."""
    rng = random.Random(seed)
    out = []
    for ref in refs:
        words = ref.split()
        words = [w if rng.random() < 0.8 else rng.choice(WORDS) for w in words]
        out.append(" ".join(words[: max(1, round(len(words) * keep * rng.uniform(0.8, 1.2)))]))
    return out


X1, X2 = "test.t", "test.t.x2"
SEEDS = [1, 2, 3, 4]
KEEP = {"base": (0.7, 0), "long": (1.0, 1), "near": (0.7, 2)}  # output length, seed offset: "long" writes longer


def _study(family: dict[str, Any], seeds: list[int] = SEEDS) -> dict[str, Any]:
    """``analyse`` on three systems x ``seeds``: x1 sentences and their pairs joined (x2), both decoded so that the
    x2 output stops early (about one sentence of two)."""
    refs = _corpus(24, 0)
    refs2 = [f"{refs[2 * i]} {refs[2 * i + 1]}" for i in range(12)]
    hyps: dict[str, Any] = {}
    systems: dict[str, Any] = {}
    for name, (keep, offset) in KEEP.items():
        per = [_hyps(refs, keep, 10 * k + offset) for k in seeds]
        per2 = [_hyps(refs[0::2], keep, 100 * k + offset) for k in seeds]  # one sentence of two
        hyps[name] = {X1: {"beam5": per}, X2: {"beam5": per2}}
        systems[name] = {"variant": name, "test_variant": None,
                         "splits": {s: {"beam5": {"signature": "b", "chrf_signature": "c"}} for s in (X1, X2)}}
    return analyse(systems, hyps, {X1: refs, X2: refs2}, None, [X1, X2], "base", seeds, 200, False, [], None,
                   family, ["beam5"]) | {"_refs": {X1: refs, X2: refs2}, "_hyps": hyps}


@pytest.fixture(scope="module")
def fixed_study() -> dict[str, Any]:
    return _study({"splits": [X2], "drops": {X2: X1}})


def _p(hyps: list[str], refs: list[str]) -> float:
    return CHRF(beta=0).corpus_score(hyps, [refs]).score  # beta 0: the F-score is the precision


def _r(hyps: list[str], refs: list[str]) -> float:
    return CHRF(beta=10**9).corpus_score(hyps, [refs]).score  # beta -> infinity: the recall


def test_precision_recall_and_brevity_penalty_are_sacrebleus(fixed_study: dict[str, Any]) -> None:
    """Per system, split and seed, and for the drop (x1 over the sentences the x2 pairs join, minus x2): chrF's P and
    R and BLEU's BP equal sacreBLEU's corpus-level CHRF (beta 0 for P, beta -> infinity for R) and BLEU().bp; chrF
    itself is the F-beta of those P and R."""
    refs, hyps = fixed_study["_refs"], fixed_study["_hyps"]
    by_label = {e["label"]: e for e in fixed_study["primary"]["length"]}
    assert list(by_label) == ["chrF test.t.x2 (beam 5)", "chrF drop test.t → test.t.x2 (beam 5)"]
    for name in KEEP:
        for split in (X1, X2):
            row = fixed_study["systems"][name]["splits"][split]["beam5"]
            for k, h in enumerate(hyps[name][split]["beam5"]):
                p, r = row["chrf_precision"][k], row["chrf_recall"][k]
                assert p == pytest.approx(_p(h, refs[split]), rel=1e-12)
                assert r == pytest.approx(_r(h, refs[split]), rel=1e-9)
                assert row["bleu_bp"][k] == pytest.approx(BLEU().corpus_score(h, [refs[split]]).bp, rel=1e-15)
                assert row["chrf"][k] == pytest.approx(5 * p * r / (4 * p + r), rel=1e-12)
        x2, drop = by_label["chrF test.t.x2 (beam 5)"]["systems"][name], \
            by_label["chrF drop test.t → test.t.x2 (beam 5)"]["systems"][name]
        assert x2["chrf_precision"] == fixed_study["systems"][name]["splits"][X2]["beam5"]["chrf_precision"]
        for k, (h1, h2) in enumerate(zip(hyps[name][X1]["beam5"], hyps[name][X2]["beam5"], strict=True)):
            assert drop["chrf_precision"][k] == pytest.approx(_p(h1, refs[X1]) - _p(h2, refs[X2]), rel=1e-9)
            assert drop["chrf_recall"][k] == pytest.approx(_r(h1, refs[X1]) - _r(h2, refs[X2]), rel=1e-9)
            assert drop["bleu_bp"][k] == pytest.approx(BLEU().corpus_score(h1, [refs[X1]]).bp
                                                       - BLEU().corpus_score(h2, [refs[X2]]).bp, rel=1e-12)
    short = by_label["chrF test.t.x2 (beam 5)"]["systems"]["base"]
    assert statistics.fmean(short["bleu_bp"]) < 0.5  # stops after about one sentence of two: a real penalty


def test_the_report_puts_them_beside_each_primary_quantity(fixed_study: dict[str, Any]) -> None:
    lines = length_lines(fixed_study)
    assert lines[2:4] == ["| quantity | system | P | R | BP | ΔP | ΔR |", "|---|---|---|---|---|---|---|"]
    rows = [line.split(" | ") for line in lines[4:-1]]
    assert [(r[0].lstrip("| "), r[1]) for r in rows] == [(q, s) for q in ("chrF test.t.x2 (beam 5)",
                                                                        "chrF drop test.t → test.t.x2 (beam 5)")
                                                         for s in KEEP]
    entry = fixed_study["primary"]["length"][0]["systems"]
    long, base = entry["long"], entry["base"]
    assert rows[1][2:5] == [f"{statistics.fmean(long['chrf_precision']):.2f}",
                            f"{statistics.fmean(long['chrf_recall']):.2f}", f"{statistics.fmean(long['bleu_bp']):.3f}"]
    delta = statistics.fmean(a - b for a, b in zip(long["chrf_recall"], base["chrf_recall"], strict=True))
    assert rows[1][6] == f"{delta:+.2f} |" and delta > 0 and rows[0][5:] == ["-", "- |"]  # longer: more recall
    assert design_lines(fixed_study) == ["Design: fixed (one look): the family is tested once, at 4 seeds per "
                                         "system, the whole α = 0.05 spent at this look.", ""]
    assert fixed_study["primary"]["design"]["kind"] == "fixed"
    assert next(line for line in primary_lines(fixed_study) if "Power (noncentral t" in line).startswith("Power (")
    assert all("sequential" not in t for t in fixed_study["primary"]["tests"])


def test_a_group_sequential_design_gives_the_look_the_alpha_spent_and_each_boundary() -> None:
    """Looks at 2, 4, 6 seeds, 4 present: look 2 of 3, alpha spent = Lan-DeMets O'Brien-Fleming at 4/6; each test's
    boundary is sequential.py's at its Holm step's level; crossed is Holm's step-down against them; futility with
    sequential.py's futility bound."""
    design = {"looks": [2, 4, 6], "spending": "obf", "futility": True, "residual_sd": 1.0}
    results = _study({"splits": [X2], "drops": {X2: X1}, "sequential": design})
    d, tests = results["primary"]["design"], results["primary"]["tests"]
    assert (d["look"], d["of"], d["seeds"], d["planned"]) == (2, 3, 4, True)
    assert d["alpha_spent"] == pytest.approx(spent(4 / 6, 0.05, "obf"), rel=1e-12)
    order = sorted(tests, key=lambda t: t["seed_test"]["p_value"])
    crossing = True
    drift = 1.0 / (1.0 * 2 ** 0.5) * 6 ** 0.5
    for j, t in enumerate(order):
        level = 0.05 / (len(tests) - j)
        c = efficacy_bounds([2 / 6, 4 / 6, 1], level, "obf")[:2]  # look 2: the looks before it decide
        s = t["sequential"]
        assert (s["step"], s["level"]) == (j + 1, pytest.approx(level))
        assert s["boundary_z"] == pytest.approx(c[-1], abs=1e-9) and s["boundary_p"] == pytest.approx(nominal_p(c)[-1])
        crossing = crossing and t["seed_test"]["p_value"] <= s["boundary_p"]
        assert s["crossed"] is crossing
        a = futility_bounds([2 / 6, 4 / 6, 1], c + [9.0], drift, 0.2, "obf")[1]  # look 2's: not the last's bound
        assert s["futility_z"] == pytest.approx(a, abs=1e-9)
        z = NormalDist().inv_cdf(1 - t["seed_test"]["p_value"] / 2)
        assert s["futility"] is (not crossing and z < s["futility_z"])
        b = t["bootstrap"]
        assert t["resolved"] == (crossing and b["p_holm"] < 0.05 and t["delta"] * b["delta"] > 0)
    assert {t["sequential"]["crossed"] for t in tests} == {True, False} and any(t["sequential"]["futility"]
                                                                                for t in tests)
    text = design_lines(results)[0]
    assert "looks at 2, 4, 6 seeds per system, Lan-DeMets O'Brien-Fleming type spending of α = 0.05" in text
    assert f"**This is look 2 of 3**, at 4 seeds per system (information 0.67): α spent so far {d['alpha_spent']:.4g}" \
        in text
    power = next(line for line in primary_lines(results) if "Power (noncentral t" in line)
    assert power.startswith("A fixed design's power at this look's seeds (not the group-sequential design's")
    # 3 seeds: an unplanned look, the planned one at 2 counted as taken
    unplanned = _study({"splits": [X2], "sequential": {"looks": [2, 4, 6]}}, [1, 2, 3])
    three = unplanned["primary"]["design"]
    assert "the looks after it will not count it" in design_lines(unplanned)[0]
    assert (three["look"], three["planned"]) == (2, False)
    assert three["alpha_spent"] == pytest.approx(spent(3 / 6, 0.05, "obf"))


def test_a_design_is_checked_in_one_line() -> None:
    with pytest.raises(ConfigError, match=r"^7 seeds per system: past the design's last look at 6 \(looks 2, 4, 6\)"):
        look_fractions(Design.from_dict({"looks": [2, 4, 6]}), 7)
    with pytest.raises(ConfigError, match=r"^family.sequential.looks: \[4, 2\]: increasing seed counts"):
        Design.from_dict({"looks": [4, 2]})
    with pytest.raises(ConfigError, match=r"^family.sequential.futility needs residual_sd > 0"):
        Design.from_dict({"looks": [2, 4], "futility": True})
    with pytest.raises(ConfigError, match=r"^family.sequential.spending: 'haybittle' is not one of: obf, pocock"):
        Design.from_dict({"looks": [2, 4], "spending": "haybittle"})
    assert Family(sequential={"looks": [2]}).to_dict()["sequential"] == {"looks": [2]}


def test_the_published_pages_and_reports_show_them_from_results_json() -> None:
    """Every published study with hypotheses: its report's and its page's length table hold results.json's means
    (P, R to 2 decimals, BP to 3), a row per system and primary quantity; each says it is a fixed design."""
    import json

    from conftest import ROOT

    for folder in sorted((ROOT / "bench" / "studies").glob("*/hypotheses")):
        name = folder.parent.name
        results = json.loads((folder.parent / "results.json").read_text(encoding="utf-8"))
        want = [f"| {e['label']} | {s} | {statistics.fmean(v['chrf_precision']):.2f} | "
                f"{statistics.fmean(v['chrf_recall']):.2f} | {statistics.fmean(v['bleu_bp']):.3f} |"
                for e in results["primary"]["length"] for s, v in e["systems"].items()]
        assert len(want) == len(results["primary"]["length"]) * (1 + len({t["system"] for t in
                                                                           results["primary"]["tests"]}))
        for text in ((folder.parent / "report.md").read_text(encoding="utf-8"),
                     (ROOT / "docs" / "pages" / "studies" / f"{name}.md").read_text(encoding="utf-8")):
            rows = [line for line in text.splitlines() if line.startswith("| chrF ") and line.count(" | ") == 6]
            assert [r.rsplit(" | ", 2)[0] + " |" for r in rows] == want, name
            assert "Design: fixed (one look): the family is tested once, at 3 seeds per system" in text, name
