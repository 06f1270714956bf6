"""bench/study.py's second half: gather every run's scores, compare with the baseline, write the report.

``aggregate`` reads the eval JSON and hypotheses test.py wrote, the attention statistics and the
validation curves, and computes means, standard deviations and paired bootstrap tests. ``write_report``
writes ``results.json``, ``report.md``, ``figures/*.png`` and TensorBoard HParams summaries.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

DECODERS = {"beam5": 5, "greedy": 1}
ALPHA = 0.05


def _read_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").split("\n")[:-1]


def aggregate(jobs: list, runs: dict[str, Path], corpus: Any, splits: list[str], baseline: str, checkpoint: str,
              samples: int, attention_sentences: int, max_sentences: int | None = None) -> dict[str, Any]:
    """Every number of the study: per variant (and test variant), split and decoder; ``corpus`` holds the
    test splits (data.sources.load_corpus)."""
    from bench.study import eval_file, file_tag, mean_std, paired_bootstrap, read_attention, seed_test, valid_curve
    from utils.config import load_config

    labels = list(dict.fromkeys(job.variant.label for job in jobs))
    seeds = sorted({job.seed for job in jobs})
    by_key = {(job.variant.label, job.seed): job for job in jobs}
    first = runs[by_key[(baseline, seeds[0])].key]
    first_cfg = load_config(first / "config.yaml")
    lowercase = first_cfg.tokenizer.lowercase
    lengths = _source_lengths(first, corpus, splits)
    references = {split: list(corpus[split]["tgt"]) for split in splits}
    systems: dict[str, dict[str, Any]] = {}
    for label in labels:
        tags = [None, *by_key[(label, seeds[0])].variant.tests]
        for tag in tags:
            name = label if tag is None else f"{label}+{tag}"
            entry: dict[str, Any] = {"variant": label, "test_variant": tag, "splits": {}}
            for split in splits:
                for decoder, beam in DECODERS.items():
                    per_seed = []
                    for seed in seeds:
                        run = runs[by_key[(label, seed)].key]
                        js = eval_file(run, split, beam, checkpoint, file_tag(tag, max_sentences))
                        scores = json.loads(js.read_text())
                        scores["hyps"] = _read_lines(js.with_suffix(".hyp"))
                        per_seed.append(scores)
                    bleu = [s["bleu"] for s in per_seed]
                    chrf = [s["chrf"] for s in per_seed]
                    hyps = [s["hyps"] for s in per_seed]
                    refs = references[split][: len(hyps[0])]
                    row = {"bleu": bleu, "chrf": chrf, "bleu_mean_std": mean_std(bleu), "chrf_mean_std": mean_std(chrf),
                           "signature": per_seed[0]["bleu_signature"], "chrf_signature": per_seed[0]["chrf_signature"],
                           "by_source_length": _buckets(hyps, refs, lengths[split], first_cfg.eval.length_buckets,
                                                        lowercase),
                           "_hyps": hyps}
                    entry["splits"].setdefault(split, {})[decoder] = row
            if tag is None:
                entry["attention"] = []
                for s in seeds:
                    run = runs[by_key[(label, s)].key]
                    stats = read_attention(run, checkpoint, attention_sentences)
                    if stats is None:
                        raise ValueError(f"{run}: no attention statistics on {attention_sentences} sentences")
                    entry["attention"].append(stats)
                entry["valid_bleu"] = [valid_curve(runs[by_key[(label, s)].key]) for s in seeds]
            systems[name] = entry

    def compare(base: str, name: str, k: int, paired: bool) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for split in splits:
            for decoder in DECODERS:
                b, x = systems[base]["splits"][split][decoder], systems[name]["splits"][split][decoder]
                refs = references[split][: len(b["_hyps"][0])]
                comp = paired_bootstrap(b["_hyps"], x["_hyps"], refs, samples, lowercase)
                comp["across_seeds"] = seed_test(b["bleu"], x["bleu"], ALPHA / k, paired=paired)
                out.setdefault(split, {})[decoder] = comp
        return out

    # Against the baseline: every other trained variant and its test variants (the baseline's own test
    # variants are the same models: they are compared with it below, paired).
    others = [name for name, entry in systems.items() if entry["variant"] != baseline]
    k = max(1, len(others) * len(splits))  # comparisons per decoder: Bonferroni's divisor
    comparisons = {name: compare(baseline, name, k, paired=False) for name in others}
    tagged = [name for name, entry in systems.items() if entry["test_variant"] is not None]
    k_own = max(1, len(tagged) * len(splits))
    own = {name: compare(systems[name]["variant"], name, k_own, paired=True) for name in tagged}
    with_attention = [name for name, entry in systems.items() if "attention" in entry]
    k_att = max(1, (len(with_attention) - 1) * len(ATTENTION_STATS))
    attention_comparisons = {
        name: {f"{kind}.{stat}": seed_test(_attention_runs(systems[baseline]["attention"], kind, stat),
                                           _attention_runs(systems[name]["attention"], kind, stat), ALPHA / k_att)
               for kind, stat in ATTENTION_STATS}
        for name in with_attention if name != baseline and "attention" in systems[baseline]}
    for entry in systems.values():
        for split in entry["splits"].values():
            for row in split.values():
                row.pop("_hyps")
    return {"baseline": baseline, "seeds": seeds, "splits": splits, "systems": systems,
            "comparisons": comparisons, "bootstrap_samples": samples, "alpha": ALPHA, "comparisons_per_decoder": k,
            "test_variant_comparisons": own, "test_variant_comparisons_per_decoder": k_own,
            "length_unit": f"{first_cfg.tokenizer.type} tokens of {baseline}'s tokenizer",
            "attention_comparisons": attention_comparisons, "attention_comparisons_count": k_att}


def _source_lengths(run: Path, corpus: Any, splits: list[str]) -> dict[str, list[int]]:
    """Every test sentence's length in the given run's source tokens (eos not counted), as test.py counts them
    but without its truncation at the model's length limit: the same buckets for every system of the study,
    whatever tokenizer each was trained with."""
    from tokenizer import load_tokenizer
    from utils.runs import TOKENIZER_DIR
    from utils.translate import encode_sources

    tok = load_tokenizer(run / TOKENIZER_DIR)
    return {split: [max(len(x) - 1, 0) for x in encode_sources(tok, list(corpus[split]["src"]), None, strict=False)]
            for split in splits}


def _buckets(hyps: list[list[str]], refs: list[str], lengths: list[int], edges: list[int],
             lowercase: bool) -> list[dict[str, Any]]:
    """BLEU and chrF by source-length bucket: each seed's, and their mean ± std (None for an empty bucket)."""
    from bench.study import mean_std
    from utils.metrics import scores_by_length

    per_seed = [scores_by_length(h, refs, lengths[: len(h)], edges, lowercase) for h in hyps]
    out = []
    for rows in zip(*per_seed, strict=True):
        row: dict[str, Any] = {"bucket": rows[0]["bucket"], "n": rows[0]["n"]}
        for metric in ("bleu", "chrf"):
            values = [r[metric] for r in rows if r["n"]]
            row[metric] = values
            row[f"{metric}_mean_std"] = mean_std(values) if values else None
        out.append(row)
    return out


