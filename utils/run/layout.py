"""The layout of a run directory: every file name a run holds is spelled here, and only here.

Layout of ``runs/<name>_<YYYYmmdd_HHMMSS>[_n]/``::

    config.yaml        the resolved config (every default filled in)
    tokenizer/         everything needed to rebuild the tokenizer
    checkpoints/       best.pt (best validation BLEU), last.pt (resume point), step_<N>.pt (periodic),
                       average<K>_step_<a>-step_<b>.pt (averaged)
    tb/                TensorBoard event files
    eval/              test.py hypotheses and score JSON, study statistics
    visualize/         visualize.py figures (its default --out; TensorBoard copies in tb/visualize/)
    train.log          the training log; its closing line holds the summary
    summary.json       the same summary, written at the end of training (runs before it have only the log line)
    environment.json   what trained it: Python, every package's version, CPU, GPUs; an entry per train.py call
    train.lock         locked (flock) while a process trains in the run
    provenance.json    a study's run: the commit(s) that trained it and its config hash (utils.study.provenance)

``runs/<name>_latest`` links to the newest run of that name that has a checkpoint, through its view
``runs/.latest/<run>/``: a folder of links to the run's files and folders except ``tb/`` (``checkpoints ->
../../<run>/checkpoints``...). Paths through the link reach the run (``runs/demo_latest/checkpoints/best.pt``), while
TensorBoard, which follows links, finds each run's event files once (``tensorboard --logdir runs``); a run folder
itself holds no link (copied or zipped, it is the run once). ``RunDir`` of the link or of a view is the run itself.

Light on purpose (no torch): scripts, utils and bench import it; models/, data/ and tokenizer/ do not.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from utils.io import atomic_write_text

SUMMARY_MARK = " | stats "  # precedes the JSON of the closing summary line in train.log
CHECKPOINT_EXT = "pt"
BEST = "best"
LAST = "last"
PERIODIC_PREFIX = "step_"


def read_summary(log_text: str) -> dict[str, Any]:
    """The closing summary of a train.log (steps, target_tokens, train/eval seconds, tokens/s, valid_ppl)."""
    for line in reversed(log_text.splitlines()):
        if SUMMARY_MARK in line and " optimizer steps" in line:
            return json.loads(line.split(SUMMARY_MARK, 1)[1])
    raise ValueError("the training log has no closing summary line (did training stop early?)")


VIEWS = ".latest"  # <runs>/.latest/<run>/: the run's files without tb/, where <name>_latest points
#: Longest run name (bytes): ``<name>_<YYYYmmdd_HHMMSS>_<n>`` must fit a file name (255 bytes).
MAX_NAME_BYTES = 200


def check_run_name(name: str) -> str:
    """``name`` if it can name run directories ``<runs>/<name>_<date>_<time>/`` and the link ``<name>_latest``
    inside the runs folder; ConfigError, one line, for an empty name, one with ``/`` or ``\\``, one starting with
    ``.`` or holding ``..``, control characters, or longer than ``MAX_NAME_BYTES`` bytes."""
    from utils.schema import ConfigError

    why = None
    if not name.strip():
        why = "it is empty"
    elif "/" in name or "\\" in name:
        why = "it holds a path separator (/ or \\); a run name is one folder name inside --runs"
    elif name.startswith(".") or ".." in name:
        why = "it starts with '.' or holds '..'"
    elif any(ord(c) < 32 or ord(c) == 127 for c in name):
        why = "it holds a control character"
    elif len(name.encode("utf-8")) > MAX_NAME_BYTES:
        why = f"it is longer than {MAX_NAME_BYTES} bytes"
    if why:
        raise ConfigError(f"run name {name!r}: {why} (use letters, digits, '_', '-' and '.')")
    return name


def run_root(path: Path | str) -> Path:
    """The run directory ``path`` names: the run itself for a ``<name>_latest`` link or a run's view
    (``<runs>/.latest/<run>``); any other path unchanged (not resolved)."""
    path = Path(path)
    real = path.resolve() if path.is_symlink() else path
    return real.parent.parent / real.name if real.parent.name == VIEWS else path


LATEST_SUFFIX = "_latest"


def latest_link_path(runs_root: Path | str, name: str) -> Path:
    """``<runs_root>/<name>_latest``: the link to the newest run of config ``name``."""
    return Path(runs_root) / f"{name}{LATEST_SUFFIX}"


def runs_in(folder: Path | str) -> list[Path]:
    """The runs ``folder`` holds: its ``*_latest`` links that reach a run, else its run directories (those with a
    config), sorted by name."""
    folder = Path(folder)
    links = sorted(p for p in folder.glob(f"*{LATEST_SUFFIX}") if RunDir(p).config.is_file())
    return links or sorted(p for p in folder.iterdir() if p.is_dir() and RunDir(p).config.is_file())


def eval_stem(checkpoint: str, beam: int, tag: str | None = None) -> str:
    """``<checkpoint>.beam<N>[.<tag>]``: what test.py's eval file names carry after the split name."""
    return f"{checkpoint}.beam{beam}" + (f".{tag}" if tag else "")


