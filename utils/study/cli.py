"""The study this toolkit exists for: a grid of configurations x seeds trained at an equal budget, every run
scored on every test split (beam 5 and greedy), attention quantified, and a report that says which
differences are significant.

    python bench/study.py --config configs/bench_small_rope.yaml --grid model.attention_pe=none,rope,alibi,t5,shaw \\
        --grid model.input_pe=sinusoidal,none --seeds 3 --steps 1500 --name pe
    python bench/study.py --preset seed-table --seeds 3 --steps 1500          # sinusoidal / learnable / RoPE
    python bench/study.py --preset all-encodings --seeds 3 --steps 1500
    python bench/study.py --preset train-short-test-long --seeds 3 --steps 1500
    python bench/study.py --preset tokenization --seeds 3 --steps 1500

``python -m utils.study`` is the same command (with the repository root on ``PYTHONPATH``).

Budget: ``--steps`` optimizer steps or ``--tokens`` target tokens per run, never wall time, so a busy
machine cannot bias the comparison. Each (variant, seed) is a normal run directory under
``runs/study_<name>/runs/<variant>/seed<k>/`` that train.py, test.py and visualize.py understand. The
study is resumable and idempotent: run the same command again and finished runs and evaluations are
skipped, a run killed mid-training is resumed from its last checkpoint. A run that another study in the
same ``--runs`` folder already finished with exactly the same config (seed and budget included) is linked,
not trained again: ``all-encodings`` reuses ``seed-table``'s sinusoidal, learnable and RoPE runs (``--no-link``
trains them again: a config does not pin the code, e.g. runs from another commit whose loss sums in another
order; comparisons are exactly paired only among runs trained by the same code). With
several GPUs, the runs at a time spread evenly over them, each seeing one. Writes ``results.json`` (every
number), ``report.md`` (tables, figures, significance in words), ``figures/*.png`` and ``tb/`` (TensorBoard
HParams: compare the runs in the HParams tab).

Test-time variants: ``--test-variant rope+linear:model.rope.scaling=linear,model.rope.factor=8`` scores the
trained models of variant ``rope`` again under inference-only overrides, as the system ``rope+linear``
(``train-short-test-long`` does this for the RoPE length extensions), compared with its baseline and with
its own trained variant (paired over seeds: the same models).

Statistics (utils/study/analysis.py, utils/study/stats.py): seeds are blocks (seed k gives every variant the
same tokenizer and batch order). Every difference with the baseline is the mean over seeds of the per-seed
difference, tested across seeds (the contrast of a blocked two-way ANOVA) and across test sentences (a paired
bootstrap of that same quantity, 10,000 resamples); the primary family (a preset's, or one declared in a file
with ``--family``, e.g. committed with a pre-registration) is Holm-corrected and a difference is resolved when
both tests reject and agree in sign; power comes from a smallest effect fixed in advance (1 chrF). Everything
else is labelled exploratory. Every system's hypotheses are published with the report (``hypotheses/``), and
``python bench/study_report.py STUDY_DIR`` recomputes the report from the published files alone.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from utils.cli import add_set_arg
from utils.config import ConfigError
from utils.study.decoders import DECODERS, LENGTH_DECODER
from utils.study.files import slug
from utils.study.gpu import STUDY_RUNS_PER_GPU, study_defaults
from utils.study.launch import LAUNCHERS, Launcher, LaunchError, Resources
from utils.study.length_control import LengthRule
from utils.study.looks import Design, look_fractions
from utils.study.plan import STUDY_KEYS, budget_overrides
from utils.study.presets import presets
from utils.study.spec import (
    Variant,
    add_test_variants,
    check_distinct,
    check_family,
    check_sets,
    grid_variants,
    inference_only,
    merge_spec,
    read_family,
    recorded_labels,
    select_variants,
)
from utils.study.stages import Study, attention, open_study, report, score, train

#: The most seeds a study may ask for (a seed is a run of every variant).
MAX_SEEDS = 10_000


def study_launcher(parser: argparse.ArgumentParser, args: argparse.Namespace, study: Path) -> Launcher | None:
    """The launcher ``--launcher`` names (None: local, the study's own processes), checked before the study
    writes anything: a ``--slurm-*`` flag without ``--launcher slurm``, submitit missing, or SLURM absent or
    refusing the resources is one line and exit 2."""
    slurm = {"--slurm-partition": args.slurm_partition, "--slurm-time": args.slurm_time,
             "--slurm-gpus-per-job": args.slurm_gpus_per_job, "--slurm-cpus-per-job": args.slurm_cpus_per_job,
             "--slurm-mem-gb": args.slurm_mem_gb, "--slurm-array-parallelism": args.slurm_array_parallelism}
    given = [flag for flag, value in slurm.items() if value is not None]
    if given and args.launcher != "slurm":
        parser.error(f"{', '.join(given)}: for --launcher slurm only")
    if args.launcher == "local":
        return None
    if args.launcher == "slurm" and args.jobs != 1:
        parser.error("--jobs: runs at a time on this machine; on SLURM give --slurm-array-parallelism")
    for flag, value in slurm.items():
        if flag == "--slurm-mem-gb" and value is not None and not value > 0:
            parser.error(f"{flag} must be > 0, got {value}")
        elif isinstance(value, int) and value < (low := 0 if flag == "--slurm-gpus-per-job" else 1):
            parser.error(f"{flag} must be >= {low}, got {value}")
    defaults = Resources()
    resources = Resources(args.slurm_partition, args.slurm_time or defaults.time_min,
                          defaults.gpus if args.slurm_gpus_per_job is None else args.slurm_gpus_per_job,
                          args.slurm_cpus_per_job, args.slurm_mem_gb, args.slurm_array_parallelism)
    try:
        return Launcher(args.launcher, study / "submitit", resources)
    except LaunchError as e:
        parser.error(str(e))


def build_parser() -> argparse.ArgumentParser:
    """The command line of bench/study.py."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(presets()), help="a ready-made study (sets config and grid)")
    parser.add_argument("--config", help="the base config every variant starts from")
    parser.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2",
                        help="a grid axis (repeatable: the cross product of all axes)")
    add_set_arg(parser, help="a config value applied to every run (repeatable)")
    parser.add_argument("--test-variant", action="append", default=[], metavar="[LABEL+]TAG:KEY=V,...",
                        help="also score the trained models under inference-only overrides, e.g. a RoPE scaling: "
                             "rope+linear:model.rope.scaling=linear,model.rope.factor=8 (repeatable)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per variant: 1..N (default 3, at most 10000)")
    budget = parser.add_mutually_exclusive_group(required=True)
    budget.add_argument("--steps", type=int, help="optimizer steps per run")
    budget.add_argument("--tokens", type=int, help="target tokens per run")
    parser.add_argument("--eval-every", type=int,
                        help="validation every N iterations (default: a fifth of --steps; 200 with --tokens)")
    parser.add_argument("--name", help="study name: runs/study_<name>/ (default: the preset's name)")
    parser.add_argument("--baseline", help="variant label the others are compared with (default: the preset's "
                        "baseline; with --grid, the first variant)")
    parser.add_argument("--variants", metavar="LABEL,...",
                        help="with --preset: only these of its variants (and its baseline), e.g. the ones a study was "
                             "pre-registered with after others joined the preset")
    parser.add_argument("--checkpoint", choices=["best", "last"], default="best",
                        help="checkpoint scored (default best: the best validation BLEU within the budget)")
    parser.add_argument("--bootstrap", type=int, default=10000, help="bootstrap samples (default 10000)")
    parser.add_argument("--attention-sentences", type=int, default=200, help="validation pairs for attention stats")
    parser.add_argument("--max-sentences", type=int, help="score only the first N sentences of each split (quick)")
    parser.add_argument("--decoders", default=",".join(DECODERS), metavar="NAME,...",
                        help=f"decoders scored and reported, of {', '.join(DECODERS)} (default all) and "
                             f"{LENGTH_DECODER} (a declared secondary: beam 5 with a length floor chosen per system "
                             "on validation data, reported in a section of its own); the primary family's must be "
                             "among them")
    parser.add_argument("--splits", metavar="SPLIT,...",
                        help="test splits scored and reported (default: every one of the config's data.test); the "
                             "primary family's, and the x1 split of each of its drops, must be among them")
    parser.add_argument("--runs", default="runs", help="folder for the study (default runs)")
    parser.add_argument("--jobs", type=int,
                        help="runs (and scorings) at a time on this machine, each with its share of the CPU cores "
                             "(default 1; with a CUDA GPU, 16 runs sharing it, each with the train keys of "
                             "configs/gpu_study.yaml: static shapes, CUDA graphs; a --jobs given keeps the runs' "
                             "config as it is)")
    parser.add_argument("--merge", action="append", default=[], metavar="STUDY_DIR",
                        help="first copy in the runs another folder of this study holds (e.g. more seeds trained on "
                             "another machine) whose config is this study's for their variant and seed; a different "
                             "config is refused, naming the key")
    parser.add_argument("--family", type=Path, metavar="FILE",
                        help="the primary family, declared in a JSON file before the runs (keys: metric, decoder, "
                             "splits, drops, systems, smallest_effect, alpha, declared, sequential): it replaces the "
                             "preset's; every system it names must be a variant of the study")
    parser.add_argument("--no-link", action="store_true",
                        help="train every run of this study, even one another study in --runs finished with the "
                             "same config (its code may differ: e.g. a baseline trained by an older commit)")
    stage = parser.add_mutually_exclusive_group()
    stage.add_argument("--train-only", action="store_true",
                       help="train (or resume) every run, then stop: a pilot, or scoring left to later")
    stage.add_argument("--score-only", action="store_true",
                       help="score and report runs already trained to the budget (e.g. by another checkout "
                            "of the code); refuse, training nothing, if one is not")
    stage.add_argument("--decode-only", action="store_true",
                       help="decode runs already trained to the budget with every decoder on every split (each "
                            "test variant too, and, with beam5-minlen, every floor of its grid), and cache their "
                            "attention statistics: all that needs their weights, which may then be deleted or left "
                            "behind on this machine; no statistics, no report (e.g. between a sequential study's "
                            "looks); refuse, decoding nothing, if a run is not trained")
    parser.add_argument("--only", metavar="LABEL:SEED,...",
                        help="with --train-only or --decode-only: only these runs of the study, each a trained "
                             "variant's label and one of seeds 1..--seeds (e.g. rope:3,sinusoidal:4): a study "
                             "trained and decoded a few runs at a time, each kept once decoded")
    launch = parser.add_argument_group("launcher")
    launch.add_argument("--launcher", choices=LAUNCHERS, default="local",
                        help="where the train.py and test.py commands run (the study itself runs here): local, "
                             "processes of this machine (default); slurm, each command one SLURM job, submitted "
                             "through submitit (pip install '.[cluster]'), its files in <study>/submitit/; "
                             "submitit-local, the same jobs as processes of this machine, in --jobs slots (a "
                             "check before a cluster)")
    launch.add_argument("--slurm-partition", metavar="NAME", help="partition of the jobs (default: the cluster's)")
    launch.add_argument("--slurm-time", type=int, metavar="MINUTES",
                        help=f"time limit of each job in minutes (default {Resources().time_min}); a job past it "
                             "fails the study, whose rerun resumes the run")
    launch.add_argument("--slurm-gpus-per-job", type=int, metavar="N",
                        help=f"GPUs of each job (default {Resources().gpus}; 0 on a cluster without GPUs)")
    launch.add_argument("--slurm-cpus-per-job", type=int, metavar="N",
                        help="CPUs of each job, also its OMP_NUM_THREADS (default: the cluster's)")
    launch.add_argument("--slurm-mem-gb", type=float, metavar="GB", help="memory of each job (default: the cluster's)")
    launch.add_argument("--slurm-array-parallelism", type=int, metavar="N",
                        help="jobs of the study running at a time (default: submitit's, 256)")
    return parser


