"""bench/study.py's second half: gather every run's scores, compare with the baseline, write the report.

``aggregate`` reads the eval JSON and hypotheses test.py wrote, the attention statistics and the
validation curves, and computes means, standard deviations and paired bootstrap tests. ``write_report``
writes ``results.json``, ``report.md``, ``figures/*.png`` and TensorBoard HParams summaries.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from utils.study.files import Ledger

from utils.cli import ROOT
from utils.study.cost import cost_lines
from utils.study.decoders import DECODERS
from utils.study.figures import ATTENTION_STATS, MIN_BUCKET, attention_runs, write_figures, write_hparams
from utils.study.files import slug
from utils.study.length_control import length_control_lines, reanalyse_length
from utils.study.sections import (
    bucket_lines,
    exploratory_lines,
    primary_lines,
    provenance_lines,
    score_table,
)
from utils.study.stats import fmt_mean_std, mean_std


def aggregate(jobs: list, runs: dict[str, Path], corpus: Any, splits: list[str], baseline: str, checkpoint: str,
              samples: int, attention_sentences: int, max_sentences: int | None = None,
              family: dict[str, Any] | None = None, decoders: list[str] | None = None,
              steps: dict[str, int] | None = None, ledger: Ledger | None = None) -> dict[str, Any]:
    """Every number of the study: per system (variant or test variant), split and decoder each seed's scores,
    length ratio and buckets; the declared family of primary tests and the exploratory ones
    (utils/study/analysis.py); ``corpus`` holds the test splits (data.sources.load_corpus). The hypotheses
    are returned under ``"_hypotheses"`` for ``write_report`` to publish. ``decoders``: those of ``DECODERS``
    scored (default all). A system missing the attention statistics of a seed (its checkpoint was gone at
    scoring), or holding ones of another training step than ``steps`` gives its run, has none in the report.
    Every score file, hypotheses file and attention statistics file is checked before use
    (``utils.study.runs.read_scores``, ``read_attention``; ``ledger``: the checksums of files that record none):
    StudyFileError, one line naming the file, for one damaged or changed since it was written."""
    from utils.config import load_config
    from utils.run.layout import RunDir
    from utils.study.runs import eval_file, file_tag, read_attention, read_scores, valid_curve

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
    results["compute"] = run_compute(jobs, runs, checkpoint, steps)
    results["_hypotheses"] = hypotheses
    return results


def run_provenance(jobs: list, runs: dict[str, Path]) -> dict[str, Any]:
    """Each run's system, seed, the commits that trained it (its ``provenance.json``; none recorded: an empty list)
    and the hash of its config (utils.study.provenance), for the report to say where the runs came from."""
    from utils.config import load_config
    from utils.run.layout import RunDir
    from utils.study.machines import recorded_cpu, recorded_packages
    from utils.study.provenance import config_sha256, read

    out = {}
    for job in jobs:
        run = runs[job.key]
        out[job.key] = {"system": job.variant.label, "seed": job.seed,
                        "trained_by": (read(run) or {}).get("trained_by", []),
                        "config_sha256": config_sha256(load_config(RunDir(run).config).to_dict())}
        if cpu := recorded_cpu(job.root):
            out[job.key]["cpu"] = cpu
        if packages := recorded_packages(job.root, run):
            out[job.key]["packages"] = packages
    return {"runs": out}


def run_compute(jobs: list, runs: dict[str, Path], checkpoint: str, steps: dict[str, int] | None) -> dict[str, Any]:
    """Each run's training and decoding time (utils.study.cost.run_cost) and the study's totals."""
    from utils.study.cost import run_cost, study_cost

    per_run = {job.key: run_cost(runs[job.key], checkpoint, (steps or {}).get(job.key)) for job in jobs}
    return {"runs": per_run, "total": study_cost(per_run)}


def analyse(systems: dict[str, dict[str, Any]], hypotheses: dict[str, Any] | None, references: dict[str, list[str]],
            lengths: dict[str, list[int]] | None, splits: list[str], baseline: str, seeds: list[int], samples: int,
            lowercase: bool, edges: list[int], train_len: int | None, family: dict[str, Any] | None,
            decoders: list[str] | None = None, secondary: bool = True) -> dict[str, Any]:
    """Scores, buckets, primary and exploratory tests from the hypotheses (or, without them, from the per-seed
    scores already in ``systems``: the seed-level tests only), for ``decoders`` (default all); without
    ``secondary``, the primary tests alone (no exploratory or attention tests: empty)."""
    from utils.study.analysis import Analysis, Family, attention_tests, exploratory, metric_for, primary
    from utils.study.stats import brevity_penalty, chrf_precision_recall, corpus_score, sentence_stats

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
                        buckets[split] = bucket_index(lengths[split][: len(refs)], edges)
                        row["by_source_length"] = length_buckets(per, buckets[split], metrics)
                row["bleu_mean_std"], row["chrf_mean_std"] = mean_std(row["bleu"]), mean_std(row["chrf"])
                scores.setdefault(name, {}).setdefault(split, {})[decoder] = {"chrF": row["chrf"], "BLEU": row["bleu"]}
    analysis = Analysis(scores, stats, baseline, samples, lowercase, buckets)
    fam = Family(**(family or {}))
    names = list(systems)
    with_attention = [n for n in names if "attention" in systems[n] and n not in fam.elsewhere]  # tested there
    attention = {f"{n}|{kind}.{stat}": attention_runs(systems[n]["attention"], kind, stat)
                 for n in with_attention for kind, stat in ATTENTION_STATS}
    declared = primary(analysis, fam, names, splits)
    decoders = list(decoders or DECODERS)
    scope = {"decoders": decoders} if decoders != list(DECODERS) else {}  # recorded where not every decoder ran
    return {"baseline": baseline, "seeds": seeds, "splits": splits, **scope, "systems": systems,
            "bootstrap_samples": samples,
            "alpha": fam.alpha, "primary": declared,
            "exploratory": exploratory(analysis, names, splits, fam, train_len,
                                       {n: e["variant"] for n, e in systems.items() if e.get("test_variant")},
                                       declared["tests"], decoders) if secondary else [],
            "attention_tests": attention_tests(attention, baseline, fam.alpha)
            if secondary and baseline in with_attention else {}}


def bucket_index(lengths: list[int], edges: list[int]) -> dict[str, list[int]]:
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


def length_buckets(per: dict[str, list[np.ndarray]], index: dict[str, list[int]],
             metrics: dict[str, Any]) -> list[dict[str, Any]]:
    """BLEU and chrF by source-length bucket, each seed's and their mean ± std (None for an empty bucket), from
    each seed's sentence statistics ``per[metric][k]``: a bucket's corpus score is that of its summed statistics,
    what ``utils.translation.scoring.scores_by_length`` computes from the sentences (``test.py``'s table)."""
    from utils.study.stats import corpus_score

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
    from utils.study.files import hypotheses_checksums, with_sha256

    doc = {"spec": spec, **{k: v for k, v in results.items() if k not in ("checksums", "sha256")},
           "checksums": hypotheses_checksums(study)}  # what the report reads again: checked before use
    atomic_write_text(study / "results.json", json.dumps(with_sha256(doc), indent=1) + "\n")
    paths = write_figures(results, figures)
    write_hparams(study, spec, results)
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
    out += primary_lines(results)
    out += cost_lines(results)
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
            *score_table(results, "chrF", "beam5"), "",
            "## BLEU, beam 5 (secondary, exploratory; each seed)", "", *score_table(results, "BLEU", "beam5"), "",
            *(["## chrF, greedy (exploratory)", "", *score_table(results, "chrF", "greedy"), ""]
              if "greedy" in results.get("decoders", DECODERS) else [])]
    out += bucket_lines(results) + bucket_lines(results, "bleu")
    out += length_control_lines(results)  # the declared secondary decoder, where scored
    out += exploratory_lines(results)
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
                cell = fmt_mean_std(mean_std(attention_runs(entry["attention"], kind, stat)))
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


