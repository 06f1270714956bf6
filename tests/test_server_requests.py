"""The server's request models and batchers, without a server: a body is validated by its model (built for the
server's limits and decoding defaults), a refusal is pydantic's first error as one line with its status, a valid
body gives the decoding settings and guides it asks for; an engine gets its way of batching (``batcher_for``)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import ValidationError

from utils.config import from_dict
from utils.serve.batcher import ContinuousBatcher, StaticBatcher, batcher_for
from utils.serve.engine import Served
from utils.serve.limits import Limits
from utils.serve.refusals import refusal
from utils.serve.schema import request_models
from utils.translation.translate import Guide

LIMITS = Limits(max_lines=3, max_chars=20, max_beam=8)
CFG = from_dict({"model": {"encoder_layers": 2, "decoder_layers": 1}, "decode": {"beam": 4, "nbest": 3}})
TRANSLATE, ATTENTION = request_models(LIMITS, CFG, {"cross": [0], "encoder": [0, 1], "decoder": [0]})
EXPORT = request_models(LIMITS, CFG, {"cross": [0]})[1]  # what a CTranslate2 export draws


def refused(model: Any, body: dict[str, Any]) -> tuple[int, str]:
    with pytest.raises(ValidationError) as caught:
        model.model_validate(body)
    err = refusal(caught.value.errors(), model)
    return err.status, err.message


@pytest.mark.parametrize(("model", "body", "status", "line"), [
    (TRANSLATE, {"colour": 1}, 422, "unknown field 'colour' (fields: text, beam, nbest, lenpen, prefix, constraints, "
                                    "sample, temperature, top_k, top_p, epsilon, num_samples, seed, mbr, mbr_utility, "
                                    "no_repeat_ngram_size, details)"),  # before the missing text
    (TRANSLATE, {"text": ["a", "b"], "constraints": [["x"], ["y"], ["z"], ["w"]]}, 413,
     "constraints has 4 lists, over the limit of 3 (--max-lines)"),
    (TRANSLATE, {"text": "a", "prefix": []}, 422, 'prefix is an empty list: give one prefix per line ("" for none)'),
    (TRANSLATE, {"text": "a", "constraints": [["x", 5]]}, 422, "constraints[0][1] must be a string, not a number"),
    (TRANSLATE, {"text": ["a", "b" * 21]}, 413, "text[1] has 21 characters, over the limit of 20 (--max-chars)"),
    (TRANSLATE, {"text": "a", "top_p": 1.5, "sample": True}, 422, "top_p must be above 0 and at most 1, got 1.5"),
    (ATTENTION, {"text": "a", "kind": None}, 422, "kind must be one of cross, encoder, decoder, got null"),
    (ATTENTION, {"text": "a", "kind": "encoder", "layer": 2}, 422,
     "layer 2: the encoder has 2 layers (0..1, or -1 for the last)"),
    (EXPORT, {"text": "a", "kind": "encoder"}, 422, "this CTranslate2 export gives only cross layer 0 (mean over "
                                                    "heads): serve the run directory for encoder layer 1"),
    (ATTENTION, {}, 422, 'missing field "text": the sentence whose attention is drawn'),
])
def test_a_refusal_is_the_first_error_in_one_line(model: Any, body: dict[str, Any], status: int, line: str) -> None:
    assert refused(model, body) == (status, line)


def test_a_body_gives_its_settings_over_the_server_s_and_its_guides() -> None:
    body = TRANSLATE.model_validate({"text": ["Oui.", "Non."], "sample": True, "mbr": 2, "seed": 7,
                                     "constraints": None, "prefix": None, "beam": None})
    decode = body.settings()
    assert (decode.beam, decode.sample, decode.mbr, decode.seed) == (4, True, 2, 7)  # beam null: the server's
    assert (decode.num_samples, decode.nbest) == (1, 2)  # MBR's candidates are its samples; nbest at most mbr
    assert body.guides() is None and body.lines == ["Oui.", "Non."] and not body.single
    guided = TRANSLATE.model_validate({"text": ["a", "b"], "prefix": [" The", ""], "constraints": ["cat "]})
    assert guided.guides() == [Guide("The", ("cat",)), Guide("", ("cat",))]
    assert guided.settings().nbest == 3  # the server's, within its beam
    assert ATTENTION.model_validate({"text": "a", "kind": "encoder", "layer": -1}).place() == ("encoder", 1)


def test_each_engine_gets_its_way_of_batching() -> None:
    """A stand-in with only ``cfg`` and ``translate`` is read with the defaults (no run, no modes) and batched
    statically; an engine whose decoding process takes requests into its decoding in flight, continuously (its
    counters the process's)."""
    stand_in = SimpleNamespace(cfg=CFG, translate=lambda texts, decode, on_done=None: [])
    served = Served.of(stand_in)
    assert (served.run, served.decoder, served.problem, served.modes, served.kind) == (None, None, None, (),
                                                                                       "ctranslate2")
    assert isinstance(batcher_for(served, LIMITS), StaticBatcher)
    decoder = SimpleNamespace(stats=(3, 40, 90), submit=None, cancel=None, translating=None)
    joined = batcher_for(Served.of(SimpleNamespace(**vars(stand_in), decoder=decoder, continuous=True)), LIMITS)
    assert isinstance(joined, ContinuousBatcher)
    assert {k: joined.snapshot()[k] for k in ("batches", "steps", "step_sentences")} == {
        "batches": 3, "steps": 40, "step_sentences": 90}
    assert isinstance(batcher_for(Served.of(SimpleNamespace(**vars(stand_in), decoder=decoder)), LIMITS),
                      StaticBatcher)  # a decoding process batched statically (--batching static)
