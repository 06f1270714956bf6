"""Text in, text out: tokenise, batch by length, decode (greedy or beam), detokenise, restore order.

``translate_stream`` does the same for a file or standard input of any size: lines are read as the
training data is read (split on ``\n`` only, UTF-8, whitespace runs made one space), translated in
chunks in bounded memory, and written in input order as each chunk is done.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import BinaryIO, TextIO

import torch

from models.constrained import ConstrainedBeamSearch
from models.decoding import BeamSearch, GreedySearch, Hypothesis, Search
from models.sampling import SampleSearch
from models.transformer import Seq2SeqTransformer
from tokenizer import Tokenizer
from utils.config import DecodeConfig

log = logging.getLogger("translate")


class InputError(ValueError):
    """A source sentence that cannot be translated (empty, or longer than the model allows)."""


@dataclass
class Translation:
    """One hypothesis as text, with its summed log-probability and length-penalised score; ``token_logprobs`` as in
    ``Hypothesis``; ``utility``: its expected utility under MBR decoding (None otherwise)."""

    text: str
    score: float
    logprob: float
    tokens: list[int]
    token_logprobs: list[float] = field(default_factory=list)
    utility: float | None = None
    constraints_met: bool = True  # False: it reached the length cap without a phrase of its constraints


@dataclass(frozen=True)
class Guide:
    """What one sentence's translation must hold: ``prefix``, the text it starts with (its tokens forced, kept in
    the output and scored), and ``constraints``, phrases it must contain (lexically constrained beam search,
    ``models.constrained``). The empty default guides nothing."""

    prefix: str = ""
    constraints: tuple[str, ...] = ()


@dataclass(frozen=True)
class GuideIds:
    """A ``Guide`` as target token ids (``encode_guides``): the prefix's, and for each phrase the token paths that
    meet it (``phrase_paths``; ``models.constrained``)."""

    prefix: tuple[int, ...] = ()
    constraints: tuple[tuple[tuple[int, ...], ...], ...] = ()


#: Punctuation a subword tokenizer may write in one token with the word before it (to the demo's, ``water`` is
#: ``▁wat er`` but ``water.`` is ``▁water.``): a phrase followed by one of them is another path that meets it.
ATTACHED = (".", ",", "!", "?", ":", ";", ")", "'", '"', "»", "…")


def phrase_paths(tokenizer: Tokenizer, phrase: str) -> tuple[tuple[int, ...], ...]:
    """The token paths that meet a constraint phrase: its tokens as written (the first path, whose length counts),
    then those of the phrase followed by each of ``ATTACHED`` where they differ."""
    paths: list[tuple[int, ...]] = []
    for ids in tokenizer.encode_tgt([phrase] + [phrase + mark for mark in ATTACHED]):
        if ids and tuple(ids) not in paths:
            paths.append(tuple(ids))
    return tuple(paths)


OnDone = Callable[[int, list[Translation]], None]  # (index of a source, its final n-best list)


def _batches(lengths: Sequence[int], batch_size: int) -> Iterator[list[int]]:
    """Indices grouped into batches of similar length (longest first), for little padding."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    for start in range(0, len(order), batch_size):
        yield order[start : start + batch_size]


def encode_sources(
    tokenizer: Tokenizer, texts: Sequence[str], max_length: int | None, strict: bool = True
) -> list[list[int]]:
    """Source ids with eos appended. Over-long or empty inputs raise ``InputError`` when ``strict``;
    otherwise over-long ones are truncated (with a warning) and empty ones stay empty."""
    from data.lines import clean_text

    texts = [clean_text(t) for t in texts]  # as training data was read, whatever the caller passes
    ids = tokenizer.encode_src(texts)
    out = []
    truncated = 0
    for n, (text, seq) in enumerate(zip(texts, ids, strict=True), 1):
        if not text.strip():
            if strict:
                raise InputError(f"sentence {n} is empty")
            out.append([])
            continue
        if max_length is not None and len(seq) + 1 > max_length:
            if strict:
                raise InputError(
                    f"sentence {n} has {len(seq) + 1} tokens, over the model's limit of {max_length} "
                    "(the positions its input position encoding represents)"
                )
            seq = seq[: max_length - 1]
            truncated += 1
        out.append(seq + [tokenizer.eos_id])
    if truncated:
        log.warning("truncated %d source sentences to the model's %d positions", truncated, max_length)
    return out