def main() -> int:
    """bench/study.py's command line (``command``); the study folder's lock is released when it returns, as at process
    exit, so one Python process can run a study again."""
    from utils.study.lock import unlock_all

    try:
        return command()
    finally:
        unlock_all()


def command() -> int:
    """Plan, train, score and report the study the command line describes."""
    parser = build_parser()
    study = define(parser, parser.parse_args())
    open_study(study)
    steps = train(study)
    if study.args.train_only:
        print(f"study {study.name}: every run trained to the budget (--train-only: not scored)")
        return 0
    if study.args.decode_only:
        lacking = attention(study, score(study, steps, every_floor=True))
        print(f"study {study.name}: every run decoded (--decode-only: no statistics, no report); " + (
              f"no attention statistics for {', '.join(lacking)} (no checkpoint)" if lacking else
              "its attention cached: its checkpoints are no longer needed to score it"))
        return 0
    report(study, score(study, steps))
    return 0


def _systems(parser: argparse.ArgumentParser, args: argparse.Namespace
             ) -> tuple[str, list[Variant], str | None, dict[str, Any]]:
    """The base config, variants, baseline (None: the first) and primary family of ``--preset`` or ``--grid``;
    a preset's ``--set`` go first in ``args.overrides``."""
    if args.preset:
        preset = presets()[args.preset]
        config, variants, baseline = args.config or preset.config, preset.variants, preset.baseline
        args.overrides = [*preset.overrides, *args.overrides]
        family = preset.family
        if args.grid:
            parser.error("--grid and --preset exclude each other")
        if args.variants:
            try:
                variants, family = select_variants(preset, args.variants)
            except ConfigError as e:
                parser.error(f"{e} (preset {args.preset})")
        return config, variants, baseline, family
    if args.variants:
        parser.error("--variants selects among a --preset's variants")
    if not (args.config and args.grid):
        parser.error("give --preset NAME, or --config CONFIG with at least one --grid")
    return args.config, grid_variants(args.grid), None, {}


