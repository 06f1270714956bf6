"""Metrics: sacreBLEU/chrF as sacrebleu computes them, nltk BLEU-4 on words (not characters), buckets."""

from __future__ import annotations

import pytest
import sacrebleu

from utils.translation.scoring import corpus_scores, scores_by_length, word_tokens

HYP = ["The cat is sleeping on the sofa.", "I would like a coffee, please.", "He eats an apple."]
REF = ["The cat sleeps on the sofa.", "I would like a coffee, please.", "He is eating an apple."]


def test_sacrebleu_and_chrf_match_the_library() -> None:
    s = corpus_scores(HYP, REF)
    assert s.bleu == pytest.approx(sacrebleu.corpus_bleu(HYP, [REF]).score)
    assert s.chrf == pytest.approx(sacrebleu.corpus_chrf(HYP, [REF]).score)
    assert s.bleu_signature.startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    assert s.chrf_signature.startswith("nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:")
    assert s.n_sentences == 3 and s.bleu_detail.startswith("BLEU = ")


def test_perfect_and_disjoint_translations() -> None:
    assert corpus_scores(REF, REF).bleu == pytest.approx(100.0)
    assert corpus_scores(REF, REF).nltk_bleu4 == pytest.approx(100.0)
    assert corpus_scores(["xyz qqq www"], ["The cat sleeps."]).bleu == pytest.approx(0.0)


def test_nltk_bleu_counts_words_not_characters() -> None:
    assert word_tokens("I'd like a coffee, please.") == ["I", "'d", "like", "a", "coffee", ",", "please", "."]
    # Same characters in another word order: character n-grams overlap a lot, word 4-grams hardly.
    hyp, ref = ["please a coffee like I would ."], ["I would like a coffee please ."]
    assert corpus_scores(hyp, ref).nltk_bleu4 < 30.0


def test_length_mismatch_is_an_error() -> None:
    with pytest.raises(ValueError, match="2 hypotheses but 3 references"):
        corpus_scores(HYP[:2], REF)


def test_scores_by_length_buckets() -> None:
    hyps = ["a b c", "x y", "the same sentence here", "the same sentence here"]
    refs = ["a b c", "p q", "the same sentence here", "the same sentence here"]
    rows = scores_by_length(hyps, refs, [3, 12, 25, 70], [10, 20, 60])
    assert [r["bucket"] for r in rows] == ["0-9", "10-19", "20-59", "60+"]
    assert [r["n"] for r in rows] == [1, 1, 1, 1]
    assert rows[1]["bleu"] == pytest.approx(0.0) and rows[2]["bleu"] == pytest.approx(100.0)
    long_out = scores_by_length(["a b c d e f", "x"], ["a b c", "p q"], [3, 12], [10])
    assert [r["length_ratio"] for r in long_out] == pytest.approx([2.0, 0.5])  # 13a tokens, hypothesis/reference
    empty = scores_by_length(hyps, refs, [3, 3, 3, 3], [10, 20])
    assert empty[1] == {"bucket": "10-19", "n": 0}


def test_lowercase_scoring_ignores_case_and_says_so() -> None:
    hyps, refs = ["the cat sleeps on the sofa."], ["The cat sleeps on the sofa."]
    cased = corpus_scores(hyps, refs)
    lower = corpus_scores(hyps, refs, lowercase=True)
    assert cased.bleu < 100.0 and lower.bleu == pytest.approx(100.0) and lower.nltk_bleu4 == pytest.approx(100.0)
    assert lower.chrf == pytest.approx(100.0) and cased.chrf < lower.chrf
    assert "case:lc" in lower.bleu_signature and "case:lc" in lower.chrf_signature
    assert "case:mixed" in cased.bleu_signature
    rows = scores_by_length(hyps, refs, [7], [10], lowercase=True)
    assert rows[0]["bleu"] == pytest.approx(100.0)


def test_bleu4_can_be_left_out_and_then_nltk_is_not_imported() -> None:
    """Validation scores BLEU and chrF only: without BLEU-4 the scores are the same and nltk (with the scipy it
    imports, about a second) stays out of the process; a training run's validation is such a process."""
    import subprocess
    import sys

    from conftest import ROOT, TINY_CLI

    full, lean = corpus_scores(HYP, REF), corpus_scores(HYP, REF, bleu4=False)
    assert lean.nltk_bleu4 is None and (lean.bleu, lean.chrf) == (full.bleu, full.chrf)
    sets = [a for s in [*TINY_CLI, "train.max_steps=1", "train.eval_every=1"] for a in ("--set", s)]
    probe = ("import runpy, sys, tempfile\n"
             "d = tempfile.mkdtemp()\n"
             f"sys.argv = ['train.py', '--config', 'configs/demo.yaml', '--runs', d, *{sets!r},"
             " '--set', 'data.cache_dir=' + d + '/c']\n"
             "try:\n    runpy.run_path('train.py', run_name='__main__')\nexcept SystemExit as e:\n"
             "    assert not e.code, e.code\n"
             "print(sorted(m for m in ('nltk', 'scipy') if m in sys.modules))\n")
    res = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "valid loss" in res.stderr + res.stdout and res.stdout.splitlines()[-1] == "[]"
