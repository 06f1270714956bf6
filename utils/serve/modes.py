"""The decoding modes of a ``POST /translate`` request beyond beam search: a target prefix, terminology constraints,
sampling, MBR and per-token details. Their fields are read and checked here (one line each, the command line's
wording where it has one), an engine says which modes it does (``engine_modes``), and ``details`` gives each
hypothesis the fields ``inference.py --format jsonl`` writes.

- ``prefix``: one string for every line, or a list aligned with ``text`` (``""``: none for that line);
- ``constraints``: a list of phrases every line's translation must contain, or a list of such lists aligned with
  ``text`` (``[]``: none for that line); at most ``MAX_PHRASES`` phrases a line;
- ``sample`` with ``temperature``, ``top_k``, ``top_p``, ``epsilon``, ``num_samples``, ``seed``: a sampling setting
  needs sampling on (the request's ``sample``, else the server's default);
- ``mbr`` N with ``mbr_utility``: MBR over N samples (with sampling) or the beam's N-best;
- ``details``: per-token log-probabilities, tokens and alignment, as ``inference.py --format jsonl`` writes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from utils.serve.fields import bool_field, check_text, choice_field, float_field, int_field, json_type
from utils.serve.limits import Limits, RequestError

if TYPE_CHECKING:
    from utils.config import DecodeConfig
    from utils.translation.translate import Guide, Translation

#: The request fields of the modes, in the order the schema lists them (after text, beam, nbest, lenpen).
FIELDS = ("prefix", "constraints", "sample", "temperature", "top_k", "top_p", "epsilon", "num_samples", "seed", "mbr",
          "mbr_utility", "details")
#: The sampling settings (each needs sampling on).
SAMPLING = ("temperature", "top_k", "top_p", "epsilon", "num_samples", "seed")
#: The modes an engine may do, as ``GET /model`` lists them (``modes``).
MODES = ("prefix", "constraints", "sample", "mbr", "details")
#: Most constraint phrases of one line.
MAX_PHRASES = 16
UTILITIES = ("chrf", "bleu")
#: Why an engine that is not a PyTorch run (a CTranslate2 export) refuses a mode, by mode.
NOT_HERE = {
    "prefix": "a target prefix needs a PyTorch run: this CTranslate2 export does not do it (serve the run directory)",
    "constraints": "terminology constraints need a PyTorch run: CTranslate2 has no constrained decoding (serve the "
                   "run directory)",
    "sample": "sampling needs a PyTorch run: this CTranslate2 export does not do it (serve the run directory)",
    "mbr": "MBR decoding needs a PyTorch run: this CTranslate2 export does not do it (serve the run directory)",
    "details": "details (per-token log-probabilities and alignment) need a PyTorch run: a CTranslate2 export does not "
               "give them here (serve the run directory)",
}


def engine_modes(engine: Any) -> tuple[str, ...]:
    """The modes of ``MODES`` an engine does: every one for a PyTorch run (or an ensemble); a CTranslate2 export
    (``CT2Model``) those its ``problem(decode, prefix, constraints, details)`` finds nothing against, tried with the
    server's defaults and each mode at its plainest; another engine those its ``modes`` attribute names, none
    without one."""
    if getattr(engine, "run", None) is not None:
        return MODES
    if getattr(engine, "problem", None) is None:
        offered = set(getattr(engine, "modes", ()))
        return tuple(m for m in MODES if m in offered)
    return tuple(m for m in MODES if _problem(engine, m) is None)


def _problem(engine: Any, mode: str) -> str | None:
    """An export's ``problem`` with ``mode`` at its plainest over the server's defaults (None: it does it)."""
    d = engine.cfg.decode.model_copy(update=dict(sample=False, mbr=0, nbest=1))
    beam = d.model_copy(update=dict(beam=max(2, d.beam)))
    tries = {"prefix": (d, True, False, False), "constraints": (beam, False, True, False),
             "sample": (d.model_copy(update=dict(sample=True, epsilon=0.0, top_k=0, top_p=1.0)), False, False, False),
             "mbr": (beam.model_copy(update=dict(mbr=2)), False, False, False), "details": (d, False, False, True)}
    return engine.problem(*tries[mode])


def refusal(engine: Any, mode: str) -> str:
    """Why an engine refuses ``mode`` (one it does not do), in one line: an export's own reason, else ``NOT_HERE``."""
    why = _problem(engine, mode) if getattr(engine, "problem", None) is not None else None
    return why or NOT_HERE[mode]


