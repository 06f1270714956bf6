"""A published study's primary family again, with its test-time decodings tested in their parent's place: a
sensitivity analysis of the seed test's pooling, not the study's result.

    python bench/sensitivity_decodings.py bench/studies/extrapolation [--decodings rope+ntk=rope,rope+yarn=rope]

A study whose family declares no ``decodings`` (those published before the second extrapolation study) tests every
contrast in one two-way ANOVA over all its systems, test-time decodings of the same trained models included. This
recomputes its primary tests, in a temporary copy of its ``results.json`` and ``hypotheses/`` (the study's folder is
left as it is), with ``--decodings`` declared (default: every family system named ``rope+...``, a decoding of
``rope``): the trained contrasts in the ANOVA of the trained systems alone, each decoding in it in its parent's
place (``utils.study.analysis.primary``). Prints one row per test: the seed test's Holm p and the verdict as
published and as recomputed, and the count of each.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as bench/sensitivity_decodings.py


def build_parser() -> argparse.ArgumentParser:
    """The command line of bench/sensitivity_decodings.py."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, help="a published study (results.json and hypotheses/)")
    parser.add_argument("--decodings", help="DECODING=PARENT,... (default: each rope+... system of the family as a "
                                            "decoding of rope)")
    return parser


def main() -> int:
    parser = build_parser()
    args = parser.parse_args()
    from utils.study.files import read_results
    from utils.study.report import reanalyse, scratch_copy

    if not (args.folder / "results.json").is_file():
        parser.error(f"{args.folder}: no results.json")
    published = read_results(args.folder, need=("primary",))
    family = dict(published["spec"].get("family") or {})
    systems = family.get("systems") or list(dict.fromkeys(t["system"] for t in published["primary"]["tests"]))
    if args.decodings:
        pairs = [p.split("=", 1) for p in args.decodings.split(",")]
        if any(len(p) != 2 for p in pairs):
            parser.error(f"--decodings {args.decodings}: give DECODING=PARENT,...")
        decodings = dict(pairs)
    else:
        decodings = {s: "rope" for s in systems if s.startswith("rope+")}
    if not decodings or any(d not in systems for d in decodings):
        parser.error(f"--decodings: {', '.join(decodings) or 'none'}: not among the family's systems "
                     f"({', '.join(systems)})")
    family["decodings"] = decodings
    with scratch_copy(args.folder, {**published, "spec": {**published["spec"], "family": family}}) as copy:
        again = reanalyse(copy, primary_only=True)["primary"]
    before = {(t["system"], t["label"]): t for t in published["primary"]["tests"]}
    print(f"{args.folder}: {', '.join(f'{d} in place of {p}' for d, p in decodings.items())}; a sensitivity "
          "analysis, not the study's result")
    print()
    print("| system | quantity | Δ mean | seed test Holm p, published | resolved | recomputed (df) | resolved |")
    print("|---|---|---|---|---|---|---|")
    for t in again["tests"]:
        old = before[(t["system"], t["label"])]
        print(f"| {t['system']} | {t['label']} | {t['delta']:+.2f} | {old['seed_test']['p_holm']:.4f} | "
              f"{'yes' if old['resolved'] else 'no'} | {t['seed_test']['p_holm']:.4f} ({t['seed_test']['df']}) | "
              f"{'yes' if t['resolved'] else 'no'} |")
    print()
    print(f"resolved: {published['primary']['resolved']} of {published['primary']['size']} as published, "
          f"{again['resolved']} of {again['size']} recomputed")
    return 0


if __name__ == "__main__":
    from utils.cli import run_main

    run_main(main)
