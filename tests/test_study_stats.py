"""The study's statistics (utils/study/stats.py) against scipy, sacreBLEU and hand computations."""

import math

import numpy as np
import pytest
from sacrebleu.metrics import BLEU, CHRF
from scipy import stats

from utils.study.stats import (
    blocked_anova,
    bootstrap_quantity,
    holm,
    paired_t,
    power,
    seeds_for_power,
    sentence_stats,
    smallest_detectable,
    unit_stats,
)


def test_holm_adjusts_step_down_with_a_running_maximum():
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1
    assert holm([]) == []


def test_blocked_contrast_with_two_systems_is_the_paired_t_test():
    base, system = [30.1, 25.3, 33.0], [31.0, 26.9, 33.4]
    contrasts, table = blocked_anova({"base": base, "sys": system}, "base")
    ref = stats.ttest_rel(system, base)
    assert contrasts["sys"].p_value == pytest.approx(ref.pvalue)
    assert contrasts["sys"].t == pytest.approx(ref.statistic)
    assert contrasts["sys"].df == 2 and table["df"] == 2
    assert paired_t(base, system).p_value == pytest.approx(ref.pvalue)


def test_blocked_anova_pools_the_residual_of_every_system_by_hand():
    y = {"a": [10.0, 14.0, 12.0], "b": [11.0, 16.0, 12.0], "c": [13.0, 15.0, 14.0]}
    contrasts, table = blocked_anova(y, "a")
    arr = np.array(list(y.values()))
    grand = arr.mean()
    ss_total = ((arr - grand) ** 2).sum()
    ss_treat = 3 * ((arr.mean(1) - grand) ** 2).sum()
    ss_block = 3 * ((arr.mean(0) - grand) ** 2).sum()
    mse = (ss_total - ss_treat - ss_block) / 4
    assert table["mse"] == pytest.approx(mse) and table["df"] == 4
    t = (np.mean(y["c"]) - np.mean(y["a"])) / math.sqrt(2 * mse / 3)
    assert contrasts["c"].t == pytest.approx(t)
    assert contrasts["c"].p_value == pytest.approx(2 * stats.t.sf(abs(t), 4))
    assert contrasts["c"].per_seed == pytest.approx([3.0, 1.0, 2.0])


def test_seeds_as_blocks_resolve_what_welch_cannot():
    """A consistent +1 under a seed effect of +-5: Welch's unpaired test sees only the seed spread."""
    base = [20.0, 30.0, 25.0]
    system = [21.1, 30.9, 26.0]
    assert stats.ttest_ind(system, base, equal_var=False).pvalue > 0.8  # unpaired: the seed spread swamps it
    contrasts, table = blocked_anova({"base": base, "sys": system}, "base")
    assert contrasts["sys"].p_value < 0.01
    assert table["seed_share"] > 0.99


def test_power_is_the_noncentral_t_and_matches_a_simulation():
    sd, seeds, systems, alpha, effect = 1.0, 3, 4, 0.05, 2.0
    df = (systems - 1) * (seeds - 1)
    assert power(0.0, sd, seeds, df, alpha) == pytest.approx(alpha)
    rng = np.random.default_rng(0)
    hits, n = 0, 4000
    for _ in range(n):
        block = rng.normal(0, 5, seeds)
        y = {f"s{i}": (block + rng.normal(0, sd, seeds) + (effect if i == 1 else 0)).tolist() for i in range(systems)}
        hits += blocked_anova(y, "s0")[0]["s1"].p_value < alpha
    assert hits / n == pytest.approx(power(effect, sd, seeds, df, alpha), abs=0.025)
    mde = smallest_detectable(sd, seeds, df, alpha)
    assert power(mde, sd, seeds, df, alpha) == pytest.approx(0.8, abs=1e-4)
    b = seeds_for_power(1.0, sd, systems, alpha)
    df_b = lambda n: (systems - 1) * (n - 1)  # noqa: E731
    assert power(1.0, sd, b, df_b(b), alpha) >= 0.8 > power(1.0, sd, b - 1, df_b(b - 1), alpha)


REFS = ["the cat sat on the mat", "a dog runs in the park", "it is raining today", "we like green tea",
        "the house is big", "she reads a long book", "they play football", "my brother is tall"]
