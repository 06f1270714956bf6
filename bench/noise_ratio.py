"""The noise pilot's endpoint: how much seed-to-seed noise one study's training leaves against another's.

    python bench/noise_ratio.py RUNS/study_pilot-cool RUNS/study_pilot-plain [--level 0.95]

Both folders are scored studies of the same systems and seeds (``bench/pilot_noise.sh`` runs two such arms). For
each quantity of their primary family (``results.json``: ``primary`` -> ``power`` -> ``per_quantity``), and for the
family's pooled value, it prints each arm's residual standard deviation (the square root of the blocked ANOVA's
residual mean square: what is left of the scores once system and seed are accounted for), their ratio (first / second)
and its interval from the F distribution on the two residual degrees of freedom (for independent arms, the variance
ratio ``s1^2 / s2^2`` over ``sigma1^2 / sigma2^2`` has ``F(df1, df2)``; arms that share their seeds, as the pilot's
do, are positively correlated if anything, which only makes this interval wider than it need be); then each arm's
power at the declared smallest effect and the seeds it needs for 80 % power (the study's own figures). A ratio of
0.5 halves the noise: a quarter of the seeds for the same power. Last, the pilot's declared secondary, each arm's
quality: the mean chrF (beam 5) of its trained systems on the x1 Tatoeba and Multi30k sets, and the validation BLEU
at each run's last evaluation (mean and SD over the runs), so that an arm that lowers the noise by lowering the
quality is seen. Then what each arm cost: its runs' training and decoding, in CPU core-hours and GPU minutes, from
``results.json``'s compute figures or, for an arm scored before they were recorded, its runs' own records.

The pooled value averages the family's quantities, which share their runs: its interval takes one quantity's degrees
of freedom, not their sum. Beside it (a second measure, added on 2026-11-30 before any pilot statistic was read; the
declared endpoint is unchanged): the residual SD of the trained systems alone, sinusoidal against RoPE, which the
second study's design rule reads (``bench/pilot_design.py``); the pooled ANOVA's systems include RoPE's test-time
decodings, the same trained models, so its residual understates the noise between trained models.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as bench/noise_ratio.py: the repository root first

from utils.study.files import read_results  # noqa: E402

X1_SPLITS = ("test.tatoeba", "test.multi30k-2016")  # the x1 sets of the extrapolation family's drops


def sd_ratio(first: float, second: float, df1: int, df2: int, level: float = 0.95) -> tuple[float, float, float]:
    """(``first / second``, and the ``level`` interval of that ratio of standard deviations): the variance ratio
    ``F = first^2 / second^2`` divided by the F(df1, df2) quantiles, square-rooted."""
    from scipy.stats import f

    ratio = first / second
    tail = (1 - level) / 2
    return ratio, ratio / math.sqrt(f.ppf(1 - tail, df1, df2)), ratio / math.sqrt(f.ppf(tail, df1, df2))


def rows(first: dict[str, Any], second: dict[str, Any], level: float) -> list[dict[str, Any]]:
    """One row per quantity both families hold, then the pooled row: each arm's residual SD, the ratio, its interval."""
    if not all((r.get("primary") or {}).get("power", {}).get("per_quantity") for r in (first, second)):
        raise ValueError("a study without a primary family's power figures (results.json: primary -> power)")
    a, b = first["primary"]["power"], second["primary"]["power"]
    if first.get("seeds") != second.get("seeds"):
        raise ValueError(f"the two studies are scored at different seeds ({first.get('seeds')} and "
                         f"{second.get('seeds')}): score both at the same seeds")
    theirs = {q["label"]: q for q in b["per_quantity"]}
    missing = [q["label"] for q in a["per_quantity"] if q["label"] not in theirs]
    if missing or len(theirs) != len(a["per_quantity"]):
        raise ValueError(f"the two studies' families test different quantities ({', '.join(missing) or 'more'})")
    out = []
    for q in a["per_quantity"]:
        sd1, sd2 = q["residual_sd"], theirs[q["label"]]["residual_sd"]
        out.append({"label": q["label"], "first": sd1, "second": sd2,
                    "ci": sd_ratio(sd1, sd2, a["df"], b["df"], level)})
    pooled = sd_ratio(a["pooled_residual_sd"], b["pooled_residual_sd"], a["df"], b["df"], level)
    out.append({"label": "pooled (the family)", "first": a["pooled_residual_sd"], "second": b["pooled_residual_sd"],
                "ci": pooled})
    return out


