"""The Studies pages of the site: one results page per published study, and the frozen pre-registration.

- ``studies/<name>.md`` for every ``bench/studies/<name>/results.json`` (and
  ``studies/extrapolation-sequential-look-K.md`` for each look of the second study with its ``about.json``, and
  ``studies/extrapolation-sequential-natural.md`` for its natural-length arm's look, with the two arms side by
  side): a
  header (question, command, machine, date, commits), the primary family and the per-seed chrF table rendered from
  ``results.json``, the reading of the results, the figures (served as ``studies/<name>/figures/*.png`` by
  ``docs/hooks.py``), the report's other tables and where the raw outputs are. The facts that ``results.json`` does
  not record (machine, date, commits, the reading) come from the study's hand-kept ``about.json``.
- ``studies/preregistration-extrapolation.md``: the pre-registration exactly as the commit that fixed it holds it
  (read from the git history), then the later amendments and notes, kept in
  ``bench/studies/extrapolation/amendments.md``.
- ``studies/preregistration-extrapolation-sequential.md``: the second study's pre-registration, a file of its own
  that is never edited (``bench/studies/extrapolation-sequential/preregistration.md``), then what was decided
  after it (``amendments.md`` beside it, when there is one), then where the study stands: its noise pilot's
  endpoint (``bench/studies/noise-pilot/ratio.md``), the design the rule gave (``design.json``) and each look
  reached (``looks/look-K/stop.txt``), as they are committed.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
STUDIES = ROOT / "bench" / "studies"

#: The pre-registration: its heading in README.md and the commit that first fixed it.
PREREGISTRATION_HEADING = ("### Pre-registration: does an attention-level encoding extrapolate in translation? "
                           "(fixed 2026-11-25, before any run)")
PREREGISTRATION_COMMIT = "f29c768d66fdd9410fc9410065baca000bdf6cc5"
PREREGISTRATION_DATE = "2026-11-25"
FROZEN_BEGIN, FROZEN_END = "<!-- frozen text: begin -->", "<!-- frozen text: end -->"
#: The second study's pre-registration: its folder and the commit that added its file.
SEQUENTIAL = "extrapolation-sequential"
SEQUENTIAL_COMMIT = "62ede59f02dec80b759d8e0c5ae8a8c20de7e8bf"
SEQUENTIAL_DATE = "2026-11-29"
#: The second study's natural-length arm: its one look, ``looks/natural``, published as ``SEQUENTIAL-natural``.
NATURAL = "natural"

DECODER_NAMES = {"beam5": "beam 5", "greedy": "greedy"}


def published() -> list[str]:
    """The published studies, in name order: every folder of ``bench/studies`` holding a ``results.json``, and each
    look of the second study that holds one and its ``about.json`` (``extrapolation-sequential/looks/look-K``, named
    ``extrapolation-sequential-look-K``; its natural-length arm's, ``looks/natural``, named
    ``extrapolation-sequential-natural``)."""
    looks = [f"{SEQUENTIAL}-{p.parent.name}" for p in (STUDIES / SEQUENTIAL / "looks").glob("*/about.json")
             if (p.parent.name.startswith("look-") or p.parent.name == NATURAL)
             and (p.parent / "results.json").is_file()]
    return sorted([p.parent.name for p in STUDIES.glob("*/results.json")] + looks)


def folder_of(name: str) -> Path:
    """The folder of the published study ``name``: ``bench/studies/<name>``, or a look's folder."""
    if name.startswith(f"{SEQUENTIAL}-look-") or name == f"{SEQUENTIAL}-{NATURAL}":
        return STUDIES / SEQUENTIAL / "looks" / name[len(SEQUENTIAL) + 1:]
    return STUDIES / name


def pages() -> dict[str, str]:
    """Every generated page of the Studies section, path relative to ``docs/pages/`` -> markdown."""
    out = {f"studies/{name}.md": results_page(name) for name in published()}
    out["studies/preregistration-extrapolation.md"] = preregistration_page()
    out[f"studies/preregistration-{SEQUENTIAL}.md"] = sequential_preregistration_page()
    return out


