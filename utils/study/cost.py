"""What a study's runs cost, from what each run recorded: every training segment's closing summary in train.log (a
resumed run has one per start; training and validation seconds), every start killed before its summary line
(SIGKILL, a session's end; SIGTERM and Ctrl-C still write it: ``killed_segments``, timed from the log to its last
line), and the decoding seconds of every test.py score file of the scored checkpoint in its eval/ folder. CPU time is
core-seconds, wall seconds x threads x processes; a run on a GPU counts its minutes there instead (runs sharing one
GPU each count their own minutes). Not counted: start-up, tokenizer and data cache, model loading, scoring's
statistics, and what a killed start ran after its last logged line."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from utils.run.layout import SUMMARY_MARK, RunDir

_DEVICE = re.compile(r"train: model: .* parameters on (\S+) \(world size (\d+)\)")
_RUN_DIR = re.compile(r"train: run directory: (\S+)")
_CLOCK = re.compile(r"^(\d\d):(\d\d):(\d\d) train: ")  # a training's own lines, not another process's
_STEP = re.compile(r" step (\d+) \|")


def training_segments(log: str) -> list[dict[str, Any]]:
    """Each training segment's closing summary in a train.log (one per start: a resumed run has several), with
    the device and world size of the start it closes (``model: ... on DEVICE (world size N)``) where the summary
    itself does not record them."""
    out, start = [], {"device": "cpu", "world_size": 1}
    for line in log.splitlines():
        if m := _DEVICE.search(line):
            start = {"device": m.group(1), "world_size": int(m.group(2))}
        elif SUMMARY_MARK in line and " optimizer steps" in line:
            try:
                summary = json.loads(line.split(SUMMARY_MARK, 1)[1])
            except ValueError:
                continue  # a line cut short (the disk filled): its segment is not counted
            out.append({**start, **{k: v for k, v in summary.items() if v is not None}})
    return out


def killed_segments(log: str) -> list[dict[str, Any]]:
    """Each training start in ``log`` that wrote no closing summary: killed (SIGKILL, a machine or session ended)
    before it could. ``log`` is a run's train.log, or a study's seed-folder study.log, which holds every start of
    every run trained there, those removed since too (killed before their first checkpoint). Each with ``run`` (the
    name of the run directory it trained in, from its ``run directory:`` line; None where the log has none),
    ``device``, ``world_size``, ``steps`` (the last step it logged, 0 for none) and ``seconds``: from its start
    (``model: ... on DEVICE``) to its last time-stamped ``train:`` line before the next start (not the next
    process's data lines), a lower bound (what it ran after its last line is not in the log). The clock's passing
    midnight is counted where the time of day falls back by more than 12 hours; a smaller step back (a clock
    adjusted) counts nothing; a gap of a day or more between two lines cannot be seen. A summary line cut short (the
    disk filled) closes nothing: ``training_segments`` cannot count it. A start with no time past it is left out."""
    out: list[dict[str, Any]] = []
    run: str | None = None
    segment: dict[str, Any] | None = None
    begun: int | None = None
    last = 0

    def close() -> None:
        if segment is not None and begun is not None and last > begun:
            out.append({**segment, "seconds": float(last - begun)})

    for line in log.splitlines():
        if m := _RUN_DIR.search(line):  # a new start: the one before it ended
            close()
            segment, run = None, Path(m.group(1)).name
        elif m := _DEVICE.search(line):
            close()
            segment, begun = {"run": run, "device": m.group(1), "world_size": int(m.group(2)), "steps": 0}, None
        elif segment is not None and SUMMARY_MARK in line and " optimizer steps" in line and _closes(line):
            segment = None
            continue
        elif segment is not None and (step := _STEP.search(line)):
            segment["steps"] = int(step.group(1))
        if segment is not None and (clock := _CLOCK.match(line)):
            now = int(clock[1]) * 3600 + int(clock[2]) * 60 + int(clock[3])
            if begun is None:
                begun = last = now
            elif now >= last % 86400:  # later the same day
                last += now - last % 86400
            elif last % 86400 - now > 43200:  # past midnight
                last += 86400 - last % 86400 + now
    close()
    return out


def _closes(line: str) -> bool:
    """Whether a summary line is whole (its JSON reads), as ``training_segments`` counts it."""
    try:
        json.loads(line.split(SUMMARY_MARK, 1)[1])
    except ValueError:
        return False
    return True


def with_killed(cost: dict[str, Any], killed: list[dict[str, Any]], threads: int | None) -> dict[str, Any]:
    """A run's ``cost`` (``run_cost``'s closed segments and score files) with its killed segments ``killed``
    (``killed_segments``) added: their seconds to ``train_cpu_s`` (x ``threads``, the config's, shared by a machine's
    processes; one where unknown, said so in ``threads_unrecorded``) or to ``train_gpu_s`` (x processes), their
    number as ``killed_segments`` and their wall seconds alone as ``killed_s``."""
    out = {**cost, "killed_segments": len(killed), "killed_s": 0.0}
    for segment in killed:
        world = segment["world_size"]
        if str(segment["device"]).startswith("cuda"):
            out["train_gpu_s"] += segment["seconds"] * world
        else:
            out["threads_unrecorded"] |= threads is None
            out["train_cpu_s"] += segment["seconds"] * world * (max(1, threads // world) if threads else 1)
        out["killed_s"] += segment["seconds"]
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in out.items()}


def run_cost(run: Path, checkpoint: str, step: int | None) -> dict[str, Any]:
    """One run's cost: ``train_cpu_s`` and ``train_gpu_s`` (the summaries' training and validation seconds, CPU ones
    times threads and processes, and the starts killed before their summary: ``with_killed``), ``decode_cpu_s`` and
    ``decode_gpu_s`` (the score files of ``checkpoint`` at training step ``step``: decoding seconds, CPU ones times
    the threads each file records), how many training segments and score files they come from (the killed starts
    apart: ``killed_segments``, and their wall seconds ``killed_s``), and whether some CPU time's threads were not
    recorded (counted as one)."""
    from utils.config import load_config

    rd = RunDir(run)
    log = rd.log.read_text(encoding="utf-8", errors="replace") if rd.log.is_file() else ""
    threads = load_config(rd.config).train.num_threads if rd.config.is_file() else None
    out: dict[str, Any] = {"train_cpu_s": 0.0, "train_gpu_s": 0.0, "decode_cpu_s": 0.0, "decode_gpu_s": 0.0,
                           "segments": 0, "score_files": 0, "threads_unrecorded": False}
    for summary in training_segments(log):
        seconds = float(summary.get("train_seconds", 0.0)) + float(summary.get("eval_seconds", 0.0))
        if str(summary["device"]).startswith("cuda"):
            out["train_gpu_s"] += seconds * summary["world_size"]
        else:  # the summary's threads are per process; the config's are shared by a machine's processes
            world = summary["world_size"]
            used = summary.get("threads") or (max(1, threads // world) if threads else None)
            out["threads_unrecorded"] |= used is None
            out["train_cpu_s"] += seconds * world * (used or 1)
        out["segments"] += 1
    for path in sorted(rd.eval_dir.glob(f"*.{checkpoint}.beam*.json")) if rd.eval_dir.is_dir() else []:
        if path.name.startswith("all."):  # every split again, in one file
            continue
        try:
            scores = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # not a score file the study reads: it checks its own before use
        if not isinstance(scores, dict) or "seconds" not in scores or (step is not None and scores.get("step") != step):
            continue
        if "threads" in scores and scores["threads"] is None:  # test.py records null threads on a GPU
            out["decode_gpu_s"] += float(scores["seconds"])
        else:  # a CPU decoding's threads; a file older than that record: one thread, said so
            out["threads_unrecorded"] |= not scores.get("threads")
            out["decode_cpu_s"] += float(scores["seconds"]) * int(scores.get("threads") or 1)
        out["score_files"] += 1
    return with_killed(out, killed_segments(log), threads)


def study_cost(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The study's totals over its runs' ``run_cost``: CPU core-hours and GPU minutes, for training and decoding."""
    def total(key: str) -> float:
        return sum(r[key] for r in runs.values())

    return {"runs": len(runs), "train_cpu_hours": round(total("train_cpu_s") / 3600, 3),
            "decode_cpu_hours": round(total("decode_cpu_s") / 3600, 3),
            "train_gpu_minutes": round(total("train_gpu_s") / 60, 2),
            "decode_gpu_minutes": round(total("decode_gpu_s") / 60, 2),
            "threads_unrecorded": sorted(k for k, r in runs.items() if r["threads_unrecorded"])}


