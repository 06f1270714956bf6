"""A group-sequential design for a study whose seeds come in batches: at which seeds it looks, how much of the
type I error each look spends, the z boundary and nominal p-value each look tests against, where it stops for
futility, and how many seeds the design needs for its power.

    python bench/sequential_design.py --looks 6,12,18,24
    python bench/sequential_design.py --looks 6,12,18,24 --family 24 --residual-sd 1.30 --effect 1.0
    python bench/sequential_design.py --looks 4,8,12 --spending pocock --alpha 0.05

``--looks``: the seeds per system at each look, fixed before the first run (the last is the most the study will
train). ``--family M``: the boundaries of Holm's first step (alpha / M, the strictest); step j of Holm tests at
alpha / (M - j + 1). ``--residual-sd``: the pooled residual SD of the seed test (what a study report prints as
"pooled residual"), so that a paired difference between two systems has SD ``residual * sqrt(2)``; with
``--effect`` (the smallest difference of interest, in the metric's units) it adds the futility boundaries, the
power of the design and the seeds it would need for ``--power`` (normal approximation); ``--systems K`` adds the
power of the seed test as a study runs it, a t-test on the residual of a K-system ANOVA with seed blocks
((K - 1)(n - 1) degrees of freedom), by simulating 20,000 studies. Boundaries are on the z scale: a look rejects
when its seed test's p-value is at most the nominal p (Jennison & Turnbull's significance-level approach for
t-tests). Lan-DeMets spending (``obf``: O'Brien-Fleming type, ``pocock``); see utils/study/sequential.py.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as bench/sequential_design.py: the root first


def seeds_list(text: str) -> list[int]:
    """``6,12,18`` -> [6, 12, 18]: increasing positive seed counts (argparse type)."""
    try:
        looks = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: seed counts as 6,12,18,24") from None
    if not looks or looks[0] < 2 or looks != sorted(set(looks)):
        raise argparse.ArgumentTypeError(f"{text!r}: increasing seed counts, each at least 2 (a seed test needs two)")
    return looks


def build_parser() -> argparse.ArgumentParser:
    """The command line of bench/sequential_design.py."""
    from utils.cli import finite_float

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--looks", type=seeds_list, required=True, metavar="N1,N2,...",
                        help="seeds per system at each look, the last the most the study trains")
    parser.add_argument("--alpha", type=finite_float(0, 1, open_ends=True), default=0.05,
                        help="two-sided type I error of the family (default 0.05)")
    parser.add_argument("--family", type=int, default=1, metavar="M",
                        help="tests in the Holm family: the boundaries shown are its first step's, alpha / M "
                             "(default 1)")
    parser.add_argument("--spending", choices=["obf", "pocock"], default="obf",
                        help="Lan-DeMets spending function: O'Brien-Fleming type (default) or Pocock type")
    parser.add_argument("--residual-sd", type=finite_float(0, open_ends=True), metavar="SD",
                        help="pooled residual SD of the seed test, in the metric's units (a report's 'pooled "
                             "residual')")
    parser.add_argument("--effect", type=finite_float(0, open_ends=True),
                        help="smallest difference of interest, in the metric's units (with --residual-sd)")
    parser.add_argument("--beta", type=finite_float(0, 1, open_ends=True), default=0.2,
                        help="type II error spent on futility stops (default 0.2)")
    parser.add_argument("--power", type=finite_float(0, 1, open_ends=True), default=0.8,
                        help="power the seeds needed are computed for (default 0.8)")
    parser.add_argument("--systems", type=int, metavar="K",
                        help="systems in the seed test's ANOVA (with --effect): also the power of that t-test at "
                             "the last look's seeds, by simulation")
    return parser


def main() -> int:
    parser = build_parser()
    args = parser.parse_args()
    if not 1 <= args.family <= 10**6:
        parser.error(f"--family must be in 1..1000000 (tests in the family), got {args.family}")
    if (args.effect is None) != (args.residual_sd is None):
        parser.error("--effect and --residual-sd go together (the design's drift needs both)")
    if args.systems is not None and (args.effect is None or not 2 <= args.systems <= 100):
        parser.error("--systems needs --effect and --residual-sd, and 2 to 100 systems")
    from utils.study.sequential import (
        crossing_probabilities,
        drift_for_power,
        efficacy_bounds,
        futility_bounds,
        nominal_p,
        simulated_power,
        spent,
    )

    looks, level = args.looks, args.alpha / args.family
    fractions = [n / looks[-1] for n in looks]
    c = efficacy_bounds(fractions, level, args.spending)
    drift = None
    if args.effect is not None:  # the expected z at the last look: effect / (sd of a paired difference) * sqrt(n)
        drift = args.effect / (args.residual_sd * math.sqrt(2)) * math.sqrt(looks[-1])
        a = futility_bounds(fractions, c, drift, args.beta, args.spending)
    print(f"{len(looks)} looks at {', '.join(map(str, looks))} seeds; two-sided alpha {args.alpha:g}"
          + (f" over a Holm family of {args.family} (first step: {level:.3g})" if args.family > 1 else "")
          + f"; {args.spending} spending")
    print()
    head = "| look | seeds | information | alpha spent | z boundary | nominal p |"
    print(head + (" futility: stop if abs(z) < |" if drift is not None else ""))
    print("|---" * (7 if drift is not None else 6) + "|")
    for k, (n, t) in enumerate(zip(looks, fractions, strict=True)):
        row = (f"| {k + 1} | {n} | {t:.3f} | {spent(t, level, args.spending):.4g} | {c[k]:.4f} | "
               f"{nominal_p([c[k]])[0]:.4g} |")
        print(row + (f" {a[k]:.4f} |" if drift is not None else ""))
    if drift is not None:
        power = sum(crossing_probabilities(fractions, c, drift))
        needed_drift = drift_for_power(fractions, c, args.power)
        needed = math.ceil((needed_drift * args.residual_sd * math.sqrt(2) / args.effect) ** 2)
        print()
        binding = sum(crossing_probabilities(fractions, c, drift, a))
        print(f"power at a true difference of {args.effect:g} (residual SD {args.residual_sd:g}): {power:.3f}, "
              f"ignoring the futility stops ({binding:.3f} if they are always taken)")
        if args.systems is not None:
            sim = simulated_power(looks, nominal_p(c), args.effect, args.residual_sd, args.systems)
            print(f"power of the seed test as run (a t-test on the residual of a {args.systems}-system ANOVA, "
                  f"{args.systems - 1} x (n - 1) degrees of freedom; 20,000 simulated studies, seed 0): {sim:.3f} "
                  f"± {math.sqrt(sim * (1 - sim) / 20000):.3f}, ignoring the futility stops")
        scale = needed / looks[-1]
        print(f"seeds for power {args.power:g}: {needed} at the last look (the looks scaled to "
              f"{', '.join(str(max(2, math.ceil(n * scale))) for n in looks)})")
    return 0


if __name__ == "__main__":
    from utils.cli import run_main

    run_main(main)
