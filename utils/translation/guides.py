"""Target prefixes and terminology constraints on the command line (inference.py, test.py): ``--prefix TEXT`` (one
prefix for every input line), ``--prefix_file FILE`` (one per input line) and ``--constraints FILE`` (each input
line's phrases, as JSON lines or tab-separated), read in full and checked line by line (a bad line: one line
naming it), then lined up with the input, whose line count must match."""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

if TYPE_CHECKING:  # torch and pydantic: imported when guides are read, not when the parser is built
    from utils.config import DecodeConfig
    from utils.translation.translate import Guide

CONSTRAINT_FORMATS = ("auto", "jsonl", "tsv")


def add_guide_args(parser: argparse.ArgumentParser) -> None:
    """--prefix, --prefix_file, --constraints, --constraints_format."""
    group = parser.add_argument_group("target prefix and terminology constraints")
    group.add_argument("--prefix", metavar="TEXT",
                       help="every translation starts with TEXT (tokenized as target text): its tokens are forced, "
                            "kept in the output and counted in its score; the search goes on after them")
    group.add_argument("--prefix_file", "--prefix-file", dest="prefix_file", metavar="FILE",
                       help="a target prefix per input line, aligned with the input (an empty line: none)")
    group.add_argument("--constraints", metavar="FILE",
                       help="the phrases each translation must contain, one line per input line: a JSON list of "
                            "strings ([] for none) or the phrases separated by tabs (an empty line for none); "
                            "beam search with dynamic beam allocation (a beam of 2 or more)")
    group.add_argument("--constraints_format", "--constraints-format", dest="constraints_format",
                       choices=CONSTRAINT_FORMATS,
                       help="how --constraints is written: jsonl, tsv, or auto (the default: JSON lines if its first "
                            "non-blank line starts with '[' or '{', else tab-separated)")


