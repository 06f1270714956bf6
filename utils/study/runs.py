"""What a study reads from and writes to its runs: test.py's score files, cached attention statistics and the
validation curve, each through the run's :class:`utils.run.layout.RunDir`. Shared by bench/study.py (which scores)
and bench/study_report.py / bench/pilot_rule.py (which read), so neither imports the other. Also the study's
progress on the terminal (``Progress``), read from the logs its commands write."""

from __future__ import annotations

import json
import re
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from utils.config import ConfigError
from utils.run.layout import RunDir

if TYPE_CHECKING:
    from utils.study.files import Ledger


def run_cfg(run: Path) -> Any:
    """The config a run trained with."""
    from utils.config import load_config

    return load_config(RunDir(run).config)


def eval_file(run: Path, split: str, beam: int, checkpoint: str, tag: str | None) -> Path:
    return RunDir(run).eval_file(split, checkpoint, beam, tag)


def file_tag(tag: str | None, max_sentences: int | None) -> str | None:
    """test.py's ``--tag`` for a (test variant, sample): a study scoring the first N sentences keeps its files
    apart from one scoring them all, also in a run two studies share."""
    return ".".join(x for x in (f"n{max_sentences}" if max_sentences else None, tag) if x) or None


def eval_current(path: Path, sentences: int, overrides: list[str], step: int) -> bool:
    """Whether test.py's scores at ``path`` exist and are what this study asks for: ``sentences`` scored
    under the inference ``overrides`` (a test variant whose settings changed is scored again) from the checkpoint
    of training step ``step`` (a run trained on after it was scored, or scores that do not say, are scored again)."""
    from utils.study.files import read_json, rescore_hint, verify_own

    if not path.is_file():
        return False
    scores = read_json(path, "test.py's scores")
    verify_own(path, scores, rescore_hint(path))
    return (scores.get("n_sentences") == sentences and scores.get("overrides", []) == overrides
            and scores.get("step") == step)


def read_scores(path: Path, sentences: int, ledger: Ledger | None = None) -> tuple[dict[str, Any], list[str]]:
    """test.py's score file at ``path`` and its hypotheses (``.hyp`` beside it), checked before use: both readable,
    ``sentences`` hypotheses, and each unchanged since test.py wrote it (the checksums the score file records, or,
    for a file an older test.py wrote without them, those ``ledger`` recorded at its first read); StudyFileError,
    one line naming the file and how to score it again, otherwise."""
    from utils.study.files import (
        StudyFileError,
        check_hypotheses,
        file_sha256,
        parse_json,
        read_bytes,
        rescore_hint,
        verify_own,
    )

    hyp = path.with_suffix(".hyp")
    score_data = read_bytes(path)
    scores = parse_json(path, score_data, "test.py's scores")
    own = verify_own(path, scores, rescore_hint(path))
    if scores.get("n_sentences") != sentences:
        raise StudyFileError(f"{path}: scores {scores.get('n_sentences')} sentences, not the {sentences} the study "
                             f"scores; {rescore_hint(path)}")
    data = read_bytes(hyp)
    lines = check_hypotheses(hyp, data, sentences, path)
    if own and "hyp_sha256" in scores:
        if scores["hyp_sha256"] != file_sha256(data):
            raise StudyFileError(f"{hyp}: changed since it was scored (its sha256 is not the one {path.name} "
                                 f"records); {rescore_hint(path)}")
    elif ledger is not None:
        ledger.check_pair(hyp, data, path, score_data)
    return scores, lines


def attention_file(run: Path, checkpoint: str, sentences: int) -> Path:
    return RunDir(run).attention_stats(checkpoint, sentences)


