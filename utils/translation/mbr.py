"""Minimum Bayes risk decoding (Eikema & Aziz 2020): of a sentence's candidates (samples, or a beam's n-best), the one
of highest expected utility against all candidates taken as pseudo-references.

For candidates c_1..c_N (duplicates kept: N samples stand for the model's distribution, each with weight 1/N) the
expected utility of a candidate h is ``1/N * sum_j u(h, c_j)``, every candidate compared with every candidate,
itself included (u(h, h) is the utility's maximum, 100, for every h that is not empty). ``u`` is sacreBLEU's
sentence-level chrF (chrF2) or BLEU (``effective_order=True``), h as the hypothesis and c_j as the reference.
The hypotheses ranked are the distinct texts, in the order first met (the candidates come best first by model
score, so ties go to the higher model score); each pair of distinct texts is scored once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import cache
from typing import Any, TypeVar

from sacrebleu.metrics import BLEU, CHRF

T = TypeVar("T", bound=Any)  # a ``utils.translation.translate.Translation``: a dataclass with ``text`` and ``utility``
UTILITIES = ("chrf", "bleu")


@cache
def _metric(name: str) -> CHRF | BLEU:
    if name == "chrf":
        return CHRF()
    if name == "bleu":
        return BLEU(effective_order=True)
    raise ValueError(f"unknown MBR utility {name!r}: one of {', '.join(UTILITIES)}")


def utility_fn(name: str) -> Callable[[str, str], float]:
    """``u(hypothesis, reference)`` in 0..100 for ``name`` (``chrf`` or ``bleu``): sacreBLEU's ``sentence_score``."""
    metric = _metric(name)
    return lambda hyp, ref: float(metric.sentence_score(hyp, [ref]).score)


def _chrf_matrix(texts: Sequence[str]) -> Callable[[str, str], float] | None:
    """chrF of every pair of ``texts`` as sacreBLEU's ``sentence_score`` computes it, each text's n-grams extracted
    once instead of once per pair (a sentence's 16 samples: 256 pairs); None where this sacreBLEU lacks the
    methods it relies on (then ``utility_fn`` serves)."""
    metric = _metric("chrf")
    needed = ("_preprocess_segment", "_extract_reference_info", "_get_match_statistics", "_compute_f_score")
    if not all(hasattr(metric, name) for name in needed):
        return None
    ngrams = {t: metric._extract_reference_info([metric._preprocess_segment(t)])["ref_ngrams"][0] for t in texts}

    def u(hyp: str, ref: str) -> float:
        stats = [x for h, r in zip(ngrams[hyp], ngrams[ref], strict=True) for x in metric._get_match_statistics(h, r)]
        return float(metric._compute_f_score(stats))

    return u


def expected_utilities(texts: Sequence[str], utility: str) -> dict[str, float]:
    """Each distinct text of ``texts`` -> its mean utility against every element of ``texts`` (itself included)."""
    counts = Counter(texts)
    u = (_chrf_matrix(list(counts)) if utility == "chrf" else None) or utility_fn(utility)
    return {h: sum(n * u(h, r) for r, n in counts.items()) / len(texts) for h in counts}


def mbr_rank(candidates: Sequence[T], utility: str = "chrf") -> list[T]:
    """The distinct candidates (``Translation``s, by text) ranked by expected utility, highest first, each with its
    ``utility`` set; ties keep the candidates' order (best model score first when they come so)."""
    expected = expected_utilities([c.text for c in candidates], utility)
    firsts: dict[str, T] = {}
    for c in candidates:
        firsts.setdefault(c.text, c)
    return sorted((replace(c, utility=expected[text]) for text, c in firsts.items()), key=lambda c: -c.utility)