def encode_target(tokenizer: Tokenizer, text: str, max_length: int | None) -> list[int]:
    """A target sentence's ids (no bos/eos), for teacher forcing; ``InputError`` if empty or, with bos, over
    ``max_length`` positions."""
    if not text.strip():
        raise InputError("the target text is empty")
    ids = tokenizer.encode_tgt([text])[0]
    if max_length is not None and len(ids) + 1 > max_length:
        raise InputError(f"the target has {len(ids) + 1} tokens, over the model's limit of {max_length}")
    return ids


#: The most tokens a sentence's target prefix and constraints may hold together (bos included) where the model's
#: positions allow more, or have no end: the decoder's length cap stretches to hold them, so a longer guide would
#: decode for as many steps (the server's --max-tokens bounds them lower).
MAX_GUIDE_TOKENS = 1024


def encode_guides(tokenizer: Tokenizer, guides: Sequence[Guide | None], max_length: int | None) -> list[GuideIds]:
    """Each guide's prefix and phrases tokenized as target text (``clean_text`` first, as sources are), each phrase
    with the paths that meet it (``phrase_paths``); InputError, one line naming the sentence (counted from 1), for an
    empty phrase or a prefix and phrases over the model's position limit."""
    from data.lines import clean_text

    out = []
    for n, guide in enumerate(guides, 1):
        if guide is None or guide == Guide():
            out.append(GuideIds())
            continue
        prefix = clean_text(guide.prefix)
        ids = tuple(tokenizer.encode_tgt([prefix])[0]) if prefix.strip() else ()
        phrases = []
        for j, phrase in enumerate(guide.constraints, 1):
            phrase = clean_text(phrase).strip()
            paths = phrase_paths(tokenizer, phrase) if phrase else ()
            if not paths:
                raise InputError(f"sentence {n}: constraint {j} is empty")
            phrases.append(paths)
        total = len(ids) + sum(len(paths[0]) for paths in phrases)
        limit = min(max_length or MAX_GUIDE_TOKENS, MAX_GUIDE_TOKENS)
        if total + 1 > limit:
            why = "the model's positions" if limit == max_length else "what a guide may hold"
            raise InputError(f"sentence {n}: its prefix and constraints have {total + 1} tokens with bos, over the "
                             f"limit of {limit} ({why})")
        out.append(GuideIds(ids, tuple(phrases)))
    return out


def translations(tokenizer: Tokenizer, hyps: Sequence[Hypothesis],
                 decode: DecodeConfig | None = None) -> list[Translation]:
    """A sentence's hypotheses as text; under MBR (``decode.mbr``) ranked by expected utility, ``decode.nbest``
    kept (``utils.translation.mbr``)."""
    out = [Translation(tokenizer.decode(h.tokens), h.score, h.logprob, h.tokens, h.token_logprobs,
                       constraints_met=h.constraints_met) for h in hyps]
    if decode is not None and decode.mbr:
        from utils.translation.mbr import mbr_rank

        out = mbr_rank(out, decode.mbr_utility)[: decode.nbest]
    return out


def outputs_per_sentence(decode: DecodeConfig) -> int:
    """How many translations ``decode`` gives each sentence: ``num_samples`` when sampling without MBR, else
    ``nbest``."""
    return decode.num_samples if decode.sample and not decode.mbr else decode.nbest


#: Why a guide cannot be decoded as asked (``guide_problem``).
GREEDY_CONSTRAINTS = ("terminology constraints need beam search (a beam of 2 or more): the beam is shared among "
                      "hypotheses at each stage of progress through the phrases; greedy search takes none")
SAMPLED_GUIDES = "a target prefix or constraints go with greedy or beam search, not with sampling"
BLOCKED_CONSTRAINTS = ("terminology constraints and decode.no_repeat_ngram_size exclude each other: a phrase may "
                       "need an n-gram the output already holds; give one or the other")


