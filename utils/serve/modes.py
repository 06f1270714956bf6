"""The decoding modes of a ``POST /translate`` request beyond beam search: a target prefix, terminology constraints,
sampling, MBR and per-token details. Their fields are the request model's (``utils/serve/schema.py``); here, what
goes together (``settings_problem``, the command line's wording where it has one), which modes an engine does
(``engine_modes``), and what an answer says of them (``details`` gives each hypothesis the fields ``inference.py
--format jsonl`` writes).

- ``prefix``: one string for every line, or a list aligned with ``text`` (``""``: none for that line);
- ``constraints``: a list of phrases every line's translation must contain, or a list of such lists aligned with
  ``text`` (``[]``: none for that line); at most ``MAX_PHRASES`` phrases a line;
- ``sample`` with ``temperature``, ``top_k``, ``top_p``, ``epsilon``, ``num_samples``, ``seed``: a sampling setting
  needs sampling on (the request's ``sample``, else the server's default);
- ``mbr`` N with ``mbr_utility``: MBR over N samples (with sampling) or the beam's N-best;
- ``details``: per-token log-probabilities, tokens and alignment, as ``inference.py --format jsonl`` writes them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from utils.serve.limits import Limits, RequestError

if TYPE_CHECKING:
    from utils.config import DecodeConfig
    from utils.serve.engine import Served
    from utils.translation.translate import Guide, Translation

#: The sampling settings (each needs sampling on).
SAMPLING = ("temperature", "top_k", "top_p", "epsilon", "num_samples", "seed")
#: The modes an engine may do, as ``GET /model`` lists them (``modes``).
MODES = ("prefix", "constraints", "sample", "mbr", "details")
#: Most constraint phrases of one line.
MAX_PHRASES = 16
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


def engine_modes(engine: Served) -> tuple[str, ...]:
    """The modes of ``MODES`` an engine does: every one for a PyTorch run (or an ensemble); an engine with a
    ``problem`` (a CTranslate2 export) those it finds nothing against, tried with the server's defaults and each mode
    at its plainest; another engine those it declares (``modes``)."""
    if engine.run is not None:
        return MODES
    if engine.problem is None:
        return tuple(m for m in MODES if m in engine.modes)
    return tuple(m for m in MODES if _problem(engine, m) is None)


def _problem(engine: Served, mode: str) -> str | None:
    """An engine's ``problem`` with ``mode`` at its plainest over the server's defaults (None: it does it)."""
    assert engine.problem is not None
    d = engine.cfg.decode.model_copy(update=dict(sample=False, mbr=0, nbest=1))
    beam = d.model_copy(update=dict(beam=max(2, d.beam)))
    tries = {"prefix": (d, True, False, False), "constraints": (beam, False, True, False),
             "sample": (d.model_copy(update=dict(sample=True, epsilon=0.0, top_k=0, top_p=1.0)), False, False, False),
             "mbr": (beam.model_copy(update=dict(mbr=2)), False, False, False), "details": (d, False, False, True)}
    return engine.problem(*tries[mode])


def refusal(engine: Served, mode: str) -> str:
    """Why an engine refuses ``mode`` (one it does not do), in one line: its own reason, else ``NOT_HERE``."""
    why = _problem(engine, mode) if engine.problem is not None else None
    return why or NOT_HERE[mode]


def engine_problem(engine: Served, decode: DecodeConfig, guides: list[Guide] | None, details: bool) -> str | None:
    """Why an engine that is not a PyTorch run cannot decode a request as asked (its ``problem``, e.g. a sampling
    setting CTranslate2 lacks), in one line; None if it can, or says nothing."""
    if engine.run is not None or engine.problem is None:
        return None
    guides = guides or []
    return engine.problem(decode, any(g.prefix for g in guides), any(g.constraints for g in guides), details)


def modes_used(decode: DecodeConfig, guides: list[Guide] | None, details: bool) -> list[str]:
    """The modes of ``MODES`` a request uses, decoded as ``decode`` (its settings in force)."""
    guides = guides or []
    return [mode for mode, on in (("prefix", any(g.prefix for g in guides)),
                                  ("constraints", any(g.constraints for g in guides)),
                                  ("sample", decode.sample), ("mbr", bool(decode.mbr)), ("details", details)) if on]


def default_nbest(nbest: int, decode: DecodeConfig) -> int:
    """The hypotheses a line gets when the request names no ``nbest`` (``nbest``: the server's), ``decode`` the
    request's other settings: one with sampling (its samples are ``num_samples``), at most the MBR candidates, else
    at most the beam."""
    if decode.mbr:
        return min(nbest, decode.mbr)
    return 1 if decode.sample else min(nbest, decode.beam)


def settings_problem(decode: DecodeConfig, guides: list[Guide] | None) -> str | None:
    """Why a request's settings (``decode``) and guides do not go together, in one line; None if they do."""
    from utils.translation.translate import guide_problem

    if decode.mbr == 1:
        return "mbr: MBR needs at least 2 candidates (0: off)"
    if decode.mbr:
        if not decode.sample and decode.mbr > decode.beam:
            return (f"mbr: {decode.mbr} candidates from beam search need a beam of at least {decode.mbr} (beam is "
                    f"{decode.beam}): raise the beam, or sample them (\"sample\": true)")
        if decode.sample and decode.num_samples not in (1, decode.mbr):
            return (f"num_samples: with mbr the candidates are mbr={decode.mbr} samples; leave num_samples out (it is "
                    f"{decode.num_samples})")
        if decode.nbest > decode.mbr:
            return f"nbest ({decode.nbest}) cannot exceed the mbr={decode.mbr} candidates"
    elif decode.sample:
        if decode.nbest > 1:
            return ("nbest: with sampling the translations of a line are its num_samples samples; leave nbest out (it "
                    f"is {decode.nbest})")
    elif decode.nbest > decode.beam:
        return f"nbest ({decode.nbest}) cannot exceed beam ({decode.beam})"
    guides = guides or []
    return guide_problem(decode, any(g.prefix for g in guides), any(g.constraints for g in guides))


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
    MBR, the blocked n-gram size (0: none), and whether details were asked for."""
    out: dict[str, Any] = {"sample": decode.sample}
    if decode.sample:
        out.update(temperature=decode.temperature, top_k=decode.top_k, top_p=decode.top_p, epsilon=decode.epsilon,
                   num_samples=decode.num_samples, seed=decode.seed)
    out["mbr"] = decode.mbr
    if decode.mbr:
        out["mbr_utility"] = decode.mbr_utility
    out["no_repeat_ngram_size"] = decode.no_repeat_ngram_size
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


def export_details(engine: Served, texts: list[str],
                   results: list[list[Translation]]) -> list[tuple[list[str], list[dict[str, Any]]]]:
    """``line_details`` for translations an engine without a PyTorch model made with their details (a CTranslate2
    export: each hypothesis carries its ``alignment``, from the attention it returned while decoding)."""
    from utils.translation.jsonl import hypothesis_record
    from utils.translation.translate import encode_sources

    tokenizer = engine.tokenizer
    sources = encode_sources(tokenizer, texts, engine.positions, strict=False)
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
