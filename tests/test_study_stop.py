"""The declared stopping rule of a group-sequential study (utils.study.looks.settled, bench/study_stop.py): a test
is settled once resolved at any look, or futile at the latest; the study stops when every test is settled or at its
last planned look."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import kept_run, results_doc, run_script

from utils.config import ConfigError
from utils.study.looks import settled

LABELS = ("chrF x4", "chrF drop")


def _look(look: int, of: int, resolved: set[str] = frozenset(), futile: set[str] = frozenset()) -> dict[str, Any]:
    tests = [{"system": s, "label": q, "resolved": f"{s}: {q}" in resolved,
              "sequential": {"crossed": f"{s}: {q}" in resolved, "futility": f"{s}: {q}" in futile}}
             for s in ("rope", "alibi") for q in LABELS]
    return {"tests": tests, "design": {"kind": "group-sequential", "look": look, "of": of, "seeds": 5 * look}}


def test_a_resolved_test_stays_resolved_and_futility_counts_at_the_latest_look() -> None:
    first = _look(1, 3, resolved={"rope: chrF x4"}, futile={"alibi: chrF x4", "alibi: chrF drop"})
    # At look 2 rope x4 no longer crosses (it stays resolved) and alibi x4 is no longer futile (open again).
    second = _look(2, 3, futile={"alibi: chrF drop", "rope: chrF drop"})
    v = settled([first, second])
    assert v["resolved"] == ["rope: chrF x4"] and v["futile"] == ["rope: chrF drop", "alibi: chrF drop"]
    assert (v["stop"], v["open"], v["why"]) == (False, ["alibi: chrF x4"], "1 of 4 tests are open at look 2 of 3")
    third = _look(3, 3)
    assert settled([first, second, third])["stop"] and settled([first, second, third])["why"] == (
        "the last planned look (15 seeds per system)")
    done = _look(2, 3, resolved={"alibi: chrF x4"}, futile={"alibi: chrF drop", "rope: chrF drop"})
    assert settled([first, done]) == {"stop": True, "why": "every test is resolved or futile",
                                      "resolved": ["rope: chrF x4", "alibi: chrF x4"],
                                      "futile": ["rope: chrF drop", "alibi: chrF drop"], "open": []}


def test_looks_of_another_design_or_family_are_refused_in_one_line() -> None:
    with pytest.raises(ConfigError, match="^no look taken yet"):
        settled([])
    with pytest.raises(ConfigError, match="declares no group-sequential design"):
        settled([{"tests": [], "design": {"kind": "fixed", "look": 1, "of": 1}}])
    other = _look(2, 3)
    other["tests"] = other["tests"][:3]
    with pytest.raises(ConfigError, match="^the looks test different families"):
        settled([_look(1, 3), other])


def test_the_command_says_stop_or_continue_first(tmp_path: Path) -> None:
    for k, look in ((1, _look(1, 2, resolved={"rope: chrF x4"})), (2, _look(2, 2))):
        (tmp_path / f"look{k}").mkdir()
        results = results_doc(primary=look)
        results["compute"] = {"runs": {}, "total": {"runs": 10 * k, "train_cpu_hours": 6.0 * k, "decode_cpu_hours": k,
                                                    "train_gpu_minutes": 0.0, "decode_gpu_minutes": 0.0,
                                                    "threads_unrecorded": []}}
        (tmp_path / f"look{k}" / "results.json").write_text(json.dumps(results))
    first = run_script("bench/study_stop.py", str(tmp_path / "look1"))
    assert first.returncode == 0 and first.stdout.splitlines()[:2] == [
        "continue: 3 of 4 tests are open at look 1 of 2", "resolved (1): rope: chrF x4"]
    assert first.stdout.splitlines()[-1] == ("compute so far: 10 runs, 7.0 CPU core-hours, 0.0 GPU minutes; per test "
                                            "resolved so far: 7.0 CPU core-hours, 0.0 GPU minutes")
    both = run_script("bench/study_stop.py", str(tmp_path / "look1"), str(tmp_path / "look2"))
    assert both.stdout.splitlines()[0] == "stop: the last planned look (10 seeds per system)"
    assert both.stdout.splitlines()[-1].startswith("compute so far: 20 runs, 14.0 CPU core-hours, 0.0 GPU minutes; "
                                                   "per test resolved so far: 14.0")  # resolved at look 1, counted
    missing = run_script("bench/study_stop.py", str(tmp_path / "look3"))
    assert missing.returncode == 2 and missing.stderr.strip().splitlines()[-1].endswith("look3: no results.json")


def test_a_study_that_continues_says_what_its_next_and_last_looks_still_need(tmp_path: Path) -> None:
    """Looks at 5, 10 and 15 seeds, two trained systems, 5 seeds scored: 10 runs cost 7 CPU core-hours so far,
    0.7 a run; look 2 needs 2 x 5 = 10 more runs (7 core-hours), the last 20 (14). ``--also`` adds the pilot's runs
    to an all-in cost; the report's Compute section says the same."""
    from utils.study.cost import cost_summary

    look = _look(1, 3, resolved={"rope: chrF x4"})
    look["design"].update(looks=[5, 10, 15], seeds=5)
    results = results_doc(primary=look, seeds=[1, 2, 3, 4, 5],
                          spec={"variants": [{"label": "sinusoidal"}, {"label": "rope"}]})
    results["compute"] = {"runs": {}, "total": {"runs": 10, "train_cpu_hours": 6.0, "decode_cpu_hours": 1.0,
                                                "train_gpu_minutes": 0.0, "decode_gpu_minutes": 0.0,
                                                "threads_unrecorded": []}}
    (tmp_path / "look1").mkdir()
    (tmp_path / "look1" / "results.json").write_text(json.dumps(results))
    pilot = results_doc()
    pilot["compute"] = {"runs": {}, "total": {**results["compute"]["total"], "runs": 12, "train_cpu_hours": 5.0,
                                              "decode_cpu_hours": 0.5}}
    (tmp_path / "pilot").mkdir()
    (tmp_path / "pilot" / "results.json").write_text(json.dumps(pilot))
    res = run_script("bench/study_stop.py", str(tmp_path / "look1"), "--also", str(tmp_path / "pilot"))
    assert res.returncode == 0, res.stderr
    need = ("10 runs to look 2 (10 seeds per system), about 7.0 CPU core-hours; 20 runs to look 3 (15 seeds per "
            "system), about 14.0 CPU core-hours, the last: at the mean cost per run so far (0.70 CPU core-hours)")
    assert res.stdout.splitlines()[-3:] == [
        "compute so far: 10 runs, 7.0 CPU core-hours, 0.0 GPU minutes; per test resolved so far: 7.0 CPU core-hours, "
        "0.0 GPU minutes",
        "all-in, with pilot: 22 runs, 12.5 CPU core-hours, 0.0 GPU minutes; per test resolved so far: "
        "12.5 CPU core-hours, 0.0 GPU minutes",
        f"still needed: {need}"]
    assert cost_summary(results).endswith(f" Still needed: {need}.")
    bare = run_script("bench/study_stop.py", str(tmp_path / "look1"), "--also", str(tmp_path / "none"))
    assert bare.returncode == 2 and bare.stderr.strip().splitlines()[-1].endswith(
        f"--also {tmp_path / 'none'}: neither compute figures (results.json) nor runs (runs/SYSTEM/seedN/)")


