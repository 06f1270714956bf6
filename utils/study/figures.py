"""The figures of a study's report (``figures/*.png``: validation curves, primary contrasts, scores by source length,
attention statistics) and its TensorBoard HParams summaries."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from utils.study.decoders import DECODERS
from utils.study.stats import mean_std

MIN_BUCKET = 30


ATTENTION_STATS = (("encoder", "distance"), ("encoder", "entropy"), ("decoder", "distance"), ("decoder", "entropy"),
                   ("cross", "distance"), ("cross", "entropy"), ("cross", "diagonal"))


def attention_runs(per_seed: list[dict[str, Any]], kind: str, stat: str) -> list[float]:
    """One statistic per seed: its mean over every layer and head of that seed's run."""
    runs = [[v for layer in s["stats"][kind][stat] for v in layer] for s in per_seed]
    return [sum(values) / len(values) for values in runs]


def half_width(std: float, n: int) -> float:
    """95 % confidence half-width of a mean over ``n`` seeds: t_{0.975, n-1} std / sqrt(n) (0 for one seed)."""
    from scipy import stats

    return 0.0 if n < 2 else float(stats.t.ppf(0.975, n - 1) * std / math.sqrt(n))


MARKERS = "osD^vP*Xh<>pd8H"


def system_style(i: int) -> dict[str, Any]:
    """A distinct colour and marker for system ``i`` (20 colours x 15 markers: no two systems alike)."""
    import matplotlib

    return {"color": matplotlib.colormaps["tab20"](i % 20), "marker": MARKERS[i % len(MARKERS)]}


def _ci(values: list[float]) -> tuple[float, float]:
    """Mean and 95 % t-interval half-width over seeds: the one error-bar convention of every figure."""
    m, sd = mean_std(values)
    return m, half_width(sd, len(values))


