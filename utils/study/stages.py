"""The stages of a study once its command line is checked (``utils.study.cli.define``): open its folder (lock,
merge runs trained elsewhere), train every run to the budget, score every run on every split with every decoder,
then attention statistics, analysis and report."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from utils.cli import ROOT, project_command
from utils.config import ConfigError, load_config
from utils.run.layout import RunDir
from utils.study.files import slug
from utils.study.launch import Launcher
from utils.study.length_control import LengthRule, add_length_results, score_length
from utils.study.linking import linked_elsewhere, shared_run
from utils.study.plan import Job, run_commands, train_command
from utils.study.provenance import Target, merge, record_runs
from utils.study.runs import (
    Progress,
    compute_attention,
    eval_current,
    eval_file,
    file_tag,
    find_run,
    read_attention,
    scored_step,
    training_done,
    training_elsewhere,
)
from utils.study.spec import Variant

Commands = list[tuple[str, list[str], Path]]  # (label, argv, log) as utils.study.plan.run_commands runs them


@dataclass
class Study:
    """A study as its command line defines it, every check passed, before anything of it is written (``train``
    adds to ``family`` and ``spec`` the contrasts tested elsewhere)."""

    args: argparse.Namespace  # the command line, checked (flags read as they are: budget, stage, scoring options)
    name: str
    folder: Path  # <--runs>/study_<name>
    config: str  # the base config every variant starts from
    variants: list[Variant]
    baseline: str
    family: dict[str, Any]  # the primary family: the preset's or --family's (utils.study.analysis.Family's keys)
    overrides: list[str]  # every run's --set: the preset's, then the command line's
    gpu_sets: list[str]  # with a CUDA GPU and no --jobs, configs/gpu_study.yaml's train keys (utils.study.gpu)
    budget_sets: list[str]  # utils.study.plan.budget_overrides
    decoders: dict[str, int]  # name -> beam size, in the report's order
    splits: list[str]  # the test splits scored and reported
    data: Any  # the base config's data section: the corpus the splits come from
    accumulate: dict[str, int]  # "<label> seed <k>" -> iterations per optimizer step, where not 1
    spec: dict[str, Any]  # what study.json will record (merged with an earlier start's)
    recorded: dict[str, Any] | None  # study.json as an earlier start of this study wrote it
    length: LengthRule | None  # the length-controlled decoder's declared rule, when it is asked for
    launcher: Launcher | None  # None: this machine's processes
    devices: int  # CUDA devices

    @property
    def seeds(self) -> list[int]:
        return list(range(1, self.args.seeds + 1))

    @property
    def jobs(self) -> list[Job]:
        """One job per (variant, seed), variants first: runs/<variant>/seed<k>."""
        return [Job(v, seed, self.folder / "runs" / slug(v.label) / f"seed{seed}")
                for v in self.variants for seed in self.seeds]

    @property
    def selected(self) -> list[Job]:
        """The jobs this command trains or decodes: every job, or those ``--only`` names."""
        only = getattr(self.args, "only", None)
        return self.jobs if only is None else [j for j in self.jobs if (j.variant.label, j.seed) in only]

    @property
    def spec_file(self) -> Path:
        return self.folder / "study.json"

    def run(self, commands: Commands, progress: Progress | None = None) -> None:
        """Run commands in the study's slots (``--jobs``, the GPUs) or through its launcher."""
        run_commands(commands, self.devices, jobs=self.args.jobs, progress=progress, launcher=self.launcher)


def open_study(study: Study) -> None:
    """Create and lock the study's folder (held until the process ends: a second start is refused in one line),
    then copy in the runs ``--merge`` names that this study would train the same."""
    from utils.io import ensure_dir
    from utils.study.lock import lock_study

    ensure_dir(study.folder, "the study folder")
    lock_study(study.folder)
    if not study.args.merge:
        return
    trains = {v.label: load_config(study.config, [*study.overrides, *study.gpu_sets, *v.overrides,
                                                  *study.budget_sets]).to_dict() for v in study.variants}
    targets = [Target(j.key, j.seed, j.root, trains[j.variant.label]) for j in study.jobs]
    for other in study.args.merge:  # runs trained elsewhere (more seeds, another machine) join this study first
        print("\n".join(merge(Path(other), study.folder, targets)) or f"  --merge {other}: nothing to merge",
              flush=True)