# ---------------------------------------------------------------------------------------------- report


def _fmt(ms: tuple[float, float] | list[float] | None) -> str:
    return "-" if ms is None else f"{ms[0]:.2f} ± {ms[1]:.2f}"


def _with_seeds(row: dict[str, Any]) -> str:
    """``9.09 ± 1.48 (7.9, 8.6, 10.8)``: the mean ± std of the seeds' BLEU, then each seed's."""
    return f"{_fmt(row['bleu_mean_std'])} ({', '.join(f'{v:.1f}' for v in row['bleu'])})"


def resolved(comp: dict[str, Any], k: int) -> tuple[bool, str]:
    """Whether one comparison's BLEU difference is resolved, and why: it must pass both tests after
    Bonferroni over ``k`` comparisons, the paired bootstrap (the test set could have been other sentences)
    and the t-test over seeds (the models could have been trained with other seeds)."""
    level = ALPHA / k
    bs, seeds = comp["BLEU"], comp.get("across_seeds") or {"p_value": None}
    bs_ok, seed_p = bs["p_value"] < level, seeds["p_value"]
    test = _seed_test_name(seeds)
    where = f"after Bonferroni over {k} comparisons (p < {level:.4f})"
    if bs_ok and seed_p is not None and seed_p < level:
        return True, f"resolved: significant on the test-set bootstrap and across seeds {where}"
    if bs_ok and seed_p is None:
        return False, (f"the test-set bootstrap resolves it {where}, but with one seed a side the variation "
                       "between training runs is not measured")
    if bs_ok:
        need = seeds.get("seeds_needed")
        more = f"; about {need} seeds per variant would resolve a true difference this size" if need else ""
        return False, (f"not resolved: the test-set bootstrap separates these models' outputs {where}, but the "
                       f"seeds do not ({test} p = {seed_p:.3f}): another set of seeds could reverse it{more}")
    if bs["p_value"] < ALPHA:
        return False, f"not resolved: the test-set bootstrap gives p < {ALPHA} alone, not {where}"
    return False, "not resolved: within what resampling the test set gives"