def check_guide_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Flags that do not go together: refused in one line (exit 2)."""
    if args.prefix is not None and args.prefix_file is not None:
        parser.error("give --prefix TEXT or --prefix_file FILE, not both")
    if args.prefix is not None and not args.prefix.strip():
        parser.error("--prefix is empty: give the text the translations start with")
    if args.constraints_format is not None and args.constraints is None:
        parser.error("--constraints_format describes a --constraints FILE: give one")


def read_lines(path: str, flag: str) -> list[str]:
    """The lines of ``path`` (UTF-8, split at line feeds, a carriage return before one dropped); InputError, one
    line, for a file that cannot be read or a line that is not text."""
    from utils.translation.translate import MAX_LINE_BYTES, InputError, bounded_lines

    p = Path(path)
    if p.is_dir():
        raise InputError(f"{flag} {path} is a folder, not a text file")
    try:
        stream = open(p, "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        raise InputError(f"{flag} {path}: file not found") from None
    except OSError as e:
        raise InputError(f"{flag} {path}: cannot read ({e.strerror or type(e).__name__})") from None
    lines = []
    with stream:
        for n, (raw, whole) in enumerate(bounded_lines(stream), 1):
            if n == 1:
                raw = raw.removeprefix(b"\xef\xbb\xbf")
            if not whole:
                raise InputError(f"{flag} {path} line {n}: longer than {MAX_LINE_BYTES:,} bytes")
            if b"\x00" in raw:
                raise InputError(f"{flag} {path} line {n}: holds NUL bytes (UTF-16 or binary?)")
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise InputError(f"{flag} {path} line {n}: not valid UTF-8 at byte {e.start}") from None
            lines.append(text.removesuffix("\n").removesuffix("\r"))
    return lines


def parse_constraints(lines: list[str], fmt: str = "auto", name: str = "--constraints") -> list[tuple[str, ...]]:
    """Each line's phrases: ``jsonl`` (a JSON list of strings, [] for none), ``tsv`` (phrases separated by tabs, an
    empty line for none) or ``auto`` (jsonl when the first non-blank line starts with '[' or '{'); whitespace runs in a
    phrase made one space. InputError, one line with the line number, for a line that is not so."""
    from data.lines import clean_text
    from utils.translation.translate import InputError

    if fmt == "auto":
        fmt = "jsonl" if next((line.lstrip() for line in lines if line.strip()), "").startswith(("[", "{")) else "tsv"
    out: list[tuple[str, ...]] = []
    for n, line in enumerate(lines, 1):
        where = f"{name} line {n}"
        if fmt == "jsonl":
            if not line.strip():
                raise InputError(f"{where}: empty; each line holds a JSON list of phrases ([] for none)")
            try:
                value = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(f"{where}: not JSON ({e.msg} at column {e.colno}); each line holds a JSON list of "
                                 "phrases ([] for none)") from None
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise InputError(f"{where}: expected a JSON list of strings ([] for none), got "
                                 f"{json.dumps(value, ensure_ascii=False)[:60]}")
            fields = value
        else:
            fields = line.split("\t") if line.strip() else []
        phrases = tuple(clean_text(f).strip() for f in fields)
        for j, phrase in enumerate(phrases, 1):
            if not phrase:
                hint = "" if fmt == "jsonl" else " (two tabs in a row, or a tab at an end of the line)"
                raise InputError(f"{where}: phrase {j} is empty{hint}")
        out.append(phrases)
    return out


@dataclass
class Guides:
    """The prefixes and constraints of a command line: ``prefix`` for every line, or ``prefixes`` and
    ``constraints`` per line (None where not given); ``files`` names the per-line files given."""

    prefix: str = ""
    prefixes: list[str] | None = None
    constraints: list[tuple[str, ...]] | None = None
    files: tuple[str, ...] = ()

    @property
    def given(self) -> bool:
        return bool(self.prefix) or self.prefixes is not None or self.constraints is not None

    @property
    def has_prefix(self) -> bool:
        return bool(self.prefix) or any(self.prefixes or [])

    @property
    def has_constraints(self) -> bool:
        return any(self.constraints or [])

    @property
    def lines(self) -> int | None:
        """The input lines the per-line files are for (None: no such file)."""
        counts = [len(x) for x in (self.prefixes, self.constraints) if x is not None]
        return counts[0] if counts else None

    def check_count(self, n: int, what: str) -> None:
        """InputError, one line, unless each per-line file has ``n`` lines (``what``: the input, e.g. a file name)."""
        from utils.translation.translate import InputError

        for flag, name, count in self._counts():
            if count != n:
                raise InputError(f"{flag} {name} has {count} line{'s' * (count != 1)} but {what} has {n}: give one "
                                 "line per input line")

    def _counts(self) -> Iterator[tuple[str, str, int]]:
        files = iter(self.files)
        for flag, lines in (("--prefix_file", self.prefixes), ("--constraints", self.constraints)):
            if lines is not None:
                yield flag, next(files), len(lines)

    def __iter__(self) -> Iterator[Guide]:
        """One ``Guide`` per input line (endless with ``--prefix`` alone)."""
        from utils.translation.translate import Guide

        prefixes = itertools.repeat(self.prefix) if self.prefixes is None else iter(self.prefixes)
        constraints = itertools.repeat(()) if self.constraints is None else iter(self.constraints)
        for prefix, phrases in zip(prefixes, constraints, strict=False):  # the shorter ends it (lines when given)
            yield Guide(prefix, phrases)

    def take(self, n: int) -> list[Guide]:
        """The guides of the first ``n`` lines."""
        return list(itertools.islice(iter(self), n))


def load_guides(args: argparse.Namespace) -> Guides:
    """--prefix, --prefix_file and --constraints (``add_guide_args``) read and checked; InputError, one line."""
    from data.lines import clean_text

    guides = Guides(prefix=clean_text(args.prefix).strip() if args.prefix else "")
    files = []
    if args.prefix_file is not None:
        guides.prefixes = [clean_text(line).strip() for line in read_lines(args.prefix_file, "--prefix_file")]
        files.append(args.prefix_file)
    if args.constraints is not None:
        name = f"--constraints {args.constraints}"
        guides.constraints = parse_constraints(read_lines(args.constraints, "--constraints"),
                                               args.constraints_format or "auto", name)
        files.append(args.constraints)
    guides.files = tuple(files)
    return guides


def count_lines(stream: BinaryIO) -> int:
    """The lines ``translate_stream`` reads from ``stream`` (from where it is to its end), as its line reader counts
    them: one per line feed, and one for a last line without."""
    n, tail = 0, b"\n"
    while block := stream.read(1 << 20):
        n += block.count(b"\n")
        tail = block[-1:]
    return n + (tail != b"\n")


def counted(stream: BinaryIO) -> tuple[BinaryIO, int]:
    """``stream`` ready to be read from its start again, and its line count (``count_lines``). A stream that cannot
    seek (standard input, a pipe) is copied first, in memory up to 64 MiB and in a temporary file beyond."""
    if stream.seekable():
        start = stream.tell()
        n = count_lines(stream)
        stream.seek(start)
        return stream, n
    copy = tempfile.SpooledTemporaryFile(max_size=64 << 20)  # noqa: SIM115 - the caller closes it
    n, tail = 0, b"\n"
    while block := stream.read(1 << 20):
        copy.write(block)
        n += block.count(b"\n")
        tail = block[-1:]
    copy.seek(0)
    return copy, n + (tail != b"\n")  # type: ignore[return-value]


def line_up(guides: Guides, stream: BinaryIO, name: str) -> BinaryIO:
    """``stream`` (the input) ready to translate, once its line count matches the per-line files' (InputError, one
    line, before anything is translated, if not); unchanged without such files."""
    if guides.lines is None:
        return stream
    stream, n = counted(stream)
    try:
        guides.check_count(n, name)
    except Exception:
        stream.close()
        raise
    return stream


def check_guides(guides: Guides, decode: DecodeConfig, run: object | None) -> None:
    """ConfigError, one line, where ``guides`` cannot be decoded: no PyTorch ``run`` (a CTranslate2 export), or
    decoding settings that cannot honour them (``guide_problem``); InputError for a line whose prefix and phrases
    do not fit in the model's positions. Nothing to check without guides."""
    from utils.config import ConfigError
    from utils.translation.translate import encode_guides, guide_problem

    if not guides.given:
        return
    if run is None:
        raise ConfigError("--prefix, --prefix_file and --constraints need a PyTorch run, not a CTranslate2 export")
    problem = guide_problem(decode, guides.has_prefix, guides.has_constraints)
    if problem:
        raise ConfigError(problem)
    model, tokenizer = run.model, run.tokenizer  # type: ignore[attr-defined]
    encode_guides(tokenizer, guides.take(guides.lines or 1), model.max_length)