def read_attention(run: Path, checkpoint: str, sentences: int, ledger: Ledger | None = None) -> dict[str, Any] | None:
    """The cached attention statistics of a run on its first ``sentences`` validation pairs, if computed, checked
    before use: unchanged since written (the checksum the file records, or, for one an older study wrote without,
    the one ``ledger`` recorded at its first read); StudyFileError, one line naming the file, otherwise."""
    from utils.study.files import StudyFileError, parse_json, read_bytes, verify_own

    out = attention_file(run, checkpoint, sentences)
    if not out.is_file():
        return None
    remedy = "delete it and run the study again to compute it again (the run's checkpoint is needed)"
    data = read_bytes(out)
    stats = parse_json(out, data, "a run's attention statistics")
    if not verify_own(out, stats, remedy) and ledger is not None:
        ledger.check_file(out, data, remedy)
    if not isinstance(stats.get("stats"), dict):
        raise StudyFileError(f"{out}: no statistics in it: not a run's attention statistics; {remedy}")
    return {k: v for k, v in stats.items() if k != "sha256"}


def compute_attention(run: Path, checkpoint: str, sentences: int, step: int | None = None) -> dict[str, Any]:
    """Attention statistics of a run on its first ``sentences`` validation pairs (cached in the run, with the
    checkpoint's training step: computed again for another ``step``)."""
    cached = read_attention(run, checkpoint, sentences)
    if cached is not None and (step is None or cached.get("step") == step):
        return cached
    from data.sources import load_corpus
    from utils.figures.attention_stats import attention_statistics
    from utils.io import atomic_write_text
    from utils.run.load import load_run
    from utils.study.files import with_sha256
    from utils.translation.translate import encode_sources

    loaded = load_run(RunDir(run).checkpoint(checkpoint), device="cpu")
    valid = load_corpus(loaded.cfg.data)["validation"]
    n = min(sentences, len(valid))
    limit = loaded.model.max_length
    src = encode_sources(loaded.tokenizer, list(valid["src"][:n]), limit, strict=False)
    tgt = loaded.tokenizer.encode_tgt(list(valid["tgt"][:n]))
    if limit is not None:
        tgt = [t[: limit - 1] for t in tgt]
    stats = attention_statistics(loaded.model, loaded.tokenizer.bos_id, list(zip(src, tgt, strict=True))).to_dict()
    stats["step"] = loaded.step
    atomic_write_text(attention_file(run, checkpoint, sentences), json.dumps(with_sha256(stats)) + "\n")
    return stats