def _only(parser: argparse.ArgumentParser, args: argparse.Namespace, labels: list[str]
          ) -> list[tuple[str, int]] | None:
    """``--only``'s runs as (label, seed), in its order; None without it. One line and exit 2 for an item that is
    no run of the study, or without --train-only or --decode-only (statistics and a report read every run)."""
    if args.only is None:
        return None
    if not (args.train_only or args.decode_only):
        parser.error("--only trains or decodes some runs (--train-only or --decode-only); statistics and a report "
                     "read every run of the study")
    runs: list[tuple[str, int]] = []
    for item in (x.strip() for x in args.only.split(",")):
        label, _, seed = item.rpartition(":")
        if label not in labels:
            parser.error(f"--only {item!r}: not LABEL:SEED with a label of the study's variants "
                         f"({', '.join(labels)})")
        if not (seed.isascii() and seed.isdigit()) or not 1 <= int(seed) <= args.seeds:
            parser.error(f"--only {item!r}: the seed must be one of 1..{args.seeds} (--seeds {args.seeds})")
        if (label, int(seed)) not in runs:
            runs.append((label, int(seed)))
    return runs


def _check_values(parser: argparse.ArgumentParser, args: argparse.Namespace, variants: list[Variant],
                  user_sets: list[str]) -> None:
    """Counts at least 1, two seeds to score, no key the study decides, no ``--set`` a variant overrides."""
    for value, flag in ((args.seeds, "--seeds"), (args.steps, "--steps"), (args.tokens, "--tokens"),
                        (args.bootstrap, "--bootstrap"), (args.attention_sentences, "--attention-sentences"),
                        (args.eval_every, "--eval-every"), (args.max_sentences, "--max-sentences"),
                        (args.jobs, "--jobs")):
        if value is not None and value < 1:
            parser.error(f"{flag} must be >= 1, got {value}")
    if args.seeds > MAX_SEEDS:
        parser.error(f"--seeds must be at most {MAX_SEEDS}, got {args.seeds}")
    if args.seeds < 2 and not (args.train_only or args.decode_only):  # refused before anything runs
        parser.error("scoring and the report need --seeds 2 or more (seeds are the blocks of every test); "
                     "train a pilot with --train-only, or decode runs with --decode-only")
    for flag, items in (("--set", args.overrides), ("--grid", args.grid)):  # what the study decides per run
        for item in items:
            key = item.partition("=")[0].strip()
            if key in STUDY_KEYS:
                parser.error(f"{flag} {key} is decided by the study ({STUDY_KEYS[key]}); leave it out")
    check_sets(user_sets, variants, grid=bool(args.grid))
    if args.tokens and any(o.startswith("tokenizer.") for v in variants for o in v.overrides):
        parser.error("--tokens counts each tokenizer's own tokens, not an equal budget across tokenizations; "
                     "use --steps")


