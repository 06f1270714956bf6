"""Do retrained runs repeat a published study's? Checks the claim that a seed repeats a CPU run exactly.

    python bench/study_replay.py bench/studies/extrapolation ../study-runs/study_extrapolation-candidates \
        [../study-runs/study_extrapolation ...]

For every run of the study folders that the published study also holds (same system label and seed), compares its
validation BLEU at each evaluation both reached with the published ``results.json`` (``systems[label].valid_bleu``,
exact float equality: one changed weight bit changes some hypothesis long before 2,250 steps), and, once the folder
has been scored (its own ``hypotheses/``), every published hypothesis of that system and seed (each test split,
beam 5 and greedy). Prints a line per run and a verdict; exits 1 when a compared value differs, 0 otherwise
(also when no run has reached a published evaluation yet). Reads only: no number of either study changes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as bench/study_replay.py: the repository root first


def published_curves(folder: Path) -> dict[tuple[str, int], dict[int, float]]:
    """(system, seed) -> {step: validation BLEU} of a published study (trained systems only)."""
    results = json.loads((folder / "results.json").read_text())
    out = {}
    for label, system in results["systems"].items():
        if system.get("test_variant"):
            continue  # the same models decoded another way: their curve is the trained system's
        for seed, curve in zip(results["seeds"], system.get("valid_bleu") or [], strict=False):
            out[(label, seed)] = {int(s): float(b) for s, b in curve}
    return out


def compare_curves(published: dict[int, float], retrained: dict[int, float]) -> tuple[int, list[int]]:
    """(how many evaluations both reached, the steps among them whose BLEU differs)."""
    common = sorted(set(published) & set(retrained))
    return len(common), [s for s in common if published[s] != retrained[s]]


def compare_hypotheses(published: dict[str, dict[str, list[str]]], retrained: dict[str, dict[str, list[str]]]
                       ) -> tuple[int, list[str]]:
    """(how many split/decoder outputs both hold, those whose lines differ as ``split/decoder``)."""
    both = [(split, dec) for split in published for dec in published[split] if dec in retrained.get(split, {})]
    return len(both), [f"{s}/{d}" for s, d in both if published[s][d] != retrained[s][d]]


def _hypotheses(folder: Path, label: str, seed: int) -> dict[str, Any] | None:
    import lzma

    from bench.study_report import _slug

    path = folder / "hypotheses" / f"{_slug(label)}.seed{seed}.json.xz"
    return json.loads(lzma.decompress(path.read_bytes())) if path.is_file() else None


def replay(published: Path, studies: list[Path]) -> tuple[list[str], bool | None]:
    """Report lines, and whether every compared value is identical (None: nothing to compare yet)."""
    from bench.study import run_dirs, slug
    from bench.study_runs import valid_curve

    curves = published_curves(published)
    lines, same, seen, compared = [], True, set(), 0
    for study in studies:
        spec = json.loads((study / "study.json").read_text())
        for variant in spec["variants"]:
            for seed in spec["seeds"]:
                key = (variant["label"], seed)
                if key not in curves or key in seen:
                    continue
                runs = run_dirs(study / "runs" / slug(variant["label"]) / f"seed{seed}")  # read only: never waits
                if not runs:
                    continue
                seen.add(key)
                n, diff = compare_curves(curves[key], dict(valid_curve(runs[-1])))
                if not n:
                    continue  # not evaluated yet
                compared += 1
                line = f"{key[0]} seed {seed}: validation BLEU {n - len(diff)} of {n} evaluations identical"
                if diff:
                    line += f" (differs at steps {', '.join(map(str, diff))})"
                hyp_pub, hyp_new = _hypotheses(published, *key), _hypotheses(study, *key)
                if hyp_pub is not None and hyp_new is not None:
                    m, hdiff = compare_hypotheses(hyp_pub, hyp_new)
                    line += f"; hypotheses {m - len(hdiff)} of {m} split/decoder outputs identical"
                    if hdiff:
                        line += f" (differ: {', '.join(hdiff)})"
                    diff = diff or hdiff
                same = same and not diff
                lines.append(line)
    return lines, same if compared else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("published", type=Path, help="a published study folder (bench/studies/<name>)")
    parser.add_argument("studies", type=Path, nargs="+", help="study folders of the retrained runs (runs/study_<name>)")
    args = parser.parse_args()
    if not (args.published / "results.json").is_file():
        parser.error(f"{args.published}: no results.json")
    missing = [str(s) for s in args.studies if not (s / "study.json").is_file()]
    if missing:
        parser.error(f"{', '.join(missing)}: no study.json")
    lines, same = replay(args.published, args.studies)
    if same is None:
        print(f"replay of {args.published}: no run of these folders has reached an evaluation it holds")
        return 0
    print("\n".join(lines))
    print(f"replay of {args.published}: " + ("every compared value identical" if same else "DIFFERS"))
    return 0 if same else 1


if __name__ == "__main__":
    from utils.cli import run_main

    run_main(main)
