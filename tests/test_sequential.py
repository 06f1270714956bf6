"""Group-sequential boundaries (utils/study/sequential.py) against published tables and a simulation."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest
from conftest import run_script
from scipy import stats

from utils.study.sequential import (
    crossing_probabilities,
    drift_for_power,
    efficacy_bounds,
    futility_bounds,
    nominal_p,
    seeds_needed,
    simulated_power,
    spent,
)

# Two-sided alpha = 0.05, equally spaced looks, Lan-DeMets spending: the critical values gsDesign
# (gsDesign(k, test.type = 2, sfu = sfLDOF / sfLDPocock)) and rpact (getDesignGroupSequential(sided = 2,
# typeOfDesign = "asOF" / "asP")) print, to 4 decimals.
PUBLISHED = {
    ("obf", 2): [2.9626, 1.9686],
    ("obf", 3): [3.7103, 2.5114, 1.9930],
    ("obf", 4): [4.3326, 2.9631, 2.3590, 2.0141],
    ("obf", 5): [4.8769, 3.3569, 2.6803, 2.2898, 2.0310],
    ("pocock", 5): [2.4380, 2.4268, 2.4101, 2.3966, 2.3859],
}


@pytest.mark.parametrize(("spending", "looks"), list(PUBLISHED))
def test_boundaries_match_the_published_tables(spending: str, looks: int) -> None:
    fractions = [(k + 1) / looks for k in range(looks)]
    bounds = efficacy_bounds(fractions, 0.05, spending)  # type: ignore[arg-type]
    assert bounds == pytest.approx(PUBLISHED[(spending, looks)], abs=2e-4)
    # ... and spend exactly alpha under the null, look by look as the spending function says.
    per_look = crossing_probabilities(fractions, bounds)
    assert np.cumsum(per_look) == pytest.approx([spent(t, 0.05, spending) for t in fractions], abs=1e-6)  # type: ignore[arg-type]


def test_one_look_is_the_fixed_design() -> None:
    (c,) = efficacy_bounds([1.0], 0.05)
    assert c == pytest.approx(stats.norm.isf(0.025), abs=1e-9) and nominal_p([c]) == pytest.approx([0.05])
    # (the lower tail adds 3e-6 of power: the drift is that much below the one-sided formula)
    assert drift_for_power([1.0], [c], 0.8) == pytest.approx(stats.norm.isf(0.025) + stats.norm.isf(0.2), abs=1e-5)


def _simulate(fractions: list[float], drift: float, n: int = 200_000, seed: int = 0) -> np.ndarray:
    """Z_1..Z_K of ``n`` simulated studies: a Brownian motion with ``drift`` observed at ``fractions``."""
    rng = np.random.default_rng(seed)
    t = np.array(fractions)
    steps = rng.normal(drift * np.diff(t, prepend=0.0), np.sqrt(np.diff(t, prepend=0.0)), (n, len(t)))
    return np.cumsum(steps, axis=1) / np.sqrt(t)


def test_unequal_looks_and_futility_hold_in_simulation() -> None:
    """Uneven looks (seeds 4, 10, 16, 20 of 20) with non-binding futility: simulated studies reject under the
    null at rate alpha whether or not they stop for futility, and stop for futility under the design effect at
    the beta spent."""
    fractions = [0.2, 0.5, 0.8, 1.0]
    c = efficacy_bounds(fractions, 0.05)
    drift = drift_for_power(fractions, c, 0.8)
    a = futility_bounds(fractions, c, drift, beta=0.2)
    assert all(0 <= x <= y for x, y in zip(a, c, strict=True)) and a[-1] == c[-1]
    assert a == sorted(a)  # futility gets stricter as information grows

    z0 = _simulate(fractions, 0.0)
    rejected_ignoring_futility = (np.abs(z0) >= c).any(axis=1).mean()
    assert rejected_ignoring_futility == pytest.approx(0.05, abs=0.002)

    z1 = _simulate(fractions, drift, seed=1)
    stopped = np.zeros(len(z1), bool)
    futile_by = []
    for k in range(len(fractions) - 1):
        futile = ~stopped & (np.abs(z1[:, k]) < a[k])
        stopped |= futile | (np.abs(z1[:, k]) >= c[k])
        futile_by.append(futile.mean())
    # beta spent on the one futility region by the one-sided function (gsDesign's sfLDOF(beta)): 2 - 2 Phi(z_0.9 /
    # sqrt(t)) = 0.0042, 0.0699, 0.1518 at t = 0.2, 0.5, 0.8 (halving beta over two sides would give 0.0005, 0.040,
    # 0.132)
    one_sided = [2 - 2 * stats.norm.cdf(stats.norm.ppf(0.9) / np.sqrt(t)) for t in fractions[:-1]]
    assert one_sided == pytest.approx([0.0042, 0.0699, 0.1518], abs=5e-4)
    assert [spent(t, 0.2, "obf", sides=1) for t in fractions[:-1]] == pytest.approx(one_sided, rel=1e-12)
    assert np.cumsum(futile_by) == pytest.approx(one_sided, abs=0.003)
    power_binding = sum(crossing_probabilities(fractions, c, drift, a))
    assert power_binding < 0.8  # futility costs power, which is why the seeds are planned with it in mind


def test_seeds_needed_grows_with_looks_and_noise() -> None:
    assert seeds_needed(1.0, 1.0, [1.0]) == 8  # (2.8016)^2 = 7.85
    four = seeds_needed(1.0, 1.0, [0.25, 0.5, 0.75, 1.0])
    assert four >= 8 and seeds_needed(1.0, 2.0, [0.25, 0.5, 0.75, 1.0]) >= 4 * four - 4


@pytest.mark.parametrize("fractions", [[], [0.5], [0.5, 0.5, 1.0], [0.0, 1.0], [0.6, 0.3, 1.0], [0.5, 1.2]])
def test_bad_fractions_are_refused(fractions: list[float]) -> None:
    with pytest.raises(ValueError, match="information fractions"):
        efficacy_bounds(fractions)


def _design(*args: str) -> subprocess.CompletedProcess[str]:
    return run_script("bench/sequential_design.py", *args)


def test_the_design_command_prints_the_published_boundaries_and_the_seeds_the_power_needs() -> None:
    res = _design("--looks", "6,12,18,24")
    assert res.returncode == 0, res.stderr
    rows = [line.split(" | ") for line in res.stdout.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [float(r[4]) for r in rows] == pytest.approx(PUBLISHED[("obf", 4)], abs=2e-4)
    assert [r[1] for r in rows] == ["6", "12", "18", "24"]
    # The extrapolation study's numbers: a pooled residual of 1.30 chrF, a 1-chrF effect, Holm over 24 tests:
    # about 53 seeds per system for 80 % power (a fixed design needs 52).
    res = _design("--looks", "6,12,18,24", "--family", "24", "--residual-sd", "1.30", "--effect", "1.0")
    assert "seeds for power 0.8: 53 at the last look (the looks scaled to 14, 27, 40, 53)" in res.stdout
    assert "seeds for power 0.8: 52 at the last look" in _design(
        "--looks", "3", "--family", "24", "--residual-sd", "1.30", "--effect", "1.0").stdout


@pytest.mark.parametrize("systems", [2, 5])
def test_the_seed_tests_simulated_power_is_the_noncentral_t_at_one_look(systems: int) -> None:
    """At one look the seed test is a t-test on (systems - 1)(n - 1) degrees of freedom whose statistic has a
    noncentral t law, noncentrality effect / (sd sqrt 2) sqrt n: the simulated power matches it within 4 standard
    errors (2 systems: the paired t-test; 5: the ANOVA residual the studies use)."""
    n, effect, sd, p = 12, 1.0, 0.6, 0.01
    df, nc = (systems - 1) * (n - 1), effect / (sd * np.sqrt(2)) * np.sqrt(n)
    crit = stats.t.isf(p / 2, df)
    exact = stats.nct.sf(crit, df, nc) + stats.nct.cdf(-crit, df, nc)
    sim = simulated_power([n], [p], effect, sd, systems, studies=40000, seed=3)
    assert abs(sim - exact) < 4 * np.sqrt(exact * (1 - exact) / 40000)
    assert (exact > 0.5) and (systems == 2 or exact > simulated_power([n], [p], effect, sd, 2, 40000, 3) + 0.05)


def test_the_design_command_gives_the_power_of_the_seed_test_as_a_study_runs_it() -> None:
    """The second study's example (looks 8, 15, 22, Holm over 24, residual 0.8272, a 1-chrF effect): the normal
    approximation's 0.823, the five-system t-test's a little less."""
    res = _design("--looks", "8,15,22", "--family", "24", "--residual-sd", "0.8272", "--effect", "1.0",
                  "--systems", "5")
    assert res.returncode == 0, res.stderr
    assert "power at a true difference of 1 (residual SD 0.8272): 0.823," in res.stdout
    line = next(x for x in res.stdout.splitlines() if x.startswith("power of the seed test as run"))
    value = float(line.split("seed 0): ")[1].split(" ")[0])
    assert 0.785 <= value <= 0.805 and "5-system ANOVA, 4 x (n - 1) degrees of freedom" in line


@pytest.mark.parametrize(("args", "message"), [
    (["--looks", "6,3"], "argument --looks: '6,3': increasing seed counts, each at least 2"),
    (["--looks", "6,12", "--alpha", "nan"], "argument --alpha: must be a finite number between 0 and 1, got nan"),
    (["--looks", "6,12", "--effect", "1"], "--effect and --residual-sd go together"),
    (["--looks", "6,12", "--systems", "5"], "--systems needs --effect and --residual-sd, and 2 to 100 systems"),
])
def test_the_design_command_refuses_bad_input_in_one_line(args: list[str], message: str) -> None:
    res = _design(*args)
    assert res.returncode == 2 and message in res.stderr.splitlines()[-1] and "Traceback" not in res.stderr


def test_the_second_studys_boundaries_spend_their_alpha_by_an_independent_integral() -> None:
    """The boundaries the second extrapolation study will use, at looks 8, 15 and 22 seeds of 22 and at Holm's first
    and last steps (alpha / 24, alpha / 1): the probability of a first crossing at each look, integrated by scipy's
    multivariate normal (the looks' Z correlated sqrt(t_i / t_j)), is the spending function's increment."""
    fractions = [8 / 22, 15 / 22, 1.0]
    t = np.array(fractions)
    corr = np.sqrt(np.minimum.outer(t, t) / np.maximum.outer(t, t))
    for alpha in (0.05 / 24, 0.05):
        c = efficacy_bounds(fractions, alpha)
        assert c == sorted(c, reverse=True)
        inside = [1.0]  # P(|Z_1| < c_1, ..., |Z_k| < c_k), by scipy
        for k in range(1, 4):
            mvn = stats.multivariate_normal(np.zeros(k), corr[:k, :k], maxpts=1_000_000, abseps=1e-9, releps=0)
            inside.append(mvn.cdf(np.array(c[:k]), lower_limit=-np.array(c[:k])))
        first_crossing = -np.diff(inside)
        expected = np.diff([0.0, *(spent(f, alpha, "obf") for f in fractions)])
        assert first_crossing == pytest.approx(expected, rel=5e-4)
    assert efficacy_bounds(fractions, 0.05 / 24) == pytest.approx([5.31, 3.80, 3.09], abs=0.01)
