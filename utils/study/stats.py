"""The statistics of a study with seeds as blocks: every number one test uses, from per-seed corpus scores
or per-sentence sufficient statistics.

Design (bench/study.py): seed k gives every system the same tokenizer and batch order, so the seeds are
blocks and every comparison with the baseline is paired by seed. The quantity tested is always

    delta = mean over seeds k of [score(system, seed k) - score(baseline, seed k)],

a corpus score (chrF or BLEU) or a linear combination of corpus scores (the drop from x1 to x4). It is
tested twice, each time on that same quantity:

- across seeds: the contrast of a two-way ANOVA without interaction (system as treatment, seed as block;
  Montgomery, *Design and Analysis of Experiments*, ch. 4), t = delta / sqrt(2 MSE / b) with the residual
  mean square MSE on (a-1)(b-1) degrees of freedom; with two systems it is the paired t-test;
- across test sentences: a paired bootstrap (Koehn 2004) that resamples test units once per sample for
  every system and seed alike and recomputes each seed's corpus score from its own summed statistics
  (never pooling seeds into one corpus), so it resamples exactly ``delta``.

Both p-values are corrected with Holm's step-down method over a family declared before the runs; a
difference is resolved when both reject and agree in sign. Power is computed from a smallest effect fixed
in advance and the pooled within-block standard deviation, with the noncentral t distribution.
"""

from __future__ import annotations

import functools
import math
import os
from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


def fmt_mean_std(ms: tuple[float, float] | list[float] | None) -> str:
    """A table cell: ``mean ± std`` to two decimals; "-" where it is missing."""
    return "-" if ms is None else f"{ms[0]:.2f} ± {ms[1]:.2f}"



def mean_std(values: list[float]) -> tuple[float, float]:
    """The mean and the sample standard deviation (0 for one value)."""
    import statistics

    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's (1979) step-down adjusted p-values: sort ascending, p_(i) * (m - i + 1), running maximum,
    capped at 1. Rejecting where the adjusted p < alpha controls the family-wise error rate at alpha."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


@dataclass
class Contrast:
    """One system against the baseline across seeds: ``delta`` (mean over seeds of the per-seed difference),
    the per-seed differences, the test statistic, its degrees of freedom and two-sided p-value."""

    delta: float
    per_seed: list[float]
    t: float | None
    df: int
    p_value: float | None
    test: str

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def blocked_anova(scores: Mapping[str, Sequence[float]], baseline: str) -> tuple[dict[str, Contrast], dict[str, Any]]:
    """Two-way ANOVA without interaction on ``scores[system][seed index]`` (every system has every seed):
    each system's contrast with ``baseline``, and the table (MSE, residual df, residual standard deviation,
    the share of the within-system variance the seed blocks explain)."""
    from scipy import stats

    names = list(scores)
    y = np.array([scores[n] for n in names], dtype=float)  # [a systems, b seeds]
    a, b = y.shape
    if a < 2 or b < 2:
        raise ValueError("a blocked ANOVA needs two systems and two seeds at least")
    resid = y - y.mean(1, keepdims=True) - y.mean(0, keepdims=True) + y.mean()
    df = (a - 1) * (b - 1)
    sse = float((resid ** 2).sum())
    mse = sse / df
    within = float(((y - y.mean(1, keepdims=True)) ** 2).sum())  # what the seeds and the residual share
    table = {"systems": a, "seeds": b, "mse": mse, "df": df, "residual_sd": math.sqrt(mse),
             "seed_share": (within - sse) / within if within > 0 else 0.0}
    base = y[names.index(baseline)]
    out = {}
    se = math.sqrt(2 * mse / b)
    for i, name in enumerate(names):
        if name == baseline:
            continue
        diff = y[i] - base
        delta = float(diff.mean())
        if se > 0:
            t = delta / se
            p = float(2 * stats.t.sf(abs(t), df))
        else:  # no residual variation at all: the means differ or they do not
            t, p = None, (1.0 if delta == 0 else 0.0)
        out[name] = Contrast(delta, diff.tolist(), t, df, p, "blocked ANOVA contrast")
    return out, table


def paired_t(base: Sequence[float], system: Sequence[float]) -> Contrast:
    """The paired t-test on the per-seed differences (one contrast's own residual, df = seeds - 1)."""
    from scipy import stats

    diff = np.asarray(system, dtype=float) - np.asarray(base, dtype=float)
    delta = float(diff.mean())
    if len(diff) < 2:
        return Contrast(delta, diff.tolist(), None, 0, None, "paired t")
    if float(diff.std()) == 0.0:
        return Contrast(delta, diff.tolist(), None, len(diff) - 1, 1.0 if delta == 0 else 0.0, "paired t")
    res = stats.ttest_rel(system, base)
    return Contrast(delta, diff.tolist(), float(res.statistic), len(diff) - 1, float(res.pvalue), "paired t")