def publish_hypotheses(folder: Path, hypotheses: dict[str, Any], seeds: list[int]) -> None:
    import lzma

    from utils.io import atomic_write_bytes

    folder.mkdir(parents=True, exist_ok=True)
    for name, per_split in hypotheses.items():
        for i, seed in enumerate(seeds):
            doc = {split: {dec: hyps[i] for dec, hyps in per_dec.items()} for split, per_dec in per_split.items()}
            data = lzma.compress(json.dumps(doc, ensure_ascii=False).encode("utf-8"), preset=9)
            atomic_write_bytes(folder / f"{slug(name, keep='=')}.seed{seed}.json.xz", data)


def read_hypotheses(folder: Path, systems: list[str], seeds: list[int], checksums: dict[str, str] | None = None,
                    splits: list[str] | None = None, decoders: list[str] | None = None,
                    references: dict[str, int] | None = None) -> dict[str, Any]:
    """``publish_hypotheses``'s files back as ``[system][split][decoder] = [seed hypotheses]``, each checked before
    use against the ``checksums`` its study's results.json records (None: none recorded), for the ``splits`` and
    ``decoders`` asked (default: the first file's), as many lines as seed 1's and at most the split's number of
    ``references``; StudyFileError, one line naming the file, for one that changed, is damaged, or is short."""
    from utils.study.files import StudyFileError, read_hypotheses_file

    out: dict[str, Any] = {}
    for name in systems:
        paths = [folder / f"{slug(name, keep='=')}.seed{s}.json.xz" for s in seeds]
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


