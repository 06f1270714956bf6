"""What trained a run: ``environment.json`` in the run directory, one entry per ``train.py`` call that trained it.

A config and a seed repeat a CPU run exactly only with the same library versions on the same kind of CPU (floating
point sums round differently with another BLAS kernel). A run trained on one machine and resumed on another holds one
entry for each, in order::

    [{"started": "2026-12-02T14:05:12Z", "resumed_from_step": null, "python": "3.11.7",
      "platform": "Linux-6.1.0-x86_64-with-glibc2.36", "cpu": "AMD EPYC", "cpu_flags": "fpu vme ...",
      "device": "cpu", "gpus": [], "packages": {"torch": "2.13.0", "numpy": "2.3.5", ...}}, ...]

``packages`` is every installed distribution and its version (what ``pip freeze`` lists). Light (no torch import):
the caller passes the device and the GPUs' names.
"""

from __future__ import annotations

import json
import platform
import time
from importlib.metadata import distributions
from pathlib import Path
from typing import Any

from utils.host import cpu_description
from utils.io import atomic_write_text
from utils.run.layout import RunDir


def installed_packages() -> dict[str, str]:
    """Every installed distribution's name (lower case, ``-`` for ``_``) and version, sorted by name."""
    found: dict[str, str] = {}
    for dist in distributions():
        name = dist.metadata["Name"]
        if name:
            found.setdefault(name.lower().replace("_", "-"), dist.version)
    return dict(sorted(found.items()))


def describe(device: str, gpus: list[str], resumed_from_step: int | None = None) -> dict[str, Any]:
    """This process's entry: when it started training (UTC), the step it resumed from (None for a new run),
    Python, the OS, the CPU, ``device`` (``cpu``, ``cuda:0``...), the names of the GPUs it used, the packages."""
    cpu, flags = cpu_description()
    return {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "resumed_from_step": resumed_from_step,
            "python": platform.python_version(), "platform": platform.platform(), "cpu": cpu, "cpu_flags": flags,
            "device": device, "gpus": gpus, "packages": installed_packages()}


def read_environment(run_dir: Path | str) -> list[dict[str, Any]]:
    """The run's entries, oldest first; empty for a run without ``environment.json`` (trained before it existed)."""
    path = RunDir(run_dir).environment
    if not path.is_file():
        return []
    entries = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(entries, list):
        raise ValueError(f"{path}: not a list of entries")
    return entries


def record_environment(run_dir: Path | str, entry: dict[str, Any]) -> Path:
    """Append ``entry`` to the run's ``environment.json`` (written whole, atomically); returns its path."""
    path = RunDir(run_dir).environment
    atomic_write_text(path, json.dumps([*read_environment(run_dir), entry], indent=1) + "\n")
    return path


def summary_line(entry: dict[str, Any]) -> str:
    """One line for the training log: Python, torch, the CPU or GPUs."""
    torch = entry["packages"].get("torch", "not installed")
    where = ", ".join(entry["gpus"]) if entry["gpus"] else entry["cpu"]
    return f"python {entry['python']}, torch {torch}, {where} ({entry['device']})"