# ---------------------------------------------------------------------------------------------- formatting


def _p(x: float | None) -> str:
    return "-" if x is None else ("< 0.0001" if x < 1e-4 else f"{x:.4f}")


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _length(results: dict[str, Any], system: str, split: str, decoder: str) -> str:
    values = results["systems"][system]["splits"][split][decoder].get("length_ratio")
    return f"{_mean(values):.2f}" if values else "-"


def _steps(n: int) -> str:
    return f"{n:,}"


# ---------------------------------------------------------------------------------------------- results pages


def primary_table(results: dict[str, Any]) -> list[str]:
    """The declared family, one row per test, every number from ``results.json``."""
    from utils.study.sections import paired_cell

    base = results["baseline"]
    out = ["| system | quantity | Δ per seed | Δ mean | seed test p (Holm) | paired t p (Holm) | bootstrap 95 % CI "
           "| bootstrap p (Holm) | len | resolved |", "|---|---|---|---|---|---|---|---|---|---|"]
    for t in results["primary"]["tests"]:
        q, b, seed = t["quantity"], t["bootstrap"], t["seed_test"]
        ci = f"[{b['ci95'][0]:+.2f}, {b['ci95'][1]:+.2f}]" if b else "-"
        boot = f"{_p(b['p_value'])} ({_p(b['p_holm'])})" if b else "-"
        length = (f"{_length(results, t['system'], q['split'], q['decoder'])} / "
                  f"{_length(results, t.get('against') or base, q['split'], q['decoder'])}")
        out.append(f"| {t['system']} | {t['label']} | {', '.join(f'{d:+.2f}' for d in t['per_seed_delta'])} | "
                   f"{t['delta']:+.2f} | {_p(seed['p_value'])} ({_p(seed['p_holm'])}) | "
                   f"{paired_cell(t)} | {ci} | {boot} | {length} | "
                   f"{'**yes**' if t['resolved'] else 'no'} |")
    return out


def chrf_table(results: dict[str, Any], decoder: str = "beam5") -> list[str]:
    """chrF of every system on every test split: mean ± std over seeds, each seed, the length ratio."""
    splits = results["splits"]
    out = ["| system | " + " | ".join(splits) + " |", "|---|" + "---|" * len(splits)]
    for name, entry in results["systems"].items():
        cells = []
        for split in splits:
            row = entry["splits"][split][decoder]
            mean, std = row["chrf_mean_std"]
            cell = f"{mean:.2f} ± {std:.2f} ({', '.join(f'{v:.1f}' for v in row['chrf'])})"
            if row.get("length_ratio"):
                cell += f" · len {_mean(row['length_ratio']):.2f}"
            cells.append(cell)
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    return out