def _train_commands(study: Study, steps: dict[str, int]) -> Commands:
    """The train.py command of every run short of the budget (a killed run resumes); a run another study in
    ``--runs`` finished with the same config is linked instead. ``steps`` gets the scored step of each run already
    trained."""
    args, todo = study.args, []
    trains = not (args.score_only or args.decode_only)
    for job in study.selected:
        if not trains and (pid := training_elsewhere(job.root)) is not None:  # refused later, without waiting
            todo.append((f"train {job.key} (pid {pid} trains it)", [], job.root / "study.log"))
            continue
        run = find_run(job.root)
        if run is None and not job.root.exists() and not args.no_link:
            expected = load_config(study.config, [*study.overrides, *job.variant.overrides, f"seed={job.seed}",
                                                  *study.budget_sets]).to_dict()
            other = shared_run(job, study.folder, expected, args.steps, args.tokens)
            if other is not None:
                print(f"  {job.key}: the same run is in {other}, linked", flush=True)
                continue
        if run is not None and training_done(run, args.steps, args.tokens):
            if not args.train_only:  # a run past the budget is refused now, not after the others trained
                steps[job.key] = scored_step(run, args.checkpoint, args.steps)
            continue
        if run is not None and not RunDir(run).last.is_file():
            raise ConfigError(f"{run}: its checkpoints are gone and it is short of the budget: it cannot be trained "
                              "on; nothing was trained or scored")
        todo.append((f"train {job.key}",
                     train_command(job, study.config, [*study.gpu_sets, *study.overrides], study.budget_sets),
                     job.root / "study.log"))
    return todo


def _settle_family(study: Study) -> None:
    """Record in the family which contrasts another study's family already tests on these very (linked) runs:
    they stay tested there, and the record cannot change once scored."""
    elsewhere = linked_elsewhere(study.jobs, study.baseline, study.family,
                                 {"checkpoint": study.args.checkpoint, "max_sentences": study.args.max_sentences})
    was = ((study.recorded or {}).get("family") or {}).get("elsewhere")
    if was is not None and was != elsewhere:
        raise ConfigError(f"{study.folder}: the contrasts tested in another study's family were "
                          f"{was or 'none'} and would now be {elsewhere or 'none'} (a linked study "
                          "was scored, removed or changed since): the family of these runs cannot change; use another "
                          "--name")
    study.family = {**study.family, "elsewhere": elsewhere}
    study.spec["family"] = study.family
    if elsewhere:
        print(f"study {study.name}: tested in the family of the study their runs are linked from, not here: "
              + ", ".join(f"{label} ({where})" for label, where in elsewhere.items()), flush=True)


def _unmake(folder: Path) -> None:
    """Remove a study folder that holds nothing but its lock (made by a start that is refused now): a refused
    command leaves nothing behind."""
    if folder.is_dir() and {p.name for p in folder.iterdir()} <= {"study.lock"}:
        from utils.study.lock import unlock_study

        unlock_study(folder)
        (folder / "study.lock").unlink(missing_ok=True)
        folder.rmdir()


def train(study: Study) -> dict[str, int]:
    """Train (or resume, or link) every run to the budget, after writing study.json; the scored training step of
    each run trained before this call, by job key. ``--score-only`` and ``--decode-only`` refuse, training nothing,
    if a run is short."""
    steps: dict[str, int] = {}
    todo = _train_commands(study, steps)
    _settle_family(study)
    if (study.args.score_only or study.args.decode_only) and todo:
        stage = "--score-only" if study.args.score_only else "--decode-only"
        _unmake(study.folder)
        raise ConfigError(f"{stage}: {len(todo)} of {len(study.selected)} runs are not trained to the budget "
                          f"({', '.join(key.removeprefix('train ') for key, _, _ in todo)}); nothing was trained "
                          "or scored: train them first (--train-only)")
    from utils.io import atomic_write_text

    atomic_write_text(study.spec_file, json.dumps(study.spec, indent=1) + "\n")
    jobs = study.selected
    some = f" (--only {len(jobs)} of its {len(study.jobs)})" if len(jobs) < len(study.jobs) else ""
    print(f"study {study.name}: {len(jobs)} runs{some}, {len(jobs) - len(todo)} trained, {len(todo)} to train",
          flush=True)
    labels = {label for label, _, _ in todo}
    training = [job.root for job in jobs if f"train {job.key}" in labels]
    record_runs(training, ROOT)  # a run resumed now: this commit trains it on (utils.study.provenance)
    study.run(todo, Progress([label for label, _, _ in todo], study.args.steps, study.accumulate))
    record_runs(training, ROOT)
    return steps


