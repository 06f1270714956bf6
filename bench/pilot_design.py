"""The second extrapolation study's design, from its noise pilot: the training arm, the seeds per system, the looks
and the family file, by the rule its pre-registration fixed before the pilot was scored (the documentation's
studies: "Pre-registration: the second extrapolation study").

    python bench/pilot_design.py RUNS/study_pilot-cool RUNS/study_pilot-plain --out DIR

Both folders are the pilot's scored arms (``bench/pilot_noise.sh``): "cool" (a learning-rate cool-down to zero over
the last 20 % of the steps and an EMA of the weights) and "plain" (the first study's training). The rule:

1. **Arm.** "cool" when its residual SD of the trained systems (``paired_residual``) is at most ``RATIO`` (0.9) times
   plain's and its mean x1 chrF (beam 5, Tatoeba and Multi30k, every trained system and seed) is at most
   ``QUALITY`` (0.5) points below plain's; otherwise "plain".
2. **Planning SD.** The chosen arm's residual SD of the trained systems at its one-sided 80 % upper confidence
   limit, ``sd * sqrt(df / chi2_0.2(df))`` (Browne 1995), on its effective degrees of freedom.
3. **Seeds N.** The fewest seeds per system at which three equally spaced looks, with Lan-DeMets O'Brien-Fleming
   spending at Holm's first step (0.05 / 24), reach power 0.8 at the smallest effect (1.0 chrF), a paired
   difference having SD planning SD x sqrt(2) (``utils.study.sequential.seeds_needed``); at least ``MIN_SEEDS``
   (6, the pilot's), at most ``MAX_SEEDS`` (30; the power there is then stated).
4. **Looks.** ceil(N / 3), ceil(2N / 3) and N seeds per system; futility non-binding, beta 0.2, at the planning SD.

Rules 1 and 2 as amended on 2026-11-29, before the pilot was scored and before any run of the study (the
pre-registration's amendments): they first read the pooled residual of the pilot's ANOVA, in which three of the four
systems (RoPE, RoPE+NTK, RoPE+YaRN) are the same trained models, which understates the noise between trained models,
and took it as a point estimate.

Each folder must be its arm scored at all six seeds (its ``--set`` overrides say which arm it is): anything else is
refused in one line. Writes ``DIR/design.json`` (the rule's inputs and what it decided) and ``DIR/family.json`` (for
``bench/study.py --family``: the first study's 24 tests with this design, RoPE+NTK and RoPE+YaRN declared as
decodings of the RoPE models), and prints the decision.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as bench/pilot_design.py: the repository root first

RATIO, QUALITY = 0.9, 0.5  # rule 1
EFFECT, ALPHA, FAMILY_SIZE, POWER, BETA, LOOKS = 1.0, 0.05, 24, 0.8, 0.2, 3  # rules 3 and 4
MIN_SEEDS, MAX_SEEDS = 6, 30
CONFIDENCE = 0.8  # rule 2: the planning SD's upper confidence limit
X1_SPLITS = ("test.tatoeba", "test.multi30k-2016")
ARMS = {"cool": ["train.cooldown=0.2", "train.ema_decay=0.99"], "plain": []}  # the arms' --set overrides
PILOT_SEEDS = [1, 2, 3, 4, 5, 6]  # the pilot's seeds: the rule reads them all
# The family's test-time decodings of the RoPE models (amendment of 2026-11-30 on the seed test): each is tested in
# the ANOVA of the trained systems with it in RoPE's place, not beside RoPE.
DECODINGS = {"rope+ntk": "rope", "rope+yarn": "rope"}
DECLARED = ("pre-registered on 2026-11-29 (the second extrapolation study's pre-registration), before any of its "
            "runs; its training arm, seeds and looks by the rule fixed there, from the noise pilot "
            "(bench/pilot_design.py)")


def x1_chrf(results: dict[str, Any]) -> float:
    """The mean chrF (beam 5) of every trained system and seed on the x1 splits (``X1_SPLITS``) of a scored study."""
    values = []
    for variant in results["spec"]["variants"]:
        for split in X1_SPLITS:
            values += results["systems"][variant["label"]]["splits"][split]["beam5"]["chrf"]
    return statistics.fmean(values)


def paired_residual(results: dict[str, Any]) -> tuple[float, int]:
    """The residual SD of the trained systems alone and its effective degrees of freedom. For each trained system but
    the baseline and each quantity of the primary family, the variance over seeds of its per-seed difference from
    the baseline, halved (the residual mean square of a two-system ANOVA with seed blocks), is averaged; the SD is
    its square root. The degrees of freedom are (seeds - 1) per test set the quantities are on: a set's score and
    its drop share their runs and sentences, so they count once."""
    base = results["baseline"]
    trained = {v["label"] for v in results["spec"]["variants"]} - {base}
    tests = [t for t in results["primary"]["tests"] if t["system"] in trained and t["against"] == base]
    if not tests:
        raise KeyError("a primary test of a trained system against the baseline")
    variance = statistics.fmean(statistics.variance(t["per_seed_delta"]) / 2 for t in tests)
    sets = {t["quantity"]["split"] for t in tests}
    return math.sqrt(variance), (len(tests[0]["per_seed_delta"]) - 1) * len(sets)


def upper_limit(sd: float, df: int, confidence: float = 0.8) -> float:
    """The one-sided ``confidence`` upper limit of a standard deviation ``sd`` estimated on ``df`` degrees of
    freedom: ``sd * sqrt(df / chi2_{1 - confidence}(df))``."""
    from scipy.stats import chi2

    return sd * math.sqrt(df / chi2.ppf(1 - confidence, df))


def looks_for(seeds: int) -> list[int]:
    """The rule's looks for ``seeds`` seeds per system at the last: ceil(k N / 3) for k = 1, 2, 3."""
    return sorted({max(2, math.ceil(k * seeds / LOOKS)) for k in range(1, LOOKS + 1)})