def _primary_section(name: str, results: dict[str, Any], about: dict[str, Any]) -> list[str]:
    from utils.study.sections import boundary_lines, design_lines, length_lines

    pr = results["primary"]
    fam, pw = pr["family"], pr["power"]
    base = results["baseline"]
    exploratory = fam.get("declared", "").startswith("exploratory")
    out = ["## Main analysis (exploratory)" if exploratory else "## Primary analysis", ""]
    out += [f"**The family.** {about.get('family') or fam['declared'][0].upper() + fam['declared'][1:] + '.'}", ""]
    if fam.get("elsewhere"):
        out += ["Not tested here: " + ", ".join(sorted(fam["elsewhere"])) + f" against {base}, whose runs and the "
                "baseline's are those of " + ", ".join(f"[{s}]({s}.md)" for s in sorted(set(fam["elsewhere"].values())))
                + ": that study's family tests them, so the same runs get one verdict per contrast.", ""]
    out += design_lines(results)
    quantities = list(dict.fromkeys(t["label"] for t in pr["tests"]))
    systems = list(dict.fromkeys(t["system"] for t in pr["tests"]))
    out += [f"Each of {', '.join(systems)} minus **{base}**, on {len(quantities)} quantities: **{pr['size']} tests**, "
            f"[Holm's correction](index.md#the-family-and-holms-correction) at α = {fam['alpha']}. Δ is the mean over "
            "seeds of each seed's difference (Δ per seed: seeds " + ", ".join(str(s) for s in results["seeds"]) + "). "
            "[Seed test](index.md#the-two-tests): the blocked ANOVA contrast over seeds, residual df "
            f"{pr['anova'][0]['df'] if pr['anova'] else '-'}; bootstrap: the paired bootstrap over test sentences "
            f"({results['bootstrap_samples']:,} resamples); the p in brackets is Holm-adjusted over the family. The "
            "paired t-test over seeds is a check, not part of the decision. [Resolved](index.md#resolved): both "
            "tests reject after Holm and agree in sign. len: the output/reference [length ratio](index.md#length-"
            f"ratio) of the system / of {base}." + (
                f" A drop is chrF(×1) − chrF(×K): a negative Δ on a drop means the system loses less than {base}."
                if fam.get("drops") else ""), ""]
    if not pr["bootstrap_available"]:
        out += ["!!! note \"Only the seed test\"", "    These runs' outputs were not kept, so the test-set bootstrap "
                "cannot be computed, nor the length ratio: nothing is called resolved on the seed test alone.", ""]
    out += [*primary_table(results), ""]
    resolved = [t for t in pr["tests"] if t["resolved"]]
    out += [f"**{pr['resolved']} of {pr['size']} tests resolved{':' if resolved else '.'}**", ""]
    if resolved:
        out += [*(f"- {t['system']}: {t['label']}, Δ {t['delta']:+.2f}" for t in resolved), ""]
    out += [*boundary_lines(results), *length_lines(results)]
    if (folder_of(name) / "figures" / "primary_contrasts.png").is_file():
        out += [f"![{_caption('primary_contrasts')}]({name}/figures/primary_contrasts.png)", ""]
    if pw.get("power_at_smallest_effect") is not None:
        out += [f"**[Power](index.md#power-and-the-smallest-effect-of-interest).** From the pooled residual "
                f"standard deviation, {pw['pooled_residual_sd']:.2f} {fam['metric']} (df {pw['df']}), a true "
                f"difference of {fam['smallest_effect']:.1f} {fam['metric']} (the smallest effect of interest) is "
                f"detected with probability {pw['power_at_smallest_effect']:.2f} at Holm's first level "
                f"({pw['level']:.4f}); 80 % power needs a true difference of {pw['detectable_at_80']:.2f}, or "
                f"{pw['seeds_for_80_at_smallest_effect'] or 'over 1,000'} seeds per system for "
                f"{fam['smallest_effect']:.1f}. An unresolved contrast is no evidence of no difference.", ""]
    return out


def _scope(results: dict[str, Any]) -> str:
    fam = results["primary"]["family"]
    columns = ", ".join(fam.get("splits") or results["splits"])
    drops = [f"{x1} → {xk}" for xk, x1 in (fam.get("drops") or {}).items()]
    systems = list(dict.fromkeys(t["system"] for t in results["primary"]["tests"]))
    return (f"In the family above: {columns}" + (f" (and the drops {', '.join(drops)}, computed from these columns)"
                                                  if drops else "")
            + f", for {', '.join(systems)} against {results['baseline']}; every other cell is exploratory.")


FIGURE_CAPTIONS = {
    "primary_contrasts": "The family at a glance: each seed's difference (dots), their mean and 95 % t-interval over "
                         "seeds (filled where resolved); grey band: the smallest effect of interest",
    "chrf_by_concatenation": "chrF against the number of test pairs joined into one input (×1 to ×8)",
    "valid_bleu": "Validation BLEU (greedy) during training, mean over seeds with its 95 % band",
    "attention_encoder": "Encoder self-attention per layer: mean distance and entropy",
    "attention_decoder": "Decoder self-attention per layer: mean distance and entropy",
    "attention_cross": "Cross-attention per layer: mean distance, entropy and mass near the diagonal",
}


def _caption(stem: str) -> str:
    if stem.startswith("chrf_by_length_"):
        return f"chrF by source length on {stem[len('chrf_by_length_'):]}"
    if stem.startswith("bleu_by_length_"):
        return f"BLEU by source length on {stem[len('bleu_by_length_'):]}"
    return FIGURE_CAPTIONS.get(stem, stem)