def _test_commands(study: Study, runs: dict[str, Path | None], steps: dict[str, int], sizes: dict[str, int]
                   ) -> Commands:
    """One test.py per run and system (trained or test variant) with the decoders not yet scored on every split;
    ``steps`` gets the scored step of each run trained (or linked) just now."""
    args, todo = study.args, []
    for job in study.selected:
        run = runs[job.key]
        assert run is not None
        if job.key not in steps:  # trained (or linked) just now
            steps[job.key] = scored_step(run, args.checkpoint, args.steps)
        step = steps[job.key]
        for tag, extra in [(None, []), *job.variant.tests.items()]:
            files = file_tag(tag, args.max_sentences)
            beams = [str(beam) for beam in study.decoders.values()  # the decoders not yet scored, in one test.py
                     if not all(eval_current(eval_file(run, split, beam, args.checkpoint, files), n, extra, step)
                                for split, n in sizes.items())]
            if not beams:
                continue
            if not RunDir(run).checkpoint(args.checkpoint).is_file():
                raise ConfigError(f"{run}: its {args.checkpoint} checkpoint is gone and beam {' '.join(beams)} "
                                  f"{'(' + tag + ') ' if tag else ''}is not scored on every one of "
                                  f"{', '.join(sizes)}: nothing was scored")
            flags = ["--tag", files] if files else []
            flags += [f for split in (study.splits if args.splits else []) for f in ("--split", split)]
            flags += ["--max_sentences", str(args.max_sentences)] if args.max_sentences else []
            cmd = project_command("test.py", "--model_path", RunDir(run).checkpoint(args.checkpoint),
                                  "--beam", *beams, *flags, overrides=extra)
            todo.append((f"test {job.key} beam {' '.join(beams)}{' ' + tag if tag else ''}", cmd,
                         job.root / "study.log"))
    return todo


@dataclass
class Scored:
    """What the scoring stage leaves to the report: each job's run folder and scored step, the corpus, and the
    length-controlled decoder's choice per system ({} without it)."""

    runs: dict[str, Path]
    steps: dict[str, int]
    corpus: Any
    choice: dict[str, Any]


def score(study: Study, steps: dict[str, int], every_floor: bool = False) -> Scored:
    """Score every run on every split (``--splits``) with every decoder (``--decoders``), and each inference-only
    test variant; a run whose checkpoint is gone is scored from its score files, which must all be there.
    ``every_floor``: the length-controlled decoder's every floor too (``score_length``), not only those chosen."""
    from data.sources import load_corpus

    corpus = load_corpus(study.data)
    args = study.args
    sizes = {s: min(len(corpus[s]), args.max_sentences or len(corpus[s])) for s in study.splits}
    found = {job.key: find_run(job.root) for job in study.selected}
    todo = _test_commands(study, found, steps, sizes)  # every run found: asserted there
    runs = {key: run for key, run in found.items() if run is not None}
    study.run(todo)
    choice = score_length(study.length, study.selected, runs, steps, args.checkpoint, args.max_sentences, sizes,
                          study.data, study.run, every_floor) if study.length else {}
    return Scored(runs, steps, corpus, choice)


def attention(study: Study, scored: Scored) -> list[str]:
    """The attention statistics of every run that has its checkpoint (cached in its ``eval/``); a run without one
    is said so, unless its cache holds the scored step's. The runs without them, by job key."""
    args, runs, steps = study.args, scored.runs, scored.steps
    lacking = []
    for job in study.selected:
        if RunDir(runs[job.key]).checkpoint(args.checkpoint).is_file():
            compute_attention(runs[job.key], args.checkpoint, args.attention_sentences, steps[job.key])
        elif (read_attention(runs[job.key], args.checkpoint, args.attention_sentences) or {}).get(
                "step") != steps[job.key]:  # none, or of another step: not this model's
            print(f"  {job.key}: no checkpoint, so no attention statistics (the report leaves its system's out)",
                  flush=True)
            lacking.append(job.key)
    return lacking


def report(study: Study, scored: Scored) -> None:
    """Attention statistics of every run, then every number (results.json) and the report (report.md)."""
    args, runs, steps = study.args, scored.runs, scored.steps
    attention(study, scored)
    from utils.study.files import Ledger
    from utils.study.report import aggregate, write_report

    print(f"study {study.name}: statistics and report", flush=True)
    ledger = Ledger(study.folder)
    results = aggregate(study.jobs, runs, scored.corpus, study.splits, study.baseline, args.checkpoint,
                        args.bootstrap, args.attention_sentences, args.max_sentences, study.family,
                        list(study.decoders), steps, ledger)
    if study.length is not None:
        add_length_results(results, study.length, scored.choice, study.jobs, runs, args.checkpoint,
                           args.max_sentences, {s: list(scored.corpus[s]["tgt"]) for s in study.length.splits},
                           args.bootstrap, study.family, ledger)
    if recorded_now := ledger.save():
        print(f"study {study.name}: {recorded_now} files record no checksum (written by an older test.py or study): "
              f"recorded in {ledger.path} at this first read; a later change to them is refused", flush=True)
    write_report(study.folder, study.spec, results)
    print(f"study {study.name}: report in {study.folder / 'report.md'}, every number in "
          f"{study.folder / 'results.json'}")