def power_at(seeds: int, sd: float) -> float:
    """The power of the rule's looks at ``seeds`` seeds (normal approximation, futility ignored) for a true
    difference of ``EFFECT`` at Holm's first step, residual SD ``sd``."""
    from utils.study.sequential import crossing_probabilities, efficacy_bounds

    looks = looks_for(seeds)
    fractions = [n / looks[-1] for n in looks]
    drift = EFFECT / (sd * math.sqrt(2)) * math.sqrt(seeds)
    return sum(crossing_probabilities(fractions, efficacy_bounds(fractions, ALPHA / FAMILY_SIZE, "obf"), drift))


def seed_test_power(seeds: int, sd: float) -> float:
    """The power of the seed test as the study runs it at the rule's looks (a t-test on the residual of the five
    trained systems' ANOVA, 4 (n - 1) degrees of freedom, against Holm's first step's nominal p), by simulating
    20,000 studies (``utils.study.sequential.simulated_power``): stated beside ``power_at``, which rule 3 reads."""
    from utils.study.sequential import efficacy_bounds, nominal_p, simulated_power

    looks = looks_for(seeds)
    nominal = nominal_p(efficacy_bounds([n / looks[-1] for n in looks], ALPHA / FAMILY_SIZE, "obf"))
    return simulated_power(looks, nominal, EFFECT, sd, 5)


def not_the_arm(name: str, results: dict[str, Any]) -> str | None:
    """Why ``results`` is not the pilot's ``name`` arm scored at all its seeds, or None: the seeds scored, and the
    arm's own ``--set`` overrides (``ARMS``) present and the other arm's absent."""
    if results.get("seeds") != PILOT_SEEDS:
        return (f"scored at seeds {results.get('seeds')}, not the pilot's {PILOT_SEEDS[0]}-{PILOT_SEEDS[-1]} "
                "(bench/pilot_noise.sh scores all six last: run it to its end)")
    given = set((results.get("spec") or {}).get("overrides") or [])
    others = {o.split("=", 1)[0] for arm in ARMS.values() for o in arm} - {o.split("=", 1)[0] for o in ARMS[name]}
    if not set(ARMS[name]) <= given or any(o.split("=", 1)[0] in others for o in given):
        return f"not the {name} arm (its overrides: {', '.join(sorted(given)) or 'none'}; the arm's: " \
               f"{', '.join(ARMS[name]) or 'no train.cooldown or train.ema_decay'})"
    return None


