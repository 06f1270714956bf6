"""The study this toolkit exists for: a grid of configurations x seeds trained at an equal budget, every run
scored on every test split (beam 5 and greedy), attention quantified, and a report that says which
differences are significant.

    python bench/study.py --config configs/bench_small_rope.yaml --grid model.attention_pe=none,rope,alibi,t5,shaw \\
        --grid model.input_pe=sinusoidal,none --seeds 3 --steps 1500 --name pe
    python bench/study.py --preset seed-table --seeds 3 --steps 1500          # sinusoidal / learnable / RoPE
    python bench/study.py --preset all-encodings --seeds 3 --steps 1500
    python bench/study.py --preset train-short-test-long --seeds 3 --steps 1500
    python bench/study.py --preset tokenization --seeds 3 --steps 1500

Budget: ``--steps`` optimizer steps or ``--tokens`` target tokens per run, never wall time, so a busy
machine cannot bias the comparison. Each (variant, seed) is a normal run directory under
``runs/study_<name>/runs/<variant>/seed<k>/`` that train.py, test.py and visualize.py understand. The
study is resumable and idempotent: run the same command again and finished runs and evaluations are
skipped, a run killed mid-training is resumed from its last checkpoint. A run that another study in the
same ``--runs`` folder already finished with exactly the same config (seed and budget included) is linked,
not trained again: ``all-encodings`` reuses ``seed-table``'s sinusoidal, learnable and RoPE runs (``--no-link``
trains them again: a config does not pin the code, e.g. runs from another commit whose loss sums in another
order; comparisons are exactly paired only among runs trained by the same code). With
several GPUs, one process per device. Writes ``results.json`` (every number), ``report.md`` (tables,
figures, significance in words), ``figures/*.png`` and ``tb/`` (TensorBoard HParams: compare the runs in
the HParams tab).

Test-time variants: ``--test-variant rope+linear:model.rope.scaling=linear,model.rope.factor=8`` scores the
trained models of variant ``rope`` again under inference-only overrides, as the system ``rope+linear``
(``train-short-test-long`` does this for the RoPE length extensions), compared with its baseline and with
its own trained variant (paired over seeds: the same models).

Statistics (bench/study_analysis.py, bench/study_stats.py): seeds are blocks (seed k gives every variant the
same tokenizer and batch order). Every difference with the baseline is the mean over seeds of the per-seed
difference, tested across seeds (the contrast of a blocked two-way ANOVA) and across test sentences (a paired
bootstrap of that same quantity, 10,000 resamples); a preset's primary family (chrF by default) is
Holm-corrected and a difference is resolved when both tests reject and agree in sign; power comes from a
smallest effect fixed in advance (1 chrF). Everything else is labelled exploratory. Every system's hypotheses
are published with the report (``hypotheses/``), and ``python bench/study_report.py STUDY_DIR`` recomputes
the report from the published files alone.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as bench/study.py: the repository root first

from bench.common import ROOT, project_command  # noqa: E402
from bench.gpu_presets import study_defaults  # noqa: E402
from bench.study_arms import NATURAL_FAMILY, NATURAL_LENGTH, NATURAL_SYSTEMS  # noqa: E402
from bench.study_decoders import DECODERS, LENGTH_DECODER  # noqa: E402
from bench.study_files import slug  # noqa: E402
from bench.study_length_control import LengthRule, add_length_results, score_length  # noqa: E402
from bench.study_runs import (  # noqa: E402
    Progress,
    compute_attention,
    eval_current,
    eval_file,
    file_tag,
    read_attention,
    run_cfg,
)
from utils.cli import add_set_arg  # noqa: E402
from utils.config import ConfigError  # noqa: E402
from utils.run.layout import RunDir  # noqa: E402
from utils.study.launch import LAUNCHERS, JobFailed, Launcher, LaunchError, Resources, die_with_parent  # noqa: E402
from utils.study.looks import Design, look_fractions  # noqa: E402
from utils.study.provenance import Target, merge, record_runs  # noqa: E402


@dataclass
class Variant:
    """One configuration of the grid: a label and its ``--set`` overrides; ``tests`` adds evaluations of the
    same trained model under inference-only overrides (e.g. RoPE scalings), label -> overrides."""

    label: str
    overrides: list[str]
    tests: dict[str, list[str]] = field(default_factory=dict)


@dataclass
class Preset:
    config: str
    variants: list[Variant]
    baseline: str
    overrides: list[str] = field(default_factory=list)  # applied to every run, before the study's --set
    family: dict[str, Any] = field(default_factory=dict)  # the primary analysis (bench.study_analysis.Family)


# Length-shifted test sets (data.sources: NAME.xK joins K consecutive pairs): the training data's vocabulary and
# style at about 1, 2, 4 and 8 times its sentence length; TED mixes a length and a domain shift.
LENGTH_SHIFTED = [f"test.{name}{f'.x{k}' if k > 1 else ''}" for name in ("tatoeba", "multi30k-2016")
                  for k in (1, 2, 4, 8)] + ["test.iwslt-tst2010"]


# The encodings of the pre-registered families, named one by one (as bench/study_arms.py names its systems), not
# read from the registry: a preset never grows by itself when an encoding is registered later (a new one is studied
# with --grid, or joins a preset by an edit here that says so). Input-level; attention-level in both stacks; and for
# causal (decoder) self-attention only, which validation refuses in the encoder (studied with RoPE in the encoder).
INPUT_ENCODINGS = ("sinusoidal", "learnable", "learnable_ln", "onehot", "gaussian", "binary")
ATTENTION_ENCODINGS = ("rope", "alibi", "t5", "shaw", "kerple_log", "kerple_power", "sandwich", "fire", "dpb")
DECODER_ONLY_ENCODINGS = ("cope", "xpos")


def _pe(label: str, input_pe: str, attention_pe: str) -> Variant:
    return Variant(label, [f"model.input_pe={input_pe}", f"model.attention_pe={attention_pe}"])


# The pre-registered primary analysis of train-short-test-long (README, "Pre-registration"): chrF, beam 5, on
# the x4 sets and each run's drop from x1 to x4; RoPE+linear is exploratory.
EXTRAPOLATION_FAMILY = {
    "metric": "chrF", "decoder": "beam5", "splits": ["test.tatoeba.x4", "test.multi30k-2016.x4"],
    "drops": {"test.tatoeba.x4": "test.tatoeba", "test.multi30k-2016.x4": "test.multi30k-2016"},
    "systems": ["learnable", "rope", "rope+ntk", "rope+yarn", "alibi", "t5"], "smallest_effect": 1.0, "alpha": 0.05,
    "declared": "pre-registered in README on 2026-11-25, before the runs"}


def presets() -> dict[str, Preset]:
    inputs, attentions, decoder_only = INPUT_ENCODINGS, ATTENTION_ENCODINGS, DECODER_ONLY_ENCODINGS
    short_scalings = {s: [f"model.rope.scaling={s}", "model.rope.factor=8", "model.rope.original_max_len=16"]
                      for s in ("linear", "ntk", "yarn")}
    short = [_pe(e, e, "none") for e in ("sinusoidal", "learnable")] + [_pe(e, "none", e) for e in ("alibi", "t5")]
    rope = _pe("rope", "none", "rope")
    rope.tests = short_scalings
    # RoPE in the encoder, no position at all in the decoder: its causal mask carries order (NoPE, Kazemnejad et
    # al. 2023). Joined the presets after the extrapolation study was pre-registered: exploratory there.
    decoder_nope = Variant("decoder-nope", ["model.input_pe=none", "model.attention_pe=rope",
                                            "model.decoder_pe.attention=none"])
    # An encoding for decoder self-attention only (CoPE) is studied as decoder-nope is, with RoPE in the encoder:
    # the two differ in the decoder's encoding alone.
    # Attention-level encodings registered after the extrapolation study was pre-registered (KERPLE, Sandwich,
    # FIRE, ...): in its preset, exploratory there, like decoder-nope, decoder-<causal-only> and sinusoidal+shape.
    newer = [_pe(e, "none", e) for e in attentions if e not in ("rope", "alibi", "t5", "shaw")]
    decoder_own = [Variant(f"decoder-{e}", ["model.input_pe=none", "model.attention_pe=rope",
                                            f"model.decoder_pe.attention={e}"]) for e in decoder_only]
    # SHAPE (Kiyono et al. 2021) on the sinusoids: in training every position of a stack is shifted by one k ~
    # U{0..100} (model.augment; inference unchanged). Joined the presets after the extrapolation study was
    # pre-registered: exploratory there.
    shape = Variant("sinusoidal+shape", ["model.input_pe=sinusoidal", "model.attention_pe=none",
                                         "model.augment.method=shape", "model.augment.shape.max_shift=100"])
    long_tests = [f"data.test=[{','.join(LENGTH_SHIFTED)}]", "train.amp=none", "train.amp_cpu=false",
                  "train.keep_checkpoints=0", "train.num_threads=1"]
    return {
        "seed-table": Preset("configs/bench_small.yaml", [_pe("sinusoidal", "sinusoidal", "none"),
                                                          _pe("learnable", "learnable", "none"),
                                                          _pe("rope", "none", "rope")], "sinusoidal"),
        "all-encodings": Preset("configs/bench_small.yaml", [_pe("none", "none", "none")]
                                + [_pe(e, e, "none") for e in inputs] + [_pe(e, "none", e) for e in attentions]
                                + [decoder_nope, *decoder_own, shape], "sinusoidal"),
        # Precision and CPU threads are part of the design (fp32 and one thread per run on every machine: a
        # thread count can change floating-point results); periodic checkpoints are resume points only.
        "train-short-test-long": Preset("configs/bench_short.yaml", [*short, rope, *newer, decoder_nope, *decoder_own,
                                                                     shape], "sinusoidal", long_tests,
                                        family=EXTRAPOLATION_FAMILY),
        # Its natural-length arm (bench/study_arms.py): the same systems trained on pairs of every length.
        "train-natural-test-long": Preset("configs/bench_short.yaml", [Variant(*v) for v in NATURAL_SYSTEMS],
                                          "sinusoidal", [*long_tests, NATURAL_LENGTH], family=NATURAL_FAMILY),
        "tokenization": Preset("configs/bench_small_rope.yaml", [
            Variant("bpe", ["tokenizer.type=bpe"]),
            Variant("unigram", ["tokenizer.type=unigram", *_same_sentences(1.125)]),
            Variant("char", ["tokenizer.type=char", "tokenizer.vocab_size=1000", "data.max_len=512",
                             "model.max_positions=1024", *_same_sentences(4.0)]),
            Variant("word", ["tokenizer.type=word", "tokenizer.vocab_size=32000", "tokenizer.min_frequency=2",
                             *_same_sentences(1.04)]),
        ], "bpe"),
    }


def _same_sentences(scale: float) -> list[str]:
    """Batch, lr reference and warmup of bench_small in a tokenizer's own tokens, for one that makes ``scale``
    times as many tokens per sentence as its BPE 8000 (bench training data, max of source and target, eos
    included: bpe 10.9, unigram 12.3, word 11.4, char 44.3): every tokenization then sees about the same
    sentences per optimizer step with about the same peak lr and warmup steps (train.py derives both from the
    target tokens it measures per batch), so ``--steps`` is an equal budget."""
    return [f"data.max_tokens={round(4096 * scale)}", f"train.lr_batch_tokens={round(3500 * scale)}",
            f"train.warmup_tokens={round(750_000 * scale)}"]


# Key parts that say what a value is but not where: a label keeps the part before them (which stack).
_PLACE_PARTS = {"input", "attention"}


def grid_labels(keys: Sequence[str]) -> dict[str, str]:
    """Each grid key's label: its shortest ending that no other key of the grid shares, never a bare ``input`` or
    ``attention`` (``model.encoder_pe.attention`` -> ``encoder_pe.attention``, ``model.attention_pe`` ->
    ``attention_pe``), so per-stack axes say which stack they set."""
    def ending(key: str, n: int) -> str:
        return ".".join(key.split(".")[-n:])

    labels = {}
    for key in keys:
        n = 2 if key.split(".")[-1] in _PLACE_PARTS and "." in key else 1
        while n < len(key.split(".")) and any(ending(o, n) == ending(key, n) for o in keys if o != key):
            n += 1
        labels[key] = ending(key, n)
    return labels


def grid_variants(grids: Sequence[str]) -> list[Variant]:
    """``["a.b=1,2", "c=x,y"]`` -> the cross product, labelled ``b=1,c=x`` (each key by ``grid_labels``)."""
    axes = []
    for item in grids:
        key, sep, values = item.partition("=")
        axis = [(key.strip(), v.strip()) for v in values.split(",") if v.strip()]
        if not sep or not key.strip() or not axis:
            raise ConfigError(f"--grid {item!r}: expected KEY=V1,V2,... e.g. model.attention_pe=rope,alibi")
        if any(other[0][0] == key.strip() for other in axes):
            raise ConfigError(f"--grid {key.strip()} is given twice: put all its values in one --grid "
                              f"{key.strip()}=V1,V2,...")
        values = [v for _, v in axis]
        if twice := sorted({v for v in values if values.count(v) > 1}):
            raise ConfigError(f"--grid {item.strip()}: {', '.join(twice)} given twice; each value once")
        axes.append(axis)
    names = grid_labels([axis[0][0] for axis in axes])
    variants = []
    for combo in itertools.product(*axes):
        label = ",".join(f"{names[k]}={v}" for k, v in combo)
        variants.append(Variant(label, [f"{k}={v}" for k, v in combo]))
    return variants


def recorded_labels(variants: list[Variant], recorded: dict[str, Any]) -> list[Variant]:
    """The variants with the label that a study's ``study.json`` (``recorded``) gives the same overrides: a grid
    study an earlier version labelled otherwise (before ``grid_labels`` named the stack) keeps its labels, which name
    its run folders, and resumes."""
    labels = {tuple(v["overrides"]): v["label"] for v in recorded.get("variants", [])}
    return [Variant(labels.get(tuple(v.overrides), v.label), v.overrides, v.tests) for v in variants]


def add_test_variants(variants: list[Variant], items: Sequence[str]) -> None:
    """``--test-variant [LABEL+]TAG:KEY=V,KEY=V``: score the trained models of variant LABEL (of every variant
    without ``LABEL+``) again under inference-only overrides, as the system ``LABEL+TAG``."""
    labels = {v.label: v for v in variants}
    for item in items:
        name, sep, sets = item.partition(":")
        label, plus, tag = name.rpartition("+")
        overrides = [x.strip() for x in re.split(r",(?=\s*[A-Za-z_][\w.]*\s*=)", sets) if x.strip()]
        if not sep or not re.fullmatch(r"[A-Za-z0-9_.-]+", tag) or not overrides or \
                any("=" not in x for x in overrides):
            raise ConfigError(f"--test-variant {item!r}: expected [LABEL+]TAG:KEY=VALUE[,KEY=VALUE...], e.g. "
                              "rope+linear:model.rope.scaling=linear,model.rope.factor=8 (TAG: letters, digits, _ . -)")
        if plus and label not in labels:
            raise ConfigError(f"--test-variant {item!r}: no variant {label!r}; variants: {', '.join(labels)}")
        for v in [labels[label]] if plus else variants:
            if tag in v.tests:
                raise ConfigError(f"--test-variant {item!r}: {v.label} already has a test variant {tag!r}")
            v.tests[tag] = overrides
    names = [v.label for v in variants] + [f"{v.label}+{tag}" for v in variants for tag in v.tests]
    if len(set(names)) < len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise ConfigError(f"two systems would share a name: {', '.join(twice)}")


def inference_only(trained: Any, tested: Any, name: str) -> None:
    """A test variant may change how a trained model is run (decoding, RoPE scaling), not what was trained
    or which data it is scored on."""

    from utils.run.load import check_compatible

    check_compatible(trained, tested, f"--test-variant {name}")
    if trained.data.to_dict() != tested.data.to_dict():
        raise ConfigError(f"--test-variant {name} changes data settings; a test variant changes inference only")


def _covers(a: str, b: str) -> bool:
    """Whether setting key ``a`` sets key ``b`` or the other way round (``model.rope`` and ``model.rope.theta``)."""
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


def check_sets(sets: Sequence[str], variants: Sequence[Variant], grid: bool) -> None:
    """ConfigError, one line, for a ``--set`` of a key that a variant also sets: the variant's value would silently
    win in its runs (``grid``: the variants are a ``--grid``'s, else a preset's)."""
    for item in sets:
        key = item.partition("=")[0].strip()
        for v in variants:
            other = next((o.partition("=")[0].strip() for o in v.overrides
                          if _covers(key, o.partition("=")[0].strip())), None)
            if other is not None:
                by = f"--grid {other}" if grid else f"the preset's variant {v.label} ({other})"
                raise ConfigError(f"--set {item.strip()}: {by} sets it too, and would silently win in its runs; "
                                  "set each key in one place")


def check_distinct(configs: dict[str, dict[str, Any]], flag: str) -> None:
    """ConfigError, one line, if two systems (label -> the config each runs) are the same config: they would train
    (or score) the same runs twice, e.g. ``--grid model.rope.theta=1e4,1E4``."""
    seen: dict[str, str] = {}
    for label, cfg in configs.items():
        same = seen.setdefault(json.dumps(cfg, sort_keys=True, default=str), label)
        if same != label:
            raise ConfigError(f"{flag}: {same} and {label} are the same config once their values are read (as 1e4 "
                              "and 1E4 are one number): the study would run it twice; give each value once")


# ---------------------------------------------------------------------------------------------- runs


STUDY_KEYS = {"seed": "--seeds", "train.max_steps": "--steps", "train.max_target_tokens": "--tokens",
              "train.max_minutes": "never wall time", "train.epochs": "the budget", "train.patience": "the budget",
              "train.eval_every": "--eval-every"}


def budget_overrides(steps: int | None, tokens: int | None, eval_every: int) -> list[str]:
    """The budget decides when a run ends: no wall-clock limit, no early stopping, epochs never run out."""
    out = ["train.max_minutes=null", "train.epochs=100000", "train.patience=1000000",
           f"train.eval_every={eval_every}"]
    out.append(f"train.max_steps={steps}" if steps else "train.max_steps=null")
    out.append(f"train.max_target_tokens={tokens}" if tokens else "train.max_target_tokens=null")
    return out


def run_dirs(root: Path) -> list[Path]:
    """The run directories in a seed folder (not the ``*_latest`` link, nor its views in ``.latest/``), oldest first;
    none if it does not exist."""
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink() and not p.name.startswith(".")) \
        if root.is_dir() else []


def find_run(root: Path, poll: float = 2.0) -> Path | None:
    """The run directory under ``root`` that has a checkpoint (runs killed before their first are removed).
    A run another process still trains in (its lock is held: e.g. the child of a study just killed, finishing
    its step) is waited for, never removed or trained at the same time."""
    import time

    from utils.run.store import discard_if_untrained, has_results, run_locked_by

    runs = run_dirs(root)
    for run in runs:
        said = False
        while (pid := run_locked_by(run)) is not None:
            if not said:
                print(f"  waiting for pid {pid}, which still trains in {run}", flush=True)
                said = True
            time.sleep(poll)
    for run in runs:
        if not discard_if_untrained(run) and not RunDir(run).last.is_file() and not has_results(run):
            shutil.rmtree(run)  # killed between a periodic checkpoint and its last.pt: nothing to resume from
    runs = [p for p in runs if p.is_dir()]
    return runs[-1] if runs else None


def training_elsewhere(root: Path) -> int | None:
    """The pid of another process training a run under ``root`` (a seed folder), else None."""
    from utils.run.store import run_locked_by

    return next((pid for run in run_dirs(root) if (pid := run_locked_by(run)) is not None), None)


def shared_run(job: Job, study: Path, expected: dict[str, Any], steps: int | None, tokens: int | None) -> Path | None:
    """A seed folder of another study in the same runs folder whose finished run has exactly the config this
    job would train (e.g. seed-table's runs inside all-encodings): link it instead of training it again."""
    from utils.config import ConfigError, load_config

    for other in sorted(study.parent.glob("study_*/runs/*/seed*")):
        if other.is_symlink() or study in other.parents or not other.is_dir():
            continue
        runs = [p for p in run_dirs(other) if RunDir(p).last.is_file()]
        if not runs:
            continue
        try:
            same = load_config(RunDir(runs[-1]).config).to_dict() == expected
        except ConfigError:
            continue
        if same and training_done(runs[-1], steps, tokens):
            job.root.parent.mkdir(parents=True, exist_ok=True)
            job.root.symlink_to(os.path.relpath(other, job.root.parent), target_is_directory=True)
            return other
    return None


ENDPOINT_KEYS = ("metric", "decoder", "splits", "drops")  # what makes two families test the same quantities


def linked_elsewhere(jobs: list[Job], baseline: str, family: dict[str, Any], scoring: dict[str, Any]) -> dict[str, str]:
    """Each system whose runs and the baseline's, every seed, are linked from one other study that already tested it
    against that baseline in its primary family -> that study's name. Its contrast stays in that family
    (``Family.elsewhere``): the same runs get the same test in every report (e.g. the seed table's learnable and
    RoPE runs inside all-encodings). That study must test the same endpoint (``ENDPOINT_KEYS``) of the same scoring
    (``scoring``: checkpoint and max_sentences) and hold the results; a test variant (``rope+ntk``) counts when the
    other study scored its base with the same inference-only settings and tested it too."""
    def source(job: Job) -> tuple[Path, str] | None:
        if not job.root.is_symlink():
            return None
        target = job.root.resolve()  # <runs>/study_<name>/runs/<variant slug>/seed<k>
        return target.parents[2], target.parent.name

    def sources(label: str) -> set[tuple[Path, str] | None]:
        return {source(j) for j in jobs if j.variant.label == label}

    base = sources(baseline)
    if len(base) != 1 or None in base:
        return {}
    (other, base_slug), = base
    from bench.study_analysis import Family

    try:
        spec = json.loads((other / "study.json").read_text())
        primary = json.loads((other / "results.json").read_text())["primary"]
        labels = {slug(v["label"]): v for v in spec["variants"]}
        theirs, ours = Family(**(spec.get("family") or {})), Family(**family)  # defaults filled in: compared as used
        tested = {t["system"] for t in primary["tests"] if t["against"] == spec["baseline"]}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # no such study, not scored, or unreadable
        return {}
    if (labels.get(base_slug, {}).get("label") != spec["baseline"]
            or any(getattr(theirs, k) != getattr(ours, k) for k in ENDPOINT_KEYS)
            or any(spec.get(k) != v for k, v in scoring.items())):
        return {}
    out = {}
    for variant in {j.variant.label: j.variant for j in jobs if j.variant.label != baseline}.values():
        found = sources(variant.label)
        if len(found) != 1 or None in found:
            continue
        (where, variant_slug), = found
        mine = labels.get(variant_slug)
        if where != other or mine is None or mine["label"] not in tested:
            continue
        out[variant.label] = other.name.removeprefix("study_")
        for tag, extra in variant.tests.items():
            if (mine.get("tests") or {}).get(tag) == extra and f"{mine['label']}+{tag}" in tested:
                out[f"{variant.label}+{tag}"] = other.name.removeprefix("study_")
    return out


def training_done(run: Path, steps: int | None, tokens: int | None) -> bool:
    from utils.run.checkpoint import load_checkpoint

    if not RunDir(run).last.is_file():  # scored, then its checkpoints removed: what its closing summary says
        try:
            done = json.loads(RunDir(run).summary_json.read_text())
        except (OSError, json.JSONDecodeError):
            return False
        return bool(steps and done.get("run_steps", 0) >= steps
                    or tokens and done.get("run_target_tokens", 0) >= tokens)
    state = load_checkpoint(RunDir(run).last)
    accumulate = run_cfg(run).train.accumulate
    if steps and state["trainer"]["iteration"] >= steps * accumulate:
        return True
    return bool(tokens) and int(state.get("tokens_seen", {}).get("tokens", 0)) >= tokens


def recorded_step(run: Path, checkpoint: str) -> int | None:
    """The training step that every score file of ``checkpoint`` in the run records (test.py writes it), when
    there is at least one and they agree; else None. The step of a scored run whose checkpoint is gone (deleted
    to save disk, or the run fetched from another machine without its weights)."""
    steps = set()
    for path in RunDir(run).eval_dir.glob(f"*.{checkpoint}.beam*.json"):
        if path.name.startswith("all."):  # test.py's summary of several splits: each split's own file says
            continue
        try:
            steps.add(json.loads(path.read_text()).get("step"))
        except (OSError, json.JSONDecodeError):
            return None
    return steps.pop() if len(steps) == 1 and isinstance(next(iter(steps)), int) else None


def checkpoint_step(run: Path, checkpoint: str) -> int:
    """The training step (iterations, as test.py records them) of the run's ``checkpoint``, read from the file,
    or, where the file is gone, the step its score files record; ConfigError if neither says."""
    from utils.run.checkpoint import load_checkpoint

    path = RunDir(run).checkpoint(checkpoint)
    if not path.is_file():
        step = recorded_step(run, checkpoint)
        if step is None:
            raise ConfigError(f"{path}: no such checkpoint, and no score file of it records its step")
        return step
    trainer = load_checkpoint(path).get("trainer")
    return int(trainer.get("iteration", 0)) if isinstance(trainer, dict) else 0


def scored_step(run: Path, checkpoint: str, steps: int | None) -> int:
    """The training step of the checkpoint a study scores; ConfigError if it is ``last`` and not exactly the
    step budget (a run trained past it, or stopped short, is not the model the study declares)."""
    step = checkpoint_step(run, checkpoint)
    accumulate = run_cfg(run).train.accumulate
    if checkpoint == "last" and steps and step != steps * accumulate:
        raise ConfigError(f"{RunDir(run).checkpoint(checkpoint)} is at step {step // accumulate}, not the study's "
                          f"budget of {steps}: not the model this study scores")
    return step


@dataclass
class Job:
    variant: Variant
    seed: int
    root: Path  # runs/study_<name>/runs/<variant>/seed<k>

    @property
    def key(self) -> str:
        return f"{self.variant.label} seed {self.seed}"


def train_command(job: Job, config: str, overrides: list[str], budget: list[str]) -> list[str]:
    """train.py for a job: the study's ``--set`` first, the variant's keys over them, then the seed and budget."""
    run = find_run(job.root)
    if run is None:
        return project_command("train.py", "--config", config, "--runs", job.root,
                               overrides=[*overrides, *job.variant.overrides, f"seed={job.seed}", *budget])
    # a killed run continues from its last checkpoint; only the budget keys are set again
    return project_command("train.py", "--resume", run, overrides=budget)


def slot_envs(devices: int, jobs: int) -> list[dict[str, str]]:
    """The environment of each slot commands run in: one per GPU when there are several, else ``jobs`` on the
    CPU, each limited to its share of the cores (``OMP_NUM_THREADS``: two runs of one thread each keep both cores
    busy without the stalls two threads suffer when anything else wants a core)."""
    if devices > 1:
        return [{"CUDA_VISIBLE_DEVICES": str(device)} for device in range(devices)]
    threads = {"OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // jobs))} if jobs > 1 else {}
    return [dict(threads) for _ in range(max(1, jobs))]


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


def run_commands(commands: list[tuple[str, list[str], Path]], devices: int, poll: float = 2.0,
                 jobs: int = 1, progress: Progress | None = None, launcher: Launcher | None = None) -> None:
    """Run (label, argv, log) commands in the slots of ``slot_envs``, a slot taking the next command as soon as
    its own ends; with a ``launcher`` (``--launcher slurm`` or ``submitit-local``) each command is one of its jobs
    instead (submitit-local: in the same slots; SLURM: all submitted, the cluster runs them). ``progress``
    (default: one made of the labels) says on the terminal what starts, validates and ends, every ``poll``
    seconds at most."""
    progress = progress or Progress([label for label, _, _ in commands])
    try:
        if launcher is None:
            _run_commands(commands, devices, poll, jobs, progress)
            return
        try:
            launcher.run(commands, ROOT, progress, None if launcher.kind == "slurm" else slot_envs(devices, jobs),
                         poll)
        except JobFailed as e:
            raise SystemExit(f"study: {e}") from None
    finally:
        progress.close()


def _run_commands(commands: list[tuple[str, list[str], Path]], devices: int, poll: float, jobs: int,
                  progress: Progress) -> None:
    import time

    pending = list(commands)
    active: list[tuple[str, subprocess.Popen, Path]] = []
    slots = slot_envs(devices, jobs)
    free = list(range(len(slots)))
    while pending or active:
        while pending and free:
            label, cmd, log = pending.pop(0)
            slot = free.pop(0)
            env = {**os.environ, **slots[slot]}
            log.parent.mkdir(parents=True, exist_ok=True)
            progress.say(f"  {label}: {' '.join(cmd[1:])}")
            progress.started(label, log, resumed="--resume" in cmd)
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=open(log, "a"), stderr=subprocess.STDOUT,
                                    preexec_fn=die_with_parent(os.getpid()))
            proc.slot = slot  # type: ignore[attr-defined]
            active.append((label, proc, log))
        while not (done := [a for a in active if a[1].poll() is not None]):
            progress.poll()
            if len(active) == 1:  # back as soon as it ends
                with contextlib.suppress(subprocess.TimeoutExpired):
                    active[0][1].wait(timeout=poll)
            else:
                time.sleep(poll)
        label, proc, log = done[0]
        active.remove(done[0])
        progress.ended(label, ok=proc.returncode == 0)
        if proc.returncode != 0:
            for _, other, _ in active:  # stop the others (a signal makes train.py save last.pt): rerun resumes
                other.terminate()
            for _, other, _ in active:
                other.wait()
            raise SystemExit(f"study: {label} failed (exit {proc.returncode}); see {log}")
        free.append(proc.slot)  # type: ignore[attr-defined]


def merge_spec(old: dict[str, Any], spec: dict[str, Any], study: Path) -> dict[str, Any]:
    """The study folder's recorded spec and this command's: the same variants, config, overrides and token
    budget, and a step budget that is the same or raised (runs then continue from their last.pt, which on
    CPU is bit-identical to training that long from the start); ``budget_history`` records each raise."""
    trained = [[v["label"], v["overrides"]] for v in spec["variants"]]  # test variants may be added later
    if [[v["label"], v["overrides"]] for v in old.get("variants", [])] != trained:
        raise ConfigError(f"{study} holds a study with other variants; use another --name")
    for key in ("config", "tokens", "overrides"):
        if old.get(key) != spec[key]:
            raise ConfigError(f"{study} holds a study with another {key}; use another --name")
    history = old.get("budget_history", [old.get("steps")])
    if old.get("steps") != spec["steps"]:
        if not (old.get("steps") and spec["steps"] and spec["steps"] > old["steps"]):
            raise ConfigError(f"{study} holds a study of {old.get('steps')} steps; its budget can only be raised "
                              "(every run then continues from its last.pt, as if trained so long from the start)")
        print(f"study {study.name}: budget raised from {old['steps']} to {spec['steps']} steps", flush=True)
        history = [*history, spec["steps"]]
    return {**spec, "budget_history": history}


# ---------------------------------------------------------------------------------------------- main


def select_variants(preset: Preset, asked: str) -> tuple[list[Variant], dict[str, Any]]:
    """The preset's variants named in ``asked`` ("a,b,..."), its baseline always kept, and its primary family
    restricted to their systems (a test variant ``rope+ntk`` belongs to ``rope``); ConfigError for an unknown label."""
    labels = [label.strip() for label in asked.split(",") if label.strip()]
    known = [v.label for v in preset.variants]
    unknown = [label for label in labels if label not in known]
    if unknown or not labels:
        named = ", ".join(unknown) if unknown else repr(asked)
        raise ConfigError(f"--variants {named}: not a variant; variants: {', '.join(known)}")
    variants = [v for v in preset.variants if v.label in labels or v.label == preset.baseline]
    family = preset.family
    if family:
        family = {**family, "systems": [s for s in family["systems"] if s.split("+")[0] in labels]}
        if not family["systems"]:  # none of the declared contrasts: the same endpoint for newcomers, not that family
            family["declared"] = ("exploratory: none of the preset's declared contrasts among --variants; each chosen "
                                  "variant against the baseline, on the declared endpoint")
    return variants, family


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
    parser.add_argument("--seeds", type=int, default=3, help="seeds per variant: 1..N (default 3)")
    budget = parser.add_mutually_exclusive_group(required=True)
    budget.add_argument("--steps", type=int, help="optimizer steps per run")
    budget.add_argument("--tokens", type=int, help="target tokens per run")
    parser.add_argument("--eval-every", type=int, help="validation every N iterations (default: a fifth of --steps)")
    parser.add_argument("--name", help="study name: runs/study_<name>/ (default: the preset's name)")
    parser.add_argument("--baseline", help="variant label the others are compared with (default: the first)")
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
    parser.add_argument("--no-link", action="store_true",
                        help="train every run of this study, even one another study in --runs finished with the "
                             "same config (its code may differ: e.g. a baseline trained by an older commit)")
    stage = parser.add_mutually_exclusive_group()
    stage.add_argument("--train-only", action="store_true",
                       help="train (or resume) every run, then stop: a pilot, or scoring left to later")
    stage.add_argument("--score-only", action="store_true",
                       help="score and report runs already trained to the budget (e.g. by another checkout "
                            "of the code); refuse, training nothing, if one is not")
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
    from bench.study_lock import unlock_all

    try:
        return command()
    finally:
        unlock_all()


def command() -> int:
    """Plan, train, score and report the study the command line describes."""
    parser = build_parser()
    args = parser.parse_args()
    gpu_sets: list[str] = []  # no --jobs with a CUDA GPU here: its preset (bench/gpu_presets.py)
    if args.jobs is None:
        args.jobs, gpu_sets = study_defaults(args.launcher)
        if gpu_sets:
            print(f"study: a CUDA GPU: {args.jobs} runs at a time, each with {' '.join(gpu_sets)} "
                  "(configs/gpu_study.yaml; --jobs N to choose)", flush=True)

    family: dict[str, Any] = {}
    user_sets = list(args.overrides)
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
    elif args.variants:
        parser.error("--variants selects among a --preset's variants")
    elif args.config and args.grid:
        config, variants, baseline = args.config, grid_variants(args.grid), None
    else:
        parser.error("give --preset NAME, or --config CONFIG with at least one --grid")
    name = args.name or args.preset
    if not name:
        parser.error("--name is required without --preset")
    study = Path(args.runs) / f"study_{slug(name)}"
    launcher = study_launcher(parser, args, study)  # checked before anything is read or written
    from bench.study_files import read_spec
    from bench.study_lock import check_free, lock_study

    check_free(study)  # another process runs this study: refused at once, nothing read or written
    spec_file = study / "study.json"
    recorded = read_spec(spec_file) if spec_file.is_file() else None  # this study's, when resumed
    if args.grid and recorded is not None:
        variants = recorded_labels(variants, recorded)
    for value, flag in ((args.seeds, "--seeds"), (args.steps, "--steps"), (args.tokens, "--tokens"),
                        (args.bootstrap, "--bootstrap"), (args.attention_sentences, "--attention-sentences"),
                        (args.eval_every, "--eval-every"), (args.max_sentences, "--max-sentences"),
                        (args.jobs, "--jobs")):
        if value is not None and value < 1:
            parser.error(f"{flag} must be >= 1, got {value}")
    if args.seeds < 2 and not args.train_only:  # refused before anything runs, not at the report after the scoring
        parser.error("scoring and the report need --seeds 2 or more (seeds are the blocks of every test); "
                     "train a pilot with --train-only")
    for flag, items in (("--set", args.overrides), ("--grid", args.grid)):  # what the study decides per run
        for item in items:
            key = item.partition("=")[0].strip()
            if key in STUDY_KEYS:
                parser.error(f"{flag} {key} is decided by the study ({STUDY_KEYS[key]}); leave it out")
    check_sets(user_sets, variants, grid=bool(args.grid))
    if args.tokens and any(o.startswith("tokenizer.") for v in variants for o in v.overrides):
        parser.error("--tokens counts each tokenizer's own tokens, not an equal budget across tokenizations; "
                     "use --steps")
    add_test_variants(variants, args.test_variant)
    for v in variants:
        for extra in v.tests.values():
            for key in (x.partition("=")[0].strip() for x in extra):
                if key in STUDY_KEYS:
                    parser.error(f"--test-variant {key} is decided by the study ({STUDY_KEYS[key]}); leave it out")
    asked = [d.strip() for d in args.decoders.split(",") if d.strip()]
    if not asked or any(d not in [*DECODERS, LENGTH_DECODER] for d in asked):
        parser.error(f"--decoders {args.decoders}: give some of {', '.join([*DECODERS, LENGTH_DECODER])}")
    decoders = {d: beam for d, beam in DECODERS.items() if d in asked}  # in the report's order, whatever was asked
    if "beam5" not in decoders or (family or {}).get("decoder", "beam5") not in decoders:
        parser.error(f"--decoders {args.decoders}: beam5 is needed (the primary family and the report's tables)")
    labels = [v.label for v in variants]
    baseline = args.baseline or baseline or labels[0]
    if baseline not in labels:
        parser.error(f"--baseline {baseline!r} is not a variant; variants: {', '.join(labels)}")

    from models.memory import check as check_memory
    from utils.config import load_config

    eval_every = args.eval_every or max(1, (args.steps or 1000) // 5)
    budget_sets = budget_overrides(args.steps, args.tokens, eval_every)  # in every load: keys may need the budget
    base_cfg = load_config(config, [*gpu_sets, *args.overrides, *budget_sets])
    splits = list(base_cfg.data.test)
    if args.splits:
        splits = [x.strip() for x in args.splits.split(",") if x.strip()]
        unknown = [x for x in splits if x not in base_cfg.data.test]
        if unknown or not splits:
            parser.error(f"--splits {args.splits}: not among the config's test splits "
                         f"({', '.join(base_cfg.data.test)})")
        needed = [*(family.get("splits") or []), *(family.get("drops") or {}).values(), *(family.get("drops") or {})]
        if family and (missing := [x for x in dict.fromkeys(needed) if x not in splits]):
            parser.error(f"--splits {args.splits}: the primary family needs {', '.join(missing)} too")
    accumulate: dict[str, int] = {}  # iterations per optimizer step, where not 1 (the progress lines' steps)
    configs: dict[str, dict[str, Any]] = {}
    for v in variants:  # every variant must load, and fit the machine's memory in training, before anything runs
        trained = load_config(config, [*args.overrides, *v.overrides, *budget_sets])
        if not args.score_only:
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
    check_distinct(configs, "--grid" if args.grid else f"--preset {args.preset}")
    from utils.io import ensure_dir

    ensure_dir(study, "the study folder")
    lock_study(study)  # held to the end; a second start of this study is refused in one line
    seeds = list(range(1, args.seeds + 1))
    jobs = [Job(v, seed, study / "runs" / slug(v.label) / f"seed{seed}") for v in variants for seed in seeds]
    import torch

    devices = torch.cuda.device_count()
    spec = {"command": " ".join(sys.argv), "config": config, "variants": [v.__dict__ for v in variants],
            "baseline": baseline, "seeds": seeds, "steps": args.steps, "tokens": args.tokens,
            "overrides": args.overrides, "checkpoint": args.checkpoint, "max_sentences": args.max_sentences,
            "attention_sentences": args.attention_sentences, "family": family}
    if args.splits or list(decoders) != list(DECODERS):  # a study scored on part of its sets or decoders says so
        spec |= {"splits": splits, "decoders": list(decoders)}
    length = LengthRule.declare(family, splits, [*configs, *(f"{v.label}+{t}" for v in variants for t in v.tests)],
                                baseline) if LENGTH_DECODER in asked else None
    if length is not None:  # the rule is recorded before anything is scored with it
        spec["length_control"] = length.to_dict()
    if recorded is not None:
        spec = merge_spec(recorded, spec, study)
    if family.get("sequential"):  # seeds past the declared design's last look: refused before anything runs
        look_fractions(Design.from_dict(family["sequential"]), args.seeds)
    trains = {v.label: load_config(config, [*args.overrides, *gpu_sets, *v.overrides, *budget_sets]).to_dict()
              for v in variants} if args.merge else {}  # what this study's runs train, to merge the same only
    for other in args.merge:  # runs trained elsewhere (more seeds, another machine) join this study first
        print("\n".join(merge(Path(other), study, [Target(j.key, j.seed, j.root, trains[j.variant.label])
                                                    for j in jobs])) or f"  --merge {other}: nothing to merge",
              flush=True)
    # 1. Train what is not trained yet (resuming killed runs).
    todo = []
    steps: dict[str, int] = {}  # job -> training step of the checkpoint it is scored at
    for job in jobs:
        if args.score_only and (pid := training_elsewhere(job.root)) is not None:  # refused below, without waiting
            todo.append((f"train {job.key} (pid {pid} trains it)", [], job.root / "study.log"))
            continue
        run = find_run(job.root)
        if run is None and not job.root.exists() and not args.no_link:
            expected = load_config(config, [*args.overrides, *job.variant.overrides, f"seed={job.seed}",
                                            *budget_sets]).to_dict()
            other = shared_run(job, study, expected, args.steps, args.tokens)
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
        todo.append((f"train {job.key}", train_command(job, config, [*gpu_sets, *args.overrides], budget_sets),
                     job.root / "study.log"))
    elsewhere = linked_elsewhere(jobs, baseline, family, {"checkpoint": args.checkpoint,
                                                          "max_sentences": args.max_sentences})
    was = ((recorded or {}).get("family") or {}).get("elsewhere")
    if was is not None and was != elsewhere:
        raise ConfigError(f"{study}: the contrasts tested in another study's family were "
                          f"{was or 'none'} and would now be {elsewhere or 'none'} (a linked study "
                          "was scored, removed or changed since): the family of these runs cannot change; use another "
                          "--name")
    family = {**family, "elsewhere": elsewhere}  # contrasts another study's family tests on these very runs stay there
    spec["family"] = family
    if elsewhere:
        print(f"study {name}: tested in the family of the study their runs are linked from, not here: "
              + ", ".join(f"{label} ({where})" for label, where in elsewhere.items()), flush=True)
    if args.score_only and todo:
        raise ConfigError(f"--score-only: {len(todo)} of {len(jobs)} runs are not trained to the budget "
                          f"({', '.join(key.removeprefix('train ') for key, _, _ in todo)}); nothing was trained "
                          "or scored: train them first (--train-only)")
    from utils.io import atomic_write_text

    atomic_write_text(spec_file, json.dumps(spec, indent=1) + "\n")
    print(f"study {name}: {len(jobs)} runs, {len(jobs) - len(todo)} trained, {len(todo)} to train", flush=True)
    training = [job.root for job in jobs if f"train {job.key}" in {label for label, _, _ in todo}]
    record_runs(training, ROOT)  # a run resumed now: this commit trains it on (utils.study.provenance)
    run_commands(todo, devices, jobs=args.jobs, progress=Progress([label for label, _, _ in todo], args.steps,
                                                                  accumulate), launcher=launcher)
    record_runs(training, ROOT)
    if args.train_only:
        print(f"study {name}: every run trained to the budget (--train-only: not scored)")
        return 0

    # 2. Score every run on every test split (--splits), beam 5 and greedy (--decoders), and each inference-only
    # test variant. A run whose checkpoint is gone is scored from its score files, which must all be there.
    from data.sources import load_corpus

    corpus = load_corpus(base_cfg.data)
    sizes = {s: min(len(corpus[s]), args.max_sentences or len(corpus[s])) for s in splits}
    todo = []
    runs = {job.key: find_run(job.root) for job in jobs}
    for job in jobs:
        run = runs[job.key]
        assert run is not None
        if job.key not in steps:  # trained (or linked) just now
            steps[job.key] = scored_step(run, args.checkpoint, args.steps)
        step = steps[job.key]
        for tag, extra in [(None, []), *job.variant.tests.items()]:
            files = file_tag(tag, args.max_sentences)
            beams = [str(beam) for beam in decoders.values()  # the decoders not yet scored, in one test.py
                     if not all(eval_current(eval_file(run, split, beam, args.checkpoint, files), n, extra, step)
                                for split, n in sizes.items())]
            if not beams:
                continue
            if not RunDir(run).checkpoint(args.checkpoint).is_file():
                raise ConfigError(f"{run}: its {args.checkpoint} checkpoint is gone and beam {' '.join(beams)} "
                                  f"{'(' + tag + ') ' if tag else ''}is not scored on every one of "
                                  f"{', '.join(sizes)}: nothing was scored")
            flags = ["--tag", files] if files else []
            flags += [f for split in (splits if args.splits else []) for f in ("--split", split)]
            flags += ["--max_sentences", str(args.max_sentences)] if args.max_sentences else []
            cmd = project_command("test.py", "--model_path", RunDir(run).checkpoint(args.checkpoint),
                                  "--beam", *beams, *flags, overrides=extra)
            todo.append((f"test {job.key} beam {' '.join(beams)}{' ' + tag if tag else ''}", cmd,
                         job.root / "study.log"))
    run_commands(todo, devices, jobs=args.jobs, launcher=launcher)
    choice = score_length(length, jobs, runs, steps, args.checkpoint, args.max_sentences, sizes, base_cfg.data,
                          lambda todo: run_commands(todo, devices, jobs=args.jobs, launcher=launcher)) if length else {}

    # 3. Attention statistics, aggregation, report.
    for job in jobs:
        if RunDir(runs[job.key]).checkpoint(args.checkpoint).is_file():
            compute_attention(runs[job.key], args.checkpoint, args.attention_sentences, steps[job.key])
        elif (read_attention(runs[job.key], args.checkpoint, args.attention_sentences) or {}).get(
                "step") != steps[job.key]:  # none, or of another step: not this model's
            print(f"  {job.key}: no checkpoint, so no attention statistics (the report leaves its system's out)",
                  flush=True)
    from bench.study_files import Ledger
    from bench.study_report import aggregate, write_report

    print(f"study {name}: statistics and report", flush=True)
    ledger = Ledger(study)
    results = aggregate(jobs, runs, corpus, splits, baseline, args.checkpoint, args.bootstrap,
                        args.attention_sentences, args.max_sentences, family, list(decoders), steps, ledger)
    if length is not None:
        add_length_results(results, length, choice, jobs, runs, args.checkpoint, args.max_sentences,
                           {s: list(corpus[s]["tgt"]) for s in length.splits}, args.bootstrap, family, ledger)
    if recorded_now := ledger.save():
        print(f"study {name}: {recorded_now} files record no checksum (written by an older test.py or study): "
              f"recorded in {ledger.path} at this first read; a later change to them is refused", flush=True)
    write_report(study, spec, results)
    print(f"study {name}: report in {study / 'report.md'}, every number in {study / 'results.json'}")
    return 0


if __name__ == "__main__":
    from utils.cli import run_main

    run_main(main)
