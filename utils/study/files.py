"""Reading the files a study and its report use, each checked before use: a damaged or changed file is refused in
one line naming it (and what is wrong, and how to make it again), never a traceback, never a silently wrong number.

Checksums (sha256), recorded when a file is written:

- test.py's score file ``eval/<split>.<checkpoint>.beam<N>[.<tag>].json`` records ``hyp_sha256``, that of its
  hypotheses (the ``.hyp`` beside it), and ``sha256``, its own: that of the compact JSON of its other keys
  (``json_sha256``);
- the attention statistics ``eval/attention_stats.*.json`` (utils/study/runs.py) and ``results.json`` record their
  own ``sha256`` the same way; ``results.json`` also records each published ``hypotheses/*.json.xz`` file's
  (``checksums``).

Files written before checksums were recorded carry none. They keep loading: a study's score and attention files
without one are recorded in ``<study>/checksums.json`` (``Ledger``) the first time the study reads them, and a
later change to them is refused; a ``results.json`` without one (a study published before) is read as it is, and
the report rewritten from it (bench/study_report.py) records them.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import os
from pathlib import Path
from typing import Any

from utils.io import json_sha256, with_sha256
from utils.schema import ConfigError


def slug(label: str, keep: str = "") -> str:
    """``label`` as a file or folder name: every run of characters other than letters, digits, ``_.+-`` and those of
    ``keep`` made one ``_`` (a variant's runs folder: ``attention_pe_rope``; its published hypotheses, ``keep="="``:
    ``attention_pe=rope``)."""
    import re

    return re.sub(rf"[^A-Za-z0-9_.+\-{re.escape(keep)}]+", "_", label)


class StudyFileError(ConfigError):
    """A file a study reads is damaged or changed since it was written: one line naming it."""


def file_sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_bytes(path: Path) -> bytes:
    """The file's bytes (OSError, which bench's commands report in one line, if it cannot be read)."""
    return Path(path).read_bytes()


def parse_json(path: Path, data: bytes, what: str = "a JSON object") -> dict[str, Any]:
    """``data`` (the bytes of ``path``) as a JSON object; StudyFileError naming ``path`` if it is not UTF-8, truncated,
    not JSON or not an object."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise StudyFileError(f"{path}: not UTF-8 text (byte {e.start} is 0x{data[e.start]:02x}): not {what}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        # the text ended inside a string or where more was expected: a prefix of a document, cut short
        why = "truncated" if e.pos >= len(text.rstrip()) or e.msg.startswith("Unterminated string") else "not JSON"
        raise StudyFileError(f"{path}: {why} ({e.msg}: line {e.lineno} column {e.colno}): not {what}") from None
    if not isinstance(doc, dict):
        raise StudyFileError(f"{path}: JSON, but not {what}")
    return doc


def read_json(path: Path, what: str = "a JSON object") -> dict[str, Any]:
    """The JSON object in ``path``, checked as ``parse_json`` does."""
    return parse_json(path, read_bytes(path), what)


def verify_own(path: Path, doc: dict[str, Any], remedy: str) -> bool:
    """Whether ``doc`` (read from ``path``) records its own checksum; StudyFileError, naming ``path`` and ``remedy``,
    if it does and its content no longer matches it."""
    recorded = doc.get("sha256")
    if recorded is None:
        return False
    if recorded != json_sha256(doc):
        raise StudyFileError(f"{path}: changed since it was written (its content no longer matches the sha256 it "
                             f"records); {remedy}")
    return True


def rescore_hint(score_file: Path) -> str:
    """How to score a run's split again: what the refusals about a score file or its hypotheses end with."""
    return (f"to score it again, delete {score_file.name} and {score_file.with_suffix('.hyp').name} in "
            f"{score_file.parent} and run the study again (its checkpoint is needed)")