def _sections(report: str) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """The report's preamble (after its title) and its ``## `` sections as (title, body lines)."""
    lines = report.splitlines()
    preamble: list[str] = []
    sections: list[tuple[str, list[str]]] = []
    for line in lines[1:]:
        if line.startswith("## "):
            sections.append((line[3:], []))
        elif sections:
            sections[-1][1].append(line)
        else:
            preamble.append(line)
    return preamble, sections


def _collapsed(title: str, body: list[str]) -> list[str]:
    """A report section in a collapsed block; its ``### `` sub-headings become bold labels."""
    out = [f'??? abstract "{title}"', ""]
    while body and body[0] == "":
        body = body[1:]
    for line in body:
        if line.startswith("### "):
            line = f"**{line[4:]}**"
        out.append(f"    {line}" if line else "")
    while out[-1] == "":
        out.pop()
    return [*out, ""]


def _figures(name: str, body: list[str]) -> list[str]:
    out: list[str] = []
    for line in body:
        if not out and not line:
            continue
        m = re.fullmatch(r"!\[([^\]]*)\]\(figures/([^)]+)\)", line)
        if m and m.group(2) == "primary_contrasts.png":  # shown with the family's table
            continue
        if m:
            out.append(f"![{_caption(Path(m.group(2)).stem)}]({name}/figures/{m.group(2)})")
            out.append("")
        elif line.startswith(("sacreBLEU signatures", "Hypotheses:")):
            continue
        else:
            out.append(line)
    while out and out[-1] == "":
        out.pop()
    return out


def _raw_outputs(name: str, results: dict[str, Any], about: dict[str, Any]) -> list[str]:
    folder = f"bench/studies/{folder_of(name).relative_to(STUDIES).as_posix()}"
    hyps = sorted((folder_of(name) / "hypotheses").glob("*.json.xz"))
    out = ["## Raw outputs", "", f"Everything is in the repository, in `{folder}/`:", "",
           "- `results.json`: every number of this page and of the report (`spec`: the command and design; "
           "`systems`: each system's per-seed scores, length ratios, buckets, validation curves and attention "
           "statistics; `primary`: the family's tests; `exploratory`: the other tests).",
           "- `report.md`: the report as the study command wrote it; `figures/`: its figures.",
           f"- `tb/`: TensorBoard HParams summaries, one per run (`tensorboard --logdir {folder}/tb`, HParams tab)."]
    if hyps:
        out.append(f"- `hypotheses/<system>.seed<k>.json.xz`: every system's output for every seed, test set and "
                   f"decoder ({len(hyps)} files, xz-compressed JSON `{{split: {{decoder: [lines]}}}}`).")
    for path, what in about.get("raw", {}).items():
        out.append(f"- `{path}`: {what}")
    out.append("")
    if hyps:
        system, seed = next(iter(results["systems"])), results["seeds"][0]
        out += ["Read one system's output:", "", "```bash",
                f"python -c \"import json, lzma; d = json.loads(lzma.open('{folder}/hypotheses/{system}.seed{seed}"
                f".json.xz').read()); print(d['{results['splits'][0]}']['beam5'][:3])\"", "```", "",
                "Recompute every number (the test sets' references are read from the corpus the study's config "
                "names; `study_report.py` rewrites the folder it is given, so give it a copy):", ""]
    else:
        out += ["Recompute the analysis from the per-seed scores (`study_report.py` rewrites the folder it is given, "
                "so give it a copy):", ""]
    out += ["```bash", f"cp -r {folder} /tmp/{name} && python bench/study_report.py /tmp/{name}",
            f"diff {folder}/report.md /tmp/{name}/report.md && echo identical", "```", "",
            "The test suite does the same for every published study "
            "(`tests/test_study_published.py::test_the_published_reports_are_what_study_report_recomputes`).", ""]
    return out