def folder_cost(folder: Path, checkpoint: str = "last") -> dict[str, Any] | None:
    """``study_cost``'s totals over every run of a study folder's ``runs/SYSTEM/seedN/`` (the latest run of each seed
    folder, every score file of ``checkpoint``): for a study scored before its results recorded their compute, or a
    folder of kept runs unpacked without results (``bench/worktree.sh``'s ``restore_runs``). None where it holds no
    run."""
    per_run = _folder_runs(folder, checkpoint)
    return study_cost(per_run) if per_run else None


def _folder_runs(folder: Path, checkpoint: str) -> dict[str, dict[str, Any]]:
    """``run_cost`` of the latest run of each seed folder ``runs/SYSTEM/seedN/``, by ``SYSTEM/seedN``."""
    from utils.study.runs import run_dirs

    return {f"{seed.parent.name}/{seed.name}": run_cost(runs[-1], checkpoint, None)
            for seed in sorted((folder / "runs").glob("*/seed*")) if (runs := run_dirs(seed))}


def kept_cost(archives: list[Path], checkpoint: str = "last") -> dict[str, Any] | None:
    """``study_cost``'s totals over the runs kept in ``archives``, ``bench/worktree.sh``'s ``keep_runs`` files (each an
    xz tar of study folders' ``runs/SYSTEM/seedN/`` without their weights), of which what ``run_cost`` reads (each run's
    train.log, config.yaml and eval/*.json) is unpacked into a temporary folder; runs of several study folders count
    together. None where they hold no run."""
    import tarfile
    import tempfile

    per_run: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for archive in archives:
            with tarfile.open(archive, "r|xz") as tar:  # read once, as a stream: what run_cost reads, as it passes
                for m in tar:
                    read = m.name.endswith(("/train.log", "/config.yaml")) or (
                        "/eval/" in m.name and m.name.endswith(".json"))
                    if read and m.isfile() and "/.latest/" not in m.name:
                        tar.extract(m, tmp, filter="data")  # nothing outside tmp, no device or setuid file
        for folder in sorted(p for p in Path(tmp).iterdir() if p.is_dir()):
            per_run |= {f"{folder.name}/{k}": v for k, v in _folder_runs(folder, checkpoint).items()}
    return study_cost(per_run) if per_run else None


