"""The compute a study spent on runs it did not keep: runs lost with a replaced machine, runs killed before their
first checkpoint (and removed when trained again), and those in flight when the study was last stopped.
``record_unkept`` reads a study folder's run directories (``runs/SYSTEM/seedN/RUN``) that no ``keep_runs`` archive
holds (bench/worktree.sh), and the starts its seed folders' study.log names whose run directory is gone, and merges
their cost (``utils.study.cost.run_cost``, ``killed_segments``) into a ledger,
``unkept.json`` beside the archives; ``unkept_cost`` totals the ledger's runs that are still in no archive. A run
resumed and kept later leaves the count (its archive holds the same run directory, every segment counted there,
killed ones too); one lost with its machine stays in it. The ledger's keys are ``STUDY/runs/SYSTEM/seedN/RUN``, as
the archives name their members::

    {"study_x/runs/rope/seed4/bench_short_20261202_172800":
        {"train_cpu_s": 1560.2, ..., "killed_segments": 1, "killed_s": 274.0, "steps": 672,
         "cpu": "AMD EPYC, flags ecfefe0f", "recorded": "2026-12-02T20:10Z"}}
"""

from __future__ import annotations

import json
import re
import tarfile
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

LEDGER = "unkept.json"
_RUN = re.compile(r"(.+/runs/[^/]+/seed\d+/[^/]+)/train\.log$")
_FIELDS = ("train_cpu_s", "train_gpu_s", "decode_cpu_s", "decode_gpu_s", "segments", "score_files")


def archived_runs(archives: Iterable[Path]) -> dict[str, int]:
    """The run directories ``keep_runs`` archives hold, as ``STUDY/runs/SYSTEM/seedN/RUN``, each with the size of its
    train.log in bytes; the archives are read as streams, their members' headers only. ValueError (one line) for a
    file that is not such an archive (cut short, or a Git LFS pointer)."""
    found: dict[str, int] = {}
    for archive in archives:
        try:
            with tarfile.open(archive, "r|xz") as tar:
                found.update((m[1], member.size) for member in tar
                             if "/.latest/" not in member.name and (m := _RUN.match(member.name)))
        except (tarfile.TarError, EOFError, OSError) as e:
            raise ValueError(f"{archive}: not a readable archive of kept runs ({e})") from None
    return found


def read_ledger(path: Path) -> dict[str, dict[str, Any]]:
    """``unkept.json``'s entries; none where it does not exist. ValueError (one line) for a file that is not one:
    each entry a run's cost (the numbers of ``_FIELDS``, ``threads_unrecorded``), with ``killed_segments``,
    ``killed_s``, ``steps``, ``cpu`` and ``recorded`` where an entry has them (entries written before the killed
    starts were recorded lack those two)."""
    if not path.is_file():
        return {}
    try:
        ledger = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise ValueError(f"{path}: not a ledger of runs not kept ({e})") from None

    def number(value: Any, whole: bool = False) -> bool:
        return isinstance(value, int if whole else (int, float)) and not isinstance(value, bool)

    def is_cost(entry: Any) -> bool:
        return (isinstance(entry, dict) and all(number(entry.get(k)) for k in _FIELDS)
                and isinstance(entry.get("threads_unrecorded"), bool)
                and all(number(entry[k], whole=k != "killed_s") for k in ("killed_segments", "killed_s", "steps")
                        if k in entry)
                and all(isinstance(entry[k], str) for k in ("cpu", "recorded") if k in entry))

    if not isinstance(ledger, dict) or not all(is_cost(v) for v in ledger.values()):
        raise ValueError(f"{path}: not a ledger of runs not kept (each entry a run's cost: {', '.join(_FIELDS)}, "
                         "threads_unrecorded; steps, killed_segments, killed_s, cpu and recorded where given)")
    return ledger


def record_unkept(folders: Path | Iterable[Path], records: Path, checkpoint: str = "last") -> dict[str, dict[str, Any]]:
    """Merge into ``records/unkept.json`` the cost of each run directory of the study folders ``folders`` (one, or
    several: the second study's two arms) that no archive in ``records`` (``*.tar.xz``) holds: ``run_cost`` of it
    (every training segment its train.log closed, and those killed before their closing line, ``killed_segments``,
    from each start to its last logged line; the score files of ``checkpoint``), the run's last step (``steps``),
    this machine's CPU (``cpu``, as ``utils.study.machines.cpu_label`` names it) and when (``recorded``). A run
    killed before its first checkpoint is removed when its seed is trained again: it is recorded from the killed
    starts its seed folder's study.log names for a run directory no longer there (the threads of the seed folder's
    latest run, the CPU of its cpu.txt where it was kept). An entry already there is replaced only by one that counts
    at least as many training starts and at least as many score files (the same run, further on), and one that
    has not changed is not written again; a run with
    neither spent nothing counted, and is left out. Seed folders that are links (another study's runs) are not
    read. ValueError (nothing written, for any folder) while a run still trains (its segment closes when it stops:
    SIGTERM), or where a folder is not a study folder, or is a study folder's copy under another name (the archives
    keep its runs under their own folder's name: recorded under this one, they would count as kept and as not kept).
    Written atomically, once; returns what this call recorded."""
    from utils.host import cpu_description
    from utils.io import atomic_write_text
    from utils.study.machines import cpu_label

    ledger_path = records / LEDGER
    ledger = read_ledger(ledger_path)
    kept = archived_runs(sorted(records.glob("*.tar.xz")))
    cpu = cpu_label(*cpu_description())
    found: dict[str, dict[str, Any]] = {}
    for folder in [folders] if isinstance(folders, Path) else folders:
        found |= _unkept_runs(folder.resolve(), kept, cpu, checkpoint)
    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%MZ")
    recorded: dict[str, dict[str, Any]] = {}
    for key, entry in found.items():
        if not entry["segments"] and not entry["score_files"] and not entry["killed_segments"]:
            continue
        old = ledger.get(key)
        if old is not None and {k: v for k, v in old.items() if k != "recorded"} == entry:
            continue  # the same run as recorded: its entry, and when it was recorded, stay as they are
        if old is None or (_starts(entry) >= _starts(old) and entry["score_files"] >= old["score_files"]):
            ledger[key] = recorded[key] = {**entry, "recorded": now}
    if recorded:
        atomic_write_text(ledger_path, json.dumps(dict(sorted(ledger.items())), indent=1) + "\n")
    return recorded


