"""The budget rule of a study's pilot, applied to its validation curves: the extrapolation study's pre-registered rule
(its pre-registration, in the documentation's studies), and with ``--seed 1,2,3 --start 2250`` the rule of its
continuation, declared after its results (a second look).

    python bench/pilot_rule.py runs/study_extrapolation [--seed 1] [--start 900] [--step 450] [--gain 1.0]
        [--cap 2250]
    python bench/pilot_rule.py ../study-runs/study_extrapolation --seed 1,2,3 --start 2250 --cap 4500

Reads every variant's seed-``--seed`` run of the study (with several seeds, their mean at each evaluation all of
them reached: how the continuation to a flattened budget was decided), prints its validation BLEU at each evaluation
and the rule's verdict: the budget B is the first of start, start + step, ... (at most ``--cap``) at which no variant
gained ``--gain`` validation BLEU or more over its last ``--step`` steps. Until the runs reach a budget where
the rule stops, it says which budget to raise the study to next. Only validation data decides.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as bench/pilot_rule.py: the repository root first


def seed_mean(per_seed: list[dict[int, float]]) -> dict[int, float]:
    """The mean over seeds of validation curves, at the steps every seed has reached."""
    steps = set.intersection(*(set(c) for c in per_seed)) if per_seed else set()
    return {s: sum(c[s] for c in per_seed) / len(per_seed) for s in sorted(steps)}


def curves(study: Path, seeds: list[int]) -> dict[str, dict[int, float]]:
    """Validation BLEU by optimizer step of each variant: its seed's run, or the mean of its seeds' runs."""
    from utils.study.files import read_spec, slug
    from utils.study.runs import find_run, valid_curve

    spec = read_spec(study / "study.json")
    out = {}
    for variant in spec["variants"]:
        runs = [find_run(study / "runs" / slug(variant["label"]) / f"seed{seed}") for seed in seeds]
        out[variant["label"]] = seed_mean([dict(valid_curve(r)) if r else {} for r in runs])
    return out


def verdict(curves: dict[str, dict[int, float]], start: int, step: int, gain: float, cap: int) -> tuple[str, int]:
    """("stop", B) where the rule fixes the budget, ("raise", B') to train on to B', or ("wait", B) while some
    run has not reached budget B yet."""
    budget = start
    while True:
        reached = all(budget in c for c in curves.values())
        if not reached:
            return "wait", budget
        gains = [c[budget] - c[budget - step] for c in curves.values() if budget - step in c]
        if budget >= cap or (len(gains) == len(curves) and all(g < gain for g in gains)):
            return "stop", budget
        budget += step


def build_parser() -> argparse.ArgumentParser:
    """The command line of bench/pilot_rule.py."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("study", type=Path, help="runs/study_<name>")
    parser.add_argument("--seed", default="1", help="a seed, or seeds as 1,2,3: their mean curve")
    parser.add_argument("--start", type=int, default=900, help="first budget considered, in steps (default 900)")
    parser.add_argument("--step", type=int, default=450,
                        help="steps between budgets, and over which a gain counts (default 450)")
    parser.add_argument("--gain", type=float, default=1.0, help="validation BLEU gained over --step steps")
    parser.add_argument("--cap", type=int, default=2250, help="largest budget, in steps (default 2250)")
    return parser


def main() -> int:
    from utils.study.files import read_spec

    parser = build_parser()
    args = parser.parse_args()
    if not (args.study / "study.json").is_file():
        parser.error(f"{args.study}: no study.json")
    try:
        seeds = [int(x) for x in args.seed.split(",")]
    except ValueError:
        parser.error(f"--seed {args.seed}: a seed or seeds as 1,2,3")
    table = curves(args.study, seeds)
    steps = sorted({s for c in table.values() for s in c})
    print("| variant | " + " | ".join(str(s) for s in steps) + " |")
    print("|---|" + "---|" * len(steps))
    for label, c in table.items():
        print(f"| {label} | " + " | ".join(f"{c[s]:.2f}" if s in c else "-" for s in steps) + " |")
    what, budget = verdict(table, args.start, args.step, args.gain, args.cap)
    if what == "stop":
        print(f"\nrule: budget B = {budget} steps (gains over the last {args.step} steps: "
              + ", ".join(f"{k} {c[budget] - c.get(budget - args.step, float('nan')):+.2f}" for k, c in table.items())
              + ")")
    elif budget > read_spec(args.study / "study.json").get("steps", 0):
        print(f"\nrule: not decided; raise the study's --steps to {budget}")
    else:
        print(f"\nrule: not decided; the runs are still training toward {budget} steps")
    return 0


if __name__ == "__main__":
    from utils.cli import run_main

    run_main(main)
