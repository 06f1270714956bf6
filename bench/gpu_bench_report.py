"""The report of bench/gpu_bench.sh: the parts' files (``OUT/parts/<part>.json``, bench/gpu_bench.py) joined into
``OUT/gpu_bench.json`` and the Markdown tables of ``OUT/gpu_bench.md``, headed by the command, the machine, the date
and the code's commit. A part missing (stopped before it wrote anything) is a line saying so."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.common import ROOT, fmt, ratio
from utils.io import atomic_write_text

SECTIONS = ("base", "profile", "study", "eole")
MODE_ORDER = ("eager", "compile", "reduce-overhead")


def commit() -> str:
    """The checkout's commit, and whether it has uncommitted changes; "unknown" outside a git checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=20)
        if head.returncode != 0:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return head.stdout.strip() + (" with uncommitted changes" if dirty else "")


def read_parts(out: Path) -> dict[str, Any]:
    parts: dict[str, Any] = {}
    for name in SECTIONS:
        path = out / "parts" / f"{name}.json"
        parts[name] = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    return parts


def write_report(out: Path, command: str) -> str:
    """Join ``out/parts/*.json`` into ``out/gpu_bench.json`` and ``out/gpu_bench.md``; returns the Markdown."""
    parts = read_parts(out)
    machines = [p["machine"] for p in parts.values() if p and p.get("machine")]
    meta = {"command": command, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit(),
            "machine": machines[0] if machines else None,
            "dry_run": any(bool(p.get("dry_run")) for p in parts.values() if p)}
    doc = {"meta": meta, **parts}
    text = markdown(doc)
    atomic_write_text(out / "gpu_bench.json", json.dumps(doc, indent=1) + "\n")
    atomic_write_text(out / "gpu_bench.md", text + "\n")
    return text


def machine_line(m: dict[str, Any] | None) -> str:
    if not m:
        return "unknown (no part recorded it)"
    cpu = f"{m['cpu']} ({m['cores']} cores)"
    if m.get("gpu"):
        return (f"{m['gpu']} ({m['gpu_memory_mib']:,} MiB, driver {m.get('driver') or '?'}, CUDA {m.get('cuda')}) on "
                f"{cpu}; torch {m['torch']}, Python {m['python']}")
    return f"CPU only: {cpu}; torch {m['torch']}, Python {m['python']}"


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def status(row: dict[str, Any]) -> str:
    return row["status"] if row.get("status") == "ok" else f"{row.get('status')}: {row.get('reason', '')}"


def markdown(doc: dict[str, Any]) -> str:
    meta = doc["meta"]
    lines = ["# GPU benchmark (bench/gpu_bench.sh)", "",
             f"- command: `{meta['command'] or 'bash bench/gpu_bench.sh'}`",
             f"- machine: {machine_line(meta['machine'])}",
             f"- date: {meta['date']}; code: commit {meta['commit']}"]
    if meta["dry_run"]:
        lines += ["", "**--dry-run**: a d 32 model on the CPU and the demo corpus, a few steps: these numbers test the "
                  "script and measure nothing."]
    lines += base_section(doc["base"]) + profile_section(doc["profile"]) + study_section(doc["study"])
    lines += eole_section(doc["eole"], doc["base"])
    return "\n".join(lines)


def missing(title: str) -> list[str]:
    return ["", f"## {title}", "", "Not measured: the part wrote nothing (stopped by its time cap or failed: see "
            "log.txt)."]


def base_section(base: dict[str, Any] | None) -> list[str]:
    title = "The base model: target tokens/s, MFU and memory"
    if base is None:
        return missing(title)
    lines = ["", f"## {title}", "",
             f"configs/gpu_base.yaml (d 512, 8 heads, 6+6 layers, FFN 2048) trained by the real loop; "
             f"{base['flops_per_target_token'] / 1e6:,.1f} MFLOP per real target token; MFU against the bf16 peak "
             f"({base['peak']}) for every precision.", "",
             "| precision | target tokens / step | mode | data.max_tokens | target tokens/s (steady) | MFU | "
             "steps/s | peak memory (MiB) | padding | first window (s) | steps | status |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    rows = sorted(base["rows"], key=lambda r: (r["precision"] != "fp32", r["target_tokens_per_step"],
                                               MODE_ORDER.index(r["mode"]) if r["mode"] in MODE_ORDER else 9))
    for r in rows:
        lines.append(f"| {r['precision']} | {r['target_tokens_per_step']:,} | {r['mode']} | {r['max_tokens']:,} | "
                     f"{fmt(r.get('tokens_per_s'), 0)} | {pct(r.get('mfu'))} | {fmt(r.get('steps_per_s'), 2)} | "
                     f"{fmt(r.get('peak_memory_mib'), 0)} | {pct(r.get('padding_share'))} | "
                     f"{fmt(r.get('first_window_s'), 0)} | {r.get('steps', '-')} | {status(r)} |")
    return lines