def check_hypotheses(hyp: Path, data: bytes, sentences: int, score_file: Path) -> list[str]:
    """test.py's hypotheses file ``hyp`` (bytes ``data``) as lines: UTF-8 text of exactly ``sentences`` lines, each
    ended; StudyFileError naming it otherwise."""
    remedy = rescore_hint(score_file)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise StudyFileError(f"{hyp}: not UTF-8 text (byte {e.start} is 0x{data[e.start]:02x}): not the hypotheses "
                             f"test.py wrote; {remedy}") from None
    lines = text.split("\n")
    if lines[-1] != "":
        raise StudyFileError(f"{hyp}: truncated (its last line has no end): not the hypotheses test.py wrote; "
                             f"{remedy}")
    lines = lines[:-1]
    if len(lines) != sentences:
        raise StudyFileError(f"{hyp}: {len(lines)} lines for the {sentences} reference sentences scored (test.py "
                             f"writes one per sentence): truncated or edited; {remedy}")
    return lines


class Ledger:
    """``<study>/checksums.json``: the sha256 of the files a study reads that carry none of their own (written by an
    older test.py or study), recorded the first time the study reads them; a later change to them is refused. A
    hypotheses file is recorded with its score file: a new score file (the split scored again) records both anew."""

    def __init__(self, study: Path) -> None:
        self.study = Path(study)
        self.path = self.study / "checksums.json"
        self.files: dict[str, Any] = {}
        if self.path.is_file():
            doc = read_json(self.path, "a study's checksums (checksums.json)")
            verify_own(self.path, doc, f"delete it, and the study records the checksums of {self.study}'s files "
                                       "again at its next read")
            self.files = doc.get("files") if isinstance(doc.get("files"), dict) else {}
        self.recorded: list[str] = []

    def _key(self, path: Path) -> str:
        return os.path.relpath(path, self.study)

    def check_pair(self, hyp: Path, hyp_data: bytes, score_file: Path, score_data: bytes) -> None:
        """A hypotheses file whose score file records no checksum: recorded at first read, then checked (while its
        score file is the same)."""
        key, pair = self._key(hyp), [file_sha256(score_data), file_sha256(hyp_data)]
        old = self.files.get(key)
        if isinstance(old, list) and old[0] == pair[0] and old[1] != pair[1]:
            raise StudyFileError(f"{hyp}: changed since it was scored (its sha256 is not the one {self.path} "
                                 f"recorded); {rescore_hint(score_file)}")
        if old != pair:
            self.files[key] = pair
            self.recorded.append(key)

    def check_file(self, path: Path, data: bytes, remedy: str) -> None:
        """A file that records no checksum: recorded at first read, then checked."""
        key, sha = self._key(path), file_sha256(data)
        old = self.files.get(key)
        if old is not None and old != sha:
            raise StudyFileError(f"{path}: changed since the study first read it (its sha256 is not the one "
                                 f"{self.path} recorded); {remedy}")
        if old is None:
            self.files[key] = sha
            self.recorded.append(key)

    def save(self) -> int:
        """Write the ledger if something was recorded; how many files were."""
        if not self.recorded:
            return 0
        from utils.io import atomic_write_text

        doc = with_sha256({"note": "sha256 of files that record none of their own (written by an older test.py or "
                                   "bench/study.py), recorded at the study's first read of them", "files": self.files})
        atomic_write_text(self.path, json.dumps(doc, indent=1) + "\n")
        return len(self.recorded)


# ---------------------------------------------------------------------------------------------- a study's folder

RESULTS_KEYS = ("spec", "systems", "seeds", "splits", "baseline")
#: What each key of a study's results holds, where the commands that read them rely on it: key (dotted: within
#: another) -> (a test of its value, what it should be).
RESULTS_SHAPE: dict[str, tuple[Any, str]] = {
    "spec": (lambda v: isinstance(v, dict), "an object"),
    "systems": (lambda v: isinstance(v, dict) and all(isinstance(e, dict) for e in v.values()),
                "an object of one object per system"),
    "seeds": (lambda v: _counts(v), "a list of seeds"),
    "splits": (lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v), "a list of split names"),
    "baseline": (lambda v: isinstance(v, str), "a system's name"),
    "primary": (lambda v: isinstance(v, dict) and isinstance(v.get("tests"), list)
                and all(isinstance(t, dict) for t in v["tests"]), "an object with a list of tests"),
    "primary.power": (lambda v: isinstance(v, dict), "an object"),
    "primary.design": (lambda v: v is None or isinstance(v, dict), "an object"),
}