def known_cost(folder: Path) -> dict[str, Any] | None:
    """A study folder's ``study_cost`` totals: its results.json's compute figures, else (scored before they were
    recorded, or kept runs without results) ``folder_cost`` at the checkpoint its results name. None without
    either."""
    from utils.study.files import read_results

    found = read_results(folder) if (folder / "results.json").is_file() else {}
    return (found.get("compute") or {}).get("total") or folder_cost(
        folder, (found.get("spec") or {}).get("checkpoint", "last"))


def spent(total: dict[str, Any]) -> tuple[float, float]:
    """(CPU core-hours, GPU minutes) of ``study_cost``'s totals, training and decoding together."""
    return (total["train_cpu_hours"] + total["decode_cpu_hours"],
            total["train_gpu_minutes"] + total["decode_gpu_minutes"])


def still_needed(results: dict[str, Any]) -> dict[str, Any] | None:
    """What a group-sequential study still needs to train, at what its runs so far cost on average: for its next
    planned look and its last, the seeds per system there, the runs (its trained systems x the seeds still missing)
    and their CPU core-hours and GPU minutes at the mean per run so far (training and decoding). None for a fixed
    design, a study past its last look, or results without compute."""
    design = (results.get("primary") or {}).get("design") or {}
    compute = results.get("compute")
    if design.get("kind") != "group-sequential" or not compute or not compute["total"]["runs"]:
        return None
    seeds, looks = len(results.get("seeds") or []), list(design.get("looks") or [])
    trained = len((results.get("spec") or {}).get("variants") or [])
    later = [n for n in looks if n > seeds]
    if not later or not trained:
        return None
    cpu, gpu = spent(compute["total"])
    runs = compute["total"]["runs"]

    def at(n: int) -> dict[str, Any]:
        todo = trained * (n - seeds)
        return {"seeds": n, "runs": todo, "cpu_hours": round(todo * cpu / runs, 2),
                "gpu_minutes": round(todo * gpu / runs, 2)}

    return {"per_run": {"cpu_hours": round(cpu / runs, 3), "gpu_minutes": round(gpu / runs, 3)},
            "next": {**at(later[0]), "look": looks.index(later[0]) + 1}, "last": {**at(looks[-1]), "look": len(looks)}}