def results_page(name: str) -> str:
    """The results page of the published study ``name`` (its folder: ``folder_of``)."""
    folder = folder_of(name)
    from utils.study.cost import cost_summary
    from utils.study.files import read_json, read_results

    results = read_results(folder)  # checked: a damaged or changed file is refused in one line naming it
    about = read_json(folder / "about.json", "a study's description (about.json)")
    spec = results["spec"]
    preamble, sections = _sections((folder / "report.md").read_text(encoding="utf-8"))
    trained = [n for n, e in results["systems"].items() if not e.get("test_variant")]
    at_test = [n for n, e in results["systems"].items() if e.get("test_variant")]
    budget = f"{_steps(spec['steps'])} optimizer steps" if spec.get("steps") else f"{spec['tokens']:,} target tokens"
    decoders = " and ".join(DECODER_NAMES[d] for d in results.get("decoders", list(DECODER_NAMES)))
    out = [f"# {about['title']}", ""]
    if about.get("notice"):
        out += ['!!! warning "' + about["notice"]["title"] + '"', "", f"    {about['notice']['text']}", ""]
    out += [f"**Question.** {about['question']}", ""]
    if about.get("established"):  # the study's answer in one paragraph a reader can quote
        out += ['!!! abstract "What is established"', "", f"    {about['established']}", ""]
    out += [f"- **Design:** `{spec['config']}`; {len(trained)} trained systems ({', '.join(trained)})"
            + (f" and {len(at_test)} decoded differently at test time ({', '.join(at_test)})" if at_test else "")
            + f"; seeds {', '.join(str(s) for s in results['seeds'])}; {budget} per run; checkpoint scored: "
            f"`{spec['checkpoint']}.pt`; {decoders} on {len(results['splits'])} test sets; baseline "
            f"**{results['baseline']}**.",
            f"- **Setup:** {about['setup']}",
            f"- **Machine:** {about['machine']}",
            f"- **Date:** {about['date']}",
            f"- **Trained by:** {about['trained_by']}",
            f"- **Scored by:** {about['scored_by']}",
            *([f"- **Compute:** {cost}"] if (cost := cost_summary(results)) else []),
            "- **Command** (as `results.json` records it):", "",
            "    ```bash", f"    python {spec['command']}", "    ```", ""]
    if "--runs " in spec["command"]:
        out += ["    `--runs` named the folder that held the runs on that machine (default `runs`).",
                ""]
    extra = [line for line in preamble if line and not line.startswith(("Command:", "Baseline:"))]
    out += [line for e in extra for line in (e, "")]
    out += _primary_section(name, results, about)
    out += ["## chrF, beam 5 (each seed)", "",
            "Mean ± standard deviation over the seeds, each seed's value in brackets, and the output/reference "
            "length ratio (len). " + _scope(results), "", *chrf_table(results), ""]
    if (arms := folder / "arms.md").is_file():  # the natural-length arm's look: bench/arms_table.py's table
        out += ["## The two arms side by side", "", *arms.read_text(encoding="utf-8").strip("\n").splitlines(), ""]
    if about.get("reading"):
        out += ["## What this does and does not show", ""]
        for paragraph in about["reading"]:
            out += [paragraph, ""]
    rest = [(title, body) for title, body in sections
            if not title.startswith(("Primary analysis", "Main analysis", "chrF, beam 5 (each seed)"))]
    figures = next((body for title, body in rest if title == "Figures"), [])
    if figures:
        out += ["## Figures", "", *_figures(name, figures), ""]
    others = [(title, body) for title, body in rest if title not in ("Figures", "Compute")]
    if others:
        out += ["## More from the report", "",
                "The report's other tables, exploratory: no claim rests on them. Click a title to open it.", ""]
        for title, body in others:
            out += _collapsed(title, body)
    if about.get("reproduce"):
        out += ["## Reproduce", ""]
        for paragraph in about["reproduce"]:
            out += [paragraph, ""]
    out += _raw_outputs(name, results, about)
    signature = next(iter(results["systems"].values()))["splits"][results["splits"][0]]["beam5"]
    out += [f"sacreBLEU signatures: BLEU `{signature['signature']}`, chrF `{signature.get('chrf_signature', '-')}`.",
            ""]
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------- pre-registration