def reanalyse(folder: Path, samples: int | None = None, primary_only: bool = False) -> dict[str, Any]:
    """Recompute a published study's analysis from its folder alone: ``results.json`` (spec, per-seed scores,
    attention, validation curves) and, when published, ``hypotheses/`` with the references read from the
    study's corpus. Rewrites results.json, report.md and the figures there. ``primary_only``: only what a declared
    family reads (its splits, their drops' baselines, its decoder) and only its primary tests (no exploratory or
    attention tests), returned and not written: they are the study's, at a fraction of the time."""
    from utils.study.files import read_results
    from utils.study.lock import check_free

    check_free(folder)  # a study running there rewrites these files
    old = read_results(folder)
    spec = old["spec"]
    splits, baseline, seeds = old["splits"], old["baseline"], old["seeds"]
    decoders = old.get("decoders", list(DECODERS))
    family = spec.get("family") or {}
    if primary_only and family.get("splits"):
        wanted = {*family["splits"], *(family.get("drops") or {}).values()}
        splits, decoders = [s for s in splits if s in wanted], [family.get("decoder", "beam5")]
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

        # the study's keys and its budget, as every run had them (a cool-down needs the step budget to end at)
        budget = [f"train.{key}={spec[field]}" for key, field in (("max_steps", "steps"),
                                                                   ("max_target_tokens", "tokens")) if spec.get(field)]
        cfg = load_config(ROOT / spec["config"], [*spec.get("overrides", []), *budget])
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
                      spec.get("family"), decoders, secondary=not primary_only)
    for key in ("length_unit", "source_lengths", "provenance", "compute"):
        if key in old:
            results[key] = old[key]
    if primary_only:
        return results
    if "length_control" in old:  # the declared secondary decoder (utils/study/decoders.py)
        results["length_control"] = reanalyse_length(old, folder, references, samples or old.get(
            "bootstrap_samples", 10000), cfg.tokenizer.lowercase if cfg else False, read_hypotheses)
    write_report(folder, spec, results)
    return results


@contextmanager
def scratch_copy(folder: Path, results: dict[str, Any] | None = None) -> Iterator[Path]:
    """A temporary copy of a study's folder as ``reanalyse`` reads it: its ``results.json`` (or ``results`` in its
    place, written with its own checksum) and ``hypotheses/``; the folder itself is left as it is."""
    import shutil
    import tempfile

    from utils.io import with_sha256

    with tempfile.TemporaryDirectory(prefix="study-copy-") as tmp:
        copy = Path(tmp) / folder.resolve().name
        copy.mkdir()
        if results is None:
            shutil.copy(folder / "results.json", copy / "results.json")
        else:
            (copy / "results.json").write_text(json.dumps(with_sha256({k: v for k, v in results.items()
                                                                       if k != "sha256"})))
        if (folder / "hypotheses").is_dir():
            shutil.copytree(folder / "hypotheses", copy / "hypotheses")
        yield copy