@dataclass(frozen=True)
class RunDir:
    """The paths of one run directory (nothing is created on construction). ``root`` given as a ``<name>_latest``
    link or a run's view is the run directory itself (``run_root``), so what is written lands in the run."""

    root: Path

    def __init__(self, root: Path | str) -> None:
        object.__setattr__(self, "root", run_root(root))

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def log(self) -> Path:
        return self.root / "train.log"

    @property
    def tokenizer(self) -> Path:
        return self.root / "tokenizer"

    @property
    def tb(self) -> Path:
        return self.root / "tb"

    @property
    def figures(self) -> Path:
        """visualize.py's default output folder."""
        return self.root / "visualize"

    @property
    def tb_figures(self) -> Path:
        """visualize.py's TensorBoard folder."""
        return self.tb / "visualize"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def lock(self) -> Path:
        return self.root / "train.lock"

    @property
    def summary_json(self) -> Path:
        return self.root / "summary.json"

    @property
    def eval_dir(self) -> Path:
        return self.root / "eval"

    @property
    def environment(self) -> Path:
        """What trained the run: Python, packages, CPU and GPUs of each train.py call (utils.run.environment)."""
        return self.root / "environment.json"

    @property
    def provenance(self) -> Path:
        """Where a study's run came from: the commits that trained it and its config hash."""
        return self.root / "provenance.json"

    @property
    def profile(self) -> Path:
        """``train.profile_steps``' output: ``phases.json`` and the profiler's trace."""
        return self.root / "profile"

    def phases(self) -> dict[str, Any]:
        """``profile/phases.json`` (utils/training/profile.py); ValueError if the run was not profiled."""
        path = self.profile / "phases.json"
        if not path.is_file():
            raise ValueError(f"{self.root} has no {path.relative_to(self.root)} (train with train.profile_steps > 0)")
        return json.loads(path.read_text(encoding="utf-8"))

    def scalars(self, tag: str) -> list[tuple[int, float]]:
        """A TensorBoard scalar of the run (e.g. ``valid/bleu``, ``train/tokens_per_s``): (iteration, value)
        pairs; empty when the run never logged it (or has no ``tb/``: a copy made without it)."""
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        if not self.tb.is_dir():
            return []

        quiet = logging.getLogger("tensorboard")  # it warns "No path found after <the last event file>"
        level = quiet.level
        quiet.setLevel(logging.ERROR)
        try:
            ea = EventAccumulator(str(self.tb), size_guidance={"scalars": 0})
            ea.Reload()
        finally:
            quiet.setLevel(level)
        if tag not in ea.Tags().get("scalars", []):
            return []
        return [(e.step, e.value) for e in ea.Scalars(tag)]

    def checkpoint(self, name: str) -> Path:
        """``checkpoints/<name>.pt`` (name: ``best``, ``last``, ``step_<N>``...)."""
        return self.checkpoints / f"{name}.{CHECKPOINT_EXT}"

    @property
    def best(self) -> Path:
        return self.checkpoint(BEST)

    @property
    def last(self) -> Path:
        return self.checkpoint(LAST)

    def periodic(self, step: int) -> Path:
        """The periodic checkpoint of iteration ``step``."""
        return self.checkpoint(f"{PERIODIC_PREFIX}{step}")

    def average(self, kept: list[Path]) -> Path:
        """Where the average of periodic checkpoints ``kept`` (oldest first) is saved."""
        return self.checkpoint(f"average{len(kept)}_{kept[0].stem}-{kept[-1].stem}")

    def eval_file(self, split: str, checkpoint: str, beam: int, tag: str | None = None, ext: str = "json") -> Path:
        """``eval/<split>.<checkpoint>.beam<N>[.<tag>].<ext>`` as test.py writes it (split ``all``: every split)."""
        return self.eval_dir / f"{split}.{eval_stem(checkpoint, beam, tag)}.{ext}"

    def attention_stats(self, checkpoint: str, sentences: int) -> Path:
        """``eval/attention_stats.<checkpoint>.n<sentences>.json`` (bench/study.py)."""
        return self.eval_dir / f"attention_stats.{checkpoint}.n{sentences}.json"

    @property
    def view(self) -> Path:
        """``<runs>/.latest/<run>/``: links to the run's files except ``tb/``, where ``<name>_latest`` points."""
        return self.root.parent / VIEWS / self.root.name

    def view_entries(self) -> tuple[list[Path], list[Path]]:
        """(folders, files) the view links to: everything of the run but ``tb/`` and ``train.lock``."""
        return ([self.tokenizer, self.checkpoints, self.eval_dir, self.figures, self.profile],
                [self.config, self.log, self.summary_json, self.environment])

    def latest_link(self, name: str) -> Path:
        """``<name>_latest`` next to this run (``name``: the config's name)."""
        return latest_link_path(self.root.parent, name)

    def write_summary(self, summary: dict[str, Any]) -> None:
        """Write ``summary.json`` atomically."""
        atomic_write_text(self.summary_json, json.dumps(summary, indent=2) + "\n")

    def summary(self) -> dict[str, Any]:
        """The closing training summary: ``summary.json``, else (runs written before it existed) parsed from
        ``train.log``. ValueError if training wrote neither."""
        if self.summary_json.is_file():
            return json.loads(self.summary_json.read_text(encoding="utf-8"))
        if self.log.is_file():
            return read_summary(self.log.read_text(encoding="utf-8"))
        raise ValueError(f"{self.root} has no {self.summary_json.name} and no {self.log.name}")