def engine_problem(engine: Any, decode: DecodeConfig, guides: list[Guide] | None, details: bool) -> str | None:
    """Why an engine that is not a PyTorch run cannot decode a request as asked (its ``problem``, e.g. a sampling
    setting CTranslate2 lacks), in one line; None if it can, or says nothing."""
    problem = getattr(engine, "problem", None)
    if getattr(engine, "run", None) is not None or problem is None:
        return None
    guides = guides or []
    return problem(decode, any(g.prefix for g in guides), any(g.constraints for g in guides), details)


@dataclass
class Modes:
    """A request's modes, read: ``guides`` (one ``Guide`` per line; None: no prefix nor constraints), the decoding
    settings to put over the server's (``update``), and whether ``details`` were asked for."""

    guides: list[Guide] | None
    update: dict[str, Any]
    details: bool

    def used(self, decode: DecodeConfig) -> list[str]:
        """The modes of ``MODES`` this request uses, decoded as ``decode`` (the request's settings in force)."""
        guides = self.guides or []
        return [mode for mode, on in (("prefix", any(g.prefix for g in guides)),
                                      ("constraints", any(g.constraints for g in guides)),
                                      ("sample", decode.sample), ("mbr", bool(decode.mbr)),
                                      ("details", self.details)) if on]


def _prefixes(value: Any, n: int, limits: Limits) -> list[str] | None:
    """``prefix``: one string for every line, or one per line (``""``: none)."""
    if value is None:
        return None
    if isinstance(value, str):
        return [check_text(value, "prefix", limits, "give the text the translations start with").strip()] * n
    if not isinstance(value, list):
        raise RequestError(422, f"prefix must be a string or a list of strings, not {json_type(value)}")
    if len(value) != n:
        raise RequestError(422, f"prefix has {len(value)} item{'s' * (len(value) != 1)} but text has {n} "
                                f"line{'s' * (n != 1)}: give one prefix per line (\"\" for none), or one string for "
                                "every line")
    return [check_text(v, f"prefix[{i}]", limits, None).strip() for i, v in enumerate(value)]


def _phrases(value: Any, name: str, limits: Limits) -> tuple[str, ...]:
    """One line's constraint phrases: a list of at most ``MAX_PHRASES`` non-blank strings."""
    if not isinstance(value, list):
        raise RequestError(422, f"{name} must be a list of phrases, not {json_type(value)}")
    if len(value) > MAX_PHRASES:
        raise RequestError(413, f"{name} has {len(value)} phrases, over the limit of {MAX_PHRASES} a line")
    return tuple(check_text(v, f"{name}[{j}]", limits, "give a word or phrase the translation must contain").strip()
                 for j, v in enumerate(value))