def trained_lines(first: dict[str, Any], second: dict[str, Any], level: float) -> list[str]:
    """Each arm's residual SD of its trained systems alone (``bench/pilot_design.py``'s ``paired_residual``, what
    the design's rule reads), their ratio and its F interval: beside the declared endpoint, whose pooled ANOVA also
    counts the RoPE models' test-time decodings as systems. None for studies without a primary test of a trained
    system against the baseline."""
    from bench.pilot_design import paired_residual

    try:
        (sd1, df1), (sd2, df2) = paired_residual(first), paired_residual(second)
    except (KeyError, TypeError):
        return []
    ratio, low, high = sd_ratio(sd1, sd2, df1, df2, level)
    return ["", f"Residual SD of the trained systems alone (what bench/pilot_design.py's rule reads; the pooled ANOVA "
            "above also counts the test-time decodings of the same trained models as systems, which understates the "
            "noise between trained models), first / second with its "
            f"{level:.0%} interval (F on {df1} and {df2} degrees of freedom):", "",
            "| first | second | first / second | interval |", "|---|---|---|---|",
            f"| {sd1:.3f} | {sd2:.3f} | {ratio:.2f} | {low:.2f}-{high:.2f} |"]


def quality(results: dict[str, Any], folder: Path | None = None) -> dict[str, Any]:
    """An arm's quality beside its noise: ``x1_chrf``, split -> the mean chrF (beam 5) over its trained systems
    (``spec`` -> ``variants``) and seeds, for each of ``X1_SPLITS`` it scored; ``valid_bleu``, the validation BLEU at
    each of those runs' last evaluation, (mean, SD, runs), or None without validation curves. With the study's
    ``folder`` the curves are read from its runs where every run of those seeds is there (a kept run from its
    ``train.log``), else from ``results.json``."""
    trained = [v["label"] for v in (results.get("spec") or {}).get("variants") or []]
    systems = results.get("systems") or {}
    chrf = {}
    for split in X1_SPLITS:
        scores = [systems.get(s, {}).get("splits", {}).get(split, {}).get("beam5", {}).get("chrf") for s in trained]
        if trained and all(scores):
            chrf[split] = statistics.fmean(x for seeds in scores for x in seeds)
    curves = _run_curves(folder, trained, results.get("seeds") or []) if folder is not None else None
    if curves is None:
        curves = [curve for s in trained for curve in systems.get(s, {}).get("valid_bleu") or []]
    last = [curve[-1][1] for curve in curves if curve]
    bleu = (statistics.fmean(last), statistics.stdev(last) if len(last) > 1 else 0.0, len(last)) if last else None
    return {"x1_chrf": chrf, "valid_bleu": bleu}


def _run_curves(folder: Path, trained: list[str], seeds: list[int]) -> list[list[tuple[int, float]]] | None:
    """The validation curve of each trained system's run of each seed in ``folder/runs`` (its newest run
    directory), or None where one is missing."""
    from utils.study.files import slug
    from utils.study.runs import run_dirs, valid_curve

    runs = [run_dirs(folder / "runs" / slug(label) / f"seed{seed}") for label in trained for seed in seeds]
    return [valid_curve(r[-1]) for r in runs] if runs and all(runs) else None


