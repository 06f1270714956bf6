"""Identical systems are no difference: the study's paired bootstrap gives p = 1, not 1 / (samples + 1)."""

from __future__ import annotations

from sacrebleu.metrics import BLEU, CHRF

from utils.study.stats import bootstrap_quantity, sentence_stats


def test_identical_systems_are_no_difference() -> None:
    refs = ["the cat sleeps", "a dog runs in the park", "good morning"]
    for hyps in (["x", "y", "z"], ["the cat sleeps", "a dog runs", "good evening"]):  # BLEU 0.00 and above
        for metric in (BLEU(), CHRF()):
            stats = sentence_stats(metric, hyps, refs)
            out = bootstrap_quantity(metric, [[stats]], [[stats.copy()]], [1.0], samples=200)
            assert out["delta"] == 0.0 and out["p_value"] == 1.0
