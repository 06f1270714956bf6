"""bench/sensitivity_decodings.py: a published study's primary tests again with a declared decoding tested in its
parent's place, in a copy (the published folder untouched); on the published seed table (no hypotheses: the seed
test alone), with learnable declared a decoding of RoPE for the test's sake."""

from __future__ import annotations

import json

from conftest import ROOT, run_script

from utils.study.stats import blocked_anova, holm

SEED_TABLE = ROOT / "bench" / "studies" / "seed-table"


def test_a_decoding_is_tested_in_its_parents_place_and_the_study_is_left_as_it_is() -> None:
    before = (SEED_TABLE / "results.json").read_bytes()
    res = run_script("bench/sensitivity_decodings.py", str(SEED_TABLE), "--decodings", "learnable=rope")
    assert res.returncode == 0, res.stderr
    assert (SEED_TABLE / "results.json").read_bytes() == before
    lines = res.stdout.splitlines()
    assert lines[0].endswith("learnable in place of rope; a sensitivity analysis, not the study's result")
    rows = {tuple(line.split(" | ")[:2]): line.split(" | ") for line in lines if line.startswith(("| learnable",
                                                                                               "| rope"))}
    assert len(rows) == 6 and lines[-1] == "resolved: 0 of 6 as published, 0 of 6 recomputed"
    # learnable's seed test: the ANOVA of sinusoidal and learnable (RoPE's row replaced), df (2 - 1)(3 - 1) = 2;
    # RoPE's: the ANOVA of sinusoidal and RoPE; Holm over the six.
    results = json.loads(before)
    tests = results["primary"]["tests"]
    p = []
    for t in tests:
        anova, table = blocked_anova({"sinusoidal": t["baseline_seeds"], t["system"]: t["system_seeds"]}, "sinusoidal")
        assert table["df"] == 2
        p.append(anova[t["system"]].p_value)
    for t, adjusted in zip(tests, holm(p), strict=True):
        row = rows[("| " + t["system"], t["label"])]
        assert row[5] == f"{adjusted:.4f} (2)" and row[3] == f"{t['seed_test']['p_holm']:.4f}"
    bad = run_script("bench/sensitivity_decodings.py", str(SEED_TABLE), "--decodings", "alibi=rope")
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].endswith(
        "--decodings: alibi: not among the family's systems (learnable, rope)")
