"""Where a study's runs came from, and runs trained on another machine merged into a study.

Each run a study trains records, in ``<run>/provenance.json``::

    {"config_sha256": "...", "trained_by": [{"commit": "<sha>" | "unknown", "uncommitted_changes": false}]}

``config_sha256`` identifies what was trained: the sha256 of the run's resolved config (``config.yaml``, every
default filled in) without the keys that name the run, where it is or how it executes (``LOCATION_KEYS``: its name
and seed, the data's and cache's folders, the device, compilation), so the same variant trained from another
checkout or machine has the same hash, and every seed of one variant too (a key that changes what is learned, such
as ``train.static_shapes``, which batches differently, is in it). ``trained_by`` lists the commits of the
checkouts that trained it, one entry per training session that changed it (a run resumed by another checkout has
two); ``unknown`` outside a git checkout.

``merge`` copies into a study the runs another study folder holds (e.g. trained on another machine with more
seeds) whose config hash is this study's for the same variant and whose seed is the folder's; a different config
is refused in one line naming the first key that differs, and nothing is merged.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from utils.io import atomic_write_text
from utils.run.layout import RunDir
from utils.schema import ConfigError

#: Keys that name a run, say where its files are or where and how it executes, not what it learns: left out of the
#: config hash (the seed too: every seed of a variant has its hash). ``train.compile`` draws the same random numbers as
#: eager; ``data.num_proc`` tokenizes the same cache.
LOCATION_KEYS = ("name", "seed", "data.path", "data.cache_dir", "data.num_proc", "train.device", "train.compile")
UNKNOWN = "unknown"


def _flat(cfg: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in cfg.items():
        if isinstance(value, dict):
            out |= _flat(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def hashed_part(cfg: dict[str, Any]) -> dict[str, Any]:
    """The dotted keys and values of a resolved config (``Config.to_dict()``) that its hash covers."""
    return {k: v for k, v in _flat(cfg).items() if k not in LOCATION_KEYS}


def config_sha256(cfg: dict[str, Any]) -> str:
    """The sha256 of a resolved config without its ``LOCATION_KEYS`` (canonical JSON, keys sorted)."""
    text = json.dumps(hashed_part(cfg), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def first_difference(ours: dict[str, Any], theirs: dict[str, Any]) -> str | None:
    """The first dotted key (in ``ours``' order, then keys only ``theirs`` has) whose value the two hashed parts of
    resolved configs differ in, with both values; None if they are the same."""
    a, b = hashed_part(ours), hashed_part(theirs)
    for key in [*a, *(k for k in b if k not in a)]:
        if a.get(key, "(absent)") != b.get(key, "(absent)"):
            return f"{key} ({b.get(key, '(absent)')!r} there, {a.get(key, '(absent)')!r} here)"
    return None


def git_commit(checkout: Path) -> tuple[str, bool]:
    """The commit ``checkout`` is at and whether tracked files differ from it; (``unknown``, False) outside git."""
    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", "-C", str(checkout), *args], capture_output=True, text=True, timeout=60)

    try:
        head = git("rev-parse", "--verify", "HEAD")
        if head.returncode != 0:
            return UNKNOWN, False
        status = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):  # no git on this machine
        return UNKNOWN, False
    return head.stdout.strip(), bool(status.stdout.strip())


def read(run: Path) -> dict[str, Any] | None:
    """A run's provenance record, or None where it has none (trained before studies recorded it); ConfigError, one
    line, for one that cannot be read."""
    path = RunDir(run).provenance
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{path}: unreadable ({type(e).__name__}); restore it, or remove it (the run's commit is "
                          "then unknown)") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("trained_by", []), list):
        raise ConfigError(f"{path}: not a run's provenance record; restore it, or remove it")
    return doc


def record(run: Path, checkout: Path) -> dict[str, Any]:
    """Record in ``run`` its config hash and the commit of ``checkout``, which trains it now (added after the
    commits already recorded unless it is the last of them); returns the record."""
    from utils.config import load_config

    doc = read(run) or {}
    commit, dirty = git_commit(checkout)
    entry = {"commit": commit, "uncommitted_changes": dirty}
    trained_by = list(doc.get("trained_by", []))
    if not trained_by or trained_by[-1] != entry:
        trained_by.append(entry)
    doc = {"config_sha256": config_sha256(load_config(RunDir(run).config).to_dict()), "trained_by": trained_by}
    atomic_write_text(RunDir(run).provenance, json.dumps(doc, indent=1) + "\n")
    return doc


def newest_run(seed_folder: Path) -> Path | None:
    """The newest run directory (one with a config) of a study's seed folder, through a link; None if none."""
    if not seed_folder.is_dir():
        return None
    runs = sorted(p for p in seed_folder.iterdir()
                  if p.is_dir() and not p.is_symlink() and not p.name.startswith(".") and RunDir(p).config.is_file())
    return runs[-1] if runs else None


def record_runs(seed_folders: Iterable[Path], checkout: Path) -> None:
    """``record`` the newest run of each seed folder that has one (the runs a study trains, or resumes, now)."""
    for folder in seed_folders:
        run = newest_run(folder)
        if run is not None:
            record(run, checkout)


def commit_label(entry: dict[str, Any]) -> str:
    """``abc1234`` (``abc1234 with uncommitted changes``; ``unknown``) for one ``trained_by`` entry."""
    commit = str(entry.get("commit", UNKNOWN))
    short = commit[:7] if commit != UNKNOWN else commit
    return short + (" with uncommitted changes" if entry.get("uncommitted_changes") else "")


# ---------------------------------------------------------------------------------------------- merge


@dataclass(frozen=True)
class Target:
    """A run of this study: its label (``rope seed 4``), seed, seed folder and the resolved config it trains."""

    key: str
    seed: int
    folder: Path
    config: dict[str, Any]


def merge(other: Path, study: Path, targets: Sequence[Target]) -> list[str]:
    """Copy into ``study`` every run of the study folder ``other`` that is one of ``targets`` (the same seed folder
    ``runs/<variant>/seed<k>``) and that ``study`` does not hold yet; each must have this study's config hash for
    its variant and the folder's seed (a seed this study holds as another run of its own is kept, and said).
    ConfigError, one line, and nothing copied, for a folder that is no study, a run still training, or a different
    config (naming the first key that differs). Returns the lines to say (one per run merged, one for those left
    there)."""
    from utils.config import load_config
    from utils.run.store import run_locked_by

    other, study = Path(other), Path(study)
    if not (other / "runs").is_dir():
        raise ConfigError(f"--merge {other}: not a study folder (it has no runs/)")
    if other.resolve() == study.resolve():
        raise ConfigError(f"--merge {other}: that is this study's own folder")
    plan: list[tuple[Target, Path, Path]] = []
    said: list[str] = []
    kept: list[str] = []
    known = set()
    for target in targets:
        rel = target.folder.relative_to(study)
        known.add(rel)
        run = newest_run(other / rel)
        if run is None:
            continue
        if (pid := run_locked_by(run)) is not None:
            raise ConfigError(f"--merge: {run} is being trained (pid {pid}); merge once it ends; nothing was merged")
        try:
            theirs = load_config(RunDir(run).config).to_dict()
        except ConfigError as e:
            raise ConfigError(f"--merge: {RunDir(run).config}: {e}; nothing was merged") from None
        if theirs.get("seed") != target.seed:
            raise ConfigError(f"--merge: {run}: trained with seed {theirs.get('seed')}, not {target.key}'s seed "
                              f"{target.seed}: not merged; nothing was merged")
        if config_sha256(theirs) != config_sha256(target.config):
            raise ConfigError(f"--merge: {run}: not {target.key} of this study: its config differs in "
                              f"{first_difference(target.config, theirs)}; nothing was merged")
        ours = newest_run(target.folder)
        if ours is None:
            plan.append((target, run.parent.resolve(), target.folder))
        elif ours.name != run.name:  # the same seed trained in both places: this study keeps its own
            kept.append(target.key)
    left = sorted(str(p.relative_to(other)) for p in other.glob("runs/*/seed*")
                  if p.relative_to(other) not in known and newest_run(p) is not None)
    for target, source, folder in plan:
        _copy(source, folder)
        doc = read(newest_run(folder)) or {}  # type: ignore[arg-type]
        commits = ", ".join(commit_label(e) for e in doc.get("trained_by", [])) or "commit not recorded"
        said.append(f"  {target.key}: merged from {source} ({commits})")
    if kept:
        said.append(f"  --merge: {', '.join(kept)}: this study holds its own run of the same seed, kept; the one in "
                    f"{other} is left there")
    if left:
        said.append(f"  --merge: {len(left)} run folders of {other} are not runs of this command, left there: "
                    + ", ".join(left))
    return said


def _copy(source: Path, folder: Path) -> None:
    """Copy the seed folder ``source`` to ``folder`` (an empty one there replaced), whole or not at all."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.parent / f".{folder.name}.merging"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        shutil.copytree(source, tmp, symlinks=True)
        if folder.is_symlink():
            folder.unlink()
        elif folder.exists():
            shutil.rmtree(folder)  # holds no run (checked): a study.log at most
        tmp.rename(folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
