"""Text in, text out: tokenise, batch by length, decode (greedy or beam), detokenise, restore order."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from models.decoding import beam_search, greedy_search
from models.transformer import Seq2SeqTransformer
from tokenizer import Tokenizer
from utils.config import DecodeConfig

log = logging.getLogger("translate")


class InputError(ValueError):
    """A source sentence that cannot be translated (empty, or longer than the model allows)."""


@dataclass
class Translation:
    """One hypothesis as text, with its summed log-probability and length-penalised score."""

    text: str
    score: float
    logprob: float
    tokens: list[int]


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
    ids = tokenizer.encode_src(list(texts))
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
                    "(model.max_positions of the learnable position table)"
                )
            seq = seq[: max_length - 1]
            truncated += 1
        out.append(seq + [tokenizer.eos_id])
    if truncated:
        log.warning("truncated %d source sentences to the model's %d positions", truncated, max_length)
    return out


@torch.no_grad()
def translate_ids(
    model: Seq2SeqTransformer,
    tokenizer: Tokenizer,
    sources: Sequence[list[int]],
    decode: DecodeConfig,
) -> list[list[Translation]]:
    """Decode already-encoded sources (eos included); empty sources give one empty translation."""
    model.eval()
    results: list[list[Translation]] = [[Translation("", 0.0, 0.0, [])] for _ in sources]
    todo = [i for i, s in enumerate(sources) if s]
    for batch in _batches([len(sources[i]) for i in todo], decode.batch_size):
        rows = [todo[j] for j in batch]
        width = max(len(sources[i]) for i in rows)
        src = torch.full((len(rows), width), tokenizer.pad_id, dtype=torch.long)
        for r, i in enumerate(rows):
            src[r, : len(sources[i])] = torch.tensor(sources[i])
        src = src.to(model.device)
        common = dict(
            bos=tokenizer.bos_id, eos=tokenizer.eos_id, max_len_a=decode.max_len_a, max_len_b=decode.max_len_b
        )
        if decode.beam == 1:
            nbest = [[h] for h in greedy_search(model, src, **common)]
        else:
            nbest = beam_search(
                model, src, beam=decode.beam, nbest=decode.nbest, lenpen=decode.lenpen, stop=decode.beam_stop, **common
            )
        for i, hyps in zip(rows, nbest, strict=True):
            results[i] = [Translation(tokenizer.decode(h.tokens), h.score, h.logprob, h.tokens) for h in hyps]
    return results


def translate(
    model: Seq2SeqTransformer, tokenizer: Tokenizer, texts: Sequence[str], decode: DecodeConfig, strict: bool = True
) -> list[list[Translation]]:
    """Translate sentences; returns the n-best list of each (``decode.nbest`` long, best first)."""
    sources = encode_sources(tokenizer, texts, model.max_length, strict=strict)
    return translate_ids(model, tokenizer, sources, decode)
