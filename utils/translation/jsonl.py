"""Machine-readable output (``--format jsonl``): one JSON object per input line with each translation's score, its
tokens, the log-probability of each, and the source token each one attends to most.

A line's object holds the best translation's fields, ``index`` (the input line's number from 0) and
``source_tokens`` (the source's subwords, end-of-sentence last); with several outputs per sentence (n-best,
samples) also ``nbest``, the list of every translation's fields, best first. A translation's fields:

- ``text``; ``score`` (what ranks it, as the text output prints it); ``logprob`` (the summed log-probability);
- ``tokens``: its subwords, end-of-sentence last when it ended with one (always, but for a diverged model);
- ``token_logprobs``: one per token, end-of-sentence included; their running sum in float32 is ``logprob``;
- ``alignment``: one source index per token (into ``source_tokens``), the source position with the highest
  cross-attention weight of the last decoder layer, averaged over its heads (and over the models of an ensemble),
  when the translation is fed back to the model (teacher forcing: the attention decoding saw);
- ``utility``: under MBR decoding, the translation's expected utility (0-100).

An empty or unreadable input line gives a record with an empty ``text`` and empty lists.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import torch

from models.ensemble import last_cross_attention
from tokenizer import Tokenizer
from utils.config import DecodeConfig
from utils.translation.translate import Translation, Writer, encode_sources, outputs_per_sentence


def output_ids(hyp: Translation, eos: int) -> list[int]:
    """The token ids a translation was scored on: its tokens, then EOS when it ended with one."""
    return hyp.tokens + [eos] * (len(hyp.token_logprobs) == len(hyp.tokens) + 1)


@torch.no_grad()
def alignments(model: Any, tokenizer: Tokenizer, sources: Sequence[list[int]], results: Sequence[list[Translation]],
               batch_size: int = 64) -> list[list[list[int]]]:
    """For each source (ids, eos included; empty: nothing) and each of its translations, the most attended source
    position of every output token (``last_cross_attention``), teacher-forced in batches of ``batch_size``."""
    out: list[list[list[int]]] = [[[] for _ in nbest] for nbest in results]
    jobs = [(i, k, src, output_ids(hyp, tokenizer.eos_id)) for i, (src, nbest) in enumerate(zip(sources, results,
                                                                                                  strict=True))
            for k, hyp in enumerate(nbest) if src and hyp.token_logprobs]
    device = model.device
    for start in range(0, len(jobs), batch_size):
        batch = jobs[start: start + batch_size]
        src = torch.full((len(batch), max(len(j[2]) for j in batch)), tokenizer.pad_id, dtype=torch.long)
        tgt = torch.full((len(batch), max(len(j[3]) for j in batch)), tokenizer.pad_id, dtype=torch.long)
        for r, (_, _, s, ids) in enumerate(batch):
            src[r, : len(s)] = torch.tensor(s)
            tgt[r, : len(ids)] = torch.tensor([tokenizer.bos_id] + ids[:-1])
        attention = last_cross_attention(model, src.to(device), tgt.to(device)).cpu()
        for r, (i, k, s, ids) in enumerate(batch):
            out[i][k] = attention[r, : len(ids), : len(s)].argmax(dim=-1).tolist()
    return out


def hypothesis_record(tokenizer: Tokenizer, hyp: Translation, alignment: list[int]) -> dict[str, Any]:
    """One translation's fields (module docstring)."""
    record = {"text": hyp.text, "score": hyp.score, "logprob": hyp.logprob,
              "tokens": tokenizer.id_to_token(output_ids(hyp, tokenizer.eos_id)),
              "token_logprobs": hyp.token_logprobs, "alignment": alignment}
    if hyp.utility is not None:
        record["utility"] = hyp.utility
    return record


def jsonl_line(tokenizer: Tokenizer, index: int, source: list[int], hyps: list[dict[str, Any]], several: bool) -> str:
    """One input line's JSON line: its index, its best translation's fields, its source tokens, and with
    ``several`` outputs per sentence every one of them under ``nbest``."""
    record = {"index": index, **hyps[0], "source_tokens": tokenizer.id_to_token(source) if source else []}
    if several:
        record["nbest"] = hyps
    return json.dumps(record, ensure_ascii=False) + "\n"


def jsonl_writer(model: Any, tokenizer: Tokenizer, batch_size: int = 64) -> Writer:
    """A ``translate_stream`` writer of JSON lines (module docstring) for translations made by ``model``."""

    def write(first: int, texts: list[str], results: list[list[Translation]], decode: DecodeConfig) -> list[str]:
        sources = encode_sources(tokenizer, texts, model.max_length, strict=False)
        aligned = alignments(model, tokenizer, sources, results, batch_size)
        several = outputs_per_sentence(decode) > 1
        lines = []
        for i, (src, nbest, align) in enumerate(zip(sources, results, aligned, strict=True)):
            hyps = [hypothesis_record(tokenizer, hyp, a) for hyp, a in zip(nbest, align, strict=True)]
            lines.append(jsonl_line(tokenizer, first + i, src, hyps, several))
        return lines

    return write
