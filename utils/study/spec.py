"""What a study is: its variants (a label and the ``--set`` overrides that make its config), a preset (a config,
variants, a baseline and a primary family), grids (``--grid``), test variants (``--test-variant``) and the checks a
spec passes before anything runs; ``merge_spec`` when a study is resumed with a raised budget."""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from utils.config import ConfigError


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
    family: dict[str, Any] = field(default_factory=dict)  # the primary analysis (utils.study.analysis.Family)


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


def read_family(path: Path) -> dict[str, Any]:
    """The primary family a study declares in a JSON file (``--family FILE``, committed with its pre-registration):
    the keys of ``utils.study.analysis.Family`` but ``elsewhere`` (the study finds that itself); ``declared``, saying
    when and where it was declared, is required, and a ``sequential`` design is checked as ``Design.from_dict``
    checks it. ConfigError, one line, for a file that cannot be read or a key out of place."""
    from dataclasses import fields

    from utils.study.analysis import METRICS, Family
    from utils.study.decoders import DECODERS
    from utils.study.looks import Design

    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e).split("\n")[0]
        raise ConfigError(f"--family {path}: cannot read it as JSON ({reason})") from None
    where = f"--family {path}"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: a JSON object of the family's keys, not {type(raw).__name__}")
    known = sorted(f.name for f in fields(Family) if f.name != "elsewhere")
    if unknown := sorted(set(raw) - set(known)):
        raise ConfigError(f"{where}: unknown key {unknown[0]!r} (keys: {', '.join(known)})")
    if not isinstance(raw.get("declared"), str) or not raw["declared"].strip():
        raise ConfigError(f"{where}: 'declared' is required: when and where the family was declared (e.g. "
                          "\"pre-registered on 2026-11-29, before any run\")")
    checks = {"metric": (lambda v: v in METRICS, f"one of {', '.join(METRICS)}"),
              "decoder": (lambda v: v in DECODERS, f"one of {', '.join(DECODERS)}"),
              "splits": (lambda v: _strings(v) and len(v) > 0, "a list of test splits"),
              "drops": (lambda v: isinstance(v, dict) and _strings(list(v)) and _strings(list(v.values())),
                        "an object: a length-shifted split -> its x1 split"),
              "systems": (lambda v: _strings(v) and len(v) > 0, "a list of system labels"),
              "smallest_effect": (lambda v: _number(v) and v > 0, "a number > 0, in the metric's points"),
              "alpha": (lambda v: _number(v) and 0 < v < 1, "a number within (0, 1)"),
              "sequential": (lambda v: v is None or isinstance(v, dict), "an object: looks, spending, futility, "
                                                                        "beta, residual_sd"),
              "decodings": (lambda v: isinstance(v, dict) and _strings(list(v)) and _strings(list(v.values())),
                            "an object: a test-time decoding (label+tag) -> the trained system it decodes")}
    for key, (ok, what) in checks.items():
        if key in raw and not ok(raw[key]):
            raise ConfigError(f"{where}: {key}: {json.dumps(raw[key])} is not {what}")
    if raw.get("sequential") is not None:
        Design.from_dict(raw["sequential"])
    return Family(**raw).to_dict()


def check_family(family: dict[str, Any], labels: Sequence[str], baseline: str, source: str) -> None:
    """Every system a family declares is one of the study's (a trained variant or a test variant's
    ``label+tag``) other than its baseline: ConfigError, one line, naming the first that is not."""
    for system in family.get("systems") or []:
        if system == baseline:
            raise ConfigError(f"{source}: system {system!r} is the baseline; the family tests the others against it")
        if system not in labels:
            raise ConfigError(f"{source}: system {system!r} is not a variant of this study (variants: "
                              f"{', '.join(labels)}); a declared family does not shrink to fit")
    for decoding, parent in (family.get("decodings") or {}).items():
        if decoding not in (family.get("systems") or []) or not decoding.startswith(f"{parent}+") \
                or parent == baseline or parent not in labels:
            raise ConfigError(f"{source}: decodings: {decoding!r} -> {parent!r}: a system of the family, a test-time "
                              "decoding ('label+tag') of the trained system it names, which is not the baseline")


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(x, str) and x for x in value)


def _number(value: Any) -> bool:
    """A finite int or float (JSON has no NaN or infinity, but Python's json reads them)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