def write_figures(results: dict[str, Any], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from data.sources import length_shifted

    paths = []
    seeds = len(results["seeds"])
    names = list(results["systems"])
    n = len(names)
    caption = f"mean over {seeds} seeds, bars: 95 % t-interval"
    if results.get("primary", {}).get("tests"):
        paths.append(contrasts_figure(results, names, caption, out / "primary_contrasts.png"))
    for split in results["splits"]:
        rows0 = results["systems"][names[0]]["splits"][split]["beam5"].get("by_source_length")
        if not rows0:
            continue
        keep = [i for i, r in enumerate(rows0) if r["n"] >= MIN_BUCKET]
        fig, ax = plt.subplots(figsize=(8, 4.5))
        for k, name in enumerate(names):
            rows = results["systems"][name]["splits"][split]["beam5"]["by_source_length"]
            stats = [_ci(rows[i]["chrf"]) for i in keep]
            shift = (k - (n - 1) / 2) * min(0.08, 0.6 / n)
            ax.errorbar([j + shift for j in range(len(keep))], [m for m, _ in stats], yerr=[h for _, h in stats],
                        capsize=2, label=name, linewidth=1, markersize=5, **system_style(k))
        ax.set_xticks(range(len(keep)), [f"{rows0[i]['bucket']}\nn={rows0[i]['n']}" for i in keep])
        ax.set(xlabel=f"source length ({results.get('length_unit', 'source tokens')})", ylabel="chrF (beam 5)",
               title=f"{split}: {caption}")
        ax.legend(fontsize=7, ncol=2)
        paths.append(save_figure(fig, out / f"chrf_by_length_{split}.png"))
    groups: dict[str, list[tuple[int, str]]] = {}
    for split in results["splits"]:
        shifted = length_shifted(split)
        base = shifted[0] if shifted else split
        groups.setdefault(base, []).append((shifted[1] if shifted else 1, split))
    groups = {b: sorted(g) for b, g in groups.items() if len(g) > 1}
    if groups:
        fig, axes = plt.subplots(1, len(groups), figsize=(5.5 * len(groups), 4.2), squeeze=False)
        for ax, (base, members) in zip(axes[0], groups.items(), strict=True):
            for k, name in enumerate(names):
                stats = [_ci(results["systems"][name]["splits"][s]["beam5"]["chrf"]) for _, s in members]
                ax.errorbar([f for f, _ in members], [m for m, _ in stats], yerr=[h for _, h in stats], capsize=2,
                            label=name, linewidth=1, markersize=5, **system_style(k))
            ax.set_xscale("log", base=2)
            ax.set_xticks([f for f, _ in members], [f"x{f}" for f, _ in members])
            ax.set(xlabel="pairs joined per sentence (length x k)", ylabel="chrF (beam 5)", title=f"{base}: {caption}")
        axes[0][0].legend(fontsize=7, ncol=2)
        paths.append(save_figure(fig, out / "chrf_by_concatenation.png"))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for k, name in enumerate(names):
        curves = [c for c in results["systems"][name].get("valid_bleu", []) if c]
        if not curves:
            continue
        steps = [s for s, _ in curves[0]]
        stats = [_ci([c[i][1] for c in curves if i < len(c)]) for i in range(len(steps))]
        style = system_style(k)
        ax.plot(steps, [m for m, _ in stats], label=name, linewidth=1, markersize=4, **style)
        if len(curves) > 1:
            ax.fill_between(steps, [m - h for m, h in stats], [m + h for m, h in stats], color=style["color"],
                            alpha=0.15, linewidth=0)
    ax.set(xlabel="optimizer step", ylabel="validation BLEU (greedy)",
           title=f"validation: {caption.replace('bars', 'band')}")
    ax.legend(fontsize=7, ncol=2)
    paths.append(save_figure(fig, out / "valid_bleu.png"))
    if not any("attention" in results["systems"][name] for name in names):  # none computed: no empty figures
        return paths
    for kind, stats_names in (("encoder", ("distance", "entropy")), ("decoder", ("distance", "entropy")),
                              ("cross", ("distance", "entropy", "diagonal"))):
        fig, axes = plt.subplots(1, len(stats_names), figsize=(4.5 * len(stats_names), 3.8))
        for k, name in enumerate(names):
            entry = results["systems"][name]
            if "attention" not in entry:
                continue
            for ax, stat in zip(axes, stats_names, strict=True):
                per_seed = [[sum(heads) / len(heads) for heads in s["stats"][kind][stat]] for s in entry["attention"]]
                layers = [_ci(list(values)) for values in zip(*per_seed, strict=True)]
                xs = range(1, len(layers) + 1)
                ax.errorbar(xs, [m for m, _ in layers], yerr=[h for _, h in layers], capsize=2, label=name,
                            linewidth=1, markersize=5, **system_style(k))
                ax.set(xlabel="layer", ylabel=stat, title=f"{kind} attention: {stat}")
                ax.set_xticks(list(xs))
        axes[0].legend(fontsize=6, ncol=2)
        fig.suptitle(f"mean over heads; {caption}", fontsize=9)
        paths.append(save_figure(fig, out / f"attention_{kind}.png"))
    return paths


def contrasts_figure(results: dict[str, Any], names: list[str], caption: str, path: Path) -> Path:
    """The primary family at a glance (a forest plot): one panel per quantity, a row per contrast; each seed's
    difference from the baseline (dots under the row), their mean with its 95 % t-interval over seeds (the figures' one
    convention; the paired t-test's interval), filled where the contrast is resolved, the band of the smallest
    effect of interest around 0."""
    import matplotlib.pyplot as plt

    pr = results["primary"]
    labels = list(dict.fromkeys(t["label"] for t in pr["tests"]))
    systems = list(dict.fromkeys(t["system"] for t in pr["tests"]))
    effect = pr["power"]["smallest_effect"]
    fig, axes = plt.subplots(1, len(labels), figsize=(3.6 * len(labels), 1.6 + 0.45 * len(systems)),
                             sharey=True, squeeze=False)
    for ax, label in zip(axes[0], labels, strict=True):
        ax.axvspan(-effect, effect, color="0.9", linewidth=0)
        ax.axvline(0, color="0.5", linewidth=0.8)
        for t in (t for t in pr["tests"] if t["label"] == label):
            row, style = systems.index(t["system"]), system_style(names.index(t["system"]))
            mean, half = _ci(t["per_seed_delta"])
            ax.plot(t["per_seed_delta"], [row + 0.22] * len(t["per_seed_delta"]), "o", color=style["color"],
                    markersize=3, alpha=0.7)
            ax.errorbar([mean], [row], xerr=[half], capsize=3, linewidth=1.2, markersize=7, **style,
                        markerfacecolor=style["color"] if t["resolved"] else "white")
        ax.set(title=label, xlabel=f"Δ vs {results['baseline']}")
        ax.title.set_fontsize(8)
    axes[0][0].set_yticks(range(len(systems)), systems)
    axes[0][0].set_ylim(len(systems) - 0.5, -0.5)  # the family's order, top down
    fig.suptitle(f"primary family: {caption}; dots: each seed; filled: resolved; grey band: ±{effect:g}, the "
                 "smallest effect of interest", fontsize=8)
    return save_figure(fig, path)


def save_figure(fig: Any, path: Path) -> Path:
    """Write ``fig`` to ``path`` (PNG, 110 dpi, tight layout) and close it: every figure of a report is written here."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_hparams(study: Path, spec: dict[str, Any], results: dict[str, Any]) -> None:
    """One HParams summary per run, so TensorBoard's HParams tab lists and compares them."""
    import shutil

    from torch.utils.tensorboard import SummaryWriter

    shutil.rmtree(study / "tb", ignore_errors=True)  # rewritten whole: a re-run adds no duplicates
    variants = {v["label"]: v for v in spec["variants"]}
    for name, entry in results["systems"].items():
        overrides = dict(o.split("=", 1) for o in variants[entry["variant"]]["overrides"])
        for i, seed in enumerate(results["seeds"]):
            hparams = {"variant": name, "seed": seed, **overrides}
            metrics = {f"test/{split}/{m}_{dec}": entry["splits"][split][dec][m][i]
                       for split in results["splits"] for dec in results.get("decoders", DECODERS)
                       for m in ("chrf", "bleu")}
            writer = SummaryWriter(log_dir=str(study / "tb" / f"{name}_seed{seed}"))
            writer.add_hparams(hparams, metrics, run_name=".")
            writer.close()