def _decoders(parser: argparse.ArgumentParser, args: argparse.Namespace, asked: list[str],
              family: dict[str, Any]) -> dict[str, int]:
    """``--decoders``: name -> beam size, in the report's order whatever the order asked; beam 5 is always among
    them (the primary family and the report's tables)."""
    if not asked or any(d not in [*DECODERS, LENGTH_DECODER] for d in asked):
        parser.error(f"--decoders {args.decoders}: give some of {', '.join([*DECODERS, LENGTH_DECODER])}")
    decoders = {d: beam for d, beam in DECODERS.items() if d in asked}
    if "beam5" not in decoders or (family or {}).get("decoder", "beam5") not in decoders:
        parser.error(f"--decoders {args.decoders}: beam5 is needed (the primary family and the report's tables)")
    return decoders


def _splits(parser: argparse.ArgumentParser, args: argparse.Namespace, tests: list[str],
            family: dict[str, Any]) -> list[str]:
    """``--splits`` (default: every test split of the config); the primary family's, and the x1 split of each of
    its drops, must be among them."""
    splits = list(tests)
    if args.splits:
        splits = [x.strip() for x in args.splits.split(",") if x.strip()]
        if not splits or any(x not in tests for x in splits):
            parser.error(f"--splits {args.splits}: not among the config's test splits ({', '.join(tests)})")
    needed = [*(family.get("splits") or []), *(family.get("drops") or {}).values(), *(family.get("drops") or {})]
    if family and (missing := [x for x in dict.fromkeys(needed) if x not in splits]):
        where = f"--splits {args.splits}" if args.splits else f"the config's test splits ({', '.join(splits)})"
        parser.error(f"{where}: the primary family needs {', '.join(missing)} too")
    return splits