def profile_section(prof: dict[str, Any] | None) -> list[str]:
    title = "Where the best setting's step goes"
    if prof is None:
        return missing(title)
    lines = ["", f"## {title}", ""]
    if prof.get("status") != "ok":
        return lines + [f"Not measured: {prof.get('reason', prof.get('status'))}."]
    s = prof["setting"]
    lines += [f"{s['precision']}, {s['target_tokens_per_step']:,} target tokens per step, {s['mode']} ({prof['why']}):"
              f" torch.profiler over steps {prof['profile_after'] + 1}-{prof['profile_after'] + prof['profile_steps']}"
              " (train.profile_steps), milliseconds per optimizer step.", "", "| phase | ms / step | share |",
              "|---|---|---|"]
    ms = prof["ms_per_step"]
    total = sum(ms.values()) or 1.0
    lines += [f"| {p} | {ms[p]:.2f} | {100 * ms[p] / total:.1f} % |" for p in prof["phases"] if p in ms]
    lines.append(f"| step | {total:.2f} | 100 % |")
    return lines


def study_section(study: dict[str, Any] | None) -> list[str]:
    title = "Runs of the study's small model per GPU"
    if study is None:
        return missing(title)
    lines = ["", f"## {title}", "",
             "configs/gpu_study.yaml with the train-short-test-long preset's keys, one train.py process per run, "
             "all started at once and stopped together; steps/s over the window where every run was past its "
             "warm-up.", "", "| runs at once | optimizer steps/s together | per run | window (s) | GPU memory used "
             "(MiB) | status |", "|---|---|---|---|---|---|"]
    for r in study["rows"]:
        lines.append(f"| {r['label']} | {fmt(r.get('steps_per_s'), 1)} | {fmt(r.get('steps_per_s_per_run'), 2)} | "
                     f"{fmt(r.get('window_s'), 0)} | {fmt(r.get('gpu_memory_used_mib'), 0)} | {status(r)} |")
    how = {r.get("how") for r in study["rows"] if r.get("how") and r.get("how") != "common window"}
    lines += [f"\n{h}." for h in sorted(how)]
    if study.get("mps"):
        lines.append(f"\nCUDA MPS: {study['mps']}.")
    return lines


def eole_section(eole: dict[str, Any] | None, base: dict[str, Any] | None) -> list[str]:
    title = "Eole 0.6.4 on the same GPU"
    if eole is None:
        return missing(title)
    lines = ["", f"## {title}", ""]
    if eole.get("status") != "ok":
        return lines + [f"Not measured: {eole.get('reason', eole.get('status'))}."]
    per_token = base.get("flops_per_target_token") if base else None
    peak = base.get("peak_flops") if base else None
    mfu = per_token * eole["target_tokens_per_s"] / peak if per_token and peak else None
    lines += [f"{eole['sizes']}, batches of {eole['max_tokens']:,} tokens (ours: about "
              f"{eole['target_tokens_per_step']:,} target tokens per step); Eole's rate is over its whole budget from "
              "its first batch, ours the steady one; MFU counts our model's FLOPs per target token.", "",
              "| system | target tokens/s | MFU | ours / Eole |", "|---|---|---|---|",
              f"| Eole {eole['version']} | {fmt(eole['target_tokens_per_s'], 0)} | {pct(mfu)} | |"]
    ours = [r for r in (base or {}).get("rows", []) if r.get("precision") == "bf16" and "tokens_per_s" in r
            and r.get("target_tokens_per_step") == eole["target_tokens_per_step"]]
    for r in sorted(ours, key=lambda r: MODE_ORDER.index(r["mode"]) if r["mode"] in MODE_ORDER else 9):
        lines.append(f"| ours, bf16, {r['mode']} | {fmt(r['tokens_per_s'], 0)} | {pct(r.get('mfu'))} | "
                     f"{ratio(r['tokens_per_s'], eole['target_tokens_per_s'])} |")
    return lines
