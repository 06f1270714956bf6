"""Iteration-level (continuous) batching of translation requests, for a server.

A static batch decodes until its last sentence ends: requests that arrive meanwhile wait, and the batch shrinks
as its sentences finish. Here requests added while others decode start a few steps later at most, as a batch of
their own (the requests waiting together that decode alike form one batch) beside the batches already decoding,
and every step runs all of them at once (``models.decoding.decode_together``: the matrix products over all rows,
attention per batch at its own positions; Orca, Yu et al. 2022). Each sentence is reported as soon as it is done,
with the n-best list ``translate`` gives it (under MBR, the candidates ranked by ``translations`` as there).

Requests decode alike when every decoding setting that shapes a search is equal (``_key``: beam, n-best, length
penalty, length cap and floor, stopping rule, sampling and its settings and seed, MBR and its utility) and they agree
on whether they carry target prefixes and whether they carry constraints; only such requests share a batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from models.decoding import Hypothesis, Search, decode_together
from models.transformer import Seq2SeqTransformer
from tokenizer import Tokenizer
from utils.config import DecodeConfig
from utils.translation.translate import GuideIds, OnDone, Translation, make_search, translations


@dataclass
class Request:
    """Sources to translate (ids with eos, as ``encode_sources`` gives; empty ones get an empty translation), how,
    and where the results go: ``on_done(i, nbest)`` for source ``i`` when final, ``on_error(exception)`` once if its
    decoding fails before all are. ``guides``: each source's target prefix and constraints (``encode_guides``),
    aligned with ``sources``; None: none."""

    sources: Sequence[list[int]]
    decode: DecodeConfig
    on_done: OnDone
    on_error: Callable[[BaseException], None]
    guides: Sequence[GuideIds] | None = None
    left: int = field(init=False)  # sources not reported yet

    def __post_init__(self) -> None:
        self.left = len(self.sources)
        if self.guides is not None and len(self.guides) != len(self.sources):
            raise ValueError(f"{len(self.guides)} guides for {len(self.sources)} sources")


#: The decoding settings that do not change what a search gives a sentence (batching is the decoder's own).
_UNUSED = ("batch_size",)


def _key(decode: DecodeConfig, guides: Sequence[GuideIds] | None = None) -> tuple:
    """What makes two requests decode alike (one batch): every decoding setting but ``_UNUSED`` (so a setting added
    to ``DecodeConfig`` separates requests too), ``nbest`` counted as 1 for greedy search, and whether the request
    has target prefixes and whether it has constraints (a constrained search is another search)."""
    settings = decode.model_dump(exclude=set(_UNUSED))
    if decode.beam == 1 and not decode.sample and not decode.mbr:
        settings["nbest"] = 1
    prefixed = bool(guides) and any(g.prefix for g in guides)
    constrained = bool(guides) and any(g.constraints for g in guides)
    return (*sorted(settings.items()), ("prefix", prefixed), ("constraints", constrained))


class ContinuousDecoder:
    """Requests ``add``-ed between ``step`` calls join the decoding at a later step (module docstring).

    Each batch in flight costs a step its own attention and search bookkeeping (Python work, which dominates a
    small model's step on a CPU), so waiting requests join together, as one batch, once they number at least
    ``join`` times the sentences decoding, or nothing decodes, or the oldest has waited ``join_after`` steps.
    ``join=0`` starts every request at the next step.
    """

    def __init__(self, model: Seq2SeqTransformer, tokenizer: Tokenizer, join: float = 0.5,
                 join_after: int = 8) -> None:
        self.model, self.tokenizer = model.eval(), tokenizer
        self.join, self.join_after = join, join_after
        self.searches: list[tuple[Search, list[Request]]] = []
        self.waiting: list[Request] = []
        self.waited = 0  # steps the oldest waiting request has waited
        self.in_flight = 0  # sentences started and not done
        self.batches = 0  # batches started
        self.steps = 0  # decoder steps run
        self.sentence_steps = 0  # over those steps, the sum of the sentences in flight (their mean: the batch size)

    @property
    def busy(self) -> bool:
        """Whether anything is decoding or waiting (``step`` has work)."""
        return bool(self.in_flight or self.waiting)

    def add(self, requests: Sequence[Request]) -> None:
        """Queue ``requests``; they start at a later ``step`` (the class docstring says when)."""
        if requests and not self.waiting:
            self.waited = 0
        self.waiting.extend(requests)

    def _admit(self) -> None:
        waiting = sum(len(r.sources) for r in self.waiting)
        if self.waiting and (not self.in_flight or waiting >= self.join * self.in_flight
                             or self.waited >= self.join_after):
            requests, self.waiting = self.waiting, []
            self.start(requests)

    @torch.no_grad()
    def start(self, requests: Sequence[Request]) -> None:
        """Start ``requests`` at the next step: empty sources are answered now; the others of requests that decode
        alike are encoded as one batch. A batch that cannot start fails its requests (``on_error``), no others."""
        groups: dict[tuple, tuple[DecodeConfig, list[tuple[Request, int]]]] = {}
        for req in requests:
            for i, src in enumerate(req.sources):
                if not src:
                    self._report(req, i, [Translation("", 0.0, 0.0, [])])
                else:
                    groups.setdefault(_key(req.decode, req.guides), (req.decode, []))[1].append((req, i))
        for decode, rows in groups.values():
            def finished(row: int, hyps: list[Hypothesis], rows: list[tuple[Request, int]] = rows,
                         decode: DecodeConfig = decode) -> None:
                self.in_flight -= 1
                self._report(rows[row][0], rows[row][1], translations(self.tokenizer, hyps, decode))

            owners = list({id(req): req for req, _ in rows}.values())
            guides = None
            if any(r.guides is not None for r, _ in rows):
                guides = [GuideIds() if r.guides is None else r.guides[i] for r, i in rows]
            try:
                search = make_search(self.model, self.tokenizer, [r.sources[i] for r, i in rows], decode, finished,
                                     guides)
            except Exception as err:  # noqa: BLE001 - e.g. settings the search refuses: those requests fail
                for req in owners:
                    req.on_error(err)
                continue
            self.searches.append((search, owners))
            self.batches += 1
            self.in_flight += len(rows)

    def step(self) -> None:
        """Start the waiting requests if it is time, then one decoder step of every batch in flight; the batches
        that end leave. If the step fails, every request in flight fails with it (``on_error``) and the decoder
        is empty again, ready for more."""
        self._admit()
        self.waited += bool(self.waiting)
        if not self.in_flight:
            return
        self.steps += 1
        self.sentence_steps += self.in_flight
        try:
            decode_together(self.model, [s for s, _ in self.searches])
        except Exception as err:  # noqa: BLE001 - reported to each request's owner
            failed = {id(req): req for _, reqs in self.searches for req in reqs if req.left}
            self.searches, self.in_flight = [], 0
            for req in failed.values():
                req.on_error(err)
            return
        self.searches = [(s, reqs) for s, reqs in self.searches if s.running]

    @staticmethod
    def _report(req: Request, i: int, nbest: list[Translation]) -> None:
        req.left -= 1
        req.on_done(i, nbest)