def needed_text(need: dict[str, Any]) -> str:
    """``still_needed`` in words."""
    def part(x: dict[str, Any]) -> str:
        return (f"{x['runs']} runs to look {x['look']} ({x['seeds']} seeds per system), about {x['cpu_hours']:.1f} CPU "
                f"core-hours" + (f" and {x['gpu_minutes']:.1f} GPU minutes" if x["gpu_minutes"] else ""))

    per = need["per_run"]
    text = part(need["next"])
    if need["last"]["look"] != need["next"]["look"]:
        text += f"; {part(need['last'])}, the last"
    return (f"{text}: at the mean cost per run so far ({per['cpu_hours']:.2f} CPU core-hours"
            + (f", {per['gpu_minutes']:.2f} GPU minutes" if per["gpu_minutes"] else "") + ")")


def cost_summary(results: dict[str, Any]) -> str | None:
    """What the runs of a study's results cost so far, in words, and per resolved comparison of its primary family;
    None for results that do not record it (published before they did)."""
    compute = results.get("compute")
    if not compute:
        return None
    t = compute["total"]
    cpu, gpu = spent(t)
    text = (f"{t['runs']} runs: **{cpu:.1f} CPU core-hours** ({t['train_cpu_hours']:.1f} training, "
            f"{t['decode_cpu_hours']:.1f} decoding the test sets) and **{gpu:.1f} GPU minutes** "
            f"({t['train_gpu_minutes']:.1f} training, {t['decode_gpu_minutes']:.1f} decoding). Core-hours are wall "
            "time x threads x processes, from each run's training summaries (every segment of a resumed run) and its "
            "score files; start-up, tokenizers, data caches, model loading and these statistics are not counted, and "
            "a run linked from another study counts here too.")
    if t["threads_unrecorded"]:
        text += (f" Some threads of {', '.join(t['threads_unrecorded'])} were not recorded (no `train.num_threads`, "
                 "or a score file older than that record): counted as one.")
    primary = results.get("primary") or {}
    resolved = primary.get("resolved")
    if resolved:
        text += (f" Per resolved comparison of the primary family ({resolved} of {primary.get('size')}): "
                 f"{cpu / resolved:.1f} CPU core-hours and {gpu / resolved:.1f} GPU minutes.")
    elif primary.get("tests"):
        text += " No comparison of the primary family is resolved: the cost per resolved comparison is unbounded."
    if need := still_needed(results):
        text += f" Still needed: {needed_text(need)}."
    return text


def cost_lines(results: dict[str, Any]) -> list[str]:
    """The report's "Compute" section (none for results that do not record it)."""
    text = cost_summary(results)
    return [] if text is None else ["## Compute", "", text, ""]
