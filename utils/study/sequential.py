"""Group-sequential boundaries: looks at a study fixed in advance, with the type I error spent across them.

A study that adds seeds in batches and reports after each batch tests the same hypothesis several times. A
group-sequential design keeps its error rate at ``alpha`` by spending it across the looks (Lan & DeMets 1983):
look ``k``, at information fraction ``t_k`` (seeds so far / seeds planned), may spend ``alpha(t_k) - alpha(t_{k-1})``.

- ``obf``: the O'Brien-Fleming-type spending function, ``alpha_1(t) = 2 - 2 Phi(z_{1-alpha_1/2} / sqrt(t))`` for
  each side's ``alpha_1 = alpha / 2``: almost nothing early, nearly the whole ``alpha`` at the last look (Lan &
  DeMets 1983, eq. 3; Jennison & Turnbull 2000, section 7.2; the convention of gsDesign's ``sfLDOF`` and rpact's
  ``asOF``, whose tables the tests check: z = 3.71, 2.51, 1.99 at three equal looks, alpha = 0.05). Not the same
  function applied to both sides at once, ``2 - 2 Phi(z_{1-alpha/2} / sqrt(t))``, which spends more early;
- ``pocock``: ``alpha(t) = alpha log(1 + (e - 1) t)``, nearly even across looks.

Futility is declared with a beta-spending function, non-binding: the efficacy bounds are computed as if the study
never stopped for futility, so stopping or not stopping for futility keeps the error rate at most ``alpha``. The
futility region ``|Z_k| < a_k`` is one region, so ``beta`` is spent by the one-sided function on its whole:
``beta(t) = 2 - 2 Phi(z_{1-beta/2} / sqrt(t))`` for ``obf`` (gsDesign's ``sfLDOF`` with ``beta`` as its level, as
its lower bounds use it), not split in two halves as ``alpha`` is.

The crossing probabilities are computed by recursive numerical integration of the joint law of the z-statistics
``Z_1..Z_K`` (Armitage, McPherson & Rowe 1969; Jennison & Turnbull 2000, chapter 19): ``Z_k sqrt(t_k)`` is a
Brownian motion with drift ``eta t`` observed at ``t_1 < ... < t_K``, ``eta`` the expected z-statistic at the
planned end (0 under the null).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy import optimize, stats

Spending = Literal["obf", "pocock"]
#: Grid points per unit of z in the numerical integration (Simpson's rule); 3-decimal boundaries need ~40.
POINTS_PER_UNIT = 80


def spent(t: float, total: float, family: Spending, sides: int = 2) -> float:
    """Error spent by information fraction ``t`` in [0, 1] out of ``total``. For ``obf``, ``sides=2`` (a two-sided
    test's ``alpha``) spends ``total / 2`` on each side, each by the one-sided function; ``sides=1`` (``beta``, or a
    one-sided ``alpha``) spends ``total`` by it: ``2 - 2 Phi(z_{1-total/2} / sqrt(t))``."""
    if sides not in (1, 2):
        raise ValueError(f"sides must be 1 or 2, not {sides!r}")
    if t <= 0:
        return 0.0
    if t >= 1:
        return total
    if family == "obf":
        each = total / sides
        return float(sides * (2 - 2 * stats.norm.cdf(stats.norm.ppf(1 - each / 2) / math.sqrt(t))))
    if family == "pocock":
        return float(total * math.log(1 + (math.e - 1) * t))
    raise ValueError(f"unknown spending function {family!r} (obf or pocock)")


def _simpson(lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
    """Nodes and Simpson weights on [lo, hi]."""
    n = max(2, int(math.ceil((hi - lo) * POINTS_PER_UNIT / 2)) * 2)
    z = np.linspace(lo, hi, n + 1)
    w = np.ones(n + 1)
    w[1:-1:2], w[2:-1:2] = 4, 2
    return z, w * (hi - lo) / (3 * n)


@dataclass
class _Density:
    """The sub-density of ``Z_k`` on the continuation region after look ``k``: nodes, weights and values."""

    z: np.ndarray
    w: np.ndarray
    f: np.ndarray
    t: float


def _first(t: float, eta: float, intervals: Sequence[tuple[float, float]]) -> _Density:
    """The density of ``Z_1`` (normal, mean ``eta sqrt(t)``) on the union of ``intervals``."""
    parts = [_simpson(lo, hi) for lo, hi in intervals if hi > lo]
    if not parts:  # nothing continues (a futility bound that met the efficacy bound)
        return _Density(np.zeros(1), np.zeros(1), np.zeros(1), t)
    z = np.concatenate([p[0] for p in parts])
    w = np.concatenate([p[1] for p in parts])
    return _Density(z, w, stats.norm.pdf(z - eta * math.sqrt(t)), t)


def _region(c: float, a: float) -> list[tuple[float, float]]:
    """The continuation region ``a <= |z| < c`` as intervals."""
    return [(-c, -a), (a, c)] if a > 0 else [(-c, c)]


def _next(prev: _Density | None, t: float, eta: float, c: float, a: float = 0.0) -> _Density:
    """The sub-density after a look at ``t`` whose continuation region is ``a <= |z| < c``."""
    return _first(t, eta, _region(c, a)) if prev is None else _advance(prev, t, eta, _region(c, a))


def _moments(prev: _Density, t: float, eta: float) -> tuple[np.ndarray, float]:
    """Mean (one per node of ``prev``) and SD of ``Z_k sqrt(t_k)`` given ``Z_{k-1}`` at those nodes."""
    dt = t - prev.t
    return prev.z * math.sqrt(prev.t) + eta * dt, math.sqrt(dt)


def _prob_outside(prev: _Density, t: float, eta: float, lo: float, hi: float) -> float:
    """P(continued through ``prev``'s look and Z_k <= lo or Z_k >= hi)."""
    mean, sd = _moments(prev, t, eta)
    s = math.sqrt(t)
    out = stats.norm.sf((hi * s - mean) / sd) + stats.norm.cdf((lo * s - mean) / sd)
    return float(np.sum(prev.w * prev.f * out))


def _prob_inside(prev: _Density, t: float, eta: float, lo: float, hi: float) -> float:
    """P(continued through ``prev``'s look and lo < Z_k < hi)."""
    mean, sd = _moments(prev, t, eta)
    s = math.sqrt(t)
    inside = stats.norm.cdf((hi * s - mean) / sd) - stats.norm.cdf((lo * s - mean) / sd)
    return float(np.sum(prev.w * prev.f * inside))


def _advance(prev: _Density, t: float, eta: float, intervals: Sequence[tuple[float, float]]) -> _Density:
    """The sub-density of ``Z_k`` on the union of ``intervals`` (the continuation region of look ``k``)."""
    mean, sd = _moments(prev, t, eta)
    s = math.sqrt(t)
    zs, ws, fs = [], [], []
    for lo, hi in intervals:
        if hi <= lo:
            continue
        z, w = _simpson(lo, hi)
        # density of Z_k = x / sqrt(t) where x ~ N(mean, sd^2): s / sd * phi((z s - mean) / sd)
        kernel = stats.norm.pdf((z[:, None] * s - mean[None, :]) / sd) * s / sd
        zs.append(z), ws.append(w), fs.append(kernel @ (prev.w * prev.f))
    if not zs:
        return _Density(np.zeros(1), np.zeros(1), np.zeros(1), t)
    return _Density(np.concatenate(zs), np.concatenate(ws), np.concatenate(fs), t)


def _check_fractions(fractions: Sequence[float]) -> list[float]:
    t = [float(x) for x in fractions]
    if not t or any(not 0 < x <= 1 for x in t) or t != sorted(set(t)) or t[-1] != 1:
        raise ValueError(f"information fractions must increase within (0, 1] and end at 1, got {list(fractions)}")
    return t


def efficacy_bounds(fractions: Sequence[float], alpha: float = 0.05, spending: Spending = "obf") -> list[float]:
    """Two-sided z boundaries ``c_1..c_K``: reject at look ``k`` when ``|Z_k| >= c_k``, with
    P(reject at some look | H0) = ``alpha`` spent as ``spending`` says at the ``fractions`` (t_K = 1)."""
    t = _check_fractions(fractions)
    bounds: list[float] = []
    prev: _Density | None = None
    for k, tk in enumerate(t):
        target = spent(tk, alpha, spending) - (spent(t[k - 1], alpha, spending) if k else 0.0)
        if prev is None:
            c = float(stats.norm.isf(target / 2))
        else:
            p = prev

            def excess(c: float, p: _Density = p, tk: float = tk, target: float = target) -> float:
                return _prob_outside(p, tk, 0.0, -c, c) - target
            c = float(optimize.brentq(excess, 0.0, 40.0, xtol=1e-10))
        bounds.append(c)
        prev = _next(prev, tk, 0.0, c)
    return bounds


def futility_bounds(fractions: Sequence[float], efficacy: Sequence[float], drift: float, beta: float = 0.2,
                    spending: Spending = "obf") -> list[float]:
    """Non-binding futility boundaries ``a_1..a_K`` for a two-sided test: stop for futility at look ``k`` when
    ``|Z_k| < a_k``, with P(stop for futility by look k | the design effect) = beta spent by ``t_k`` (one-sided:
    ``spent(t_k, beta, spending, sides=1)``). ``drift``:
    the expected z at the planned end under the smallest effect of interest. The last look's ``a_K`` is ``c_K``
    (the final decision); an ``a_k`` that would pass ``c_k`` is set to ``c_k``."""
    t = _check_fractions(fractions)
    if len(efficacy) != len(t):
        raise ValueError("one efficacy bound per look")
    out: list[float] = []
    prev: _Density | None = None
    for k, tk in enumerate(t):
        c = float(efficacy[k])
        if k == len(t) - 1:
            out.append(c)
            break
        target = spent(tk, beta, spending, 1) - (spent(t[k - 1], beta, spending, 1) if k else 0.0)

        def inside(a: float, p: _Density | None = prev, tk: float = tk) -> float:
            if p is None:
                m = drift * math.sqrt(tk)
                return float(stats.norm.cdf(a - m) - stats.norm.cdf(-a - m))
            return _prob_inside(p, tk, drift, -a, a)
        a = c if inside(c) <= target else float(optimize.brentq(lambda a, b=target: inside(a) - b, 0.0, c,
                                                                  xtol=1e-10))
        out.append(a)
        prev = _next(prev, tk, drift, c, a)
    return out


def crossing_probabilities(fractions: Sequence[float], efficacy: Sequence[float], drift: float = 0.0,
                           futility: Sequence[float] | None = None) -> list[float]:
    """P(the study stops for efficacy at look k) for each k, given the drift (0: the null), with the futility
    bounds applied when given (binding) or not."""
    t = _check_fractions(fractions)
    probs: list[float] = []
    prev: _Density | None = None
    for k, tk in enumerate(t):
        c = float(efficacy[k])
        a = float(futility[k]) if futility is not None else 0.0
        if prev is None:
            m = drift * math.sqrt(tk)
            probs.append(float(stats.norm.sf(c - m) + stats.norm.cdf(-c - m)))
        else:
            probs.append(_prob_outside(prev, tk, drift, -c, c))
        prev = _next(prev, tk, drift, c, a)
    return probs


def nominal_p(bounds: Sequence[float]) -> list[float]:
    """Two-sided nominal p-value thresholds of z boundaries: reject at look k when p_k <= 2 (1 - Phi(c_k)).
    Applied to a t-test's p-value, this is Jennison & Turnbull's significance-level approach (section 3.8)."""
    return [float(2 * stats.norm.sf(c)) for c in bounds]



def drift_for_power(fractions: Sequence[float], efficacy: Sequence[float], power: float = 0.8,
                    futility: Sequence[float] | None = None) -> float:
    """The drift (expected z at the planned end) at which the design rejects with probability ``power``."""
    return float(optimize.brentq(lambda d: sum(crossing_probabilities(fractions, efficacy, d, futility)) - power,
                                 0.0, 40.0, xtol=1e-8))


def simulated_power(looks: Sequence[int], nominal: Sequence[float], effect: float, sd: float, systems: int,
                    studies: int = 20000, seed: int = 0) -> float:
    """The power of the seed test as a study runs it, by simulating ``studies`` studies: ``systems`` systems, seeds
    as blocks, residuals normal with SD ``sd``, one system ``effect`` above the baseline; at look ``k`` (its first
    ``looks[k]`` seeds) the paired difference's t statistic on the residual of the two-way ANOVA, on
    ``(systems - 1)(n - 1)`` degrees of freedom, rejects when its two-sided p is at most ``nominal[k]``. Unlike the
    normal approximation of ``drift_for_power``, it counts what the t-test's few degrees of freedom cost."""
    if len(looks) != len(nominal) or systems < 2 or studies < 1:
        raise ValueError("one nominal p per look, at least two systems and one study")
    rng = np.random.default_rng(seed)
    rejected = 0
    for start in range(0, studies, 4000):
        m = min(4000, studies - start)
        y = rng.normal(0.0, sd, (m, looks[-1], systems))  # studies x seeds x systems
        y[:, :, 1] += effect
        hit = np.zeros(m, bool)
        for n, p in zip(looks, nominal, strict=True):
            z = y[:, :n, :]
            resid = z - z.mean(1, keepdims=True) - z.mean(2, keepdims=True) + z.mean((1, 2), keepdims=True)
            df = (n - 1) * (systems - 1)
            t = (z[:, :, 1].mean(1) - z[:, :, 0].mean(1)) / np.sqrt(2 * (resid ** 2).sum((1, 2)) / df / n)
            hit |= 2 * stats.t.sf(np.abs(t), df) <= p
        rejected += int(hit.sum())
    return rejected / studies


def seeds_needed(effect: float, sd: float, fractions: Sequence[float], alpha: float = 0.05, power: float = 0.8,
                 spending: Spending = "obf") -> int:
    """Seeds (paired runs) a design needs at its last look to detect a mean paired difference ``effect`` with
    ``power`` when paired differences have SD ``sd``: the drift ``effect / sd * sqrt(n)`` must reach
    ``drift_for_power`` (normal approximation; the t-test's few degrees of freedom add about one seed)."""
    drift = drift_for_power(fractions, efficacy_bounds(fractions, alpha, spending), power)
    return math.ceil((drift * sd / effect) ** 2)
