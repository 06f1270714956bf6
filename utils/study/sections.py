"""The text sections of a study's report.md (bench/study_report.py writes them): score cells, the design and its
boundaries, the length rule, provenance, the primary family's table, per-seed score tables, exploratory tests and the
tables by source length."""

from __future__ import annotations

from collections import Counter
from typing import Any

from utils.study.stats import fmt_mean_std


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


def result_row(t: dict[str, Any], paired: str | None = None, length: str | None = None) -> str:
    """One row of a table of tests: system, quantity, Δ per seed, Δ mean, the seed test's p and Holm p, ``paired``
    (the paired t p, where the table has that column), the bootstrap's 95 % interval, p and Holm p, ``length`` (the
    len cell, where it has one) and whether the difference is resolved."""
    b = t["bootstrap"]
    cells = [t["system"], t["label"], ", ".join(f"{d:+.2f}" for d in t["per_seed_delta"]), f"{t['delta']:+.2f}",
             _p(t["seed_test"]["p_value"]), _p(t["seed_test"]["p_holm"]), *([paired] if paired is not None else []),
             f"[{b['ci95'][0]:+.2f}, {b['ci95'][1]:+.2f}]" if b else "-", _p(b["p_value"]) if b else "-",
             _p(b.get("p_holm")) if b else "-", *([length] if length is not None else []),
             "**yes**" if t["resolved"] else "no"]
    return "| " + " | ".join(cells) + " |"


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
    unplanned = "" if d["planned"] else (" (not a planned look: the planned looks below it are counted as taken; "
                                         "the looks after it will not count it, so their boundaries spend as if it "
                                         "had not been taken)")
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
    return [line, "", *cpu_lines(runs), *package_lines(runs)]


def cpu_lines(runs: dict[str, Any]) -> list[str]:
    """Which CPUs trained the kept runs (their ``cpu.txt``), and each seed whose systems were trained on more than
    one; nothing where no run recorded its CPU. A run's "group" (an arm, say), where given, tells its seeds apart from
    another group's of the same number."""
    cpus = {key: run["cpu"] for key, run in runs.items() if run.get("cpu")}
    if not cpus:
        return []
    counts = Counter(cpus.values())
    by_seed: dict[tuple[str, int], set[str]] = {}
    for key, cpu in cpus.items():
        by_seed.setdefault((runs[key].get("group", ""), runs[key]["seed"]), set()).add(cpu)
    line = "CPUs that trained the runs (each kept run's cpu.txt): " + "; ".join(
        f"{cpu} ({n} run{'s' if n > 1 else ''})" for cpu, n in sorted(counts.items()))
    if unknown := len(runs) - len(cpus):
        line += f"; not recorded for {unknown} run{'s' if unknown > 1 else ''}"
    split = sorted(key for key, found in by_seed.items() if len(found) > 1)
    many = len(split) > 1
    named = ", ".join(f"{seed} ({group})" if group else str(seed) for group, seed in split)
    line += (f". **{'Seeds' if many else 'Seed'} {named}: {'their' if many else 'its'} systems "
             "were trained on more than one CPU** (a replaced machine), so the CPUs' last-bit differences fall inside "
             f"the contrasts of {'those seeds' if many else 'that seed'}." if split
             else ". Every seed's systems were trained on one CPU.")
    return [line, ""]


def package_lines(runs: dict[str, Any]) -> list[str]:
    """Whether the kept runs' environments had the same package versions (their ``packages.txt`` or
    ``environment.json``), naming each package whose version differs and how many runs had each; nothing where no run
    recorded them."""
    recorded = [run["packages"] for run in runs.values() if run.get("packages")]
    if not recorded:
        return []
    names = sorted(set().union(*recorded))
    differ = {name: Counter(p.get(name, "not installed") for p in recorded) for name in names
              if len({p.get(name) for p in recorded}) > 1}
    runs_word = f"{len(recorded)} run{'s' if len(recorded) > 1 else ''}"
    line = "Packages of the environments that trained the runs (each kept run's packages.txt or environment.json): "
    if differ:
        versions = {name: ", ".join(f"{v} ({n} run{'s' if n > 1 else ''})" for v, n in sorted(c.items()))
                    for name, c in differ.items()}
        line += (f"{len(names) - len(differ)} of {len(names)} at one version in the {runs_word} that record them; "
                 "**these differ**: " + "; ".join(f"{name} {v}" for name, v in versions.items()))
    else:
        torch = recorded[0].get("torch", "not installed")
        line += f"all {len(names)} at one version in the {runs_word} that record them (torch {torch})"
    if unknown := len(runs) - len(recorded):
        line += f"; not recorded for {unknown} run{'s' if unknown > 1 else ''}"
    return [line + ".", ""]