def valid_curve(run: Path) -> list[tuple[int, float]]:
    """Validation BLEU of a run against optimizer steps: from its TensorBoard events, or, where the run has none
    (a run kept without ``tb/``), from the validation lines of its ``train.log`` (BLEU to two decimals; the last
    line of a step where a resumed run logged it twice)."""
    curve = RunDir(run).scalars("valid/bleu")
    if not curve:
        log = RunDir(run).log
        text = log.read_text(encoding="utf-8", errors="replace") if log.is_file() else ""
        logged = {int(m[1]): float(m[2]) for m in map(_VALID_LINE.search, text.splitlines()) if m}
        curve = sorted(logged.items())
    if not curve:
        return []
    accumulate = run_cfg(run).train.accumulate  # the steps are iterations; the budget counts updates
    return [(step // accumulate, value) for step, value in curve]


# ---------------------------------------------------------------------------------------------- progress

# train.py's validation log line (utils/training/loop.py): its step is the trainer's iteration.
_VALID_LINE = re.compile(r"epoch \d+ step (\d+) \| valid loss .*? BLEU (-?[\d.]+|nan) chrF")


def duration(seconds: float) -> str:
    """``45s``, ``4m12s``, ``1h02m``."""
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


@dataclass
class _Running:
    index: int
    name: str  # "rope seed 2"
    action: str  # "" for a training, "beam 5 1" (and a test variant's tag) for a scoring
    log: Path
    offset: int  # where this command's output starts in its (appended) log
    started: float
    done: float = 0.0  # fraction of the budget trained, from its last validation


class Progress:
    """What a study's commands do, on the terminal: one line per command started, per validation of a training
    (its step and validation BLEU, read from the log the command appends to) and per command finished, on standard
    output; with standard error a terminal, also an overall bar there (tqdm), which the lines scroll above.

    Commands are named by their labels: ``train <variant> seed <k>`` or ``test <variant> seed <k> beam ...``.
    ``steps``: the study's budget in optimizer steps (None: a token budget); ``accumulate``: iterations per
    optimizer step of each ``<variant> seed <k>``, where not 1."""

    def __init__(self, labels: list[str], steps: int | None = None, accumulate: dict[str, int] | None = None,
                 bar: bool | None = None) -> None:
        self.total = len(labels)
        self.index = {label: i for i, label in enumerate(labels, 1)}
        self.steps, self.accumulate = steps, accumulate or {}
        self.running: dict[str, _Running] = {}
        self.finished = 0
        self.bar = None
        if (sys.stderr.isatty() if bar is None else bar) and labels:
            try:
                from tqdm import tqdm
            except ImportError:  # a bare environment: the lines alone
                tqdm = None
            if tqdm is not None:
                desc = f"training {self.total} runs" if labels[0].startswith("train ") else \
                    f"scoring: {self.total} commands"
                self.bar = tqdm(total=self.total, desc=desc, file=sys.stderr, leave=False, dynamic_ncols=True,
                                bar_format="{desc}: {percentage:3.0f}%|{bar}| {elapsed}<{remaining}")

    def say(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line, file=sys.stdout)
            sys.stdout.flush()
        else:
            print(line, flush=True)

    @staticmethod
    def _parts(label: str) -> tuple[str, str]:
        """(``<variant> seed <k>``, what is done to it) of a command's label."""
        what, _, rest = label.partition(" ")
        if what == "test":
            name, sep, beams = rest.partition(" beam ")
            return name, f"beam {beams}" if sep else "scoring"
        return rest, ""

    def started(self, label: str, log: Path, resumed: bool = False) -> None:
        name, action = self._parts(label)
        offset = log.stat().st_size if log.is_file() else 0
        run = _Running(self.index.get(label, 0), name, action, log, offset, time.monotonic())
        self.running[label] = run
        what = f"scoring ({action}) started" if action else "started" + (" (resuming its last checkpoint)"
                                                                          if resumed else "")
        self.say(f"[{run.index}/{self.total}] {name}: {what}")

    def poll(self) -> None:
        """Report the validations the running trainings logged since the last call."""
        for run in self.running.values():
            if not run.action:
                self._read(run)
        self._draw()

    def ended(self, label: str, ok: bool = True) -> None:
        run = self.running.pop(label, None)
        if run is None:
            return
        if not run.action:
            self._read(run)
        took = duration(time.monotonic() - run.started)
        if ok:
            self.finished += 1
            self.say(f"[{run.index}/{self.total}] {run.name}: " + (f"scored ({run.action}) in {took}" if run.action
                                                                    else f"finished in {took}"))
        else:
            self.say(f"[{run.index}/{self.total}] {run.name}: failed after {took}")
        self._draw()

    def _read(self, run: _Running) -> None:
        try:
            with open(run.log, "rb") as f:
                f.seek(run.offset)
                chunk = f.read()
        except OSError:
            return
        end = chunk.rfind(b"\n") + 1  # whole lines only: the rest is read once it is complete
        run.offset += end
        for line in chunk[:end].decode("utf-8", "replace").splitlines():
            m = _VALID_LINE.search(line)
            if m is None:
                continue
            step = int(m.group(1)) // self.accumulate.get(run.name, 1)
            if self.steps:
                run.done = min(1.0, step / self.steps)
            total = f"/{self.steps}" if self.steps else ""
            self.say(f"[{run.index}/{self.total}] {run.name}: step {step}{total} valid BLEU {float(m.group(2)):.1f}")

    def _draw(self) -> None:
        if self.bar is not None:
            self.bar.n = self.finished + sum(r.done for r in self.running.values())
            self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


# ---------------------------------------------------------------------------------------------- run folders


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
