"""Do retrained runs repeat a published study's? Checks the claim that a seed repeats a CPU run exactly.

    python bench/study_replay.py bench/studies/extrapolation ../study-runs/study_extrapolation-candidates \
        [../study-runs/study_extrapolation ...]

For every run of the study folders that the published study also holds (same system label and seed), compares its
validation BLEU at each published evaluation the run has passed with the published ``results.json``
(``systems[label].valid_bleu``, exact float equality: one changed weight bit changes some hypothesis long before
2,250 steps; a published evaluation the run has no value for counts as a difference), and, once the folder has
been scored at the published study's step budget (its own ``hypotheses/``), every published hypothesis of that
system and seed (each test split, beam 5 and greedy); hypotheses scored at another budget are not compared.
Prints a line per run and a verdict; exits 1 when a compared value differs, 0 otherwise
(also when no run has reached a published evaluation yet). Reads only: no number of either study changes.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def published_curves(folder: Path) -> dict[tuple[str, int], dict[int, float]]:
    """(system, seed) -> {step: validation BLEU} of a published study (trained systems only)."""
    from utils.study.files import read_results

    results = read_results(folder)
    out = {}
    for label, system in results["systems"].items():
        if system.get("test_variant"):
            continue  # the same models decoded another way: their curve is the trained system's
        for seed, curve in zip(results["seeds"], system.get("valid_bleu") or [], strict=False):
            out[(label, seed)] = {int(s): float(b) for s, b in curve}
    return out


def compare_curves(published: dict[int, float], retrained: dict[int, float]) -> tuple[int, list[int], list[int]]:
    """(how many published evaluations the run has passed, the steps among them whose BLEU differs, those it has
    no value for: an evaluation lost, e.g. a TensorBoard event not yet flushed when the run was killed)."""
    last = max(retrained, default=-1)
    due = sorted(s for s in published if s <= last)
    return len(due), [s for s in due if s in retrained and published[s] != retrained[s]], [
        s for s in due if s not in retrained]


def compare_hypotheses(published: dict[str, dict[str, list[str]]], retrained: dict[str, dict[str, list[str]]]
                       ) -> tuple[int, list[str]]:
    """(how many split/decoder outputs both hold, those whose lines differ as ``split/decoder``)."""
    both = [(split, dec) for split in published for dec in published[split] if dec in retrained.get(split, {})]
    return len(both), [f"{s}/{d}" for s, d in both if published[s][d] != retrained[s][d]]


def _hypotheses(folder: Path, label: str, seed: int) -> dict[str, Any] | None:
    """One system's and seed's published hypotheses ``{split: {decoder: lines}}``, None if the folder has none."""
    from utils.study.files import read_results
    from utils.study.report import read_hypotheses

    checksums = read_results(folder).get("checksums") if (folder / "results.json").is_file() else None
    try:
        per_split = read_hypotheses(folder / "hypotheses", [label], [seed], checksums)[label]
    except FileNotFoundError:
        return None
    return {split: {dec: hyps[0] for dec, hyps in per_dec.items()} for split, per_dec in per_split.items()}


def _scored_steps(folder: Path) -> int | None:
    """The step budget a scored study folder's hypotheses were decoded at (its ``results.json``), else None."""
    from utils.study.files import read_results

    return read_results(folder)["spec"].get("steps") if (folder / "results.json").is_file() else None


def replay(published: Path, studies: list[Path]) -> tuple[list[str], bool | None]:
    """Report lines, and whether every compared value is identical (None: nothing to compare yet)."""
    from utils.run.layout import RunDir
    from utils.study.files import read_spec, slug
    from utils.study.runs import run_dirs, valid_curve

    curves = published_curves(published)
    at = _scored_steps(published)
    lines, same, seen = [], True, set()
    for study in studies:
        spec = read_spec(study / "study.json")
        scored = _scored_steps(study)
        for variant in spec["variants"]:
            for seed in spec["seeds"]:
                key = (variant["label"], seed)
                if key not in curves or key in seen:
                    continue
                runs = run_dirs(study / "runs" / slug(variant["label"]) / f"seed{seed}")  # read only: never waits
                runs = [r for r in runs if RunDir(r).last.is_file()] or runs  # the run a study resumes or scores
                if not runs:
                    continue
                n, diff, missing = compare_curves(curves[key], dict(valid_curve(runs[-1])))
                if not n:
                    continue  # not evaluated yet
                seen.add(key)
                same_n = n - len(diff) - len(missing)
                line = f"{key[0]} seed {seed}: validation BLEU {same_n} of {n} evaluations identical"
                if diff:
                    line += f" (differs at steps {', '.join(map(str, diff))})"
                if missing:
                    line += f" (no value at steps {', '.join(map(str, missing))})"
                diff = diff + missing
                hyp_pub, hyp_new = _hypotheses(published, *key), _hypotheses(study, *key)
                if hyp_pub is not None and hyp_new is not None and scored != at:
                    line += f"; hypotheses not compared (scored at step {scored}, published at {at})"
                elif hyp_pub is not None and hyp_new is not None:
                    m, hdiff = compare_hypotheses(hyp_pub, hyp_new)
                    line += f"; hypotheses {m - len(hdiff)} of {m} split/decoder outputs identical"
                    if hdiff:
                        line += f" (differ: {', '.join(hdiff)})"
                    diff = diff or hdiff
                same = same and not diff
                lines.append(line)
    return lines, same if seen else None


def build_parser() -> argparse.ArgumentParser:
    """The command line of bench/study_replay.py."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("published", type=Path, help="a published study folder (bench/studies/<name>)")
    parser.add_argument("studies", type=Path, nargs="+", help="study folders of the retrained runs (runs/study_<name>)")
    return parser


def main() -> int:
    parser = build_parser()
    args = parser.parse_args()
    if not (args.published / "results.json").is_file():
        parser.error(f"{args.published}: no results.json")
    missing = [str(s) for s in args.studies if not (s / "study.json").is_file()]
    if missing:
        parser.error(f"{', '.join(missing)}: no study.json")
    lines, same = replay(args.published, args.studies)
    if same is None:
        print(f"replay of {args.published}: no run of these folders (same system label and seed) has reached an "
              "evaluation it holds")
        return 0
    print("\n".join(lines))
    print(f"replay of {args.published}: " + ("every compared value identical" if same else "DIFFERS"))
    return 0 if same else 1