def primary_lines(results: dict[str, Any]) -> list[str]:
    from utils.study.analysis import Family

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
        f"{pr['anova'][0]['df'] if pr['anova'] else '-'}{_decodings(fam)}. Test-set test: a paired bootstrap of the "
        "same quantity "
        f"({results['bootstrap_samples']} resamples of the test units, every seed's statistics kept apart; "
        "two-sided: the resampled differences shifted to mean 0 against the observed one; sacreBLEU's own rule, "
        "a half to a third of it, is `p_value_sacrebleu` in results.json). Resolved: both reject after Holm and "
        "agree in sign. The paired t-test over seeds is shown beside them as a check, with its Holm p over the "
        "same family in brackets. A drop is score(x1) - "
        "score(xK): a positive Δ on a drop means the system loses more with length than what it is compared "
        "with. len: the hypothesis/reference length ratio on the quantity's split (a drop's xK split), system / "
        "baseline.",
        ""]
    if not pr["bootstrap_available"]:
        out += ["The hypotheses of these runs were not published, so the test-set bootstrap cannot be computed: "
                "only the seed-level test is shown, and **nothing is called resolved** on it alone. Nor can the "
                "length ratio (len: - / -): a higher chrF bought with longer output cannot be ruled out here.", ""]
    out += ["| system | quantity | Δ per seed | Δ mean | seed test p | p Holm | paired t p (Holm) | bootstrap 95 % CI "
            "| bootstrap p | p Holm | len | resolved |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for t in pr["tests"]:
        out.append(result_row(t, paired_cell(t), _len(results, t)))
    out += ["", f"**{pr['resolved']} of {pr['size']} resolved.**{paired_check(pr)}", "", *boundary_lines(results),
            *length_lines(results)]
    if pw["power_at_smallest_effect"] is not None:
        sequential = (pr.get("design") or {}).get("kind") == "group-sequential"
        out += [("A fixed design's power at this look's seeds (not the group-sequential design's, planned before the "
                 "runs and stated with its boundaries above): " if sequential else "")
                + f"Power (noncentral t, from the pooled residual standard deviation {pw['pooled_residual_sd']:.2f} "
                f"{fam['metric']} over {pw['seeds']} seeds and {pw['systems']} systems, df {pw['df']}, at "
                f"{pw['level_note']} = {pw['level']:.4f}): a true difference of {fam['smallest_effect']} "
                f"{fam['metric']} (the smallest effect of interest, fixed in advance) is detected with probability "
                f"{pw['power_at_smallest_effect']:.2f}; 80 % power needs a true difference of "
                f"{pw['detectable_at_80']:.2f}, or {pw['seeds_for_80_at_smallest_effect'] or '> 1000'} seeds per "
                f"system for {fam['smallest_effect']}. The seed blocks explain "
                + ", ".join(f"{q['seed_share']:.0%} ({q['label']})" for q in pw["per_quantity"])
                + " of the within-system variance.", ""]
    return out


def paired_cell(test: dict[str, Any]) -> str:
    """A test's paired t p, and in brackets its Holm p over the family where the results record it."""
    pt = test.get("paired_t", {})
    return _p(pt.get("p_value")) + (f" ({_p(pt['p_holm'])})" if "p_holm" in pt else "")


def paired_check(pr: dict[str, Any]) -> str:
    """The paired t-test check of a family's resolved tests, in words: which of them its Holm-adjusted p (over the
    same family) does not confirm at the family's level, or that it confirms them all ("" where nothing is resolved
    or the results predate the check's Holm p)."""
    done = [t for t in pr["tests"] if t["resolved"]]
    if not done or any("p_holm" not in t.get("paired_t", {}) for t in pr["tests"]):
        return ""
    alpha = pr["family"]["alpha"]
    failing = [f"{t['system']}: {t['label']}" for t in done if t["paired_t"]["p_holm"] >= alpha]
    if not failing:
        return f" Each also passes the check: its paired t-test after Holm over the family, at α = {alpha}."
    return (f" Not confirmed by the check (the paired t-test after Holm over the family, at α = {alpha}): "
            f"{'; '.join(failing)}.")


def _decodings(fam: dict[str, Any]) -> str:
    """The seed test of a family's test-time decodings, in words ("" for a family that declares none)."""
    decodings: dict[str, str] = fam.get("decodings") or {}
    if not decodings:
        return ""
    return (f" (over the trained systems: {', '.join(decodings)} decode the models of "
            f"{', '.join(dict.fromkeys(decodings.values()))} and share their noise, so each is tested by the "
            "contrast in the same ANOVA with it in the place of the system it decodes)")


def score_table(results: dict[str, Any], metric: str, decoder: str) -> list[str]:
    key = metric.lower()
    out = ["| system | " + " | ".join(results["splits"]) + " |", "|---|" + "---|" * len(results["splits"])]
    for name, entry in results["systems"].items():
        out.append(f"| {name} | " + " | ".join(_cell(entry["splits"][s][decoder], key) for s in results["splits"])
                   + " |")
    return out


def exploratory_lines(results: dict[str, Any]) -> list[str]:
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


def bucket_lines(results: dict[str, Any], metric: str = "chrf") -> list[str]:
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