def _seed_test_name(seeds: dict[str, Any]) -> str:
    return "the paired t-test" if seeds.get("test") == "paired t" else "Welch's t-test"


def significance_lines(results: dict[str, Any], decoder: str = "beam5", own: bool = False) -> list[str]:
    """One sentence per comparison: both differences, both p-values and what they mean together. ``own``:
    the test-time variants against their own trained models instead of the variants against the baseline."""
    comparisons, k = _comparisons(results, own)
    floor = 1 / (results["bootstrap_samples"] + 1)  # the smallest p-value the resampling can give
    lines = []
    if comparisons and floor >= ALPHA / k:
        need = math.ceil(k / ALPHA)
        lines.append(f"- With {results['bootstrap_samples']} bootstrap samples no p-value can go below {floor:.4f}, "
                     f"so none can pass Bonferroni over {k} comparisons ({ALPHA}/{k}); rerun with --bootstrap {need} "
                     "or more to test that.")
    for name, per_split in comparisons.items():
        base = results["systems"][name]["variant"] if own else results["baseline"]
        for split, per_dec in per_split.items():
            comp = per_dec[decoder]
            seeds = comp.get("across_seeds") or {}
            mean = f"{seeds['delta']:+.2f} BLEU in the mean over seeds" if "delta" in seeds else ""
            if seeds.get("p_value") is not None:
                mean += f" ({'paired t' if seeds.get('test') == 'paired t' else 'Welch'} p = {seeds['p_value']:.3f})"
            pooled = f"{comp['BLEU']['delta']:+.2f} pooled (bootstrap p = {comp['BLEU']['p_value']:.3f})"
            lines.append(f"- {name} vs {base} on {split}: {', '.join(x for x in (mean, pooled) if x)}; "
                         f"{resolved(comp, k)[1]}.")
    return lines


def _comparisons(results: dict[str, Any], own: bool) -> tuple[dict[str, Any], int]:
    if own:
        return results.get("test_variant_comparisons", {}), results.get("test_variant_comparisons_per_decoder", 1)
    return results["comparisons"], results["comparisons_per_decoder"]


def _comparison_table(results: dict[str, Any], decoder: str, own: bool) -> list[str]:
    comparisons, k = _comparisons(results, own)
    test = "paired t p (seeds)" if own else "Welch p (seeds)"
    out = [f"| system | {'against' if own else 'split'} | {'split | ' if own else ''}Δ mean | {test} "
           "| seeds for 80 % power | pooled BLEU ± 95 % CI | Δ pooled | bootstrap p | resolved |",
           "|---|---|---|---|---|---|---|---|---|" + ("---|" if own else "")]
    for name, per_split in comparisons.items():
        for split, per_dec in per_split.items():
            comp = per_dec[decoder]
            seeds, bs = comp.get("across_seeds") or {}, comp["BLEU"]
            sp = "-" if seeds.get("p_value") is None else f"{seeds['p_value']:.3f}"
            need = seeds.get("seeds_needed") or "-"
            mean = f"{seeds['delta']:+.2f}" if "delta" in seeds else "-"
            against = f"{results['systems'][name]['variant']} | " if own else ""
            out.append(f"| {name} | {against}{split} | {mean} | {sp} | {need} | {bs['system']['score']:.2f} ± "
                       f"{bs['system']['ci']:.2f} | {bs['delta']:+.2f} | {bs['p_value']:.3f} | "
                       f"{'yes' if resolved(comp, k)[0] else 'no'} |")
    return out