def guide_problem(decode: DecodeConfig, prefix: bool, constraints: bool) -> str | None:
    """Why sentences with a target prefix (``prefix``) or constraints (``constraints``) cannot be decoded as
    ``decode`` says, in one line; None if they can."""
    if (prefix or constraints) and decode.sample:
        return SAMPLED_GUIDES
    if constraints and decode.beam == 1:
        return GREEDY_CONSTRAINTS
    if constraints and decode.no_repeat_ngram_size:
        return BLOCKED_CONSTRAINTS
    return None


def make_search(model: Seq2SeqTransformer, tokenizer: Tokenizer, sources: Sequence[list[int]], decode: DecodeConfig,
                on_done: Callable[[int, list[Hypothesis]], None], guides: Sequence[GuideIds] | None = None) -> Search:
    """One batch of non-empty ``sources`` (eos included, right-padded) encoded and ready to decode as ``decode``
    says (beam 1: greedy); ``on_done(row, hypotheses)`` for each as it finishes. ``guides``: each source's target
    prefix and constraints (with constraints: ``ConstrainedBeamSearch``); ValueError, one line
    (``guide_problem``), where ``decode`` cannot honour them."""
    prefixed = bool(guides) and any(g.prefix for g in guides)
    constrained = bool(guides) and any(g.constraints for g in guides)
    problem = guide_problem(decode, prefixed, constrained)
    if problem:
        raise ValueError(problem)
    width = max(len(s) for s in sources)
    src = torch.full((len(sources), width), tokenizer.pad_id, dtype=torch.long)
    for r, seq in enumerate(sources):
        src[r, : len(seq)] = torch.tensor(seq)
    src = src.to(model.device)
    common = dict(bos=tokenizer.bos_id, eos=tokenizer.eos_id, max_len_a=decode.max_len_a, max_len_b=decode.max_len_b,
                  min_len_a=decode.min_len_a, min_len_b=decode.min_len_b, on_done=on_done,
                  no_repeat_ngram=decode.no_repeat_ngram_size)
    if prefixed:
        common["forced"] = [g.prefix for g in guides]
    if constrained:
        return ConstrainedBeamSearch(model, src, constraints=[g.constraints for g in guides], beam=decode.beam,
                                     nbest=decode.mbr or decode.nbest, lenpen=decode.lenpen, stop=decode.beam_stop,
                                     **common)
    if decode.sample:  # MBR's candidates: decode.mbr samples
        return SampleSearch(model, src, num_samples=decode.mbr or decode.num_samples, temperature=decode.temperature,
                            top_k=decode.top_k, top_p=decode.top_p, epsilon=decode.epsilon, seed=decode.seed,
                            lenpen=decode.lenpen, **common)
    if decode.beam == 1 and not decode.mbr:
        return GreedySearch(model, src, **common)
    return BeamSearch(model, src, beam=decode.beam, nbest=decode.mbr or decode.nbest, lenpen=decode.lenpen,
                      stop=decode.beam_stop, **common)


@torch.no_grad()
def translate_ids(
    model: Seq2SeqTransformer,
    tokenizer: Tokenizer,
    sources: Sequence[list[int]],
    decode: DecodeConfig,
    on_done: OnDone | None = None,
    guides: Sequence[GuideIds] | None = None,
) -> list[list[Translation]]:
    """Decode already-encoded sources (eos included); empty sources give one empty translation.
    ``on_done(i, nbest)`` is called for source ``i`` as soon as its list is final (the server answers it then).
    ``guides``: each source's target prefix and constraints (``encode_guides``), aligned with ``sources``."""
    if guides is not None and len(guides) != len(sources):
        raise ValueError(f"{len(guides)} guides for {len(sources)} sources")
    model.eval()
    results: list[list[Translation]] = [[Translation("", 0.0, 0.0, [])] for _ in sources]
    todo = [i for i, s in enumerate(sources) if s]
    if on_done is not None:
        for i in (i for i, s in enumerate(sources) if not s):
            on_done(i, results[i])
    for batch in _batches([len(sources[i]) for i in todo], decode.batch_size):
        rows = [todo[j] for j in batch]

        def finished(row: int, hyps: list[Hypothesis], rows: list[int] = rows) -> None:
            i = rows[row]
            results[i] = translations(tokenizer, hyps, decode)
            if on_done is not None:
                on_done(i, results[i])

        make_search(model, tokenizer, [sources[i] for i in rows], decode, finished,
                    None if guides is None else [guides[i] for i in rows]).run()
    return results