def _constraints(value: Any, n: int, limits: Limits) -> list[tuple[str, ...]] | None:
    """``constraints``: a list of phrases for every line, or a list of such lists, one per line."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise RequestError(422, "constraints must be a list of phrases (for every line) or of lists of phrases (one "
                                f"per line), not {json_type(value)}")
    if not value:
        raise RequestError(422, "constraints is an empty list: give the phrases, or leave the field out")
    if all(isinstance(v, list) for v in value):
        if len(value) != n:
            raise RequestError(422, f"constraints has {len(value)} lists but text has {n} line{'s' * (n != 1)}: give "
                                    "one list of phrases per line ([] for none), or one list of phrases for every "
                                    "line")
        return [_phrases(v, f"constraints[{i}]", limits) for i, v in enumerate(value)]
    if any(isinstance(v, list) for v in value):
        raise RequestError(422, "constraints must be a list of phrases or a list of lists of phrases, not both")
    return [_phrases(value, "constraints", limits)] * n


def read_modes(body: dict[str, Any], decode: DecodeConfig, n: int, limits: Limits) -> Modes:
    """The mode fields of a request of ``n`` lines, over the server's decoding settings ``decode`` (beam, nbest
    and lenpen already the request's); ``RequestError`` in one line for a bad field or settings that do not go
    together. The updated settings are left for ``check_modes``."""
    from utils.translation.translate import Guide

    prefixes = _prefixes(body.get("prefix"), n, limits)
    phrases = _constraints(body.get("constraints"), n, limits)
    guides = None
    if prefixes is not None or phrases is not None:
        guides = [Guide(p, c) for p, c in zip(prefixes or [""] * n, phrases or [()] * n, strict=True)]
    sample = bool_field(body, "sample", decode.sample)
    given = [name for name in SAMPLING if body.get(name) is not None]
    if given and not sample:
        raise RequestError(422, f"{given[0]} applies to sampling: add \"sample\": true")
    update: dict[str, Any] = {
        "sample": sample,
        "temperature": float_field(body, "temperature", decode.temperature, 0, 100, low_open=True, high_open=True),
        "top_k": int_field(body, "top_k", decode.top_k, 0, 10**6),
        "top_p": float_field(body, "top_p", decode.top_p, 0, 1, low_open=True),
        "epsilon": float_field(body, "epsilon", decode.epsilon, 0, 1, high_open=True),
        "num_samples": int_field(body, "num_samples", decode.num_samples, 1, limits.max_beam),
        "seed": int_field(body, "seed", decode.seed, 0, 2**63 - 1) if body.get("seed") is not None else decode.seed,
        "mbr": int_field(body, "mbr", decode.mbr, 0, limits.max_beam),
        "mbr_utility": choice_field(body, "mbr_utility", decode.mbr_utility, UTILITIES),
    }
    if body.get("mbr_utility") is not None and not update["mbr"]:
        raise RequestError(422, "mbr_utility applies to MBR decoding: add \"mbr\": N")
    if update["mbr"] and sample and body.get("num_samples") is None:
        update["num_samples"] = 1  # the candidates are mbr samples; a server default for plain sampling is not used
    return Modes(guides, update, bool_field(body, "details", False))


def default_nbest(decode: DecodeConfig, update: dict[str, Any], beam: int) -> int:
    """The hypotheses a line gets when the request names no ``nbest``: one with sampling (its samples are
    ``num_samples``), at most the MBR candidates, else at most the beam."""
    if update["mbr"]:
        return min(decode.nbest, update["mbr"])
    return 1 if update["sample"] else min(decode.nbest, beam)


def check_modes(decode: DecodeConfig, modes: Modes) -> None:
    """``RequestError`` 422, one line, for settings that do not go together: ``decode`` is the request's."""
    from utils.translation.translate import guide_problem

    if decode.mbr == 1:
        raise RequestError(422, "mbr: MBR needs at least 2 candidates (0: off)")
    if decode.mbr:
        if not decode.sample and decode.mbr > decode.beam:
            raise RequestError(422, f"mbr: {decode.mbr} candidates from beam search need a beam of at least "
                                    f"{decode.mbr} (beam is {decode.beam}): raise the beam, or sample them "
                                    "(\"sample\": true)")
        if decode.sample and decode.num_samples not in (1, decode.mbr):
            raise RequestError(422, f"num_samples: with mbr the candidates are mbr={decode.mbr} samples; leave "
                                    f"num_samples out (it is {decode.num_samples})")
        if decode.nbest > decode.mbr:
            raise RequestError(422, f"nbest ({decode.nbest}) cannot exceed the mbr={decode.mbr} candidates")
    elif decode.sample:
        if decode.nbest > 1:
            raise RequestError(422, "nbest: with sampling the translations of a line are its num_samples samples; "
                                    f"leave nbest out (it is {decode.nbest})")
    elif decode.nbest > decode.beam:
        raise RequestError(422, f"nbest ({decode.nbest}) cannot exceed beam ({decode.beam})")
    guides = modes.guides or []
    problem = guide_problem(decode, any(g.prefix for g in guides), any(g.constraints for g in guides))
    if problem:
        raise RequestError(422, problem)