def git_readme(commit: str) -> str:
    """README.md as ``commit`` holds it (the git history must be present: a clone, not an archive)."""
    res = subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:README.md"], capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"cannot read README.md at commit {commit[:7]} (a clone with its history is needed): "
                           f"{res.stderr.strip()}")
    return res.stdout


def section(markdown: str, heading: str) -> str:
    """The body of the section under ``heading`` (its exact line), up to the next heading of its level or above
    (a ``#`` line inside a code block is no heading)."""
    lines = markdown.split("\n")
    start = lines.index(heading) + 1
    level = len(heading) - len(heading.lstrip("#"))
    end, fenced = len(lines), False
    for i in range(start, len(lines)):
        if lines[i].startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(rf"#{{1,{level}}} ", lines[i]):
            end = i
            break
    return "\n".join(lines[start:end]).strip("\n")


def preregistration_page() -> str:
    """The pre-registration of the extrapolation study, frozen, then what was decided after it."""
    frozen = section(git_readme(PREREGISTRATION_COMMIT), PREREGISTRATION_HEADING)
    amendments = (STUDIES / "extrapolation" / "amendments.md").read_text(encoding="utf-8").strip("\n")
    short = PREREGISTRATION_COMMIT[:7]
    out = [f"# {PREREGISTRATION_HEADING.lstrip('#').strip()}", "",
           f'!!! info "Fixed on {PREREGISTRATION_DATE}, in commit {short}"', "",
           f"    The text between the two rules below is the pre-registration exactly as commit `{short}` "
           f"({PREREGISTRATION_DATE}) fixed it, before any run of the study: `git show {short}:README.md` holds "
           "it, and the test suite checks this page against it. Everything decided later is under "
           "[After the pre-registration](#after-the-pre-registration), each item with its date. The results: "
           "[Extrapolation (2,250 steps)](extrapolation.md), the pre-registered report, and "
           "[Extrapolation continued (2,700 steps)](extrapolation-2700.md), a second look: its budget was decided "
           "after the 2,250-step results were published, so it is not pre-registered.", "",
           "---", "", FROZEN_BEGIN, "", frozen, "", FROZEN_END, "", "---", "", amendments, ""]
    return "\n".join(out)


def sequential_preregistration_page() -> str:
    """The second extrapolation study's pre-registration, as fixed, then what was decided after it."""
    folder = STUDIES / SEQUENTIAL
    frozen = (folder / "preregistration.md").read_text(encoding="utf-8").strip("\n")
    amendments = folder / "amendments.md"
    after = (amendments.read_text(encoding="utf-8").strip("\n") if amendments.is_file()
             else "Nothing has been decided after it yet.")
    short, path = SEQUENTIAL_COMMIT[:7], f"bench/studies/{SEQUENTIAL}/preregistration.md"
    out = ["# Pre-registration: the second extrapolation study, group-sequential "
           f"(fixed {SEQUENTIAL_DATE}, before any of its runs)", "",
           f'!!! info "Fixed on {SEQUENTIAL_DATE}, in commit {short}"', "",
           f"    The text between the two rules below is `{path}` as commit `{short}` ({SEQUENTIAL_DATE}) added it, "
           "before any run of the study and before any test set of its pilot was decoded; the file is never "
           "edited, and the test suite checks both. Everything decided later is under "
           "[After the pre-registration](#after-the-pre-registration), each item with its date. The first "
           "study: [its pre-registration](preregistration-extrapolation.md) and [its results](extrapolation.md).",
           "", "---", "", FROZEN_BEGIN, "", frozen, "", FROZEN_END, "", "---", "",
           "## After the pre-registration", "", after, "", *sequential_status()]
    return "\n".join(out)


def _signed(x: float) -> str:
    """+0.12 or −0.12 (a true minus sign, as the pages print differences)."""
    return f"{x:+.2f}".replace("-", "−")