HYP_A = ["the cat sat on a mat", "a dog ran in the park", "it rains today", "we like green tea",
         "the home is big", "she reads a book", "they are playing football", "my brother is big"]
HYP_B = ["a cat sits on the mat", "the dog runs in a park", "it is raining now", "we love tea",
         "the house is large", "she reads a long book", "they play soccer", "my brother tall"]


def test_bootstrap_with_one_seed_is_sacrebleus_paired_bootstrap():
    from sacrebleu.metrics import CHRF
    from sacrebleu.significance import PairedTest

    metric = CHRF()
    a, b = sentence_stats(metric, HYP_A, REFS), sentence_stats(metric, HYP_B, REFS)
    ours = bootstrap_quantity(metric, [[b]], [[a]], [1.0], samples=500, seed=12345)
    _, scores = PairedTest([("baseline", HYP_A), ("system", HYP_B)], {"chrF": CHRF()}, [REFS], test_type="bs",
                           n_samples=500)()  # baseline first; sacreBLEU's seed 12345 draws the same sentences
    ref_p = scores["chrF2"][1].p_value
    assert ours["p_value_sacrebleu"] == pytest.approx(ref_p)
    assert ours["delta"] == pytest.approx(scores["chrF2"][1].score - scores["chrF2"][0].score)


def test_bootstrap_p_value_is_two_sided_recomputed_from_resampled_corpus_scores():
    """The decision p: the resampled differences shifted to mean 0 against the observed one, on both sides.
    Recomputed here from sacreBLEU's corpus scores of the resampled sentences (the same draws), not from the
    statistics the function sums; sacreBLEU's own rule is about half of it (one-sided)."""
    from sacrebleu.metrics import CHRF

    metric = CHRF()
    refs, hyp_a = REFS * 4, HYP_A * 4
    hyp_b = [b if i % 3 else a for i, (a, b) in enumerate(zip(hyp_a, HYP_B * 4, strict=True))]  # B on 2 in 3
    a, b = sentence_stats(metric, hyp_a, refs), sentence_stats(metric, hyp_b, refs)
    samples = 300
    ours = bootstrap_quantity(metric, [[b]], [[a]], [1.0], samples=samples, seed=7)
    observed = metric.corpus_score(hyp_b, [refs]).score - metric.corpus_score(hyp_a, [refs]).score
    idx = np.random.default_rng(7).choice(len(refs), size=(samples, len(refs)), replace=True)
    diffs = np.array([metric.corpus_score([hyp_b[i] for i in row], [[refs[i] for i in row]]).score
                      - metric.corpus_score([hyp_a[i] for i in row], [[refs[i] for i in row]]).score for row in idx])
    two_sided = (np.sum(np.abs(diffs - diffs.mean()) >= abs(observed)) + 1) / (samples + 1)
    assert ours["delta"] == pytest.approx(observed)
    assert ours["p_value"] == pytest.approx(two_sided)
    assert 0.01 < ours["p_value"] < 0.9  # a case where the two rules differ
    assert ours["p_value"] > 1.5 * ours["p_value_sacrebleu"]


def test_bootstrap_resamples_the_mean_of_the_per_seed_differences_not_a_pooled_corpus():
    from sacrebleu.metrics import CHRF

    metric = CHRF()
    seeds_base = [HYP_A, HYP_B]
    seeds_sys = [HYP_B, HYP_B]
    base = [[sentence_stats(metric, h, REFS)] for h in seeds_base]
    system = [[sentence_stats(metric, h, REFS)] for h in seeds_sys]
    out = bootstrap_quantity(metric, system, base, [1.0], samples=200)
    per_seed = [metric.corpus_score(s, [REFS]).score - metric.corpus_score(b, [REFS]).score
                for s, b in zip(seeds_sys, seeds_base, strict=True)]
    assert out["delta"] == pytest.approx(np.mean(per_seed))
    pooled = metric.corpus_score(seeds_sys[0] + seeds_sys[1], [REFS + REFS]).score - \
        metric.corpus_score(seeds_base[0] + seeds_base[1], [REFS + REFS]).score
    assert abs(out["delta"] - pooled) > 1e-3  # the old pooled quantity is another number