def rows_per_line(decode: DecodeConfig) -> int:
    """The hypotheses decoded side by side for each line (what ``--max-beam-tokens`` multiplies): the samples when
    sampling (the MBR candidates), else the beam."""
    return (decode.mbr or decode.num_samples) if decode.sample else decode.beam


def check_samples(counts: list[int], decode: DecodeConfig, limits: Limits) -> None:
    """413 for a sampling request whose source tokens (``counts``, summed) times its samples per line are over
    ``max_beam_tokens`` (beam search: ``limits.check_lines`` says it of the beam)."""
    if not decode.sample:
        return
    rows, total = rows_per_line(decode), sum(counts)
    if total * rows > limits.max_beam_tokens:
        raise RequestError(413, f"this request asks for {total * rows} source tokens x samples ({len(counts)} "
                                f"line(s) of {total} tokens in all, {rows} samples each), over the limit of "
                                f"{limits.max_beam_tokens} (--max-beam-tokens): send fewer or shorter lines or fewer "
                                "samples, or start the server with a larger --max-beam-tokens")


def settings_answer(decode: DecodeConfig, details: bool) -> dict[str, Any]:
    """The decoding settings an answer states beside beam, nbest and lenpen: sampling's when sampling, MBR's when
    MBR, and whether details were asked for."""
    out: dict[str, Any] = {"sample": decode.sample}
    if decode.sample:
        out.update(temperature=decode.temperature, top_k=decode.top_k, top_p=decode.top_p, epsilon=decode.epsilon,
                   num_samples=decode.num_samples, seed=decode.seed)
    out["mbr"] = decode.mbr
    if decode.mbr:
        out["mbr_utility"] = decode.mbr_utility
    out["details"] = details
    return out


def hypothesis_answer(hyp: Translation, guide: Guide | None) -> dict[str, Any]:
    """One hypothesis: text, score, log-probability; its MBR ``utility``; with constraints, whether it met them."""
    out: dict[str, Any] = {"text": hyp.text, "score": hyp.score, "logprob": hyp.logprob}
    if hyp.utility is not None:
        out["utility"] = hyp.utility
    if guide is not None and guide.constraints:
        out["constraints_met"] = hyp.constraints_met
    return out


def export_details(engine: Any, texts: list[str],
                   results: list[list[Translation]]) -> list[tuple[list[str], list[dict[str, Any]]]]:
    """``line_details`` for translations an engine without a PyTorch model made with their details (a CTranslate2
    export: each hypothesis carries its ``alignment``, from the attention it returned while decoding)."""
    from utils.translation.jsonl import hypothesis_record
    from utils.translation.translate import encode_sources

    tokenizer = engine.tokenizer
    sources = encode_sources(tokenizer, texts, getattr(engine, "max_length", None), strict=False)
    return [(tokenizer.id_to_token(src) if src else [],
             [hypothesis_record(tokenizer, hyp, list(getattr(hyp, "alignment", []))) for hyp in nbest])
            for src, nbest in zip(sources, results, strict=True)]


def line_details(model: Any, tokenizer: Any, texts: list[str], results: list[list[Translation]],
                 batch_size: int) -> list[tuple[list[str], list[dict[str, Any]]]]:
    """Each line's source tokens and its hypotheses' jsonl fields (``utils.translation.jsonl.hypothesis_record``:
    tokens, token log-probabilities, the alignment the cross-attention gives) for translations ``model`` made."""
    from utils.translation.jsonl import alignments, hypothesis_record
    from utils.translation.translate import encode_sources

    sources = encode_sources(tokenizer, texts, model.max_length, strict=False)
    aligned = alignments(model, tokenizer, sources, results, batch_size)
    return [(tokenizer.id_to_token(src) if src else [],
             [hypothesis_record(tokenizer, hyp, a) for hyp, a in zip(nbest, align, strict=True)])
            for src, nbest, align in zip(sources, results, aligned, strict=True)]