def _runs_kept(design: dict[str, Any]) -> list[str]:
    """How far the second study's runs are, from its committed archives (``records/ARM.SYSTEM.seedN.tar.xz``, one
    per run trained, decoded and kept by ``bench/study_sequential.sh``), and the training compute still planned."""
    plan = {"short": 5 * design["seeds"], "natural": 15}
    records = STUDIES / SEQUENTIAL / "records"
    archives = {arm: sorted(records.glob(f"{arm}.*.seed*.tar.xz")) for arm in plan}
    kept = {arm: len(found) for arm, found in archives.items()}
    first = 5 * design["looks"][0]
    left = sum(plan.values()) - sum(kept.values())
    text = (f"{sum(kept.values())} of {sum(plan.values())} runs are trained, decoded and committed in "
            f"`bench/studies/{SEQUENTIAL}/records/`: {kept['short']} of {plan['short']} in the short-trained arm, "
            f"{kept['natural']} of {plan['natural']} in the natural-length arm. Look 1 needs the short arm's "
            f"{first} runs of seeds 1-{design['looks'][0]} ({max(0, first - kept['short'])} to go), then the "
            f"natural arm's 15 ({plan['natural'] - kept['natural']} to go)"
            + "".join(f"; look {k}, the short arm's {5 * s} runs of seeds 1-{s} ({max(0, 5 * s - kept['short'])} to go)"
                      for k, s in enumerate(design["looks"][1:], 2))
            + f". The whole plan has {left} runs to go, "
            f"about {left * 55 / 60:.0f} CPU core-hours of training at the plan's 55 core-minutes a run, plus "
            "decoding; a look that stops the study early leaves the rest unrun.")
    from utils.study.cost import kept_cost, spent
    from utils.study.unkept import unkept_cost

    if total := kept_cost([a for found in archives.values() for a in found]):
        per = spent(total)[0] / total["runs"]
        text += (f" The runs kept so far cost {spent(total)[0]:.1f} CPU core-hours ({total['train_cpu_hours']:.1f} "
                 f"training, {total['decode_cpu_hours']:.1f} decoding; wall time x threads, every segment of a "
                 f"resumed run), {per:.2f} a run: at that mean the {left} runs to go need about {left * per:.0f} "
                 "CPU core-hours.")
    if lost := unkept_cost(records):
        cpus = "; ".join(f"{cpu} ({n} run{'s' * (n > 1)})" for cpu, n in lost["cpus"].items())
        text += (f" Trained and not kept (`records/unkept.json`, recorded at each stop by `bench/study_unkept.py`, "
                 f"last on {lost['last_recorded'][:10]}): {lost['runs']} run{'s' * (lost['runs'] > 1)}, "
                 f"{lost['steps']} training steps, {spent(lost)[0]:.1f} CPU core-hours "
                 f"({lost['train_cpu_hours']:.1f} training, {lost['decode_cpu_hours']:.1f} decoding), on {cpus}: "
                 "runs lost with a replaced machine or killed before their first checkpoint (counted for good; a "
                 "training killed without its closing line is counted to its last logged line) and runs in flight at "
                 "the last record (which leave this count once kept).")
        if total:
            text += f" Spent in all: {spent(total)[0] + spent(lost)[0]:.1f} CPU core-hours."
    from utils.study.machines import archived_machines
    from utils.study.sections import cpu_lines, package_lines

    arms = {"short": "short-trained arm", "natural": "natural-length arm"}
    cpus = {f"{arm}/{key}": {**run, "group": arms[arm]} for arm, found in archives.items()
            for key, run in archived_machines(found).items()}  # each arm's seeds are its own
    return ["### Runs kept", "", text, "", *cpu_lines(cpus), *package_lines(cpus)]


def _look_where(look: str) -> str:
    """Where a look of the second study lives: its results page once published, and its folder."""
    name = f"{SEQUENTIAL}-{look}"
    where = f"[its results]({name}.md), " if name in published() else ""
    return f"{where}`bench/studies/{SEQUENTIAL}/looks/{look}`"