def _load_variants(args: argparse.Namespace, config: str, variants: list[Variant], budget_sets: list[str],
                   what: str) -> tuple[list[str], dict[str, int]]:
    """Load every variant's config, and each test variant's (inference-only keys alone), and check that the
    trained ones fit this machine's memory (unless ``--score-only``) and differ: before anything runs. The
    systems' labels, and the accumulation of each run that accumulates gradients (the progress lines' steps)."""
    from models.memory import check as check_memory
    from utils.config import load_config

    accumulate: dict[str, int] = {}
    configs: dict[str, dict[str, Any]] = {}
    for v in variants:
        trained = load_config(config, [*args.overrides, *v.overrides, *budget_sets])
        if not (args.score_only or args.decode_only):
            check_memory(trained)
        configs[v.label] = trained.to_dict()
        if trained.train.accumulate != 1:
            accumulate |= {f"{v.label} seed {seed}": trained.train.accumulate for seed in range(1, args.seeds + 1)}
        tested = {v.label: configs[v.label]}
        for tag, extra in v.tests.items():
            cfg = load_config(config, [*args.overrides, *v.overrides, *budget_sets, *extra])
            inference_only(trained, cfg, f"{v.label}+{tag}")
            tested[f"{v.label}+{tag}"] = cfg.to_dict()
        check_distinct(tested, "--test-variant")
    check_distinct(configs, what)
    return [*configs, *(f"{v.label}+{t}" for v in variants for t in v.tests)], accumulate