def test_a_memo_resamples_a_shared_baseline_once_with_the_same_numbers(monkeypatch):
    """Several systems against one baseline: with a memo the baseline's side is resampled once, and every result
    is the one computed without it (the same draws, the same floats)."""
    import utils.study.stats as study_stats

    metric = CHRF()
    base = [[sentence_stats(metric, HYP_A, REFS)]]
    systems = {"b": [[sentence_stats(metric, HYP_B, REFS)]], "a": [[sentence_stats(metric, HYP_A[::-1], REFS)]]}
    plain = {name: bootstrap_quantity(metric, side, base, [1.0], samples=300, seed=3) for name, side in systems.items()}
    calls = []
    scores = study_stats.corpus_scores
    monkeypatch.setattr(study_stats, "corpus_scores", lambda m, summed: calls.append(1) or scores(m, summed))
    memo: dict = {}
    kept = {name: bootstrap_quantity(metric, side, base, [1.0], samples=300, seed=3, memo=memo, keys=(name, "base"))
            for name, side in systems.items()}
    assert kept == plain  # every p-value, interval and delta exactly
    assert len(calls) == 3 and len(memo) == 3  # b, the baseline, a: not the baseline twice
    other_seed = bootstrap_quantity(metric, systems["b"], base, [1.0], samples=300, seed=4, memo=memo,
                                    keys=("b", "base"))
    assert len(calls) == 5  # other draws: both sides resampled again, not read from the memo
    assert other_seed["ci95"] != plain["b"]["ci95"]


def test_bootstrap_of_identical_systems_is_no_difference():
    from sacrebleu.metrics import BLEU

    metric = BLEU()
    a = sentence_stats(metric, HYP_A, REFS)
    out = bootstrap_quantity(metric, [[a]], [[a.copy()]], [1.0], samples=100)
    assert out["delta"] == 0 and out["p_value"] == 1.0


def test_drop_units_carry_their_x1_sentences():
    from sacrebleu.metrics import CHRF

    from data.sources import concatenate_pairs

    metric = CHRF()
    x4_hyp, x4_ref = concatenate_pairs(HYP_A, REFS, 4)
    x1 = unit_stats(sentence_stats(metric, HYP_A, REFS), 4, 2)
    x4 = sentence_stats(metric, x4_hyp, x4_ref)
    assert x1.shape == x4.shape == (2, x1.shape[1])
    base_x1 = unit_stats(sentence_stats(metric, HYP_B, REFS), 4, 2)
    base_x4 = sentence_stats(metric, *concatenate_pairs(HYP_B, REFS, 4))
    out = bootstrap_quantity(metric, [[x1, x4]], [[base_x1, base_x4]], [1.0, -1.0], samples=50)
    drop = lambda h: metric.corpus_score(h, [REFS]).score - metric.corpus_score(  # noqa: E731
        concatenate_pairs(h, REFS, 4)[0], [concatenate_pairs(h, REFS, 4)[1]]).score
    assert out["delta"] == pytest.approx(drop(HYP_A) - drop(HYP_B))


def test_a_drop_uses_the_xk_pairs_whose_x1_sentences_were_scored():
    """With --max-sentences N both splits are cut to N sentences: N x1 sentences hold N/4 x4 pairs' worth, so the
    drop is computed over those pairs (a full study scores every x1 sentence: every pair counts)."""
    from sacrebleu.metrics import CHRF

    from data.sources import concatenate_pairs
    from utils.study.analysis import Analysis, Quantity

    metric = CHRF()
    x4_hyp, x4_ref = concatenate_pairs(HYP_A, REFS, 4)
    n = len(x4_hyp)
    cut = 4 * (n - 1)  # the x1 split scored short of the last pair's four sentences
    stats = {"a": {"t": {"beam5": {"chrF": [sentence_stats(metric, HYP_A[:cut], REFS[:cut])]}},
                   "t.x4": {"beam5": {"chrF": [sentence_stats(metric, x4_hyp, x4_ref)]}}}}
    scores = {"a": {s: {"beam5": {"chrF": [0.0], "BLEU": [0.0]}} for s in ("t", "t.x4")}}
    q = Quantity("drop", "t.x4", "chrF", "beam5", base_split="t")
    expected = metric.corpus_score(HYP_A[:cut], [REFS[:cut]]).score - metric.corpus_score(
        x4_hyp[: n - 1], [x4_ref[: n - 1]]).score
    assert Analysis(scores, stats, "a", 10).seeds("a", q) == [pytest.approx(expected)]