def sequential_status() -> list[str]:
    """Where the second study stands, from its committed files: the noise pilot's endpoint, the design its rule
    gave, and the looks reached (each scored look's resolved tests and spent alpha, and the stopping rule's answer
    once written)."""
    out = ["## Where the study stands", ""]
    ratio = STUDIES / "noise-pilot" / "ratio.md"
    if not ratio.is_file():
        return [*out, "The noise pilot is not scored yet: no design, no run of the study.", ""]
    body = ratio.read_text(encoding="utf-8").strip("\n").split("\n", 1)[1].strip("\n")  # without its title
    out += ["### The noise pilot's result", "", body, ""]
    design = STUDIES / SEQUENTIAL / "design.json"
    if not design.is_file():
        return [*out, "The design is not fixed yet.", ""]
    import json

    d = json.loads(design.read_text(encoding="utf-8"))
    runs = 5 * d["seeds"] + 15
    out += ["### The design", "",
            f"By the pre-registered rule (`bench/pilot_design.py`, `bench/studies/{SEQUENTIAL}/design.json` and "
            "`family.json`, committed together before any run of the study):", "",
            f"- **Arm:** {d['arm']} (`{' '.join(f'--set {o}' for o in d['overrides']) or 'no --set'}`): the "
            f"trained systems' residual SD ratio cool / plain {d['ratio']:.2f} (the rule: at most "
            f"{d['rule']['ratio']}), x1 chrF cool − plain {_signed(d['x1_chrf_gap'])} (at least "
            f"−{d['rule']['quality']}).",
            f"- **Planning residual SD:** {d['planning_sd']:.3f} chrF, the {d['arm']} arm's "
            f"{d['pilot'][d['arm']]['residual_sd']:.3f} at its {d['rule']['confidence']:.0%} upper confidence limit.",
            f"- **Seeds per system:** {d['seeds']}" + (f" (capped; {d['seeds_needed']} needed)" if d["capped"] else "")
            + f"; **looks** at {', '.join(map(str, d['looks']))} seeds per system.",
            f"- **Power** at {d['rule']['effect']} chrF, Holm's first step: {d['power']:.3f} by the normal "
            f"approximation the rule reads, {d['power_seed_test']:.3f} for the seed test as run (simulated)."
            if "power_seed_test" in d else f"- **Power** at {d['rule']['effect']} chrF: {d['power']:.3f}.",
            f"- **Runs:** {runs} ({5 * d['seeds']} in the short-trained arm, 15 in the natural-length arm), about "
            f"{runs * 55 / 60:.0f} CPU core-hours of training at 55 core-minutes a run, plus decoding.", ""]
    out += _runs_kept(d)
    looks = sorted(p.parent for p in (STUDIES / SEQUENTIAL / "looks").glob("look-*/results.json"))
    if not looks:
        return [*out, "No look is reached yet.", ""]
    out += ["### Looks reached", ""]
    for look in looks:  # scored; the stopping rule's answer once written (after look 1, beside the natural arm)
        stop = look / "stop.txt"
        first = (stop.read_text(encoding="utf-8").splitlines()[0] if stop.is_file() else
                 "scored; the stopping rule's answer (`stop.txt`) is written once the natural-length arm is "
                 "scored beside it")
        primary = json.loads((look / "results.json").read_text(encoding="utf-8")).get("primary") or {}
        design = primary.get("design") or {}
        scored = (f"{primary['resolved']} of {primary['size']} primary tests resolved"
                  + (f", α spent {design['alpha_spent']:.2g} of {design['alpha']}" if "alpha_spent" in design else "")
                  + "; " if "resolved" in primary and "size" in primary else "")
        out.append(f"- **{look.name}:** {scored}{first} ({_look_where(look.name)})")
        if look.name == "look-1" and (natural := look.parent / NATURAL / "results.json").is_file():
            primary = json.loads(natural.read_text(encoding="utf-8")).get("primary") or {}
            scored = (f"{primary['resolved']} of {primary['size']} tests of its own family resolved "
                      if "resolved" in primary and "size" in primary else "scored ")
            out.append(f"- **natural-length arm** (seeds 1-3, one look, after look 1): {scored}"
                       f"({_look_where(NATURAL)})")
    return [*out, ""]
