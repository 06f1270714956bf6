"""What trained a study's kept runs: the CPU (``cpu.txt``) and the package versions (``packages.txt``, or the run's
``environment.json``) of each, read from seed folders or from ``bench/worktree.sh``'s ``keep_runs`` archives."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def recorded_packages(seed_folder: Path, run: Path | None = None) -> dict[str, str] | None:
    """The package versions of a kept run's environment: its seed folder's ``packages.txt`` (``pip freeze`` where
    ``keep_runs`` in bench/worktree.sh kept it), else the last entry of the run's ``environment.json``
    (utils.run.environment: what train.py recorded); ``{name: version}``, names in lower case with ``-``; None where
    neither was recorded."""
    try:
        text = (Path(seed_folder) / "packages.txt").read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = None
    if text is not None:
        found = {}
        for line in text.splitlines():
            name, sep, version = line.partition("==") if "==" in line else line.partition(" @ ")
            if sep and name.strip() and not line.startswith(("#", "-")):
                found[name.strip().lower().replace("_", "-")] = version.strip()
        return dict(sorted(found.items())) or None
    if run is not None:
        from utils.run.environment import read_environment

        try:
            entries = read_environment(run)
        except ValueError:
            return None
        return entries[-1].get("packages") or None if entries else None
    return None


def recorded_cpu(seed_folder: Path) -> str | None:
    """The CPU that trained a kept run, from its seed folder's ``cpu.txt`` (written by ``keep_runs`` in
    bench/worktree.sh, lscpu's words): its ``Model name``, and the first 8 hex digits of the SHA-256 of its
    instruction-set ``Flags`` where recorded (virtual machines may give CPUs with other instructions one model name);
    None where no model name was recorded."""
    try:
        text = (Path(seed_folder) / "cpu.txt").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    model = fields.get("Model name", "").strip()
    return cpu_label(model, fields.get("Flags", "")) if model else None


def cpu_label(model: str, flags: str) -> str:
    """A CPU as the study's pages name it: the model name, and the first 8 hex digits of the SHA-256 of its sorted
    instruction-set flags where there are any (lscpu's ``Flags``, /proc/cpuinfo's ``flags``: the same set)."""
    flags = " ".join(sorted(flags.split()))
    return f"{model}, flags {hashlib.sha256(flags.encode()).hexdigest()[:8]}" if flags else model


def archived_machines(archives: Iterable[Path]) -> dict[str, dict[str, Any]]:
    """The seed, CPU (``recorded_cpu``) and packages (``recorded_packages``) of each run kept in ``archives``,
    ``bench/worktree.sh``'s ``keep_runs`` files (each an xz tar of study folders' ``runs/SYSTEM/seedN/``, read as a
    stream): ``{"STUDY/runs/SYSTEM/seedN": {"seed": N, "cpu": ..., "packages": {...}}}``, "cpu" left out where its
    archive holds no cpu.txt with a model name, "packages" where it holds no packages.txt. The shape ``cpu_lines``
    and ``package_lines`` read."""
    import re
    import tarfile
    import tempfile

    runs: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for archive in archives:
            with tarfile.open(archive, "r|xz") as tar:
                for m in tar:
                    found = re.match(r"(.+/runs/[^/]+/seed(\d+))(/.*)?$", m.name)
                    if not found or "/.latest/" in m.name:
                        continue
                    run = runs.setdefault(found[1], {"seed": int(found[2])})
                    if found[3] == "/cpu.txt" and m.isfile():
                        tar.extract(m, tmp, filter="data")  # nothing outside tmp
                        if cpu := recorded_cpu(Path(tmp, found[1])):
                            run["cpu"] = cpu
                    elif found[3] == "/packages.txt" and m.isfile():
                        tar.extract(m, tmp, filter="data")
                        if packages := recorded_packages(Path(tmp, found[1])):
                            run["packages"] = packages
    return runs