def translate(
    model: Seq2SeqTransformer, tokenizer: Tokenizer, texts: Sequence[str], decode: DecodeConfig, strict: bool = True,
    on_done: OnDone | None = None, guides: Sequence[Guide | None] | None = None,
) -> list[list[Translation]]:
    """Translate sentences; returns the n-best list of each (``decode.nbest`` long, best first); ``on_done`` as in
    ``translate_ids``. ``guides``: per sentence, a ``Guide`` (target prefix, constraints) or None; a sentence's
    hypotheses then start with its prefix and contain its phrases (``Translation.constraints_met`` says where one
    ran out of room)."""
    sources = encode_sources(tokenizer, texts, model.max_length, strict=strict)
    if guides is not None and len(guides) != len(texts):
        raise ValueError(f"{len(guides)} guides for {len(texts)} sentences")
    ids = None if guides is None else encode_guides(tokenizer, guides, model.max_length)
    return translate_ids(model, tokenizer, sources, decode, on_done, ids)


# ----------------------------------------------------------------------------------------------
# Streams: files and standard input of any size


def open_source(path: str | None) -> BinaryIO:
    """The bytes of ``--input`` (``None`` or ``-``: standard input); InputError, one line, if unusable."""
    if path in (None, "-"):
        if sys.stdin is None:
            raise InputError("standard input is closed: pipe sentences in, or give --input FILE")
        return sys.stdin.buffer
    p = Path(path)
    if p.is_dir():
        raise InputError(f"--input {path} is a folder, not a text file")
    try:
        return open(p, "rb")
    except FileNotFoundError:
        raise InputError(f"--input {path}: file not found") from None
    except OSError as e:
        raise InputError(f"--input {path}: cannot read ({e.strerror or type(e).__name__})") from None


@dataclass
class StreamReport:
    """What ``translate_stream`` did: lines read and written, and the lines it could not translate."""

    lines: int = 0
    empty: int = 0  # empty input lines (unreadable ones are in ``bad``)
    bad: list[tuple[int, str]] = field(default_factory=list)  # (line number, why): an empty output line each
    unmet: list[int] = field(default_factory=list)  # line numbers whose best translation lacks a constraint phrase
    seconds: float = 0.0


#: The longest input line read (a sentence is far shorter): memory stays bounded whatever the input, even an
#: endless one without newlines (a device, a binary file).
MAX_LINE_BYTES = 1 << 16


def bounded_lines(stream: BinaryIO, limit: int = MAX_LINE_BYTES) -> Iterator[tuple[bytes, bool]]:
    """(line, whole) for each line of ``stream``: at most ``limit + 1`` bytes held at a time; a longer line is
    yielded as its first ``limit`` bytes with ``whole`` False, then read through to its end in pieces."""
    while raw := stream.readline(limit + 1):
        if len(raw) <= limit or raw.endswith(b"\n"):
            yield raw, True
            continue
        yield raw[:limit], False  # first, so that the caller may refuse it (binary input) before the rest is read
        while (more := stream.readline(limit)) and not more.endswith(b"\n"):
            pass


def source_lines(stream: BinaryIO, name: str, report: StreamReport) -> Iterator[str]:
    """Lines of ``stream`` as the training data is read: split on ``\n`` only (any ``\r`` becomes a space),
    UTF-8 (a BOM is dropped), ``clean_text``. A line that is not valid UTF-8 is yielded as "" and recorded
    in ``report.bad``; NUL bytes in the first line mean the input is not text (InputError)."""
    from data.lines import clean_text

    for n, (raw, whole) in enumerate(bounded_lines(stream), 1):
        if n == 1:
            if b"\x00" in raw[:65536]:
                raise InputError(f"{name} is not a text file (NUL bytes in its first line; UTF-16 or binary?)")
            raw = raw.removeprefix(b"\xef\xbb\xbf")
        if not whole:
            report.bad.append((n, f"longer than {MAX_LINE_BYTES:,} bytes"))
            yield ""
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            report.bad.append((n, f"not valid UTF-8 at byte {e.start}"))
            yield ""
            continue
        if "\x00" in text:
            report.bad.append((n, "holds NUL bytes"))
            yield ""
            continue
        yield clean_text(text)


