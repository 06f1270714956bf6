"""Scoring translations: corpus sacreBLEU (with its signature), chrF and nltk BLEU-4 on words, by source length,
and ``decode_and_score``, the one decode-then-score path of test.py, validation and the benchmarks."""

from __future__ import annotations

import functools
import json
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from sacrebleu.metrics import BLEU, CHRF

if TYPE_CHECKING:
    from utils.config import DecodeConfig
    from utils.translation.translate import Translation


@dataclass
class Scores:
    """Corpus scores in percent (0-100), with sacreBLEU's reproducibility signatures."""

    bleu: float
    chrf: float
    nltk_bleu4: float | None  # None where not asked for (validation: BLEU and chrF only)
    bleu_signature: str
    chrf_signature: str
    bleu_detail: str  # e.g. "BLEU = 27.3 58.1/33.0/20.9/13.6 (BP = 1.000 ratio = 1.02 ...)"
    n_sentences: int

    def to_dict(self) -> dict[str, float | str | int]:
        return asdict(self)


@functools.cache
def _treebank() -> Any:
    """nltk's Penn Treebank tokenizer, imported on first use: nltk brings scipy along (about a second), which
    training's validation, scoring BLEU and chrF only, does not need."""
    from nltk.tokenize import TreebankWordTokenizer

    return TreebankWordTokenizer()


def word_tokens(text: str) -> list[str]:
    """Penn Treebank word tokens (no downloads needed, unlike nltk.word_tokenize)."""
    return _treebank().tokenize(text)


def nltk_bleu4(hypotheses: list[str], references: list[str], lowercase: bool = False) -> float:
    """nltk corpus BLEU-4 (uniform weights) on word tokens, in percent; method1 smoothing for empty n-gram counts."""
    from nltk.translate.bleu_score import SmoothingFunction, corpus_bleu

    case = str.lower if lowercase else str
    refs = [[word_tokens(case(r))] for r in references]
    hyps = [word_tokens(case(h)) for h in hypotheses]
    return 100.0 * corpus_bleu(refs, hyps, smoothing_function=SmoothingFunction().method1)


def corpus_scores(hypotheses: list[str], references: list[str], lowercase: bool = False,
                  bleu4: bool = True) -> Scores:
    """sacreBLEU (13a tokenisation, exp smoothing), chrF2 and nltk BLEU-4 of detokenised text.

    ``lowercase``: score case-insensitively, as a model trained on lowercased text must be (the
    signatures then say ``case:lc``). ``bleu4=False``: no nltk BLEU-4 (``nltk_bleu4`` is None).
    """
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    bleu, chrf = BLEU(lowercase=lowercase), CHRF(lowercase=lowercase)
    b = bleu.corpus_score(hypotheses, [references])
    c = chrf.corpus_score(hypotheses, [references])
    return Scores(
        bleu=b.score, chrf=c.score, nltk_bleu4=nltk_bleu4(hypotheses, references, lowercase) if bleu4 else None,
        bleu_signature=str(bleu.get_signature()), chrf_signature=str(chrf.get_signature()),
        bleu_detail=str(b), n_sentences=len(hypotheses),
    )


def bucket_label(lo: int, hi: int | None) -> str:
    return f"{lo}-{hi - 1}" if hi is not None else f"{lo}+"


def scores_by_length(
    hypotheses: list[str], references: list[str], lengths: list[int], edges: list[int], lowercase: bool = False
) -> list[dict[str, float | int | str]]:
    """Corpus sacreBLEU, chrF and hypothesis/reference length ratio of the sentences in each source-length bucket.

    ``edges`` [e1, e2, ...] make buckets [0, e1), [e1, e2), ..., [e_last, inf); empty buckets are
    reported with n = 0 and no scores. Lengths are source subword tokens (what ``data.max_train_len``
    counts), so a train-short/test-long study reads off how quality falls with length.
    """
    bounds = [0, *edges]
    rows = []
    for i, lo in enumerate(bounds):
        hi = bounds[i + 1] if i + 1 < len(bounds) else None
        idx = [j for j, n in enumerate(lengths) if n >= lo and (hi is None or n < hi)]
        row: dict[str, float | int | str] = {"bucket": bucket_label(lo, hi), "n": len(idx)}
        if idx:
            hyps, refs = [hypotheses[j] for j in idx], [references[j] for j in idx]
            bleu = BLEU(lowercase=lowercase).corpus_score(hyps, [refs])
            row["bleu"], row["length_ratio"] = bleu.score, bleu.sys_len / max(bleu.ref_len, 1)
            row["chrf"] = CHRF(lowercase=lowercase).corpus_score(hyps, [refs]).score
        rows.append(row)
    return rows


@dataclass
class Scored:
    """What ``decode_and_score`` gives: each sentence's best hypothesis, the corpus scores, and the time taken."""

    best: list[Translation]
    scores: Scores
    seconds: float  # tokenising, decoding and detokenising (not scoring)
    source_lengths: list[int]  # source subword tokens, eos excluded (0 for an empty sentence)

    @property
    def texts(self) -> list[str]:
        return [h.text for h in self.best]


def decode_and_score(model: Any, tokenizer: Any, sources: list[str], refs: list[str], decode: DecodeConfig,
                     lowercase: bool = False, shard: bool = False, guides: list[Any] | None = None,
                     bleu4: bool = True) -> Scored:
    """Translate ``sources`` (each one's best under ``decode``; over-long ones truncated, empty ones empty) and
    score them against ``refs``. ``shard``: under data-parallel training (``ignite.distributed``) every rank
    decodes every world-th sentence and the hypotheses are gathered, so every rank gets the same scores.
    ``guides``: each source's target prefix and constraints (``translate.Guide``), aligned with ``sources``.
    ``bleu4=False``: no nltk BLEU-4 (``corpus_scores``)."""
    from utils.translation.translate import (  # torch: only when decoding
        Translation,
        encode_guides,
        encode_sources,
        translate_ids,
    )

    rank, world = 0, 1
    if shard:  # ignite.distributed costs most of a second to import: only training's validation pays it
        import ignite.distributed as idist

        rank, world = idist.get_rank(), idist.get_world_size()
    start = time.perf_counter()
    ids = encode_sources(tokenizer, sources, model.max_length, strict=False)
    guide_ids = None if guides is None else encode_guides(tokenizer, guides, model.max_length)[rank::world]
    best = [nbest[0] for nbest in translate_ids(model, tokenizer, ids[rank::world], decode, guides=guide_ids)]
    if world > 1:
        shards = [[Translation(**h) for h in json.loads(x)]
                  for x in idist.all_gather(json.dumps([asdict(h) for h in best]))]
        best = [shards[i % world][i // world] for i in range(len(ids))]
    seconds = time.perf_counter() - start
    scores = corpus_scores([h.text for h in best], refs, lowercase=lowercase, bleu4=bleu4)
    return Scored(best, scores, seconds, [max(len(x) - 1, 0) for x in ids])