def _sha256(obj: object) -> str:
    return hashlib.sha256(json.dumps(obj, ensure_ascii=False).encode("utf-8")).hexdigest()


def guide_tag(guides: Guides) -> list[str]:
    """File-name tag parts for scores decoded with ``guides`` (a short hash of each), so that they never overwrite
    the scores of plain decoding nor each other's."""
    parts = []
    if guides.prefix:
        parts.append(f"prefix-{_sha256(guides.prefix)[:8]}")
    if guides.prefixes is not None:
        parts.append(f"prefixes-{_sha256(guides.prefixes)[:8]}")
    if guides.constraints is not None:
        parts.append(f"constraints-{_sha256(guides.constraints)[:8]}")
    return parts


def guide_report(guides: Guides, texts: list[str], met: list[bool], lowercase: bool = False
                 ) -> tuple[dict[str, object], str | None]:
    """What a score file records of ``guides`` for the translations ``texts`` of its first lines (``met``: whether
    each one's search met its constraints), and the line test.py prints (None without constraints): the sentences
    meeting all their phrases, and the phrases found in the text (case-insensitively for a lowercasing
    tokenizer)."""
    entry: dict[str, object] = {}
    if guides.prefix:
        entry["prefix"] = guides.prefix
    if guides.prefixes is not None:
        entry["prefix_file"] = {"path": guides.files[0], "sha256": _sha256(guides.prefixes)}
    if guides.constraints is None:
        return entry, None
    case = str.lower if lowercase else str
    phrases = guides.constraints[: len(texts)]
    asked = [i for i, p in enumerate(phrases) if p]
    found = sum(case(p) in case(texts[i]) for i in asked for p in phrases[i])
    total = sum(len(phrases[i]) for i in asked)
    entry["constraints"] = {"path": guides.files[-1], "sha256": _sha256(guides.constraints), "sentences": len(asked),
                            "sentences_met": sum(met[i] for i in asked), "phrases": total, "phrases_found": found}
    line = (f"  constraints: {sum(met[i] for i in asked)}/{len(asked)} sentences meet all theirs; {found}/{total} "
            "phrases appear in the translations")
    return entry, line