# ---------------------------------------------------------------------------------------------- power


def power(effect: float, sd: float, seeds: int, df: int, alpha: float) -> float:
    """Power of the two-sided blocked contrast at level ``alpha`` for a true difference ``effect``: the
    noncentral t with ``df`` degrees of freedom and noncentrality effect / (sd sqrt(2 / seeds))."""
    from scipy import stats

    if sd <= 0:
        return 1.0 if effect != 0 else alpha
    crit = stats.t.ppf(1 - alpha / 2, df)
    nc = effect / (sd * math.sqrt(2 / seeds))
    out = float(stats.nct.sf(crit, df, nc) + stats.nct.cdf(-crit, df, nc))
    if math.isnan(out):  # scipy's series fails far in the tail, where the answer is 0 or 1 to many digits
        out = 1.0 if abs(nc) > crit else 0.0
    return out


def smallest_detectable(sd: float, seeds: int, df: int, alpha: float, target: float = 0.8) -> float:
    """The true difference the blocked contrast detects with power ``target`` at level ``alpha``."""
    from scipy.optimize import brentq

    if sd <= 0:
        return 0.0
    hi = sd
    while power(hi, sd, seeds, df, alpha) < target:
        hi *= 2
    return float(brentq(lambda e: power(e, sd, seeds, df, alpha) - target, 0.0, hi, xtol=1e-6))


def seeds_for_power(effect: float, sd: float, systems: int, alpha: float, target: float = 0.8,
                    most: int = 1000) -> int | None:
    """The fewest seeds per system for which the blocked contrast over ``systems`` systems detects ``effect``
    with power ``target`` at level ``alpha`` (residual df (systems - 1)(seeds - 1)); None past ``most``."""
    for b in range(2, most + 1):
        if power(effect, sd, b, (systems - 1) * (b - 1), alpha) >= target:
            return b
    return None


# ---------------------------------------------------------------------------------------------- bootstrap


#: sacreBLEU's preprocessed references (n-grams, lengths) by metric setting and reference list, newest last: a
#: study scores every system, seed and decoder against the same references of a split; with them, the statistics
#: of each (sentence index, hypothesis) already computed (a third of a study's hypotheses repeat one: the same
#: output from another seed, system or decoder).
_REFERENCES: OrderedDict[tuple[Any, ...], tuple[Any, dict[tuple[int, str], list[float]]]] = OrderedDict()


def sentence_stats(metric: Any, hyps: Sequence[str], refs: Sequence[str]) -> np.ndarray:
    """sacreBLEU's sufficient statistics of each hypothesis, ``[sentences, statistics]``: a corpus score is
    computed from their sum, so any sum of sentences (a unit, a resample) is scored exactly. The references are
    preprocessed once per metric setting and reference list (sacreBLEU's own reference cache)."""
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses for {len(refs)} references")
    setting = tuple((k, v) for k, v in sorted(vars(metric).items())
                    if not k.startswith("_") and isinstance(v, (bool, int, float, str, type(None))))
    key = (type(metric).__name__, setting, tuple(refs))
    if key not in _REFERENCES:
        _REFERENCES[key] = (metric._cache_references([list(refs)]), {})
        while len(_REFERENCES) > 32:
            _REFERENCES.popitem(last=False)
    _REFERENCES.move_to_end(key)
    cache, seen = _REFERENCES[key]
    todo = list(dict.fromkeys((i, h) for i, h in enumerate(hyps) if (i, h) not in seen))
    if todo:
        own = metric._ref_cache
        metric._ref_cache = [cache[i] for i, _ in todo]
        try:
            rows = metric._extract_corpus_statistics([h for _, h in todo], None)
        finally:
            metric._ref_cache = own
        seen.update(zip(todo, rows, strict=True))
    return np.array([seen[i, h] for i, h in enumerate(hyps)], dtype=np.float64)


def unit_stats(stats: np.ndarray, group: int, units: int) -> np.ndarray:
    """Sum the statistics of ``group`` consecutive sentences into each of ``units`` units: the x1 sentences
    that one xK pair joins; ``[units, statistics]``."""
    return stats[: units * group].reshape(units, group, -1).sum(1)


def corpus_score(metric: Any, stats: np.ndarray) -> float:
    return float(metric._compute_score_from_stats(stats.tolist()).score)


