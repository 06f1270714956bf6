"""bench/study.py's second half: gather every run's scores, compare with the baseline, write the report.

``aggregate`` reads the eval JSON and hypotheses test.py wrote, the attention statistics and the
validation curves, and computes means, standard deviations and paired bootstrap tests. ``write_report``
writes ``results.json``, ``report.md``, ``figures/*.png`` and TensorBoard HParams summaries.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from bench.study_files import Ledger

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as bench/study_report.py: the repository root first

from bench.common import ROOT, fmt_mean_std  # noqa: E402
from bench.study_decoders import DECODERS  # noqa: E402
from bench.study_length_control import length_control_lines, reanalyse_length  # noqa: E402

ALPHA = 0.05


def aggregate(jobs: list, runs: dict[str, Path], corpus: Any, splits: list[str], baseline: str, checkpoint: str,
              samples: int, attention_sentences: int, max_sentences: int | None = None,
              family: dict[str, Any] | None = None, decoders: list[str] | None = None,
              steps: dict[str, int] | None = None, ledger: Ledger | None = None) -> dict[str, Any]:
    """Every number of the study: per system (variant or test variant), split and decoder each seed's scores,
    length ratio and buckets; the declared family of primary tests and the exploratory ones
    (bench/study_analysis.py); ``corpus`` holds the test splits (data.sources.load_corpus). The hypotheses
    are returned under ``"_hypotheses"`` for ``write_report`` to publish. ``decoders``: those of ``DECODERS``
    scored (default all). A system missing the attention statistics of a seed (its checkpoint was gone at
    scoring), or holding ones of another training step than ``steps`` gives its run, has none in the report.
    Every score file, hypotheses file and attention statistics file is checked before use
    (``bench.study_runs.read_scores``, ``read_attention``; ``ledger``: the checksums of files that record none):
    StudyFileError, one line naming the file, for one damaged or changed since it was written."""
    from bench.study_runs import eval_file, file_tag, read_attention, read_scores, valid_curve
    from utils.config import load_config
    from utils.run.layout import RunDir

    labels = list(dict.fromkeys(job.variant.label for job in jobs))
    seeds = sorted({job.seed for job in jobs})
    by_key = {(job.variant.label, job.seed): job for job in jobs}
    references = {split: list(corpus[split]["tgt"]) for split in splits}
    sizes = {split: min(len(refs), max_sentences or len(refs)) for split, refs in references.items()}
    hypotheses: dict[str, dict[str, dict[str, list[list[str]]]]] = {}
    systems: dict[str, dict[str, Any]] = {}
    for label in labels:
        for tag in [None, *by_key[(label, seeds[0])].variant.tests]:
            name = label if tag is None else f"{label}+{tag}"
            entry: dict[str, Any] = {"variant": label, "test_variant": tag}
            for split in splits:
                for decoder, beam in ((d, DECODERS[d]) for d in decoders or DECODERS):
                    per_seed = []
                    for seed in seeds:
                        js = eval_file(runs[by_key[(label, seed)].key], split, beam, checkpoint,
                                       file_tag(tag, max_sentences))
                        per_seed.append(read_scores(js, sizes[split], ledger))
                    hypotheses.setdefault(name, {}).setdefault(split, {})[decoder] = [h for _, h in per_seed]
                    signatures = {"signature": per_seed[0][0]["bleu_signature"],
                                  "chrf_signature": per_seed[0][0]["chrf_signature"]}
                    entry.setdefault("splits", {}).setdefault(split, {})[decoder] = signatures
            if tag is None:
                keys = [by_key[(label, s)].key for s in seeds]
                attention = [read_attention(runs[k], checkpoint, attention_sentences, ledger) for k in keys]
                if all(a is not None and (steps is None or a.get("step") == steps[k])
                       for a, k in zip(attention, keys, strict=True)):
                    entry["attention"] = attention
                entry["valid_bleu"] = [valid_curve(runs[by_key[(label, s)].key]) for s in seeds]
            systems[name] = entry
    first = runs[by_key[(baseline, seeds[0])].key]
    first_cfg = load_config(RunDir(first).config)
    lengths = _source_lengths(first, corpus, splits)
    results = analyse(systems, hypotheses, references, lengths, splits, baseline, seeds, samples,
                      first_cfg.tokenizer.lowercase, first_cfg.eval.length_buckets, first_cfg.data.max_train_len,
                      family, decoders)
    results["length_unit"] = f"{first_cfg.tokenizer.type} tokens of {baseline}'s tokenizer"
    results["source_lengths"] = lengths
    results["provenance"] = run_provenance(jobs, runs)
    results["_hypotheses"] = hypotheses
    return results


def run_provenance(jobs: list, runs: dict[str, Path]) -> dict[str, Any]:
    """Each run's system, seed, the commits that trained it (its ``provenance.json``; none recorded: an empty list)
    and the hash of its config (utils.study.provenance), for the report to say where the runs came from."""
    from utils.config import load_config
    from utils.run.layout import RunDir
    from utils.study.provenance import config_sha256, read

    out = {}
    for job in jobs:
        run = runs[job.key]
        out[job.key] = {"system": job.variant.label, "seed": job.seed,
                        "trained_by": (read(run) or {}).get("trained_by", []),
                        "config_sha256": config_sha256(load_config(RunDir(run).config).to_dict())}
    return {"runs": out}


def analyse(systems: dict[str, dict[str, Any]], hypotheses: dict[str, Any] | None, references: dict[str, list[str]],
            lengths: dict[str, list[int]] | None, splits: list[str], baseline: str, seeds: list[int], samples: int,
            lowercase: bool, edges: list[int], train_len: int | None, family: dict[str, Any] | None,
            decoders: list[str] | None = None) -> dict[str, Any]:
    """Scores, buckets, primary and exploratory tests from the hypotheses (or, without them, from the per-seed
    scores already in ``systems``: the seed-level tests only), for ``decoders`` (default all)."""
    from bench.study_analysis import Analysis, Family, attention_tests, exploratory, metric_for, primary
    from bench.study_stats import brevity_penalty, chrf_precision_recall, corpus_score, sentence_stats

    scores: dict[str, Any] = {}
    stats: dict[str, Any] | None = {} if hypotheses is not None else None
    metrics = {"chrF": metric_for("chrF", lowercase), "BLEU": metric_for("BLEU", lowercase)}
    buckets = {}
    for name, entry in systems.items():
        for split in splits:
            for decoder in decoders or DECODERS:
                row = entry["splits"][split][decoder]
                if hypotheses is not None:
                    hyps = hypotheses[name][split][decoder]
                    if len({len(h) for h in hyps}) != 1 or len(hyps[0]) > len(references[split]):
                        raise ValueError(f"{name}, {split}, {decoder}: {[len(h) for h in hyps]} hypotheses per seed "
                                         f"for {len(references[split])} references")
                    refs = references[split][: len(hyps[0])]
                    per = {m: [sentence_stats(metric, h, refs) for h in hyps] for m, metric in metrics.items()}
                    stats.setdefault(name, {}).setdefault(split, {})[decoder] = per  # type: ignore[union-attr]
                    row["chrf"] = [corpus_score(metrics["chrF"], x.sum(0)) for x in per["chrF"]]
                    row["bleu"] = [corpus_score(metrics["BLEU"], x.sum(0)) for x in per["BLEU"]]
                    row["length_ratio"] = [float(x[:, 0].sum() / max(x[:, 1].sum(), 1)) for x in per["BLEU"]]
                    pr = [chrf_precision_recall(metrics["chrF"], x.sum(0)) for x in per["chrF"]]
                    row["chrf_precision"], row["chrf_recall"] = [p for p, _ in pr], [r for _, r in pr]
                    row["bleu_bp"] = [brevity_penalty(x.sum(0)) for x in per["BLEU"]]
                    row["n_sentences"] = len(refs)
                    if lengths is not None:
                        buckets[split] = _bucket_index(lengths[split][: len(refs)], edges)
                        row["by_source_length"] = _buckets(per, buckets[split], metrics)
                row["bleu_mean_std"], row["chrf_mean_std"] = mean_std(row["bleu"]), mean_std(row["chrf"])
                scores.setdefault(name, {}).setdefault(split, {})[decoder] = {"chrF": row["chrf"], "BLEU": row["bleu"]}
    analysis = Analysis(scores, stats, baseline, samples, lowercase, buckets)
    fam = Family(**(family or {}))
    names = list(systems)
    with_attention = [n for n in names if "attention" in systems[n] and n not in fam.elsewhere]  # tested there
    attention = {f"{n}|{kind}.{stat}": _attention_runs(systems[n]["attention"], kind, stat)
                 for n in with_attention for kind, stat in ATTENTION_STATS}
    declared = primary(analysis, fam, names, splits)
    decoders = list(decoders or DECODERS)
    scope = {"decoders": decoders} if decoders != list(DECODERS) else {}  # recorded where not every decoder ran
    return {"baseline": baseline, "seeds": seeds, "splits": splits, **scope, "systems": systems,
            "bootstrap_samples": samples,
            "alpha": fam.alpha, "primary": declared,
            "exploratory": exploratory(analysis, names, splits, fam, train_len,
                                       {n: e["variant"] for n, e in systems.items() if e.get("test_variant")},
                                       declared["tests"], decoders),
            "attention_tests": attention_tests(attention, baseline, fam.alpha) if baseline in with_attention else {}}


def mean_std(values: list[float]) -> tuple[float, float]:
    import statistics

    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def _bucket_index(lengths: list[int], edges: list[int]) -> dict[str, list[int]]:
    """Sentence indices of each source-length bucket (labelled as ``scores_by_length`` labels them)."""
    from utils.translation.scoring import bucket_label

    bounds = [0, *edges]
    out = {}
    for i, lo in enumerate(bounds):
        hi = bounds[i + 1] if i + 1 < len(bounds) else None
        out[bucket_label(lo, hi)] = [j for j, n in enumerate(lengths) if n >= lo and (hi is None or n < hi)]
    return out


def _source_lengths(run: Path, corpus: Any, splits: list[str]) -> dict[str, list[int]]:
    """Every test sentence's length in the given run's source tokens (eos not counted), as test.py counts them
    but without its truncation at the model's length limit: the same buckets for every system of the study,
    whatever tokenizer each was trained with."""
    from tokenizer import load_tokenizer
    from utils.run.layout import RunDir
    from utils.translation.translate import encode_sources

    tok = load_tokenizer(RunDir(run).tokenizer)
    return {split: [max(len(x) - 1, 0) for x in encode_sources(tok, list(corpus[split]["src"]), None, strict=False)]
            for split in splits}


def _buckets(per: dict[str, list[np.ndarray]], index: dict[str, list[int]],
             metrics: dict[str, Any]) -> list[dict[str, Any]]:
    """BLEU and chrF by source-length bucket, each seed's and their mean ± std (None for an empty bucket), from
    each seed's sentence statistics ``per[metric][k]``: a bucket's corpus score is that of its summed statistics,
    what ``utils.translation.scoring.scores_by_length`` computes from the sentences (``test.py``'s table)."""
    from bench.study_stats import corpus_score

    out = []
    for label, idx in index.items():
        row: dict[str, Any] = {"bucket": label, "n": len(idx)}
        summed = {m: [x[idx].sum(0) for x in seeds] if idx else [] for m, seeds in per.items()}
        values = {"bleu": [corpus_score(metrics["BLEU"], x) for x in summed["BLEU"]],
                  "chrf": [corpus_score(metrics["chrF"], x) for x in summed["chrF"]],
                  "length_ratio": [float(x[0] / max(x[1], 1)) for x in summed["BLEU"]]}
        for metric, seeds in values.items():
            row[metric] = seeds
            row[f"{metric}_mean_std"] = mean_std(seeds) if seeds else None
        out.append(row)
    return out


# ---------------------------------------------------------------------------------------------- report


def _cell(row: dict[str, Any], metric: str) -> str:
    """``51.23 ± 0.40 (50.9, 51.7, 51.1) · len 0.98``: mean ± std over seeds, each seed, and the mean
    hypothesis/reference length ratio (longer output can buy chrF: it must be visible)."""
    values = row[metric]
    out = f"{fmt_mean_std(row[f'{metric}_mean_std'])} ({', '.join(f'{v:.1f}' for v in values)})"
    if row.get("length_ratio"):
        out += f" · len {sum(row['length_ratio']) / len(row['length_ratio']):.2f}"
    return out


def _p(x: float | None) -> str:
    return "-" if x is None else ("< 0.0001" if x < 1e-4 else f"{x:.4f}")


def _len(results: dict[str, Any], test: dict[str, Any]) -> str:
    """``0.97 / 0.99``: the mean hypothesis/reference length ratio of the system and of what it is compared with,
    on the test's split (a drop's xK split; a bucket's sentences), its decoder."""
    q = test["quantity"]

    def ratio(name: str) -> str:
        row = results["systems"][name]["splits"][q["split"]][q["decoder"]]
        if q["kind"] == "bucket":  # the bucket's own sentences
            row = next((b for b in row.get("by_source_length", []) if b["bucket"] == q["bucket"]), {})
        values = row.get("length_ratio")
        return f"{sum(values) / len(values):.2f}" if values else "-"

    return f"{ratio(test['system'])} / {ratio(test.get('against') or results['baseline'])}"


def design_lines(results: dict[str, Any]) -> list[str]:
    """The design the family is tested under and the look these seeds make: fixed (one look), or the declared
    group-sequential design with the alpha spent so far."""
    from utils.study.looks import SPENDING_NAMES

    pr = results["primary"]
    if not pr["tests"]:  # nothing tested here: no look
        return []
    d = pr.get("design") or {"kind": "fixed", "seeds": len(results["seeds"]), "alpha": pr["family"]["alpha"]}
    if d["kind"] == "fixed":
        return [f"Design: fixed (one look): the family is tested once, at {d['seeds']} seeds per system, the whole "
                f"α = {d['alpha']} spent at this look.", ""]
    futility = (f"; futility declared (non-binding; β = {d['beta']}, planning residual SD {d['residual_sd']:.2f})"
                if d["futility"] else "; no futility boundary")
    unplanned = "" if d["planned"] else " (not a planned look: the planned looks below it are counted as taken)"
    first = (f" (Holm's first step: {d['alpha_spent_first_step']:.3g} of {d['alpha'] / pr['size']:.3g})"
             if pr["size"] > 1 else "")
    return [f"Design: group-sequential, declared with the family: looks at {', '.join(map(str, d['looks']))} seeds per "
            f"system, Lan-DeMets {SPENDING_NAMES[d['spending']]} spending of α = {d['alpha']}{futility}. **This is "
            f"look {d['look']} of {d['of']}**, at {d['seeds']} seeds per system{unplanned} (information "
            f"{d['information']:.2f}): α spent so far {d['alpha_spent']:.4g} of {d['alpha']}{first}. The seed test "
            "rejects where its p-value is at most its boundary at this look: Holm's step-down, the j-th smallest p "
            "tested against the boundary of the spending function at α / (tests - j + 1). A test is resolved where "
            "its seed test crossed, its bootstrap rejects after Holm, and both agree in sign.", ""]


def boundary_lines(results: dict[str, Any]) -> list[str]:
    """Under a group-sequential design: each test's boundary at this look, whether it crossed, and futility."""
    tests = [t for t in results["primary"]["tests"] if "sequential" in t]
    if not tests:
        return []
    out = ["| system | quantity | seed test p | Holm step (level) | boundary z (nominal p) | crossed | futility |",
           "|---|---|---|---|---|---|---|"]
    for t in tests:
        s = t["sequential"]
        futility = (f"{'**yes**' if s['futility'] else 'no'} (z < {s['futility_z']:.3f})" if "futility" in s
                    else "-")
        out.append(f"| {t['system']} | {t['label']} | {_p(t['seed_test']['p_value'])} | {s['step']} "
                   f"({s['level']:.3g}) | {s['boundary_z']:.3f} ({_p(s['boundary_p'])}) | "
                   f"{'**yes**' if s['crossed'] else 'no'} | {futility} |")
    return [*out, ""]


def length_lines(results: dict[str, Any]) -> list[str]:
    """chrF precision and recall and BLEU's brevity penalty beside each primary quantity, every system of the family
    (descriptive: no test)."""
    import statistics

    pr = results["primary"]
    if not pr["tests"]:
        return []
    if not pr.get("length"):
        return ["chrF precision and recall, BLEU's brevity penalty: not computable (these runs' hypotheses were not "
                "published).", ""]
    base = results["baseline"]
    out = ["Length beside each primary quantity (descriptive, not tested): chrF's n-gram precision (P) and recall (R), "
           "the averages over its character and word orders that chrF combines with β = 2 (recall weighs four times "
           "as much as precision: longer output can raise chrF), and BLEU's brevity penalty (BP: 1 for output at "
           "least as long as the reference, less for shorter), each the mean over seeds; for a drop, each is its x1 "
           f"value minus its xK value. ΔP, ΔR: the mean over seeds of each seed's difference with {base}.", "",
           "| quantity | system | P | R | BP | ΔP | ΔR |", "|---|---|---|---|---|---|---|"]
    for entry in pr["length"]:
        b = entry["systems"][base]
        for name, v in entry["systems"].items():
            deltas = ["-" if name == base else
                      f"{statistics.fmean(x - y for x, y in zip(v[k], b[k], strict=True)):+.2f}"
                      for k in ("chrf_precision", "chrf_recall")]
            out.append(f"| {entry['label']} | {name} | {statistics.fmean(v['chrf_precision']):.2f} | "
                       f"{statistics.fmean(v['chrf_recall']):.2f} | {statistics.fmean(v['bleu_bp']):.3f} | "
                       f"{deltas[0]} | {deltas[1]} |")
    return [*out, ""]


def provenance_lines(results: dict[str, Any]) -> list[str]:
    """Which commits trained the runs (more than one: said plainly), and whether each system's seeds share one
    config hash."""
    from utils.study.provenance import commit_label

    runs = (results.get("provenance") or {}).get("runs")
    if not runs:
        return ["Provenance: not recorded (these runs were trained before a study recorded each run's commit and "
                "config hash).", ""]
    by_commit: dict[str, dict[str, list[int]]] = {}
    hashes: dict[str, set[str]] = {}
    for run in runs.values():
        for label in dict.fromkeys(commit_label(e) for e in run["trained_by"]) or ["not recorded"]:
            by_commit.setdefault(label, {}).setdefault(run["system"], []).append(run["seed"])
        hashes.setdefault(run["system"], set()).add(run["config_sha256"])

    def which(systems: dict[str, list[int]]) -> str:
        return "; ".join(f"{name} seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}"
                         for name, seeds in systems.items())

    commits = [c for c in by_commit if c != "not recorded"]
    if len(by_commit) == 1 and commits:
        line = f"Provenance: every run was trained by commit {commits[0]}"
    else:
        line = (f"Provenance: **the runs come from {len(commits)} commits, not one**: " if len(commits) > 1
                else "Provenance: ") + ", ".join(f"{c} ({which(by_commit[c])})" for c in by_commit)
        line += ("; runs of different commits are paired like runs of one only where the code between them does "
                 "not change what they compute" if len(commits) > 1 else "")
    mixed = [name for name, h in hashes.items() if len(h) > 1]
    line += (f"; **the seeds of {', '.join(mixed)} differ in config hash**" if mixed
             else "; each system's runs share one config hash") + " (each run's provenance.json)."
    return [line, ""]


def _primary_lines(results: dict[str, Any]) -> list[str]:
    from bench.study_analysis import Family

    pr = results["primary"]
    fam, pw = pr["family"], pr["power"]
    base = results["baseline"]
    quantities = list(dict.fromkeys(t["label"] for t in pr["tests"]))
    declared = fam.get("declared", Family().declared)
    heading = "## Main analysis (exploratory)" if declared.startswith("exploratory") else "## Primary analysis"
    out = [heading, "", f"The family: {declared}.", ""]
    elsewhere: dict[str, str] = fam.get("elsewhere") or {}
    if elsewhere:
        by_study: dict[str, list[str]] = {}
        for name, where in elsewhere.items():
            by_study.setdefault(where, []).append(name)
        out += ["Not tested here: " + "; ".join(
            f"{', '.join(names)} against {base} on this endpoint, whose runs (and the baseline's) are linked from "
            f"study `{where}`: its family tests them, one family per contrast, so the same runs get the same test "
            "in every report" for where, names in by_study.items()) + ".", ""]
    if not pr["tests"]:
        return [*out, "No contrast is left in this family: every system's is tested in the family above.", ""]
    out += [*design_lines(results),
        f"Contrasts: each of {', '.join(dict.fromkeys(t['system'] for t in pr['tests']))} minus **{base}**, on "
        f"{len(quantities)} quantities ({'; '.join(quantities)}): a family of **{pr['size']} tests**, Holm's "
        f"correction at α = {fam['alpha']}. Each quantity is the mean over seeds of the per-seed difference "
        "(the seed is a block: the same tokenizer and batch order for every system). Seed-level test: the "
        "contrast of a two-way ANOVA without interaction (system × seed block), residual df "
        f"{pr['anova'][0]['df'] if pr['anova'] else '-'}. Test-set test: a paired bootstrap of the same quantity "
        f"({results['bootstrap_samples']} resamples of the test units, every seed's statistics kept apart; "
        "two-sided: the resampled differences shifted to mean 0 against the observed one; sacreBLEU's own rule, "
        "a half to a third of it, is `p_value_sacrebleu` in results.json). Resolved: both reject after Holm and "
        "agree in sign. The paired t-test over seeds is shown beside them as a check. A drop is score(x1) - "
        "score(xK): a positive Δ on a drop means the system loses more with length than what it is compared "
        "with. len: the hypothesis/reference length ratio on the quantity's split (a drop's xK split), system / "
        "baseline.",
        ""]
    if not pr["bootstrap_available"]:
        out += ["The hypotheses of these runs were not published, so the test-set bootstrap cannot be computed: "
                "only the seed-level test is shown, and **nothing is called resolved** on it alone. Nor can the "
                "length ratio (len: - / -): a higher chrF bought with longer output cannot be ruled out here.", ""]
    out += ["| system | quantity | Δ per seed | Δ mean | seed test p | p Holm | paired t p | bootstrap 95 % CI "
            "| bootstrap p | p Holm | len | resolved |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for t in pr["tests"]:
        b = t["bootstrap"]
        ci = f"[{b['ci95'][0]:+.2f}, {b['ci95'][1]:+.2f}]" if b else "-"
        out.append(f"| {t['system']} | {t['label']} | {', '.join(f'{d:+.2f}' for d in t['per_seed_delta'])} | "
                   f"{t['delta']:+.2f} | {_p(t['seed_test']['p_value'])} | {_p(t['seed_test']['p_holm'])} | "
                   f"{_p(t.get('paired_t', {}).get('p_value'))} | {ci} | {_p(b['p_value']) if b else '-'} | "
                   f"{_p(b.get('p_holm')) if b else '-'} | {_len(results, t)} | "
                   f"{'**yes**' if t['resolved'] else 'no'} |")
    out += ["", f"**{pr['resolved']} of {pr['size']} resolved.**", "", *boundary_lines(results), *length_lines(results)]
    if pw["power_at_smallest_effect"] is not None:
        out += [f"Power (noncentral t, from the pooled residual standard deviation {pw['pooled_residual_sd']:.2f} "
                f"{fam['metric']} over {pw['seeds']} seeds and {pw['systems']} systems, df {pw['df']}, at "
                f"{pw['level_note']} = {pw['level']:.4f}): a true difference of {fam['smallest_effect']} "
                f"{fam['metric']} (the smallest effect of interest, fixed in advance) is detected with probability "
                f"{pw['power_at_smallest_effect']:.2f}; 80 % power needs a true difference of "
                f"{pw['detectable_at_80']:.2f}, or {pw['seeds_for_80_at_smallest_effect'] or '> 1000'} seeds per "
                f"system for {fam['smallest_effect']}. The seed blocks explain "
                + ", ".join(f"{q['seed_share']:.0%} ({q['label']})" for q in pw["per_quantity"])
                + " of the within-system variance.", ""]
    return out


def _score_table(results: dict[str, Any], metric: str, decoder: str) -> list[str]:
    key = metric.lower()
    out = ["| system | " + " | ".join(results["splits"]) + " |", "|---|" + "---|" * len(results["splits"])]
    for name, entry in results["systems"].items():
        out.append(f"| {name} | " + " | ".join(_cell(entry["splits"][s][decoder], key) for s in results["splits"])
                   + " |")
    return out


def _exploratory_lines(results: dict[str, Any]) -> list[str]:
    rows = results["exploratory"]
    if not rows:
        return []
    out = ["## Exploratory tests (not part of the family: unadjusted p, no claim rests on them)", "",
           "Seed test: the blocked ANOVA over every system (a test-time variant against its own models: the paired "
           "t-test); bootstrap p two-sided; len: hypothesis/reference length ratio, system / what it is compared "
           "with.", "",
           "| system | against | quantity | Δ mean | Δ per seed | seed test p | bootstrap p | len |",
           "|---|---|---|---|---|---|---|---|"]
    for t in rows:
        b = t["bootstrap"]
        out.append(f"| {t['system']} | {t.get('against', results['baseline'])} | {t['label']} | {t['delta']:+.2f} | "
                   f"{', '.join(f'{d:+.2f}' for d in t['per_seed_delta'])} | {_p(t['seed_test']['p_value'])} | "
                   f"{_p(b['p_value']) if b else '-'} | {_len(results, t)} |")
    return [*out, ""]


def _bucket_lines(results: dict[str, Any], metric: str = "chrf") -> list[str]:
    out = []
    for split in results["splits"]:
        first = next(iter(results["systems"].values()))["splits"][split]["beam5"]
        rows = first.get("by_source_length")
        if not rows:
            continue
        out += [f"### {split}", "", "| system | " + " | ".join(f"{r['bucket']} (n={r['n']})" for r in rows) + " |",
                "|---|" + "---|" * len(rows)]
        for name, entry in results["systems"].items():
            cells = [_bucket_cell(r, metric) for r in entry["splits"][split]["beam5"]["by_source_length"]]
            out.append(f"| {name} | " + " | ".join(cells) + " |")
        out.append("")
    if not out:
        return []
    return [f"## {'chrF' if metric == 'chrf' else 'BLEU'} by source length, beam 5 (exploratory; mean ± std over "
            "seeds)", "", f"Source length in {results.get('length_unit', 'source tokens')}, the same buckets for every "
            "system; len: the mean hypothesis/reference length ratio of the bucket.", "", *out]


def _bucket_cell(row: dict[str, Any], metric: str) -> str:
    if not row["n"]:
        return "-"
    ratio = row.get("length_ratio_mean_std")
    return fmt_mean_std(row[f"{metric}_mean_std"]) + (f" · len {ratio[0]:.2f}" if ratio else "")


def write_report(study: Path, spec: dict[str, Any], results: dict[str, Any]) -> None:
    """``results.json`` (every number), ``report.md``, ``figures/``, ``hypotheses/`` (each system's and seed's
    output on every split and decoder, xz-compressed JSON, so every number can be recomputed) and ``tb/``."""
    from utils.io import atomic_write_text

    hypotheses = results.pop("_hypotheses", None)
    if hypotheses is not None:
        publish_hypotheses(study / "hypotheses", hypotheses, results["seeds"])
    figures = study / "figures"
    figures.mkdir(parents=True, exist_ok=True)
    for old in figures.glob("*.png"):  # the report is rewritten whole: no stale figure stays beside it
        old.unlink()
    from bench.study_files import hypotheses_checksums, with_sha256

    doc = {"spec": spec, **{k: v for k, v in results.items() if k not in ("checksums", "sha256")},
           "checksums": hypotheses_checksums(study)}  # what the report reads again: checked before use
    atomic_write_text(study / "results.json", json.dumps(with_sha256(doc), indent=1) + "\n")
    paths = _figures(results, figures)
    _hparams(study, spec, results)
    base = results["baseline"]
    n_seeds = len(results["seeds"])
    budget = f"{spec['steps']} optimizer steps" if spec.get("steps") else f"{spec['tokens']} target tokens"
    out = [f"# Study: {Path(spec['config']).name}, {len(spec['variants'])} variants x {n_seeds} seeds, {budget} each",
           "", f"Command: `{spec['command']}`", "",
           f"Baseline: **{base}**. Checkpoint scored: {spec['checkpoint']}.pt. Scores are sacreBLEU's chrF "
           "(primary) and BLEU (signatures below); tables give the mean ± standard deviation over the seeds, each "
           "seed's value, and the hypothesis/reference length ratio (len).", "", *provenance_lines(results)]
    if "decoders" in results or spec.get("splits"):
        out += [f"Scored on part of the study's sets or decoders: {', '.join(results['splits'])}; "
                f"{', '.join(results.get('decoders', DECODERS))}.", ""]
    lacking = [n for n, e in results["systems"].items() if not e.get("test_variant") and "attention" not in e]
    if lacking:
        out += [f"Attention statistics: not computed for {', '.join(lacking)} (no checkpoint when scored).", ""]
    out += _primary_lines(results)
    fam = results["primary"]["family"]
    drops = [f"{x1} → {xk}" for xk, x1 in fam.get("drops", {}).items()]
    scope = ", ".join(fam.get("splits") or results["splits"])
    if drops:
        scope += f" and the drops {', '.join(drops)} (computed from these columns)"
    elsewhere = fam.get("elsewhere") or {}
    there = (f"; {', '.join(elsewhere)}: in the family of the study their runs come from "
             f"({', '.join(dict.fromkeys(elsewhere.values()))})") if elsewhere else ""
    out += ["## chrF, beam 5 (each seed)", "", f"In the family above: {scope}, for its systems{there}; every other "
            "column and system is exploratory.", "",
            *_score_table(results, "chrF", "beam5"), "",
            "## BLEU, beam 5 (secondary, exploratory; each seed)", "", *_score_table(results, "BLEU", "beam5"), "",
            *(["## chrF, greedy (exploratory)", "", *_score_table(results, "chrF", "greedy"), ""]
              if "greedy" in results.get("decoders", DECODERS) else [])]
    out += _bucket_lines(results) + _bucket_lines(results, "bleu")
    out += length_control_lines(results)  # the declared secondary decoder, where scored
    out += _exploratory_lines(results)
    att = results.get("attention_tests", {})
    if att:
        out += ["## Attention (exploratory; validation sample; mean over heads and layers, then mean ± std over "
                "seeds)", "", "| system | encoder distance | encoder entropy | decoder distance | decoder entropy "
                "| cross distance | cross entropy | cross diagonal (±2) |", "|---|---|---|---|---|---|---|---|"]
        for name, entry in results["systems"].items():
            if "attention" not in entry:
                continue
            cells = []
            for kind, stat in ATTENTION_STATS:
                cell = fmt_mean_std(mean_std(_attention_runs(entry["attention"], kind, stat)))
                test = att.get(f"{name}|{kind}.{stat}")
                if test and test["p_value"] is not None:
                    cell += f" (p {test['p_value']:.3f}{', Holm ' + format(test['p_holm'], '.3f')}"
                    cell += f"){' *' if test['significant'] else ''}"
                cells.append(cell)
            out.append(f"| {name} | " + " | ".join(cells) + " |")
        out += ["", f"p: paired t-test over seeds against {base} (seeds are shared); Holm over the {len(att)} "
                "attention comparisons; \\* significant after it. Exploratory: not in the declared family, "
                "and a difference in attention is a description, not an explanation."
                + (f" No p for {', '.join(elsewhere)}: the study their runs come from tests them." if elsewhere
                   else ""), ""]
    out += ["## Figures", "", "Error bars and bands: 95 % t-interval of the mean over seeds; buckets of fewer than "
            f"{MIN_BUCKET} sentences are left out.", ""] + [f"![{p.stem}](figures/{p.name})" for p in paths]
    row = next(iter(results["systems"].values()))["splits"][results["splits"][0]]["beam5"]
    out += ["", f"sacreBLEU signatures: BLEU `{row['signature']}`, chrF `{row.get('chrf_signature', '-')}`.", ""]
    if hypotheses is not None or (study / "hypotheses").is_dir():
        out += ["Hypotheses: `hypotheses/<system>.seed<k>.json.xz` ({split: {decoder: [lines]}}); "
                "`python bench/study_report.py <this folder>` recomputes every number from them.", ""]
    atomic_write_text(study / "report.md", "\n".join(out))


MIN_BUCKET = 30


def publish_hypotheses(folder: Path, hypotheses: dict[str, Any], seeds: list[int]) -> None:
    import lzma

    from utils.io import atomic_write_bytes

    folder.mkdir(parents=True, exist_ok=True)
    for name, per_split in hypotheses.items():
        for i, seed in enumerate(seeds):
            doc = {split: {dec: hyps[i] for dec, hyps in per_dec.items()} for split, per_dec in per_split.items()}
            data = lzma.compress(json.dumps(doc, ensure_ascii=False).encode("utf-8"), preset=9)
            atomic_write_bytes(folder / f"{_slug(name)}.seed{seed}.json.xz", data)


def read_hypotheses(folder: Path, systems: list[str], seeds: list[int], checksums: dict[str, str] | None = None,
                    splits: list[str] | None = None, decoders: list[str] | None = None,
                    references: dict[str, int] | None = None) -> dict[str, Any]:
    """``publish_hypotheses``'s files back as ``[system][split][decoder] = [seed hypotheses]``, each checked before
    use against the ``checksums`` its study's results.json records (None: none recorded), for the ``splits`` and
    ``decoders`` asked (default: the first file's), as many lines as seed 1's and at most the split's number of
    ``references``; StudyFileError, one line naming the file, for one that changed, is damaged, or is short."""
    from bench.study_files import StudyFileError, read_hypotheses_file

    out: dict[str, Any] = {}
    for name in systems:
        paths = [folder / f"{_slug(name)}.seed{s}.json.xz" for s in seeds]
        docs = [read_hypotheses_file(p, checksums) for p in paths]
        want = {split: list(decoders or docs[0].get(split, {})) for split in splits or docs[0]}
        for path, doc in zip(paths, docs, strict=True):
            wrong = [f"{split}/{dec}" + ("" if dec in doc.get(split, {}) else " (none)")
                     for split, decs in want.items() for dec in decs
                     if dec not in doc.get(split, {}) or dec not in docs[0].get(split, {})
                     or len(doc[split][dec]) != len(docs[0][split][dec])
                     or len(doc[split][dec]) > (references or {}).get(split, len(doc[split][dec]))]
            if wrong:
                raise StudyFileError(f"{path}: not the lines of every sentence for {', '.join(wrong)} (as many as "
                                     f"{paths[0].name}'s, at most the references'): truncated or edited; restore "
                                     "it as the study published it, or score the study again")
        out[name] = {split: {dec: [d[split][dec] for d in docs] for dec in decs} for split, decs in want.items()}
    return out


def _slug(name: str) -> str:
    import re

    return re.sub(r"[^A-Za-z0-9_.+=-]+", "_", name)


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


MARKERS = "osD^vP*Xh<>pd8H"


def _style(i: int) -> dict[str, Any]:
    """A distinct colour and marker for system ``i`` (20 colours x 15 markers: no two systems alike)."""
    import matplotlib

    return {"color": matplotlib.colormaps["tab20"](i % 20), "marker": MARKERS[i % len(MARKERS)]}


def _ci(values: list[float]) -> tuple[float, float]:
    """Mean and 95 % t-interval half-width over seeds: the one error-bar convention of every figure."""
    m, sd = mean_std(values)
    return m, half_width(sd, len(values))


def _figures(results: dict[str, Any], out: Path) -> list[Path]:
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
        paths.append(_contrasts_figure(results, names, caption, out / "primary_contrasts.png"))
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
                        capsize=2, label=name, linewidth=1, markersize=5, **_style(k))
        ax.set_xticks(range(len(keep)), [f"{rows0[i]['bucket']}\nn={rows0[i]['n']}" for i in keep])
        ax.set(xlabel=f"source length ({results.get('length_unit', 'source tokens')})", ylabel="chrF (beam 5)",
               title=f"{split}: {caption}")
        ax.legend(fontsize=7, ncol=2)
        paths.append(_save(fig, out / f"chrf_by_length_{split}.png"))
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
                            label=name, linewidth=1, markersize=5, **_style(k))
            ax.set_xscale("log", base=2)
            ax.set_xticks([f for f, _ in members], [f"x{f}" for f, _ in members])
            ax.set(xlabel="pairs joined per sentence (length x k)", ylabel="chrF (beam 5)", title=f"{base}: {caption}")
        axes[0][0].legend(fontsize=7, ncol=2)
        paths.append(_save(fig, out / "chrf_by_concatenation.png"))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for k, name in enumerate(names):
        curves = [c for c in results["systems"][name].get("valid_bleu", []) if c]
        if not curves:
            continue
        steps = [s for s, _ in curves[0]]
        stats = [_ci([c[i][1] for c in curves if i < len(c)]) for i in range(len(steps))]
        style = _style(k)
        ax.plot(steps, [m for m, _ in stats], label=name, linewidth=1, markersize=4, **style)
        if len(curves) > 1:
            ax.fill_between(steps, [m - h for m, h in stats], [m + h for m, h in stats], color=style["color"],
                            alpha=0.15, linewidth=0)
    ax.set(xlabel="optimizer step", ylabel="validation BLEU (greedy)",
           title=f"validation: {caption.replace('bars', 'band')}")
    ax.legend(fontsize=7, ncol=2)
    paths.append(_save(fig, out / "valid_bleu.png"))
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
                            linewidth=1, markersize=5, **_style(k))
                ax.set(xlabel="layer", ylabel=stat, title=f"{kind} attention: {stat}")
                ax.set_xticks(list(xs))
        axes[0].legend(fontsize=6, ncol=2)
        fig.suptitle(f"mean over heads; {caption}", fontsize=9)
        paths.append(_save(fig, out / f"attention_{kind}.png"))
    return paths