def test_a_contrast_another_studys_family_tests_is_neither_in_this_family_nor_tested_again_on_its_endpoint():
    """``Family.elsewhere``: one family per contrast. The linked system leaves this family and its exploratory
    re-test of the family's endpoint; its other quantities (BLEU, greedy) stay exploratory."""
    from utils.study.analysis import Analysis, Family, exploratory, primary

    rng = np.random.default_rng(0)
    scores = {name: {"test": {d: {"chrF": list(50 + shift + rng.normal(0, 0.3, 3)),
                                  "BLEU": list(20 + shift + rng.normal(0, 0.3, 3))} for d in ("beam5", "greedy")}}
              for name, shift in (("base", 0.0), ("old", 2.0), ("new", 1.0))}
    analysis = Analysis(scores, None, "base", 10)
    family = Family(elsewhere={"old": "seed-table"})
    declared = primary(analysis, family, ["base", "old", "new"], ["test"])
    assert [t["system"] for t in declared["tests"]] == ["new"] and declared["size"] == 1
    assert declared["anova"][0]["df"] == (2 - 1) * (3 - 1)  # base and new only
    rest = exploratory(analysis, ["base", "old", "new"], ["test"], family, None, None, declared["tests"])
    old = {t["label"] for t in rest if t["system"] == "old"}
    assert "chrF test (beam 5)" not in old and {"BLEU test (beam 5)", "chrF test (greedy)"} <= old
    plain = primary(analysis, Family(), ["base", "old", "new"], ["test"])
    assert [t["system"] for t in plain["tests"]] == ["old", "new"]
    empty = primary(analysis, Family(elsewhere={"old": "s", "new": "s"}), ["base", "old", "new"], ["test"])
    assert empty["size"] == 0 and empty["tests"] == [] and empty["power"]["power_at_smallest_effect"] is None
    from utils.study.sections import primary_lines

    lines = primary_lines({"primary": empty, "baseline": "base", "bootstrap_samples": 10})
    assert "No contrast is left in this family" in lines[-2] and "old, new against base" in lines[4]


def test_a_test_time_decoding_is_tested_in_its_trained_systems_place_not_beside_it() -> None:
    """``Family.decodings``: RoPE+NTK decodes the RoPE models, so its per-seed scores follow RoPE's. In one ANOVA with
    RoPE the pair's shared noise leaves the residual too small (every contrast's seed test too bold); declared, the
    trained contrasts are tested in the ANOVA of the trained systems alone, and the decoding in that ANOVA with it in
    RoPE's place: the same p-values as blocked_anova on those rows."""
    from utils.study.analysis import Analysis, Family, primary
    from utils.study.sections import primary_lines
    from utils.study.stats import blocked_anova

    rng = np.random.default_rng(3)
    seeds = 300  # enough for the residual's shrinkage (to about 6/7 in expectation) to show in one draw
    block = rng.normal(0, 2, seeds)
    rope = 50 + block + rng.normal(0, 1, seeds)
    rows = {"base": 50 + block + rng.normal(0, 1, seeds), "learnable": 50.5 + block + rng.normal(0, 1, seeds),
            "rope": rope, "rope+ntk": rope + 0.8 + rng.normal(0, 0.05, seeds),
            "alibi": 51 + block + rng.normal(0, 1, seeds)}
    scores = {n: {"t": {"beam5": {"chrF": list(v), "BLEU": list(v)}}} for n, v in rows.items()}
    analysis = Analysis(scores, None, "base", 10)
    systems = list(rows)
    together = primary(analysis, Family(), systems, ["t"])
    apart = primary(analysis, Family(decodings={"rope+ntk": "rope"}), systems, ["t"])
    assert [t["system"] for t in apart["tests"]] == [t["system"] for t in together["tests"]] == systems[1:]
    trained, _ = blocked_anova({n: list(rows[n]) for n in ("base", "learnable", "rope", "alibi")}, "base")
    swapped, table = blocked_anova({n: list(rows[n]) for n in ("base", "learnable", "rope+ntk", "alibi")}, "base")
    p = {t["system"]: t["seed_test"]["p_value"] for t in apart["tests"]}
    for name in ("learnable", "rope", "alibi"):
        assert p[name] == pytest.approx(trained[name].p_value, rel=1e-12)
    assert p["rope+ntk"] == pytest.approx(swapped["rope+ntk"].p_value, rel=1e-12)
    ntk = next(t for t in apart["tests"] if t["system"] == "rope+ntk")
    assert ntk["seed_test"]["anova"] == {"systems": 4, "mse": pytest.approx(table["mse"]), "df": 3 * (seeds - 1),
                                         "residual_sd": pytest.approx(table["residual_sd"]), "replaces": "rope"}
    assert apart["anova"][0]["systems"] == 4 and apart["power"]["systems"] == 4
    # Beside RoPE, the near-copy shrinks the residual: every seed test looks stronger than it is.
    assert together["anova"][0]["mse"] < 0.92 * apart["anova"][0]["mse"]
    assert all(t["seed_test"]["p_value"] < p[t["system"]] for t in together["tests"] if t["system"] != "rope+ntk")
    def report(pr: dict) -> str:
        results = {"primary": pr, "baseline": "base", "bootstrap_samples": 10, "seeds": list(range(seeds)),
                   "systems": {n: {"splits": {"t": {"beam5": {}}}} for n in rows}}
        return " ".join(primary_lines(results))

    assert "rope+ntk decode the models of rope and share their noise" in report(apart)
    assert "decode the models" not in report(together)