def _unkept_runs(folder: Path, kept: dict[str, int], cpu: str, checkpoint: str) -> dict[str, dict[str, Any]]:
    """``record_unkept``'s entries for one study folder (``recorded`` apart), by ledger key; ``kept`` is
    ``archived_runs`` of the records, ``cpu`` this machine's label. ValueError as ``record_unkept`` says."""
    from utils.run.layout import RunDir
    from utils.run.store import run_locked_by
    from utils.study.cost import killed_segments, run_cost, training_segments, with_killed
    from utils.study.machines import recorded_cpu
    from utils.study.runs import run_dirs

    if not (folder / "runs").is_dir():
        raise ValueError(f"{folder}: not a study folder (no runs/ in it)")
    seeds = [seed for seed in sorted((folder / "runs").glob("*/seed*")) if not seed.is_symlink()]
    runs = {f"{folder.name}/runs/{seed.parent.name}/{seed.name}/{run.name}": run
            for seed in seeds for run in run_dirs(seed)}
    elsewhere = {(k.split("/runs/", 1)[1], size): k.split("/runs/", 1)[0] for k, size in kept.items()}
    for key, run in runs.items():  # a kept run (same run directory, same train.log) under another folder name
        log = RunDir(run).log
        same = (key.split("/runs/", 1)[1], log.stat().st_size if log.is_file() else -1)
        if key not in kept and (other := elsewhere.get(same)) is not None:
            raise ValueError(f"{folder}: its runs are kept under the study folder name {other}, not {folder.name}: "
                             "give the study folder itself")
    runs = {key: run for key, run in runs.items() if key not in kept and RunDir(run).log.is_file()}
    for run in runs.values():
        if (pid := run_locked_by(run)) is not None:
            raise ValueError(f"{run}: still training (pid {pid}): stop the study (SIGTERM) and wait for its "
                             "processes to end")
    found: dict[str, dict[str, Any]] = {}
    for key, run in runs.items():
        log = RunDir(run).log.read_text(encoding="utf-8", errors="replace")
        steps = [int(s.get("run_steps", s.get("steps", 0))) for s in training_segments(log)]
        found[key] = {**run_cost(run, checkpoint, None),
                      "steps": max(steps + [s["steps"] for s in killed_segments(log)] + [0]), "cpu": cpu}
    for seed in seeds:  # runs removed since: killed before a first checkpoint
        study_log = seed / "study.log"
        text = study_log.read_text(encoding="utf-8", errors="replace") if study_log.is_file() else ""
        removed: dict[str, list[dict[str, Any]]] = {}
        for segment in killed_segments(text):
            key = f"{folder.name}/runs/{seed.parent.name}/{seed.name}/{segment['run']}"
            if segment["run"] and not (seed / segment["run"]).exists() and key not in kept:
                removed.setdefault(key, []).append(segment)
        latest = run_dirs(seed)[-1:]  # the same job's config trains every run of a seed folder
        for key, killed in removed.items():
            nothing = {**dict.fromkeys(_FIELDS[:4], 0.0), "segments": 0, "score_files": 0, "threads_unrecorded": False}
            found[key] = {**with_killed(nothing, killed, _threads(latest[0]) if latest else None),
                          "steps": max(s["steps"] for s in killed), "cpu": recorded_cpu(seed) or cpu}
    return found


def _threads(run: Path) -> int | None:
    """The threads the config of ``run`` trains with; None where it has no readable config."""
    from utils.config import ConfigError, load_config
    from utils.run.layout import RunDir

    try:
        return load_config(RunDir(run).config).train.num_threads
    except (ConfigError, OSError):
        return None


def _starts(entry: dict[str, Any]) -> int:
    """How many training starts an entry counts: closed segments and killed ones."""
    return int(entry["segments"]) + int(entry.get("killed_segments", 0))


def unkept_cost(records: Path) -> dict[str, Any] | None:
    """``study_cost``'s totals over the ledger's runs that no archive in ``records`` holds, with ``cpus`` (how many
    of them each CPU trained) and ``last_recorded``; None without a ledger or such a run."""
    from utils.study.cost import study_cost

    ledger = read_ledger(records / LEDGER)
    kept = archived_runs(sorted(records.glob("*.tar.xz"))) if ledger else {}
    left = {k: v for k, v in ledger.items() if k not in kept}
    if not left:
        return None
    cpus: dict[str, int] = {}
    for entry in left.values():
        cpus[entry.get("cpu") or "unrecorded"] = cpus.get(entry.get("cpu") or "unrecorded", 0) + 1
    return {**study_cost(left), "cpus": dict(sorted(cpus.items())),
            "steps": sum(int(v.get("steps", 0)) for v in left.values()),
            "last_recorded": max(str(v.get("recorded", "")) for v in left.values())}