def define(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Study:
    """The study the command line describes, every check passed and every config loaded before anything is
    written: a bad flag or value is one line and exit 2 (``parser.error``), a config that cannot be a study's a
    ConfigError; a study another process runs is refused at once."""
    gpu_sets: list[str] = []  # no --jobs with a CUDA GPU here: its preset (utils/study/gpu.py)
    if args.jobs is None:
        args.jobs, gpu_sets = study_defaults(args.launcher)
        if gpu_sets:
            gpus = args.jobs // STUDY_RUNS_PER_GPU
            print(f"study: {'a CUDA GPU' if gpus == 1 else f'{gpus} CUDA GPUs'}: {args.jobs} runs at a time"
                  f"{'' if gpus == 1 else f' ({STUDY_RUNS_PER_GPU} on each)'}, each with {' '.join(gpu_sets)} "
                  "(configs/gpu_study.yaml; --jobs N to choose)", flush=True)
    user_sets = list(args.overrides)
    config, variants, baseline, family = _systems(parser, args)
    name = args.name or args.preset
    if not name:
        parser.error("--name is required without --preset")
    folder = Path(args.runs) / f"study_{slug(name)}"
    launcher = study_launcher(parser, args, folder)  # checked before anything is read or written
    from utils.study.files import read_spec
    from utils.study.lock import check_free

    check_free(folder)  # another process runs this study: refused at once, nothing read or written
    spec_file = folder / "study.json"
    recorded = read_spec(spec_file) if spec_file.is_file() else None  # this study's, when resumed
    for other in args.merge:  # checked before the study's folder is made
        if not (Path(other) / "runs").is_dir():
            parser.error(f"--merge {other}: not a study folder (it has no runs/)")
    if args.grid and recorded is not None:
        variants = recorded_labels(variants, recorded)
    _check_values(parser, args, variants, user_sets)
    add_test_variants(variants, args.test_variant)
    if args.family is not None:  # declared in a file: it replaces the preset's, and must fit the study as it is
        family = read_family(args.family)
        check_family(family, [*(v.label for v in variants), *(f"{v.label}+{t}" for v in variants for t in v.tests)],
                     args.baseline or baseline or variants[0].label, f"--family {args.family}")
    for v in variants:
        for extra in v.tests.values():
            for key in (x.partition("=")[0].strip() for x in extra):
                if key in STUDY_KEYS:
                    parser.error(f"--test-variant {key} is decided by the study ({STUDY_KEYS[key]}); leave it out")
    asked = [d.strip() for d in args.decoders.split(",") if d.strip()]
    decoders = _decoders(parser, args, asked, family)
    labels = [v.label for v in variants]
    baseline = args.baseline or baseline or labels[0]
    if baseline not in labels:
        parser.error(f"--baseline {baseline!r} is not a variant; variants: {', '.join(labels)}")
    args.only = _only(parser, args, labels)

    from utils.config import load_config

    eval_every = args.eval_every or max(1, (args.steps or 1000) // 5)
    budget_sets = budget_overrides(args.steps, args.tokens, eval_every)  # in every load: keys may need the budget
    base_cfg = load_config(config, [*gpu_sets, *args.overrides, *budget_sets])
    splits = _splits(parser, args, list(base_cfg.data.test), family)
    systems, accumulate = _load_variants(args, config, variants, budget_sets,
                                         "--grid" if args.grid else f"--preset {args.preset}")
    spec = {"command": " ".join(sys.argv), "config": config, "variants": [v.__dict__ for v in variants],
            "baseline": baseline, "seeds": list(range(1, args.seeds + 1)), "steps": args.steps, "tokens": args.tokens,
            "overrides": args.overrides, "checkpoint": args.checkpoint, "max_sentences": args.max_sentences,
            "attention_sentences": args.attention_sentences, "family": family}
    if args.splits or list(decoders) != list(DECODERS):  # a study scored on part of its sets or decoders says so
        spec |= {"splits": splits, "decoders": list(decoders)}
    length = LengthRule.declare(family, splits, systems, baseline) if LENGTH_DECODER in asked else None
    if length is not None:  # the rule is recorded before anything is scored with it
        spec["length_control"] = length.to_dict()
    if recorded is not None:
        spec = merge_spec(recorded, spec, folder)
    if family.get("sequential"):  # seeds past the declared design's last look: refused before anything runs
        look_fractions(Design.from_dict(family["sequential"]), args.seeds)
    import torch

    return Study(args, name, folder, config, variants, baseline, family, args.overrides, gpu_sets, budget_sets,
                 decoders, splits, base_cfg.data, accumulate, spec, recorded, length, launcher,
                 torch.cuda.device_count())