@pytest.mark.parametrize("options", [{}, {"word_order": 2}, {"beta": 3}, {"eps_smoothing": True},
                                     {"char_order": 4, "word_order": 1, "eps_smoothing": True}])
def test_the_vectorized_chrf_is_sacrebleus_to_the_last_bit(options):
    """Every row of summed statistics, zero counts (an empty hypothesis, no match, an empty reference) included,
    scores exactly as sacreBLEU's CHRF scores it one row at a time: the bootstrap's p-values cannot move."""
    from utils.study.stats import corpus_scores

    metric = CHRF(**options)
    hyps = ["the cat sat on the mat", "", "a dog", "xyz", "the the the", "Le chat."]
    refs = ["the cat is on the mat", "something", "", "abc", "the", "The cat."]
    stats = sentence_stats(metric, hyps, refs)
    rng = np.random.default_rng(3)
    summed = np.concatenate([stats, rng.integers(0, 3, size=(400, len(hyps))) @ stats, np.zeros((1, stats.shape[1]))])
    summed[5, 0::3] = 0  # a row whose hypothesis side is empty at every order
    expected = [metric._compute_score_from_stats(row.tolist()).score for row in summed]
    assert corpus_scores(metric, summed).tolist() == expected
    assert 0 in expected and any(0 < e < 100 for e in expected)


@pytest.mark.parametrize("options", [{}, {"smooth_method": "none"}, {"smooth_method": "floor", "smooth_value": 0.1},
                                     {"max_ngram_order": 2}, {"lowercase": True}])
def test_the_vectorized_bleu_is_sacrebleus_to_the_last_bit(options):
    """As for chrF: every row, with no match at some orders, no n-gram of an order at all (short hypotheses), an
    empty hypothesis and a hypothesis longer than its reference, scores exactly as sacreBLEU's BLEU does."""
    from utils.study.stats import corpus_scores

    metric = BLEU(**options)
    hyps = ["the cat sat on the mat today", "", "a dog barks at night", "xyz", "The the the", "cat", "a b c d e f g h"]
    refs = ["the cat is on the mat", "something here", "a dog barks at noon", "abc", "the", "the cat", "a b"]
    stats = sentence_stats(metric, hyps, refs)
    rng = np.random.default_rng(5)
    summed = np.concatenate([stats, rng.integers(0, 3, size=(400, len(hyps))) @ stats, np.zeros((1, stats.shape[1]))])
    expected = [metric._compute_score_from_stats(row.tolist()).score for row in summed]
    assert corpus_scores(metric, summed).tolist() == expected
    assert 0 in expected and any(0 < e < 100 for e in expected)