def write_report(study: Path, spec: dict[str, Any], results: dict[str, Any]) -> None:
    from bench.study import mean_std
    from utils.io import atomic_write_text

    figures = study / "figures"
    figures.mkdir(parents=True, exist_ok=True)
    atomic_write_text(study / "results.json", json.dumps({"spec": spec, **results}, indent=1) + "\n")
    paths = _figures(results, figures)
    _hparams(study, spec, results)
    base = results["baseline"]
    n_seeds = len(results["seeds"])
    budget = f"{spec['steps']} optimizer steps" if spec.get("steps") else f"{spec['tokens']} target tokens"
    out = [f"# Study: {Path(spec['config']).name}, {len(spec['variants'])} variants x {n_seeds} seeds, {budget} each",
           "", f"Command: `{spec['command']}`", "",
           f"Baseline: **{base}**. Checkpoint scored: {spec['checkpoint']}.pt. BLEU is sacreBLEU (signature below), "
           f"mean ± standard deviation over {n_seeds} seeds. A difference with the baseline is tested twice: across "
           "seeds (Welch's t-test on the seeds' BLEU: would other training runs agree?) and across test sentences "
           f"(sacreBLEU's paired bootstrap, {results['bootstrap_samples']} samples, on all seeds' outputs pooled, "
           "a test sentence's statistics summed over the seeds: would other test sentences agree?). A difference "
           "counts as resolved only when both say so after Bonferroni's correction.", ""]
    k = results["comparisons_per_decoder"]
    for decoder in ("beam5", "greedy"):
        title = "beam 5" if decoder == "beam5" else "greedy"
        out += [f"## BLEU, {title}", ""]
        head = "| system | " + " | ".join(results["splits"]) + " |"
        out += [head, "|---|" + "---|" * len(results["splits"])]
        for name, entry in results["systems"].items():
            cells = []
            for split in results["splits"]:
                comp = results["comparisons"].get(name, {}).get(split, {}).get(decoder)
                mark = " *" if comp and resolved(comp, k)[0] else ""
                cells.append(_fmt(entry["splits"][split][decoder]["bleu_mean_std"]) + mark)
            out.append(f"| {name} | " + " | ".join(cells) + " |")
        out += ["", f"Against {base}, {title}:", "", *_comparison_table(results, decoder, own=False), ""]
    out += [f"\\* resolved against {base}: significant after Bonferroni over {k} comparisons on both tests, "
            "the paired bootstrap over test sentences (sacreBLEU's, on all seeds' outputs pooled) and Welch's "
            "t-test over the seeds' BLEU. Pooled BLEU is the corpus BLEU of every seed's output together, what "
            "the bootstrap resamples; it need not equal the mean of the seeds' BLEU. Seeds for 80 % power: "
            "per variant, if the true difference were the observed mean difference.", ""]
    out += ["## BLEU, beam 5, with each seed's value", "", "Mean ± std (seed 1, seed 2, ...):", "",
            "| system | " + " | ".join(results["splits"]) + " |", "|---|" + "---|" * len(results["splits"])]
    for name, entry in results["systems"].items():
        out.append(f"| {name} | " + " | ".join(_with_seeds(entry["splits"][s]["beam5"]) for s in results["splits"])
                   + " |")
    out.append("")
    for decoder, title in (("beam5", "beam 5"), ("greedy", "greedy")):
        lines = significance_lines(results, decoder)
        n = sum(resolved(per_dec[decoder], k)[0] for per_split in results["comparisons"].values()
                for per_dec in per_split.values())
        total = sum(len(per_split) for per_split in results["comparisons"].values())
        out += [f"## What the intervals resolve, {title}", "", f"{n} of {total} differences resolved.", "",
                *lines, ""]
    if results.get("test_variant_comparisons"):
        k_own = results["test_variant_comparisons_per_decoder"]
        out += ["## Test-time variants against their own trained models", "",
                "The same trained models scored under inference-only overrides (e.g. a RoPE scaling): each seed's "
                "model is compared with itself, so the seed-level test is the paired t-test on the per-seed "
                f"differences; Bonferroni over {k_own} comparisons per decoder.", ""]
        for decoder, title in (("beam5", "beam 5"), ("greedy", "greedy")):
            n = sum(resolved(per_dec[decoder], k_own)[0]
                    for per_split in results["test_variant_comparisons"].values() for per_dec in per_split.values())
            total = sum(len(per_split) for per_split in results["test_variant_comparisons"].values())
            out += [f"### {title}: {n} of {total} differences resolved", "",
                    *_comparison_table(results, decoder, own=True), "",
                    *significance_lines(results, decoder, own=True), ""]
    out += ["## chrF, beam 5", "", "| system | " + " | ".join(results["splits"]) + " |",
            "|---|" + "---|" * len(results["splits"])]
    for name, entry in results["systems"].items():
        out.append(f"| {name} | " + " | ".join(_fmt(entry["splits"][s]["beam5"]["chrf_mean_std"])
                                            for s in results["splits"]) + " |")
    out += ["", "## Attention (validation sample; mean over heads and layers, then mean ± std over seeds)", "",
            "| variant | encoder distance | encoder entropy | decoder distance | decoder entropy | cross distance "
            "| cross entropy | cross diagonal (±2) |", "|---|---|---|---|---|---|---|---|"]
    k_att = results["attention_comparisons_count"]
    for name, entry in results["systems"].items():
        if "attention" not in entry:
            continue
        cells = []
        for kind, stat in ATTENTION_STATS:
            cell = _fmt(mean_std(_attention_runs(entry["attention"], kind, stat)))
            p = results["attention_comparisons"].get(name, {}).get(f"{kind}.{stat}", {}).get("p_value")
            cell += "" if p is None else f" (p {p:.3f}){' *' if p < ALPHA / k_att else ''}"
            cells.append(cell)
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    out += ["", f"p: Welch's t-test over seeds against {base}; \\* significant after Bonferroni over {k_att} "
            "comparisons.", ""]
    out += ["", "## Figures", ""] + [f"![{p.stem}](figures/{p.name})" for p in paths]
    row = next(iter(results["systems"].values()))["splits"][results["splits"][0]]["beam5"]
    out += ["", f"sacreBLEU signatures: BLEU `{row['signature']}`, chrF `{row.get('chrf_signature', '-')}`. "
            f"BLEU by length buckets sentences by their length in {results.get('length_unit', 'source tokens')}, "
            "the same buckets for every system.", ""]
    atomic_write_text(study / "report.md", "\n".join(out))


