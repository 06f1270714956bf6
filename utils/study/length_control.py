"""The declared secondary decoder of a study: beam 5 with an output length floor chosen on validation data.

``LENGTH_DECODER`` (``beam5-minlen``, utils/study/decoders.py), scored when ``--decoders`` names it: beam 5 with an
output length floor (``decode.min_len_a``: end-of-sentence blocked until a hypothesis has a * source length tokens;
models.decoding) whose ``a`` is chosen for each system from validation data alone, by the rule the study's spec
records (``LengthRule``; a study's ``--decode-only`` decodes the test sets at every ``a`` of the grid beforehand, so
that no later choice needs the weights, and the choice reads none of those files): the smallest ``a`` of a fixed
grid whose validation length ratio (hypothesis/reference words, sacreBLEU's 13a tokens, the mean over seeds) reaches
the target; the grid's largest where none does. The validation data is the length-shifted validation split
``validation.xK`` (K the longest shift among the family's splits) where the study tests longer inputs, else the
validation split. Its tests are a family of their own, the primary endpoint decoded so, Holm-corrected within it and
reported in a section of their own: never in the primary family's correction.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from utils.study.decoders import LENGTH_DECODER
from utils.study.sections import result_row

GRID = (0.0, 0.25, 0.5, 0.75, 1.0)
TARGET_RATIO = 0.95
DECLARED = ("declared secondary: the primary endpoint decoded with beam 5 and a length floor chosen for each system "
            "from validation data alone (no test-set score is read to choose it); Holm-corrected within this family "
            "only, never in the primary family")

Command = tuple[str, list[str], Path]  # (label, argv, log) as bench/study.py runs them


@dataclass(frozen=True)
class LengthRule:
    """How ``LENGTH_DECODER`` is chosen and scored, recorded in the study's spec before it scores: ``validation``
    the split the floor is chosen on, ``splits`` the test splits decoded with it (the family's quantities),
    ``systems`` those decoded (the baseline first, then the family's contrasts), ``grid`` the values of
    ``decode.min_len_a`` tried in order, ``target`` the validation length ratio to reach, ``beam`` the beam size."""

    validation: str
    splits: tuple[str, ...]
    systems: tuple[str, ...]
    grid: tuple[float, ...] = GRID
    target: float = TARGET_RATIO
    beam: int = 5

    @classmethod
    def declare(cls, family: dict[str, Any], splits: list[str], systems: list[str], baseline: str) -> LengthRule:
        """The rule for a study of ``systems`` (every trained and test variant) whose primary ``family`` (a
        ``utils.study.analysis.Family`` as a dict; ``{}``: the default) tests on ``splits``."""
        from utils.study.analysis import Family, shift_factor

        fam = Family(**family)
        needed = {s for q in fam.quantities(splits) for s in (q.base_split, q.split) if s}
        needed = [s for s in splits if s in needed] + sorted(needed - set(splits))  # in the study's order
        k = max(shift_factor(s) for s in needed)
        contrasts = [s for s in (fam.systems or systems) if s != baseline and s in systems]
        return cls(f"validation.x{k}" if k > 1 else "validation", tuple(needed), (baseline, *contrasts))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LengthRule:
        return cls(d["validation"], tuple(d["splits"]), tuple(d["systems"]), tuple(d["grid"]), d["target"],
                   d["beam"])

    def to_dict(self) -> dict[str, Any]:
        return {"decoder": LENGTH_DECODER, **asdict(self), "declared": DECLARED,
                "rule": f"the smallest decode.min_len_a of {', '.join(f'{a:g}' for a in self.grid)} whose length "
                        f"ratio on {self.validation} (beam {self.beam}, the mean over seeds) is at least "
                        f"{self.target:g}; {self.grid[-1]:g} where none is"}

    def choice(self, ratios: dict[float, list[float]]) -> float | None:
        """The floor the rule picks from the validation length ratios measured so far (``a`` -> each seed's), in
        grid order: None while the next ``a`` to decide on is not measured yet."""
        for a in self.grid:
            if a not in ratios:
                return None
            if statistics.fmean(ratios[a]) >= self.target:
                return a
        return self.grid[-1]


def floor_tag(tag: str | None, a: float) -> str | None:
    """test.py's ``--tag`` for a system's files (``tag``: utils.study.runs.file_tag's) decoded with floor ``a``; with
    no floor, the files of beam 5 itself."""
    return ".".join(x for x in (tag, f"minlen{a:g}" if a else None) if x) or None


def length_ratio(hypotheses: list[str], references: list[str], lowercase: bool) -> float:
    """Corpus hypothesis/reference length in sacreBLEU's 13a words, as the report's ``len`` counts it."""
    from utils.study.analysis import metric_for
    from utils.study.stats import sentence_stats

    x = sentence_stats(metric_for("BLEU", lowercase), hypotheses, references)
    return float(x[:, 0].sum() / max(x[:, 1].sum(), 1))


@dataclass
class _System:
    name: str
    tag: str | None  # test variant
    extra: list[str]  # its inference-only overrides
    jobs: list[Any]  # utils.study.plan.Job, one per seed


def _systems(rule: LengthRule, jobs: list[Any]) -> list[_System]:
    """Each of ``rule.systems`` with runs among ``jobs`` (all of them, or a study's ``--only``): a trained variant's
    label, or ``LABEL+TAG``, its test variant ``TAG``."""
    out = []
    for name in rule.systems:
        if mine := [j for j in jobs if j.variant.label == name]:  # a trained variant
            out.append(_System(name, None, [], mine))
        elif "+" in name:  # a test variant of a trained one (whose runs may all be left out)
            label, tag = name.rsplit("+", 1)
            if mine := [j for j in jobs if j.variant.label == label and tag in j.variant.tests]:
                out.append(_System(name, tag, list(mine[0].variant.tests[tag]), mine))
    return out


def _lowercase(rule: LengthRule, jobs: list[Any], runs: dict[str, Path]) -> bool:
    """Whether the baseline's first run (without it among ``jobs``, the first job's) scores case-insensitively (its
    tokenizer lowercases), as the report does."""
    from utils.study.runs import run_cfg

    first = next((j for j in jobs if j.variant.label == rule.systems[0]), jobs[0])
    return bool(run_cfg(runs[first.key]).tokenizer.lowercase)


def score_length(rule: LengthRule, jobs: list[Any], runs: dict[str, Path], steps: dict[str, int], checkpoint: str,
                 max_sentences: int | None, sizes: dict[str, int], data: Any,
                 run: Callable[[list[Command]], None], every_floor: bool = False) -> dict[str, Any]:
    """Choose each system's floor on ``rule.validation`` (test.py on every seed's run, one grid value at a time,
    until the rule decides), then decode ``rule.splits`` (``sizes``: sentences scored of each) with it; ``run``
    runs test.py commands. -> ``{system: {"min_len_a": a, "validation_ratio": {"a": [each seed's]}}}``. ``data``:
    the study's data config (its validation split); ConfigError, one line, for a run whose checkpoint is gone
    when something is still to decode. ``every_floor``: decode every value of the grid on the validation split
    and on ``rule.splits`` first, so that any later choice (more seeds change the mean) finds its files without
    the weights; the choice made is the same."""
    from data.sources import concatenate_pairs, length_shifted, load_corpus
    from utils.cli import project_command
    from utils.config import ConfigError
    from utils.run.layout import RunDir
    from utils.study.runs import eval_current, eval_file, file_tag, read_scores

    corpus = load_corpus(data)
    shifted = length_shifted(rule.validation)
    valid = corpus["validation"]
    refs = (concatenate_pairs(list(valid["src"]), list(valid["tgt"]), shifted[1])[1] if shifted
            else list(valid["tgt"]))
    refs = refs[: max_sentences or len(refs)]
    systems = _systems(rule, jobs)
    lowercase = _lowercase(rule, jobs, runs)

    def command(system: _System, job: Any, a: float, splits: list[str], extra: list[str]) -> Command:
        path = RunDir(runs[job.key]).checkpoint(checkpoint)
        if not path.is_file():
            raise ConfigError(f"{runs[job.key]}: its {checkpoint} checkpoint is gone and {LENGTH_DECODER} "
                              f"(min_len_a {a:g}) is not scored on {', '.join(splits)}: nothing was scored")
        tag = floor_tag(file_tag(system.tag, max_sentences), a)
        flags = [f for split in splits for f in ("--split", split)] + (["--tag", tag] if tag else [])
        flags += ["--max_sentences", str(max_sentences)] if max_sentences else []
        on = f" on {rule.validation}" if splits == [rule.validation] else ""
        return (f"test {job.key} beam {rule.beam} min_len_a {a:g}{on}{' ' + system.tag if system.tag else ''}",
                project_command("test.py", "--model_path", path, "--beam", str(rule.beam), *flags, overrides=extra),
                job.root / "study.log")

    def overrides(system: _System, a: float, validation: bool) -> list[str]:
        return [*system.extra, *([f"data.test=[{rule.validation}]"] if validation and shifted else []),
                *([f"decode.min_len_a={a:g}"] if a else [])]

    def path(system: _System, job: Any, split: str, a: float) -> Path:
        return eval_file(runs[job.key], split, rule.beam, checkpoint, floor_tag(file_tag(system.tag, max_sentences), a))

    def run_some(commands: list[Command]) -> None:
        if commands:
            run(commands)

    if every_floor:
        run_some([command(s, j, a, [rule.validation], overrides(s, a, True)) for a in rule.grid for s in systems
                  for j in s.jobs
                  if not eval_current(path(s, j, rule.validation, a), len(refs), overrides(s, a, True), steps[j.key])])
        run_some([command(s, j, a, list(rule.splits), overrides(s, a, False)) for a in rule.grid if a
                  for s in systems for j in s.jobs
                  if not all(eval_current(path(s, j, split, a), sizes[split], overrides(s, a, False), steps[j.key])
                             for split in rule.splits)])
    ratios: dict[str, dict[float, list[float]]] = {s.name: {} for s in systems}
    chosen: dict[str, float] = {}
    for a in rule.grid:
        todo = [s for s in systems if s.name not in chosen]
        if not todo:
            break
        run_some([command(s, j, a, [rule.validation], overrides(s, a, True)) for s in todo for j in s.jobs
             if not eval_current(path(s, j, rule.validation, a), len(refs), overrides(s, a, True), steps[j.key])])
        for s in todo:
            ratios[s.name][a] = [length_ratio(read_scores(path(s, j, rule.validation, a), len(refs))[1], refs,
                                              lowercase) for j in s.jobs]
            if (c := rule.choice(ratios[s.name])) is not None:
                chosen[s.name] = c
    run_some([command(s, j, chosen[s.name], list(rule.splits), overrides(s, chosen[s.name], False))
         for s in systems if chosen[s.name] for j in s.jobs
         if not all(eval_current(path(s, j, split, chosen[s.name]), sizes[split], overrides(s, chosen[s.name], False),
                                 steps[j.key]) for split in rule.splits)])
    return {s.name: {"min_len_a": chosen[s.name], "validation_ratio": {f"{a:g}": r for a, r in ratios[s.name].items()}}
            for s in systems}


def add_length_results(results: dict[str, Any], rule: LengthRule, choice: dict[str, Any], jobs: list[Any],
                       runs: dict[str, Path], checkpoint: str, max_sentences: int | None,
                       references: dict[str, list[str]], samples: int, family: dict[str, Any],
                       ledger: Any = None) -> None:
    """``results`` (utils.study.report.aggregate's) with ``LENGTH_DECODER``'s hypotheses among those it publishes
    and its analysis as ``results["length_control"]``: each file checked before use (utils.study.runs.read_scores)."""
    from utils.study.runs import eval_file, file_tag, read_scores

    hypotheses: dict[str, dict[str, list[list[str]]]] = {}
    for s in _systems(rule, jobs):
        tag = floor_tag(file_tag(s.tag, max_sentences), choice[s.name]["min_len_a"])
        for split in rule.splits:
            n = min(len(references[split]), max_sentences or len(references[split]))
            per_seed = [read_scores(eval_file(runs[j.key], split, rule.beam, checkpoint, tag), n, ledger)[1]
                        for j in s.jobs]
            hypotheses.setdefault(s.name, {})[split] = per_seed
            results["_hypotheses"][s.name][split][LENGTH_DECODER] = per_seed
    results["length_control"] = analyse_length(rule, choice, hypotheses, references, results["baseline"],
                                               samples, _lowercase(rule, jobs, runs), family)


def analyse_length(rule: LengthRule, choice: dict[str, Any], hypotheses: dict[str, dict[str, list[list[str]]]],
                   references: dict[str, list[str]], baseline: str, samples: int, lowercase: bool,
                   family: dict[str, Any]) -> dict[str, Any]:
    """The secondary analysis: each system's scores with its chosen floor (``hypotheses[system][split]``, one list
    per seed) and the primary family's endpoint tested on them as a family of its own (utils.study.analysis.primary:
    Holm within it, a fixed design even where the primary family is group-sequential)."""
    from utils.study.analysis import Analysis, Family, metric_for, primary
    from utils.study.stats import corpus_score, sentence_stats

    metrics = {"chrF": metric_for("chrF", lowercase), "BLEU": metric_for("BLEU", lowercase)}
    scores: dict[str, Any] = {}
    stats: dict[str, Any] = {}
    systems: dict[str, Any] = {}
    for name, per_split in hypotheses.items():
        for split, per_seed in per_split.items():
            refs = references[split][: len(per_seed[0])]
            per = {m: [sentence_stats(metric, h, refs) for h in per_seed] for m, metric in metrics.items()}
            stats.setdefault(name, {})[split] = {LENGTH_DECODER: per}
            row = {"chrf": [corpus_score(metrics["chrF"], x.sum(0)) for x in per["chrF"]],
                   "bleu": [corpus_score(metrics["BLEU"], x.sum(0)) for x in per["BLEU"]],
                   "length_ratio": [float(x[:, 0].sum() / max(x[:, 1].sum(), 1)) for x in per["BLEU"]]}
            scores.setdefault(name, {})[split] = {LENGTH_DECODER: {"chrF": row["chrf"], "BLEU": row["bleu"]}}
            systems.setdefault(name, {})[split] = row
    # Tested once, at the look where the study stops: Holm at the family's alpha, never a group-sequential boundary.
    fam = Family(**{**family, "decoder": LENGTH_DECODER, "systems": list(rule.systems[1:]), "elsewhere": {},
                    "declared": DECLARED, "sequential": None})
    tests = primary(Analysis(scores, stats, baseline, samples, lowercase), fam, list(rule.systems), list(rule.splits))
    return {"rule": rule.to_dict(), "choice": choice, "systems": systems, "family": tests}


def reanalyse_length(old: dict[str, Any], folder: Path, references: dict[str, list[str]] | None,
                     samples: int, lowercase: bool,
                     read_hypotheses: Callable[..., dict[str, Any]]) -> dict[str, Any] | None:
    """A published study's secondary analysis again, from its ``results.json`` (``old``) and ``hypotheses/``
    (``references``: its test splits' targets; None when not published: the recorded analysis is kept), read by
    ``read_hypotheses`` (utils.study.report's); None for a study without one. The recorded choice must be the
    rule's on the recorded validation ratios."""
    from utils.study.files import StudyFileError

    recorded = old.get("length_control")
    if recorded is None or references is None:
        return recorded
    rule = LengthRule.from_dict(recorded["rule"])
    for name, c in recorded["choice"].items():
        if rule.choice({float(a): r for a, r in c["validation_ratio"].items()}) != c["min_len_a"]:
            raise StudyFileError(f"{folder / 'results.json'}: {name}'s recorded min_len_a {c['min_len_a']:g} is not "
                                 "the rule's on its recorded validation ratios: changed since the study wrote it")
    read = read_hypotheses(folder / "hypotheses", list(rule.systems), old["seeds"], old.get("checksums"),
                           list(rule.splits), [LENGTH_DECODER], {s: len(references[s]) for s in rule.splits})
    hypotheses = {name: {split: per[LENGTH_DECODER] for split, per in splits.items()} for name, splits in read.items()}
    return analyse_length(rule, recorded["choice"], hypotheses, references, old["baseline"], samples, lowercase,
                          old["spec"].get("family") or {})


def length_control_lines(results: dict[str, Any]) -> list[str]:
    """The report's section on ``LENGTH_DECODER`` (none for a study that did not score it): the rule, each system's
    floor and scores, and the secondary family's tests."""
    lc = results.get("length_control")
    if not lc:
        return []
    rule, fam = lc["rule"], lc["family"]
    base = results["baseline"]
    out = [f"## Length-controlled decoding, {LENGTH_DECODER} (declared secondary)", "",
           f"Beam {rule['beam']} with an output length floor: end-of-sentence is blocked until a hypothesis has "
           "min_len_a × source length tokens (`decode.min_len_a`), min_len_a chosen for each system from "
           f"{rule['validation']} alone (test-set files decoded at other floors, where a study has them, are not "
           f"read to choose it): {rule['rule']}. It separates what a "
           f"system translates from when it stops. A family of its own, declared secondary: {fam['size']} tests, the "
           f"primary endpoint decoded so, Holm's correction at α = {fam['family']['alpha']} within them only, never "
           "in the primary family's; each test as there.", "", *_interim(results),
           "| system | min_len_a | validation len (each min_len_a tried) | "
           + " | ".join(f"chrF {s}" for s in rule["splits"]) + " |",
           "|---|---|---|" + "---|" * len(rule["splits"])]
    for name in rule["systems"]:
        c = lc["choice"][name]
        tried = ", ".join(f"{a}: {statistics.fmean(r):.2f}" for a, r in c["validation_ratio"].items())
        cells = []
        for split in rule["splits"]:
            row = lc["systems"][name][split]
            cells.append(f"{statistics.fmean(row['chrf']):.2f} · len {statistics.fmean(row['length_ratio']):.2f}")
        out.append(f"| {name} | {c['min_len_a']:g} | {tried} | " + " | ".join(cells) + " |")
    out += ["", "| system | quantity | Δ per seed | Δ mean | seed test p | p Holm | bootstrap 95 % CI | bootstrap p "
            "| p Holm | resolved |", "|---|---|---|---|---|---|---|---|---|---|"]
    out += [result_row(t) for t in fam["tests"]]
    return [*out, "", f"**{fam['resolved']} of {fam['size']} resolved** (secondary; against {base}).", ""]


def _interim(results: dict[str, Any]) -> list[str]:
    """Under a group-sequential primary design, the look these tests were made at: they count only at the look
    where the study stops."""
    d = (results.get("primary") or {}).get("design") or {}
    if d.get("kind") != "group-sequential":
        return []
    return [f"At look {d['look']} of {d['of']} of the primary design: this family is tested once, at the look where "
            "the study stops (its last planned look, or the first at which every primary test is resolved or "
            "futile); at any look before that these tests are interim, and no claim rests on them.", ""]