def chrf_precision_recall(metric: Any, stats: np.ndarray) -> tuple[float, float]:
    """chrF's n-gram precision and recall (in percent) of summed CHRF statistics ``[3 * order]`` (hypothesis,
    reference and matching n-grams of each character and word order): the averages over the orders that sacreBLEU's
    ``CHRF`` combines into its F-beta (an order without hypothesis or reference n-grams left out, as it does), so
    chrF = (1 + beta^2) P R / (beta^2 P + R). With beta = 2, recall weighs four times as much as precision."""
    values = stats.tolist()
    precision = recall = 0.0
    effective = 0
    for i in range(metric.order):
        n_hyp, n_ref, n_match = values[3 * i: 3 * i + 3]
        if n_hyp > 0 and n_ref > 0:
            precision += n_match / n_hyp
            recall += n_match / n_ref
            effective += 1
    return (100 * precision / effective, 100 * recall / effective) if effective else (0.0, 0.0)


def brevity_penalty(stats: np.ndarray) -> float:
    """BLEU's brevity penalty of summed BLEU statistics (output length, reference length, ...), as sacreBLEU's
    ``BLEU.compute_bleu``: 1 for output at least as long as the reference, exp(1 - ref / out) below, 0 for none."""
    sys_len, ref_len = float(stats[0]), float(stats[1])
    if sys_len >= ref_len:
        return 1.0
    return math.exp(1 - ref_len / sys_len) if sys_len > 0 else 0.0


def _chrf_scores(metric: Any, summed: np.ndarray) -> np.ndarray:
    """sacreBLEU's ``CHRF._compute_f_score`` on every row of ``[samples, 3 * order]`` summed statistics at once:
    the same float operations in the same order (Popović 2015, eq. 1: the F-beta of character n-gram precision
    and recall averaged over orders; sacreBLEU's effective-order and eps smoothing), so the same floats."""
    eps, factor = 1e-16, metric.beta ** 2
    score, avg_prec, avg_rec, effective = (np.zeros(len(summed)) for _ in range(4))
    with np.errstate(divide="ignore", invalid="ignore"):
        for i in range(metric.order):
            n_hyp, n_ref, n_match = summed[:, 3 * i], summed[:, 3 * i + 1], summed[:, 3 * i + 2]
            prec = np.where(n_hyp > 0, n_match / n_hyp, eps)
            rec = np.where(n_ref > 0, n_match / n_ref, eps)
            denom = factor * prec + rec
            score = score + np.where(denom > 0, (1 + factor) * prec * rec / denom, eps)
            both = (n_hyp > 0) & (n_ref > 0)
            avg_prec, avg_rec = np.where(both, avg_prec + prec, avg_prec), np.where(both, avg_rec + rec, avg_rec)
            effective += both
        if metric.eps_smoothing:
            return 100 * score / metric.order
        avg_prec = np.where(effective > 0, avg_prec / effective, 0.0)
        avg_rec = np.where(effective > 0, avg_rec / effective, 0.0)
        f = (1 + factor) * avg_prec * avg_rec
        f = f / ((factor * avg_prec) + avg_rec)
        return np.where(avg_prec + avg_rec != 0, 100 * f, 0.0)