def table(first: Path, second: Path, level: float = 0.95) -> str:
    """The Markdown report of ``first`` against ``second`` (two scored study folders)."""
    a, b = (read_results(f, need=("primary", "primary.power")) for f in (first, second))
    lines = [f"Residual SD of {first.name} (first) against {second.name} (second), {level:.0%} interval of the ratio "
             f"(F on {a['primary']['power']['df']} and {b['primary']['power']['df']} degrees of freedom)", "",
             "| quantity | first | second | first / second | interval |", "|---|---|---|---|---|"]
    for r in rows(a, b, level):
        ratio, low, high = r["ci"]
        lines.append(f"| {r['label']} | {r['first']:.3f} | {r['second']:.3f} | {ratio:.2f} | {low:.2f}-{high:.2f} |")
    lines += ["", "| arm | seeds | power at the smallest effect | seeds for 80 % |", "|---|---|---|---|"]
    for name, res in ((first.name, a), (second.name, b)):
        p = res["primary"]["power"]
        lines.append(f"| {name} | {p['seeds']} | {p['power_at_smallest_effect']:.3f} | "
                     f"{p['seeds_for_80_at_smallest_effect']} |")
    lines += trained_lines(a, b, level)
    quality_rows = [(folder.name, quality(res, folder)) for folder, res in ((first, a), (second, b))]
    if any(q["x1_chrf"] or q["valid_bleu"] for _, q in quality_rows):
        lines += ["", "Quality beside the noise (trained systems, every seed):", "",
                  "| arm | " + " | ".join(f"chrF {s} (beam 5)" for s in X1_SPLITS)
                  + " | validation BLEU, last evaluation (mean ± SD over runs) |", "|---|---|---|---|"]
        for name, q in quality_rows:
            cells = [f"{q['x1_chrf'][s]:.2f}" if s in q["x1_chrf"] else "-" for s in X1_SPLITS]
            v = q["valid_bleu"]
            cells.append(f"{v[0]:.2f} ± {v[1]:.2f} ({v[2]} runs)" if v else "-")
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def compute_lines(folders: list[Path]) -> list[str]:
    """What each scored study folder's runs cost (``results.json``'s compute figures, else its runs' own records:
    ``utils.study.cost.known_cost``), one table row per folder and their sum; none where no folder holds either."""
    from utils.study.cost import known_cost

    rows, sums = [], [0, 0.0, 0.0, 0.0]
    for folder in folders:
        if (total := known_cost(folder)) is None:
            continue
        gpu = total["train_gpu_minutes"] + total["decode_gpu_minutes"]
        values = [total["runs"], total["train_cpu_hours"], total["decode_cpu_hours"], gpu]
        sums = [a + b for a, b in zip(sums, values, strict=True)]
        rows.append(f"| {folder.name} | {values[0]} | {values[1]:.1f} | {values[2]:.1f} | {gpu:.1f} |")
    if not rows:
        return []
    return ["", "Compute (each arm's runs; CPU time is wall time x threads):", "",
            "| arm | runs | training, CPU core-hours | decoding, CPU core-hours | GPU minutes |",
            "|---|---|---|---|---|",
            *rows, f"| both | {sums[0]} | {sums[1]:.1f} | {sums[2]:.1f} | {sums[3]:.1f} |"]


def build_parser() -> argparse.ArgumentParser:
    """The command line of bench/noise_ratio.py."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("first", type=Path, help="a scored study folder (e.g. the pilot's cool arm)")
    parser.add_argument("second", type=Path, help="the study it is compared with (e.g. the plain arm)")
    parser.add_argument("--level", type=float, default=0.95, help="the interval's coverage (default 0.95)")
    return parser


def main() -> int:
    parser = build_parser()
    args = parser.parse_args()
    if not 0 < args.level < 1:
        parser.error(f"--level must be in (0, 1), got {args.level}")
    for folder in (args.first, args.second):
        if not (folder / "results.json").is_file():
            parser.error(f"{folder}: no results.json (score the study first)")
    try:
        print("\n".join([table(args.first, args.second, args.level), *compute_lines([args.first, args.second])]))
    except ValueError as e:
        parser.error(str(e))
    return 0


if __name__ == "__main__":
    from utils.cli import run_main

    run_main(main)