def test_sentence_statistics_reuse_references_only_for_the_same_metric_setting():
    """The cached references give sacreBLEU's own statistics, and a metric set otherwise (lowercase, n-gram
    order) gets its own: 'The' matches 'the' only lowercased; bigram BLEU has 2 + 2 * 2 statistics."""
    hyps, refs = ["The cat sat", "a Dog"], ["the cat sat down", "a dog"]
    for metric in (BLEU(), BLEU(lowercase=True), BLEU(max_ngram_order=2), CHRF(), CHRF(lowercase=True)):
        for _ in range(2):  # the second call reads the cache
            assert sentence_stats(metric, hyps, refs).tolist() == metric._extract_corpus_statistics(hyps, [refs])
        assert metric._ref_cache is None  # the caller's metric is left as it was
    assert sentence_stats(BLEU(lowercase=True), hyps, refs)[0, 2] == 3 and sentence_stats(BLEU(), hyps, refs)[0, 2] == 2
    assert sentence_stats(BLEU(max_ngram_order=2), hyps, refs).shape == (2, 6)
    with pytest.raises(ValueError, match="2 hypotheses for 1 references"):
        sentence_stats(CHRF(), hyps, refs[:1])


def test_resample_counts_are_sacrebleus_draws_counted_per_sample_and_made_once() -> None:
    """The bootstrap's resamples: row b counts how often each unit is drawn in sacreBLEU's b-th resample (the
    draws of ``np.random.default_rng(seed).choice``), every row sums to the number of units, and one test set's
    draws are made once and shared read-only."""
    from utils.study.stats import resample_counts

    counts = resample_counts(7, 50, 3)
    idx = np.random.default_rng(3).choice(7, size=(50, 7), replace=True)
    assert counts.shape == (50, 7) and counts.dtype == np.float64
    assert np.array_equal(counts, np.stack([np.bincount(row, minlength=7) for row in idx]))
    assert (counts.sum(1) == 7).all() and resample_counts(7, 50, 3) is counts and not counts.flags.writeable
    assert not np.array_equal(resample_counts(7, 50, 4), counts)
    assert resample_counts(7, 50, 3, np.float32).dtype == np.float32


def test_resampled_sums_are_the_float64_matrix_product_to_the_last_bit() -> None:
    """Summed in float32 where every sum is an integer below 2^24, in float64 otherwise: the values of
    ``counts @ stats`` in float64, exactly, either way."""
    from utils.study.stats import resample_counts, resampled_sums

    rng = np.random.default_rng(0)
    for units, high in ((300, 50), (300, 2**20)):  # the second bound is over 2^24: float64
        stats = rng.integers(0, high, size=(units, 9)).astype(np.float64)
        exact = resample_counts(units, 200, 5) @ stats
        assert np.array_equal(resampled_sums(units, 200, 5, stats), exact)
    fractional = rng.random((300, 4))  # not counts: float64 as it was
    assert np.array_equal(resampled_sums(300, 200, 5, fractional), resample_counts(300, 200, 5) @ fractional)



def test_the_line_under_the_primary_table_names_each_resolved_test_the_paired_t_check_does_not_confirm() -> None:
    """Holm over the family on each contrast's own paired t p: a resolved test whose adjusted p is at or above the
    family's alpha is named; where every resolved test passes, the line says so; with nothing resolved, or results
    written before the check's Holm p, nothing is added."""
    from utils.study.sections import paired_check

    def family(resolved_holm: list[tuple[bool, float]]) -> dict:
        return {"family": {"alpha": 0.05}, "tests": [
            {"system": f"s{i}", "label": "chrF x4", "resolved": r, "paired_t": {"p_value": p / 4, "p_holm": p}}
            for i, (r, p) in enumerate(resolved_holm)]}

    assert paired_check(family([(True, 0.01), (True, 0.05), (False, 0.2)])) == (
        " Not confirmed by the check (the paired t-test after Holm over the family, at α = 0.05): s1: chrF x4.")
    assert paired_check(family([(True, 0.01), (False, 0.5)])) == (
        " Each also passes the check: its paired t-test after Holm over the family, at α = 0.05.")
    assert paired_check(family([(False, 0.01)])) == ""
    older = family([(True, 0.01)])
    del older["tests"][0]["paired_t"]["p_holm"]
    assert paired_check(older) == ""