def _chunks(lines: Iterable[str], size: int) -> Iterator[list[str]]:
    chunk: list[str] = []
    for line in lines:
        chunk.append(line)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


#: Formats a chunk's results as output lines: (index of its first line, its lines, their n-best lists, decode).
Writer = Callable[[int, list[str], list[list[Translation]], DecodeConfig], Iterable[str]]


def text_lines(first: int, texts: list[str], results: list[list[Translation]], decode: DecodeConfig) -> list[str]:
    """The text output of a chunk: each line's best translation, or with several outputs per sentence (n-best,
    samples) ``INDEX<TAB>SCORE<TAB>TEXT`` rows, ``INDEX`` counted from 0 over the whole input."""
    if outputs_per_sentence(decode) == 1:
        return [nbest[0].text + "\n" for nbest in results]
    return [f"{first + i}\t{hyp.score:.4f}\t{hyp.text}\n" for i, nbest in enumerate(results) for hyp in nbest]


def translate_stream(
    translate_fn: Callable[[list[str], DecodeConfig], list[list[Translation]]],
    stream: BinaryIO,
    out: TextIO,
    decode: DecodeConfig,
    name: str = "standard input",
    chunk_lines: int = 2000,
    progress: TextIO | None = None,
    progress_every: float = 10.0,
    write: Writer = text_lines,
    guides: Iterable[Guide | None] | None = None,
) -> StreamReport:
    """Translate every line of ``stream`` to ``out`` with ``translate_fn(lines, decode)`` (e.g. ``translate``
    of a model, or an exported CTranslate2 model's), one output line per input line, in input order.

    Lines go in chunks of ``chunk_lines`` (sorted by length inside a chunk for little padding); each chunk
    is written and flushed when done, so memory stays bounded whatever the input size. ``write`` formats each
    chunk's results (``text_lines`` by default: with several outputs per sentence, ``decode.nbest`` > 1 or
    ``decode.num_samples`` > 1, ``line<TAB>score<TAB>text`` rows, line numbers from 0). Empty, undecodable and
    over-long lines never stop the others (empty output / truncation). Progress goes to ``progress``
    every ``progress_every`` seconds. ``guides``: one ``Guide`` per line, in order (``translate_fn`` then takes
    them as ``guides=``); the lines whose best translation misses a constraint are listed in ``report.unmet``.
    """
    report = StreamReport()
    start = last = time.perf_counter()
    pending = None if guides is None else iter(guides)
    for chunk in _chunks(source_lines(stream, name, report), chunk_lines):
        first = report.lines
        if pending is None:
            results = translate_fn(chunk, decode)
        else:
            part = list(islice(pending, len(chunk)))
            if len(part) != len(chunk):
                raise InputError(f"{name} has more lines than the {first + len(part)} prefixes or constraint lines")
            results = translate_fn(chunk, decode, guides=part)  # type: ignore[call-arg]
            report.unmet += [first + i + 1 for i, nbest in enumerate(results) if not nbest[0].constraints_met]
        if len(results) != len(chunk):
            raise ValueError(f"{len(results)} results for {len(chunk)} lines")
        report.empty += sum(not text for text in chunk)
        out.writelines(write(first, chunk, results, decode))
        out.flush()
        report.lines += len(chunk)
        now = time.perf_counter()
        if progress is not None and now - last >= progress_every:
            last = now
            print(f"{report.lines:,} lines translated ({report.lines / (now - start):.1f} sentences/s)",
                  file=progress, flush=True)
    report.empty -= len(report.bad)  # unreadable lines are reported as such, not as empty ones
    report.seconds = time.perf_counter() - start
    return report