def design(cool: dict[str, Any], plain: dict[str, Any]) -> dict[str, Any]:
    """The rule applied to the two arms' ``results.json``: what each arm measured, and the arm, planning SD, seeds,
    looks and power it decides."""
    from utils.study.sequential import seeds_needed

    measured = {}
    for name, res in (("cool", cool), ("plain", plain)):
        p = res["primary"]["power"]
        sd, df = paired_residual(res)
        measured[name] = {"residual_sd": sd, "df": df, "pooled_residual_sd": p["pooled_residual_sd"],
                          "pooled_df": p["df"], "seeds": p["seeds"], "x1_chrf": x1_chrf(res)}
    ratio = measured["cool"]["residual_sd"] / measured["plain"]["residual_sd"]
    gap = measured["cool"]["x1_chrf"] - measured["plain"]["x1_chrf"]
    arm = "cool" if ratio <= RATIO and gap >= -QUALITY else "plain"
    sd = upper_limit(measured[arm]["residual_sd"], measured[arm]["df"], CONFIDENCE)
    needed = seeds_needed(EFFECT, sd * math.sqrt(2), [k / LOOKS for k in range(1, LOOKS + 1)],
                          ALPHA / FAMILY_SIZE, POWER, "obf")
    seeds = min(MAX_SEEDS, max(MIN_SEEDS, needed))
    return {"pilot": measured, "ratio": ratio, "x1_chrf_gap": gap, "arm": arm, "overrides": ARMS[arm],
            "planning_sd": sd, "seeds_needed": needed, "seeds": seeds, "capped": needed > MAX_SEEDS,
            "looks": looks_for(seeds), "power": power_at(seeds, sd), "power_seed_test": seed_test_power(seeds, sd),
            "rule": {"ratio": RATIO, "quality": QUALITY, "confidence": CONFIDENCE, "effect": EFFECT, "alpha": ALPHA,
                     "family": FAMILY_SIZE, "power": POWER, "beta": BETA, "looks": LOOKS, "min_seeds": MIN_SEEDS,
                     "max_seeds": MAX_SEEDS}}


def family(decided: dict[str, Any]) -> dict[str, Any]:
    """The family file of the decided design: the first study's 24 tests (``EXTRAPOLATION_FAMILY``) with its looks."""
    from utils.study.presets import EXTRAPOLATION_FAMILY

    return {**EXTRAPOLATION_FAMILY, "declared": DECLARED, "decodings": DECODINGS,
            "sequential": {"looks": decided["looks"], "spending": "obf", "futility": True, "beta": BETA,
                           "residual_sd": decided["planning_sd"]}}


def summary(decided: dict[str, Any]) -> str:
    """The decision in a few lines."""
    m = decided["pilot"]
    lines = [f"residual SD of the trained systems: cool {m['cool']['residual_sd']:.3f}, plain "
             f"{m['plain']['residual_sd']:.3f} (ratio {decided['ratio']:.2f}; the rule: at most {RATIO}; "
             f"{m['cool']['df']} and {m['plain']['df']} degrees of freedom)",
             f"x1 chrF: cool {m['cool']['x1_chrf']:.2f}, plain {m['plain']['x1_chrf']:.2f} (cool - plain "
             f"{decided['x1_chrf_gap']:+.2f}; the rule: at least -{QUALITY})",
             f"arm: {decided['arm']} ({' '.join(f'--set {o}' for o in decided['overrides']) or 'no --set'})",
             f"seeds per system: {decided['seeds']} (power 0.8 needs {decided['seeds_needed']}"
             + (f"; capped at {MAX_SEEDS}" if decided["capped"] else "") + f"), looks at "
             f"{', '.join(map(str, decided['looks']))}, power {decided['power']:.3f} at {EFFECT} chrF "
             f"(planning residual SD {decided['planning_sd']:.3f}: the {decided['arm']} arm's at its "
             f"{CONFIDENCE:.0%} upper confidence limit; normal approximation)",
             f"power of the seed test as run (a t-test on the five trained systems' residual, simulated): "
             f"{decided['power_seed_test']:.3f}"]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The command line of bench/pilot_design.py."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cool", type=Path, help="the pilot's scored cool arm (runs/study_pilot-cool)")
    parser.add_argument("plain", type=Path, help="the pilot's scored plain arm (runs/study_pilot-plain)")
    parser.add_argument("--out", type=Path, required=True, help="folder for design.json and family.json")
    return parser


def main() -> int:
    parser = build_parser()
    args = parser.parse_args()
    from utils.io import atomic_write_text
    from utils.study.files import read_results

    arms = []
    for name, folder in (("cool", args.cool), ("plain", args.plain)):
        if not (folder / "results.json").is_file():
            parser.error(f"{folder}: no results.json (score the pilot's arm first)")
        arms.append(read_results(folder, need=("primary", "primary.power")))
        why = not_the_arm(name, arms[-1])
        if why:
            parser.error(f"{folder}: {why}")
    try:
        decided = design(*arms)
    except (KeyError, TypeError) as e:
        parser.error(f"not the pilot's scored arms: results.json lacks {e} (each needs a primary family and beam-5 "
                     f"chrF on {', '.join(X1_SPLITS)})")
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out / "design.json", json.dumps(decided, indent=1) + "\n")
    atomic_write_text(args.out / "family.json", json.dumps(family(decided), indent=1) + "\n")
    print(summary(decided))
    print(f"wrote {args.out / 'design.json'} and {args.out / 'family.json'} (bench/study.py --family)")
    return 0


if __name__ == "__main__":
    from utils.cli import run_main

    run_main(main)
