"""Identical systems are no difference: the paired bootstrap gives p = 1, not 1 / (samples + 1)."""

from __future__ import annotations

import sys

from conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))

import study  # noqa: E402


def test_identical_systems_are_no_difference() -> None:
    refs = ["the cat sleeps", "a dog runs in the park", "good morning"]
    for hyps in (["x", "y", "z"], ["the cat sleeps", "a dog runs", "good evening"]):  # BLEU 0.00 and above
        out = study.paired_bootstrap([hyps], [list(hyps)], refs, samples=200)
        for metric in ("BLEU", "chrF"):
            assert out[metric]["delta"] == 0.0 and out[metric]["p_value"] == 1.0