ATTENTION_STATS = (("encoder", "distance"), ("encoder", "entropy"), ("decoder", "distance"), ("decoder", "entropy"),
                   ("cross", "distance"), ("cross", "entropy"), ("cross", "diagonal"))


def _attention_runs(per_seed: list[dict[str, Any]], kind: str, stat: str) -> list[float]:
    """One statistic per seed: its mean over every layer and head of that seed's run."""
    runs = [[v for layer in s["stats"][kind][stat] for v in layer] for s in per_seed]
    return [sum(values) / len(values) for values in runs]


def half_width(std: float, n: int) -> float:
    """95 % confidence half-width of a mean over ``n`` seeds: t_{0.975, n-1} std / sqrt(n) (0 for one seed)."""
    from scipy import stats

    return 0.0 if n < 2 else float(stats.t.ppf(0.975, n - 1) * std / math.sqrt(n))


def _figures(results: dict[str, Any], out: Path) -> list[Path]:
    import matplotlib

    from bench.study import mean_std

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    seeds = len(results["seeds"])
    for split in results["splits"]:
        fig, ax = plt.subplots(figsize=(7, 4))
        n = len(results["systems"])
        for k, (name, entry) in enumerate(results["systems"].items()):
            rows = entry["splits"][split]["beam5"]["by_source_length"]
            xs = [i for i, r in enumerate(rows) if r["bleu_mean_std"]]
            shift = (k - (n - 1) / 2) * min(0.08, 0.5 / n)  # side by side, so the bars do not hide each other
            ax.errorbar([x + shift for x in xs], [rows[i]["bleu_mean_std"][0] for i in xs],
                        yerr=[half_width(rows[i]["bleu_mean_std"][1], seeds) for i in xs], marker="o", capsize=3,
                        label=name)
        buckets = [r["bucket"] for r in next(iter(results["systems"].values()))["splits"][split]["beam5"][
            "by_source_length"]]
        ax.set_xticks(range(len(buckets)), buckets)
        ax.set(xlabel=f"source length ({results.get('length_unit', 'source tokens')})", ylabel="BLEU (beam 5)",
               title=f"{split}: mean over {seeds} seeds, 95 % CI")
        ax.legend(fontsize=7)
        paths.append(_save(fig, out / f"bleu_by_length_{split}.png"))
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, entry in results["systems"].items():
        curves = [c for c in entry.get("valid_bleu", []) if c]
        if not curves:
            continue
        steps = [s for s, _ in curves[0]]
        stats = [mean_std([c[i][1] for c in curves if i < len(c)]) for i in range(len(steps))]
        (line,) = ax.plot(steps, [m for m, _ in stats], marker=".", label=name)
        ax.fill_between(steps, [m - d for m, d in stats], [m + d for m, d in stats], color=line.get_color(),
                        alpha=0.15, linewidth=0)
    ax.set(xlabel="optimizer step", ylabel="validation BLEU, mean ± std over seeds")
    ax.legend(fontsize=7)
    paths.append(_save(fig, out / "valid_bleu.png"))
    for kind, stats in (("encoder", ("distance", "entropy")), ("decoder", ("distance", "entropy")),
                        ("cross", ("distance", "entropy", "diagonal"))):
        fig, axes = plt.subplots(1, len(stats), figsize=(4.5 * len(stats), 3.5))
        for name, entry in results["systems"].items():
            if "attention" not in entry:
                continue
            for ax, stat in zip(axes, stats, strict=True):
                per_seed = [[sum(heads) / len(heads) for heads in s["stats"][kind][stat]] for s in entry["attention"]]
                layers = [mean_std(values) for values in zip(*per_seed, strict=True)]  # mean over heads, then seeds
                xs = range(1, len(layers) + 1)
                ax.errorbar(xs, [m for m, _ in layers], yerr=[d for _, d in layers], marker="o", capsize=3, label=name)
                ax.set(xlabel="layer", ylabel=f"{stat}, mean ± std over seeds", title=f"{kind} attention: {stat}")
                ax.set_xticks(list(xs))
        axes[0].legend(fontsize=7)
        paths.append(_save(fig, out / f"attention_{kind}.png"))
    return paths


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _hparams(study: Path, spec: dict[str, Any], results: dict[str, Any]) -> None:
    """One HParams summary per run, so TensorBoard's HParams tab lists and compares them."""
    import shutil

    from torch.utils.tensorboard import SummaryWriter

    shutil.rmtree(study / "tb", ignore_errors=True)  # rewritten whole: a re-run adds no duplicates
    variants = {v["label"]: v for v in spec["variants"]}
    for name, entry in results["systems"].items():
        overrides = dict(o.split("=", 1) for o in variants[entry["variant"]]["overrides"])
        for i, seed in enumerate(results["seeds"]):
            hparams = {"variant": name, "seed": seed, **overrides}
            metrics = {f"test/{split}/bleu_{dec}": entry["splits"][split][dec]["bleu"][i]
                       for split in results["splits"] for dec in DECODERS}
            writer = SummaryWriter(log_dir=str(study / "tb" / f"{name}_seed{seed}"))
            writer.add_hparams(hparams, metrics, run_name=".")
            writer.close()
