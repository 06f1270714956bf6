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

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


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


def welch(base: Sequence[float], system: Sequence[float]) -> Contrast:
    """Welch's t-test, only for systems that share no seeds (independently trained, unpaired)."""
    from scipy import stats

    delta = float(np.mean(system) - np.mean(base))
    if min(len(base), len(system)) < 2:
        return Contrast(delta, [], None, 0, None, "Welch")
    if np.var(base) == 0 and np.var(system) == 0:
        return Contrast(delta, [], None, 0, 1.0 if delta == 0 else 0.0, "Welch")
    res = stats.ttest_ind(system, base, equal_var=False)
    return Contrast(delta, [], float(res.statistic), int(res.df), float(res.pvalue), "Welch")


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


def sentence_stats(metric: Any, hyps: Sequence[str], refs: Sequence[str]) -> np.ndarray:
    """sacreBLEU's sufficient statistics of each hypothesis, ``[sentences, statistics]``: a corpus score is
    computed from their sum, so any sum of sentences (a unit, a resample) is scored exactly."""
    return np.array(metric._extract_corpus_statistics(list(hyps), [list(refs)]), dtype=np.float64)


def unit_stats(stats: np.ndarray, group: int, units: int) -> np.ndarray:
    """Sum the statistics of ``group`` consecutive sentences into each of ``units`` units: the x1 sentences
    that one xK pair joins; ``[units, statistics]``."""
    return stats[: units * group].reshape(units, group, -1).sum(1)


def corpus_score(metric: Any, stats: np.ndarray) -> float:
    return float(metric._compute_score_from_stats(stats.tolist()).score)


def _scores(metric: Any, summed: np.ndarray) -> np.ndarray:
    """Corpus scores of a ``[samples, statistics]`` array of summed statistics."""
    return np.array([metric._compute_score_from_stats(row.tolist()).score for row in summed])


def bootstrap_quantity(metric: Any, system: Sequence[Sequence[np.ndarray]], baseline: Sequence[Sequence[np.ndarray]],
                       coefficients: Sequence[float], samples: int, seed: int | None = None) -> dict[str, Any]:
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
    ``seed`` (default ``$SACREBLEU_SEED`` or 12345) makes it repeatable."""
    from sacrebleu.significance import _compute_p_value

    if seed is None:
        seed = int(os.environ.get("SACREBLEU_SEED", "12345"))
    seeds, parts = len(system), len(coefficients)
    if len(baseline) != seeds or any(len(s) != parts for s in (*system, *baseline)):
        raise ValueError("system and baseline need the same seeds and parts")
    units = system[0][0].shape[0]
    if any(x.shape[0] != units for s in (*system, *baseline) for x in s):
        raise ValueError("every part must cover the same test units")
    rng = np.random.default_rng(seed)
    idx = rng.choice(units, size=(samples, units), replace=True)  # sacreBLEU's draws: one seed repeats its test
    counts = np.stack([np.bincount(row, minlength=units) for row in idx]).astype(np.float64)  # [samples, units]

    def value(side: Sequence[Sequence[np.ndarray]]) -> tuple[float, np.ndarray]:
        full, resampled = 0.0, np.zeros(samples)
        for k in range(seeds):
            for p, c in enumerate(coefficients):
                stats = side[k][p]
                full += c * corpus_score(metric, stats.sum(0)) / seeds
                resampled += c * _scores(metric, counts @ stats) / seeds
        return full, resampled

    s_full, s_res = value(system)
    b_full, b_res = value(baseline)
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