def read_results(folder: Path, need: tuple[str, ...] = ()) -> dict[str, Any]:
    """A study's ``results.json``: a JSON object holding a study's results (``RESULTS_KEYS``, and the keys of
    ``need``, keys of ``RESULTS_SHAPE``, dotted within another: ``primary.power``), each of the shape it gives,
    unchanged since written where it records its checksum; StudyFileError naming it otherwise (one line)."""
    path = Path(folder) / "results.json"
    doc = read_json(path, "a study's results")
    verify_own(path, doc, "restore it as it was published or written (it cannot be recomputed from itself)")
    required = {*RESULTS_KEYS, *need}
    for key, (test, what) in RESULTS_SHAPE.items():  # a parent before its dotted keys
        parent, _, last = key.rpartition(".")
        holder = doc.get(parent) if parent else doc
        if not isinstance(holder, dict) or last not in holder:
            if key in required:
                raise StudyFileError(f"{path}: no {key!r}: not a study's results (or a study scored by an older "
                                     "version, without it)")
            continue
        if not test(holder[last]):
            raise StudyFileError(f"{path}: {key!r} is not {what}: not a study's results as a study writes them; "
                                 "restore it as it was published or written")
    return doc


def _count_or_none(value: Any) -> bool:
    """Whether ``value`` is a whole number of 0 or more (not a boolean), or None."""
    return value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0)


def _counts(value: Any) -> bool:
    """Whether ``value`` is a list of whole numbers of 0 or more (seeds)."""
    return isinstance(value, list) and all(x is not None and _count_or_none(x) for x in value)


def read_spec(path: Path) -> dict[str, Any]:
    """A study's ``study.json`` (its definition: variants, seeds, budget); StudyFileError naming it if it is not
    one (truncated, not JSON, variants that are not label and overrides)."""
    doc = read_json(path, "a study's definition")
    variants = doc.get("variants", [])
    if not isinstance(variants, list) or not all(
            isinstance(v, dict) and isinstance(v.get("label"), str) and isinstance(v.get("overrides"), list)
            and all(isinstance(o, str) for o in v["overrides"]) for v in variants):
        raise StudyFileError(f"{path}: its variants are not a list of label and overrides: not a study's definition")
    if not (_count_or_none(doc.get("steps")) and _count_or_none(doc.get("tokens")) and _counts(doc.get("seeds", []))):
        raise StudyFileError(f"{path}: its budget (steps, tokens) or seeds are not counts: not a study's definition")
    return doc


def hypotheses_checksums(folder: Path) -> dict[str, str]:
    """``hypotheses/<file>`` -> sha256 of each published hypotheses file of a study folder."""
    return {f"hypotheses/{p.name}": file_sha256(p.read_bytes()) for p in sorted((folder / "hypotheses").glob("*.xz"))}


def read_hypotheses_file(path: Path, checksums: dict[str, str] | None = None) -> dict[str, dict[str, list[str]]]:
    """One published ``hypotheses/<system>.seed<k>.json.xz`` as ``{split: {decoder: lines}}``, checked against the
    ``checksums`` its study's results.json records (None: it records none, a study published before them);
    StudyFileError naming it if it changed, is truncated or is not one."""
    data = read_bytes(path)
    remedy = "restore it as the study published it, or score the study again"
    if checksums is not None:
        key = f"hypotheses/{path.name}"
        if key not in checksums:
            raise StudyFileError(f"{path}: not among the files {path.parent.parent / 'results.json'} records (added "
                                 f"or renamed since); {remedy}")
        if checksums[key] != file_sha256(data):
            raise StudyFileError(f"{path}: changed since it was published (its sha256 is not the one "
                                 f"{path.parent.parent / 'results.json'} records); {remedy}")
    try:
        raw = lzma.decompress(data)
    except (lzma.LZMAError, EOFError) as e:
        why = "truncated" if isinstance(e, EOFError) or "ended before" in str(e) else "not xz-compressed"
        raise StudyFileError(f"{path}: {why} ({e}): not a study's published hypotheses; {remedy}") from None
    doc = parse_json(path, raw, "a study's published hypotheses")
    if not all(isinstance(per, dict) and all(isinstance(lines, list) and all(isinstance(x, str) for x in lines)
                                             for lines in per.values()) for per in doc.values()):
        raise StudyFileError(f"{path}: not {{split: {{decoder: [lines]}}}}: not a study's published hypotheses; "
                             f"{remedy}")
    return doc
