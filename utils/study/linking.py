"""Runs a study shares with another study in the same ``--runs`` folder: a finished run of exactly the config a job
would train is linked instead of trained again, and the contrasts that study's family already tests on those very
runs stay in its family (``linked_elsewhere``)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from utils.run.layout import RunDir
from utils.study.files import slug
from utils.study.plan import Job
from utils.study.runs import run_dirs, training_done


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
    from utils.study.analysis import Family

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