def _bleu_scores(metric: Any, summed: np.ndarray) -> np.ndarray:
    """sacreBLEU's ``BLEU.compute_bleu`` (no effective order; smoothing none, floor or exp) on every row of
    ``[samples, 2 + 2 * order]`` summed statistics (sys_len, ref_len, correct n-grams, total n-grams): Papineni
    et al. 2002, eq. 1, BP * exp(mean_n log p_n), with mteval's exp smoothing (Chen and Cherry 2014, method 3).
    Precisions in numpy (+, *, / only), logs and exponentials with ``math`` as sacreBLEU takes them, and the
    log-sum in sacreBLEU's order: the same floats."""
    from sacrebleu.utils import my_log

    order, method = metric.max_ngram_order, metric.smooth_method
    value = metric.smooth_value if metric.smooth_value is not None else metric.SMOOTH_DEFAULTS[method]
    sys_len, ref_len = summed[:, 0].astype(np.int64), summed[:, 1].astype(np.int64)
    correct, total = summed[:, 2:2 + order], summed[:, 2 + order:2 + 2 * order]
    precisions, smooth, stopped = np.zeros((len(summed), order)), np.ones(len(summed)), np.zeros(len(summed), bool)
    with np.errstate(divide="ignore", invalid="ignore"):
        for n in range(order):
            stopped |= total[:, n] == 0
            zero = ~stopped & (correct[:, n] == 0)
            if method == "exp":
                smooth = np.where(zero, smooth * 2, smooth)
                precisions[:, n] = np.where(zero, 100.0 / (smooth * total[:, n]), precisions[:, n])
            elif method == "floor":
                precisions[:, n] = np.where(zero, 100.0 * value / total[:, n], precisions[:, n])
            hit = ~stopped & (correct[:, n] != 0)
            precisions[:, n] = np.where(hit, 100.0 * correct[:, n] / total[:, n], precisions[:, n])
    # Per row as sacreBLEU computes it, BP * exp(sum(my_log(p) for p in row) / order), with the same float
    # operations in the same order: the logs and exponentials by ``math`` (mapped in C), the log-sum left to right.
    flat = precisions.ravel().tolist()
    logs = np.array(list(map(math.log, flat)) if 0.0 not in flat else [my_log(p) for p in flat])
    logs = logs.reshape(len(summed), order)
    log_sum = logs[:, 0].copy()  # sum() starts at 0, and 0 + x is x
    for n in range(1, order):
        log_sum = log_sum + logs[:, n]
    score = np.array(list(map(math.exp, (log_sum / order).tolist())))
    short = (sys_len < ref_len) & (sys_len > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(short, 1 - ref_len / np.where(sys_len > 0, sys_len, 1), 0.0)
    bp = np.where(sys_len < ref_len, np.where(short, list(map(math.exp, ratio.tolist())), 0.0), 1.0)
    return np.where(correct.any(1), bp * score, 0.0)


def corpus_scores(metric: Any, summed: np.ndarray) -> np.ndarray:
    """Corpus scores of a ``[samples, statistics]`` array of summed statistics (a bootstrap scores 10,000
    resamples per seed, part and system): chrF and BLEU vectorized, any other metric or setting row by row
    with sacreBLEU. The vectorized score is checked against sacreBLEU's own on the first and last rows of
    every call, so a sacreBLEU whose formula changed stops here instead of giving other p-values."""
    from sacrebleu.metrics.bleu import BLEU
    from sacrebleu.metrics.chrf import CHRF

    if isinstance(metric, CHRF):
        fast = _chrf_scores
    elif isinstance(metric, BLEU) and not metric.effective_order and metric.smooth_method in ("none", "floor", "exp"):
        fast = _bleu_scores
    else:
        fast = None
    if fast is None or len(summed) == 0:
        return np.array([metric._compute_score_from_stats(row.tolist()).score for row in summed])
    scores = fast(metric, summed)
    for row in (0, len(summed) - 1):
        if scores[row] != metric._compute_score_from_stats(summed[row].tolist()).score:
            raise RuntimeError(f"the vectorized {type(metric).__name__} differs from sacreBLEU's: update "
                               f"utils/study/stats.{fast.__name__}")
    return scores


def resampled_sums(units: int, samples: int, seed: int, stats: np.ndarray) -> np.ndarray:
    """Each resample's summed statistics, ``resample_counts(units, samples, seed) @ stats`` (``[samples, units]`` @
    ``[units, statistics]``), exactly. The statistics are counts, so every product and partial sum is an integer;
    while ``units * max(stats)`` (a bound on every sum) stays below 2^24, float32 holds each of them exactly, and its
    matrix product (about 4x faster here) gives the float64 one's values to the last bit."""
    if stats.size and float(units) * float(np.abs(stats).max()) < 2**24 and np.array_equal(stats, np.round(stats)):
        return (resample_counts(units, samples, seed, np.float32) @ stats.astype(np.float32)).astype(np.float64)
    return resample_counts(units, samples, seed) @ stats


@functools.lru_cache(maxsize=16)
def resample_counts(units: int, samples: int, seed: int, dtype: type = np.float64) -> np.ndarray:
    """``[samples, units]``: how often each test unit is drawn in each of ``samples`` resamples with replacement,
    from ``np.random.default_rng(seed)`` as sacreBLEU draws them (a seed repeats its test). The same draws serve
    every bootstrap of a test set of ``units`` units, so they are made once per process (read-only)."""
    if dtype is not np.float64:
        counts = resample_counts(units, samples, seed).astype(dtype)
    else:
        idx = np.random.default_rng(seed).choice(units, size=(samples, units), replace=True)
        flat = (idx + units * np.arange(samples)[:, None]).ravel()  # each sample's draws in a range of its own
        counts = np.bincount(flat, minlength=samples * units).reshape(samples, units).astype(np.float64)
    counts.flags.writeable = False
    return counts


def bootstrap_quantity(metric: Any, system: Sequence[Sequence[np.ndarray]], baseline: Sequence[Sequence[np.ndarray]],
                       coefficients: Sequence[float], samples: int, seed: int | None = None,
                       memo: dict[Hashable, tuple[float, np.ndarray]] | None = None,
                       keys: tuple[Hashable, Hashable] | None = None) -> dict[str, Any]:
    """Paired bootstrap over test units of ``delta = mean_k sum_p c_p [score(system[k][p]) - score(baseline[k][p])]``.

    ``system[k][p]`` / ``baseline[k][p]``: seed k's statistics ``[units, statistics]`` for part p of the
    quantity (one part, coefficient 1: a corpus score; two parts x1 and x4 over the same units, coefficients
    +1 and -1: the drop). One resample of unit indices is drawn per sample and applied to every seed, part
    and system, so the resampled statistic is exactly ``delta`` on another test set of the same size.
    ``p_value``: two-sided, the resampled differences shifted to mean 0 (the null) against the observed one,
    ``(#{|d_b - mean(d)| >= |delta|} + 1) / (samples + 1)``. ``p_value_sacrebleu``: sacreBLEU's paired bootstrap
    rule (``_compute_p_value`` of the absolute differences centred on their mean), which for a normal bootstrap
    distribution is a half to a third of the two-sided p, in effect a one-sided test. Both exactly 1 for an
    observed delta of 0 (identical systems are no difference).
    ``seed`` (default ``$SACREBLEU_SEED`` or 12345) makes it repeatable. ``memo`` with ``keys`` (one for each
    side, naming what its statistics are, e.g. the system and quantity) keeps each side's values for the next
    call: the draws depend only on the units, samples and seed, so a baseline compared with several systems is
    resampled once, with the same floats."""
    from sacrebleu.significance import _compute_p_value

    if seed is None:
        seed = int(os.environ.get("SACREBLEU_SEED", "12345"))
    seeds, parts = len(system), len(coefficients)
    if len(baseline) != seeds or any(len(s) != parts for s in (*system, *baseline)):
        raise ValueError("system and baseline need the same seeds and parts")
    units = system[0][0].shape[0]
    if any(x.shape[0] != units for s in (*system, *baseline) for x in s):
        raise ValueError("every part must cover the same test units")
    memo = {} if memo is None else memo

    def value(side: Sequence[Sequence[np.ndarray]], key: Hashable | None) -> tuple[float, np.ndarray]:
        slot = None if key is None else (key, units, samples, seed)
        if slot in memo:
            return memo[slot]
        full, resampled = 0.0, np.zeros(samples)
        # Every seed's and part's resampled sums from one product (the draws are read once, not once per seed
        # and part): the same integers as one product each, so the same floats.
        blocks = [side[k][p] for k in range(seeds) for p in range(parts)]
        sums = resampled_sums(units, samples, seed, np.concatenate(blocks, axis=1))
        edges = np.cumsum([0, *(b.shape[1] for b in blocks)])
        for k in range(seeds):
            for p, c in enumerate(coefficients):
                stats, j = side[k][p], k * parts + p
                full += c * corpus_score(metric, stats.sum(0)) / seeds
                resampled += c * corpus_scores(metric, np.ascontiguousarray(sums[:, edges[j]:edges[j + 1]])) / seeds
        if slot is not None:
            memo[slot] = full, resampled
        return full, resampled

    s_full, s_res = value(system, keys[0] if keys else None)
    b_full, b_res = value(baseline, keys[1] if keys else None)
    observed = s_full - b_full
    diffs = s_res - b_res
    distance = np.abs(diffs)
    if observed == 0:
        p = p_sacrebleu = 1.0
    else:
        p = float((np.sum(np.abs(diffs - diffs.mean()) >= abs(observed)) + 1) / (samples + 1))
        p_sacrebleu = float(_compute_p_value(distance - distance.mean(), abs(observed)))
    low, high = np.percentile(diffs, [2.5, 97.5])
    return {"delta": observed, "p_value": p, "p_value_sacrebleu": p_sacrebleu, "ci95": [float(low), float(high)],
            "samples": samples, "seed": seed, "units": units,
            "test": "paired bootstrap of the mean per-seed difference, two-sided"}


def resolved(seed_p: float | None, bootstrap_p: float | None, seed_delta: float, bootstrap_delta: float,
             alpha: float) -> bool:
    """Both (already multiplicity-adjusted) tests reject at ``alpha`` and agree in sign."""
    if seed_p is None or bootstrap_p is None:
        return False
    return seed_p < alpha and bootstrap_p < alpha and seed_delta * bootstrap_delta > 0