def test_the_all_in_cost_counts_a_pilot_scored_before_results_recorded_compute(tmp_path: Path) -> None:
    """The noise pilot was scored by a commit whose results.json has no compute, and on a new machine only its kept
    runs come back (no results.json): ``--also`` then counts the runs' own records, the latest run of each seed
    folder (an older run beside it, replaced, is not counted twice)."""
    from utils.study.cost import folder_cost

    look = _look(1, 3, resolved={"rope: chrF x4"})
    results = results_doc(primary=look)
    results["compute"] = {"runs": {}, "total": {"runs": 10, "train_cpu_hours": 6.0, "decode_cpu_hours": 1.0,
                                                "train_gpu_minutes": 0.0, "decode_gpu_minutes": 0.0,
                                                "threads_unrecorded": []}}
    (tmp_path / "look1").mkdir()
    (tmp_path / "look1" / "results.json").write_text(json.dumps(results))
    scored, kept = tmp_path / "study_pilot-plain", tmp_path / "kept" / "study_pilot-cool"
    scored.mkdir()
    (scored / "results.json").write_text(json.dumps(results_doc(spec={"checkpoint": "last", "variants": []})))
    for folder in (scored, kept):
        for system in ("sinusoidal", "rope"):
            kept_run(folder / "runs" / system / "seed1", 3240.0, 360.0)  # 0.9 + 0.1 core-hours
    kept_run(kept / "runs" / "rope" / "seed1", 9e9, 9e9, stamp="20261129_000000")  # older: not the one kept
    assert folder_cost(kept) == {"runs": 2, "train_cpu_hours": 1.8, "decode_cpu_hours": 0.2,
                                 "train_gpu_minutes": 0.0, "decode_gpu_minutes": 0.0, "threads_unrecorded": []}
    res = run_script("bench/study_stop.py", str(tmp_path / "look1"), "--also", str(scored), "--also", str(kept))
    assert res.returncode == 0, res.stderr
    assert ("all-in, with study_pilot-plain, study_pilot-cool: 14 runs, 11.0 CPU core-hours, 0.0 GPU minutes; per "
            "test resolved so far: 11.0 CPU core-hours") in res.stdout  # the folders' names: stop.txt is portable