def check_published(folder: Path) -> list[str]:
    """Recompute a published study in a temporary copy of its ``results.json`` and ``hypotheses/`` (the folder is
    left as it is) and compare: the differences, one line each (none: it recomputes exactly). Compared: report.md
    byte for byte, and each primary test's system and label, seed-test p and Holm p, and bootstrap p (to 1e-9
    relative: the float sums may end in another last bit)."""
    import math

    from utils.study.files import read_results

    before = read_results(folder)
    with scratch_copy(folder) as copy:
        after = reanalyse(copy)
        report = (copy / "report.md").read_text(encoding="utf-8")
    out = []
    published = folder / "report.md"
    if not published.is_file() or published.read_text(encoding="utf-8") != report:
        out.append("report.md differs from the recomputed one")
    old, new = before["primary"]["tests"], after["primary"]["tests"]
    if [(t["system"], t["label"]) for t in old] != [(t["system"], t["label"]) for t in new]:
        return [*out, "the primary tests are not the published ones"]

    def close(a: float | None, b: float | None) -> bool:
        return (a is None) == (b is None) and (a is None or math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0))

    for o, n in zip(old, new, strict=True):
        pairs = [("seed-test p", o["seed_test"]["p_value"], n["seed_test"]["p_value"]),
                 ("Holm p", o["seed_test"]["p_holm"], n["seed_test"]["p_holm"]),
                 ("bootstrap p", (o.get("bootstrap") or {}).get("p_value"), (n.get("bootstrap") or {}).get("p_value"))]
        out += [f"{o['system']} {o['label']}: {what} {a} published, {b} recomputed" for what, a, b in pairs
                if not close(a, b)]
    return out


def published_folders(studies: Path) -> list[Path]:
    """Every published study folder under ``studies`` (``bench/studies``): each ``<name>/`` holding a ``results.json``,
    and each look of a group-sequential study, ``<name>/looks/<look>/``, holding one."""
    return sorted(p.parent for pattern in ("*/results.json", "*/looks/*/results.json") for p in studies.glob(pattern))


def build_parser() -> argparse.ArgumentParser:
    """The command line of bench/study_report.py."""
    parser = argparse.ArgumentParser(description="Recompute a published study's report from its folder alone "
                                                 "(results.json, and hypotheses/ when published).")
    parser.add_argument("folder", type=Path, nargs="*", help="e.g. bench/studies/all-encodings or runs/study_<name> "
                        "(with --check: several, or none for every study published under bench/studies, a "
                        "sequential study's looks too)")
    parser.add_argument("--bootstrap", type=int, help="bootstrap samples (default: the study's)")
    parser.add_argument("--check", action="store_true",
                        help="recompute each folder in a temporary copy and compare with what it publishes: one line "
                             "per study, exit status 1 if any differs (the folders are not written)")
    return parser


def main() -> int:
    parser = build_parser()
    args = parser.parse_args()
    if args.check and not args.folder:
        args.folder = published_folders(ROOT / "bench" / "studies")
    if not args.folder:
        parser.error("the study folder is missing")
    if args.bootstrap is not None and not 1 <= args.bootstrap <= 10**7:
        parser.error(f"--bootstrap must be in 1..10000000 (resamples), got {args.bootstrap}")
    for folder in args.folder:
        if not (folder / "results.json").is_file():
            parser.error(f"{folder}: no results.json")
    if args.check:
        if args.bootstrap is not None:
            parser.error("--check recomputes with the study's own bootstrap samples: leave out --bootstrap")
        failed = 0
        for folder in args.folder:
            differences = check_published(folder)
            failed += bool(differences)
            print(f"{folder}: " + ("recomputes exactly (report.md and the primary tests)" if not differences else
                                   f"{len(differences)} differences"), flush=True)
            for line in differences:
                print(f"  {line}")
        return 1 if failed else 0
    if len(args.folder) > 1:
        parser.error("one folder at a time (several only with --check)")
    args.folder = args.folder[0]
    results = reanalyse(args.folder, args.bootstrap)
    pr = results["primary"]
    print(f"{args.folder}: {pr['resolved']} of {pr['size']} primary tests resolved; report in "
          f"{args.folder / 'report.md'}")
    return 0