def _contrasts_figure(results: dict[str, Any], names: list[str], caption: str, path: Path) -> Path:
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
            row, style = systems.index(t["system"]), _style(names.index(t["system"]))
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
    return _save(fig, path)


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
            metrics = {f"test/{split}/{m}_{dec}": entry["splits"][split][dec][m][i]
                       for split in results["splits"] for dec in results.get("decoders", DECODERS)
                       for m in ("chrf", "bleu")}
            writer = SummaryWriter(log_dir=str(study / "tb" / f"{name}_seed{seed}"))
            writer.add_hparams(hparams, metrics, run_name=".")
            writer.close()


def reanalyse(folder: Path, samples: int | None = None) -> dict[str, Any]:
    """Recompute a published study's analysis from its folder alone: ``results.json`` (spec, per-seed scores,
    attention, validation curves) and, when published, ``hypotheses/`` with the references read from the
    study's corpus. Rewrites results.json, report.md and the figures there."""
    from bench.study_files import read_results
    from bench.study_lock import check_free

    check_free(folder)  # a study running there rewrites these files
    old = read_results(folder)
    spec = old["spec"]
    splits, baseline, seeds = old["splits"], old["baseline"], old["seeds"]
    decoders = old.get("decoders", list(DECODERS))
    systems = {name: {k: v for k, v in entry.items() if k in ("variant", "test_variant", "attention", "valid_bleu")}
               | {"splits": {s: {d: {k: entry["splits"][s][d][k] for k in
                                     ("bleu", "chrf", "signature", "chrf_signature", "by_source_length")
                                     if k in entry["splits"][s][d]} for d in decoders} for s in splits}}
               for name, entry in old["systems"].items()}
    hypotheses = references = lengths = None
    cfg = None
    if (folder / "hypotheses").is_dir():
        from data.sources import load_corpus
        from utils.config import load_config

        cfg = load_config(ROOT / spec["config"], spec.get("overrides", []))
        corpus = load_corpus(cfg.data)
        checksums = old.get("checksums")
        references = {s: list(corpus[s]["tgt"]) for s in splits}
        hypotheses = read_hypotheses(folder / "hypotheses", list(systems), seeds, checksums, splits, decoders,
                                     {s: len(refs) for s, refs in references.items()})
        if checksums is None:
            print(f"{folder}: results.json records no checksums (written before they were): its hypotheses were read "
                  "as they are; the results.json written now records them", flush=True)
        lengths = old.get("source_lengths")
    results = analyse(systems, hypotheses, references or {}, lengths, splits, baseline, seeds,
                      samples or old.get("bootstrap_samples", 10000), cfg.tokenizer.lowercase if cfg else False,
                      cfg.eval.length_buckets if cfg else [], cfg.data.max_train_len if cfg else None,
                      spec.get("family"), decoders)
    for key in ("length_unit", "source_lengths", "provenance"):
        if key in old:
            results[key] = old[key]
    if "length_control" in old:  # the declared secondary decoder (bench/study_decoders.py)
        results["length_control"] = reanalyse_length(old, folder, references, samples or old.get(
            "bootstrap_samples", 10000), cfg.tokenizer.lowercase if cfg else False, read_hypotheses)
    write_report(folder, spec, results)
    return results


def build_parser() -> argparse.ArgumentParser:
    """The command line of bench/study_report.py."""
    parser = argparse.ArgumentParser(description="Recompute a published study's report from its folder alone "
                                                 "(results.json, and hypotheses/ when published).")
    parser.add_argument("folder", type=Path, help="e.g. bench/studies/all-encodings or runs/study_<name>")
    parser.add_argument("--bootstrap", type=int, help="bootstrap samples (default: the study's)")
    return parser


def main() -> int:
    parser = build_parser()
    args = parser.parse_args()
    if not (args.folder / "results.json").is_file():
        parser.error(f"{args.folder}: no results.json")
    results = reanalyse(args.folder, args.bootstrap)
    pr = results["primary"]
    print(f"{args.folder}: {pr['resolved']} of {pr['size']} primary tests resolved; report in "
          f"{args.folder / 'report.md'}")
    return 0


if __name__ == "__main__":
    from utils.cli import run_main

    run_main(main)
