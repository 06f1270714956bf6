"""The decoding modes of ``POST /translate`` on a trained run (the app in this process, on uvicorn in a thread): a
target prefix, terminology constraints, seeded sampling, MBR and per-token details answer what ``translate`` (the
command line's decoding) gives for the same settings; bad fields are one 4xx line each; requests that decode
differently never share a batch (static batching here, the continuous decoder, the decoding process); an engine
without a mode refuses it; an ensemble is served."""

from __future__ import annotations

import http.client
import json
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, serving_app, train_tiny_run

from utils.serve.app import Limits, create_app
from utils.serve.modes import MODES, NOT_HERE
from utils.translation.translate import BLOCKED_CONSTRAINTS, GREEDY_CONSTRAINTS, SAMPLED_GUIDES, Guide, translate

LINES = (ROOT / "data" / "demo" / "test.fr").read_text(encoding="utf-8").splitlines()
LIMITS = Limits(max_wait_ms=0, max_tokens=40, max_beam_tokens=600)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny run trained for 20 steps (about 9 s: its samples and n-best lists differ) and a copy of it."""
    tmp = tmp_path_factory.mktemp("server_modes")
    run = train_tiny_run(tmp, ["model.input_pe=none", "decode.max_len_a=0", "decode.max_len_b=10"], epochs=1,
                         max_steps=20, eval_every=1000, lr=0.005)
    return {"run": run, "twin": shutil.copytree(run, tmp / "twin")}


@pytest.fixture(scope="module")
def run(runs: dict[str, Path]) -> Any:
    from utils.run.load import load_run

    return load_run(runs["run"], device="cpu")


class Recording:
    """The run decoding in the server's process (``TorchEngine``), each ``translate`` call recorded; ``gate``
    cleared holds the calls until it is set again."""

    def __init__(self, run: Any) -> None:
        from utils.translation.engines import TorchEngine

        self.inner = TorchEngine(run)
        self.run, self.cfg = run, run.cfg
        self.calls: list[tuple[list[str], Any, bool]] = []
        self.gate = threading.Event()
        self.gate.set()

    def translate(self, texts: list[str], decode: Any, on_done: Any = None, guides: Any = None) -> list[list[Any]]:
        self.calls.append((list(texts), decode, guides is not None))
        assert self.gate.wait(30)
        return self.inner.translate(texts, decode, on_done, guides=guides)


def serving(engine: Any, limits: Limits = LIMITS) -> AbstractContextManager[int]:
    """``engine`` behind uvicorn in a thread of this process, on a free port of 127.0.0.1 -> the port."""
    return serving_app(create_app(engine, limits))


@pytest.fixture(scope="module")
def engine(run: Any) -> Recording:
    return Recording(run)


@pytest.fixture(scope="module")
def port(engine: Recording) -> Iterator[int]:
    with serving(engine) as port:
        yield port


def call(port: int, body: dict[str, Any], path: str = "/translate", method: str = "POST") -> tuple[int, Any]:
    """-> (status, JSON answer)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request(method, path, body=None if method == "GET" else json.dumps(body).encode(),
                     headers={"Content-Type": "application/json"})
        res = conn.getresponse()
        return res.status, json.loads(res.read())
    finally:
        conn.close()


def ok(port: int, **body: Any) -> dict[str, Any]:
    status, answer = call(port, body)
    assert status == 200, answer
    return answer


def expected(run: Any, lines: list[str], guides: list[Guide] | None = None, **settings: Any) -> list[list[Any]]:
    """What ``translate`` (the command line's decoding) gives ``lines`` with the run's settings and ``settings``."""
    return translate(run.model, run.tokenizer, lines, run.cfg.decode.model_copy(update=settings), strict=False,
                     guides=guides)


def same(answer: dict[str, Any], results: list[list[Any]]) -> None:
    """The answer's n-best lists are ``results``: texts equal, scores and log-probabilities to float rounding."""
    assert len(answer["translations"]) == len(results)
    for line, nbest in zip(answer["translations"], results, strict=True):
        assert [h["text"] for h in line["nbest"]] == [h.text for h in nbest]
        assert line["translation"] == nbest[0].text
        assert [h["score"] for h in line["nbest"]] == pytest.approx([h.score for h in nbest], abs=1e-4)
        assert [h["logprob"] for h in line["nbest"]] == pytest.approx([h.logprob for h in nbest], abs=1e-4)


def test_a_prefix_is_kept_and_the_answer_is_what_translate_gives(port: int, run: Any) -> None:
    lines = LINES[:3]
    answer = ok(port, text=lines, prefix="The cat", nbest=2)
    same(answer, expected(run, lines, [Guide("The cat")] * 3, nbest=2))
    assert all(h["text"].startswith("The cat") for line in answer["translations"] for h in line["nbest"])
    assert (answer["beam"], answer["nbest"], answer["sample"], answer["mbr"]) == (2, 2, False, 0)
    per_line = ok(port, text=lines, prefix=["The cat", "", "It"], beam=1)  # greedy; the second line has none
    same(per_line, expected(run, lines, [Guide("The cat"), Guide(""), Guide("It")], beam=1))
    assert per_line["translations"][2]["translation"].startswith("It")


def test_blocked_ngram_repeats_answer_what_translate_gives(port: int, run: Any) -> None:
    lines = LINES[:6]
    for beam in (1, 3):
        answer = ok(port, text=lines, beam=beam, no_repeat_ngram_size=2, details=True)
        same(answer, expected(run, lines, no_repeat_ngram_size=2, beam=beam))
        assert answer["no_repeat_ngram_size"] == 2
        for line in answer["translations"]:
            tokens = line["nbest"][0]["tokens"]
            assert len(set(zip(tokens, tokens[1:], strict=False))) == max(len(tokens) - 1, 0)
    plain = ok(port, text=lines, beam=1, details=True)  # none blocked: the bigrams repeat
    assert plain["no_repeat_ngram_size"] == 0
    assert any(len(set(zip(t, t[1:], strict=False))) < len(t) - 1
               for t in (line["nbest"][0]["tokens"] for line in plain["translations"]))
    status, answer = call(port, {"text": "Le chat.", "constraints": ["cat"], "no_repeat_ngram_size": 2})
    assert status == 422 and answer == {"error": BLOCKED_CONSTRAINTS}


def test_every_constraint_appears_and_the_answer_is_what_translate_gives(port: int, run: Any) -> None:
    lines = LINES[3:6]
    phrases = [["the cat"], [], ["is not", "house"]]
    answer = ok(port, text=lines, constraints=phrases, beam=4, nbest=2)
    same(answer, expected(run, lines, [Guide("", tuple(p)) for p in phrases], beam=4, nbest=2))
    for line, wanted in zip(answer["translations"], phrases, strict=True):
        for hyp in line["nbest"]:
            assert ("constraints_met" in hyp) == bool(wanted)
            if hyp.get("constraints_met"):
                assert all(p in hyp["text"] for p in wanted)
    assert answer["translations"][0]["nbest"][0]["constraints_met"] and "the cat" in answer["translations"][0][
        "translation"]
    every = ok(port, text=lines[:2], constraints=["the cat"], beam=4, prefix="It")  # one list for every line
    same(every, expected(run, lines[:2], [Guide("It", ("the cat",))] * 2, beam=4))


def test_a_seeded_sample_repeats_and_is_what_translate_gives(port: int, run: Any) -> None:
    lines = LINES[6:9]
    settings = dict(sample=True, num_samples=3, seed=7, temperature=1.5, top_k=50, top_p=0.95, epsilon=0.001)
    first = ok(port, text=lines, **settings)
    assert ok(port, text=lines, **settings)["translations"] == first["translations"]
    same(first, expected(run, lines, **settings))
    assert [len(t["nbest"]) for t in first["translations"]] == [3, 3, 3] and first["nbest"] == 3
    assert {k: first[k] for k in settings} == settings
    other = ok(port, text=lines, **{**settings, "seed": 8})
    assert other["translations"] != first["translations"]


def test_mbr_answers_the_candidates_mbr_rank_picks(port: int, run: Any) -> None:
    from utils.translation.mbr import mbr_rank

    lines = LINES[9:11]
    answer = ok(port, text=lines, sample=True, mbr=8, seed=3, nbest=3)
    samples = expected(run, lines, sample=True, num_samples=8, seed=3)
    for line, candidates in zip(answer["translations"], samples, strict=True):
        ranked = mbr_rank(candidates, "chrf")[:3]
        assert [h["text"] for h in line["nbest"]] == [c.text for c in ranked]
        assert [h["utility"] for h in line["nbest"]] == pytest.approx([c.utility for c in ranked])
    assert (answer["mbr"], answer["mbr_utility"], answer["nbest"], answer["num_samples"]) == (8, "chrf", 3, 1)
    beam = ok(port, text=lines, beam=4, mbr=4, mbr_utility="bleu")  # over the beam's 4-best
    nbest = expected(run, lines, beam=4, nbest=4)
    for line, candidates in zip(beam["translations"], nbest, strict=True):
        assert [h["text"] for h in line["nbest"]] == [mbr_rank(candidates, "bleu")[0].text]


def test_details_are_the_jsonl_fields(port: int, run: Any) -> None:
    from utils.translation.jsonl import alignments, hypothesis_record
    from utils.translation.translate import encode_sources

    lines = LINES[11:13]
    answer = ok(port, text=lines, nbest=2, details=True, prefix="The")
    results = expected(run, lines, [Guide("The")] * 2, nbest=2)
    sources = encode_sources(run.tokenizer, lines, run.model.max_length, strict=False)
    aligned = alignments(run.model, run.tokenizer, sources, results)
    assert answer["details"] is True
    for line, src, nbest, align in zip(answer["translations"], sources, results, aligned, strict=True):
        assert line["source_tokens"] == run.tokenizer.id_to_token(src)
        for got, hyp, a in zip(line["nbest"], nbest, align, strict=True):
            record = hypothesis_record(run.tokenizer, hyp, a)
            assert got["tokens"] == record["tokens"] and got["alignment"] == record["alignment"]
            assert got["token_logprobs"] == pytest.approx(record["token_logprobs"], abs=1e-4)
            assert sum(got["token_logprobs"]) == pytest.approx(got["logprob"], abs=1e-3)
            assert len(got["alignment"]) == len(got["tokens"]) and max(got["alignment"]) < len(src)
    plain = ok(port, text=lines[0])["translations"][0]
    assert "source_tokens" not in plain and set(plain["nbest"][0]) == {"text", "score", "logprob"}


BAD = [
    ({"temperature": 0.5}, 422, 'temperature applies to sampling: add "sample": true'),
    ({"seed": 1}, 422, 'seed applies to sampling: add "sample": true'),
    ({"mbr_utility": "bleu"}, 422, 'mbr_utility applies to MBR decoding: add "mbr": N'),
    ({"beam": 1, "constraints": ["cat"]}, 422, GREEDY_CONSTRAINTS),
    ({"sample": True, "prefix": "The"}, 422, SAMPLED_GUIDES),
    ({"text": ["Oui.", "Non."], "prefix": ["The"]}, 422,
     'prefix has 1 item but text has 2 lines: give one prefix per line ("" for none), or one string for every line'),
    ({"text": ["Oui.", "Non."], "constraints": [["cat"]]}, 422,
     "constraints has 1 lists but text has 2 lines: give one list of phrases per line ([] for none), or one list of "
     "phrases for every line"),
    ({"prefix": "  "}, 422, "prefix is empty: give the text the translations start with"),
    ({"prefix": 5}, 422, "prefix must be a string or a list of strings, not a number"),
    ({"constraints": ["cat", " "]}, 422, "constraints[1] is empty: give a word or phrase the translation must contain"),
    ({"constraints": []}, 422, "constraints is an empty list: give the phrases, or leave the field out"),
    ({"constraints": "cat"}, 422, "constraints must be a list of phrases (for every line) or of lists of phrases (one "
                                  "per line), not a string"),
    ({"constraints": [["a"], "b"]}, 422, "constraints must be a list of phrases or a list of lists of phrases, not "
                                         "both"),
    ({"constraints": ["a"] * 17}, 413, "constraints has 17 phrases, over the limit of 16 a line"),
    ({"prefix": "the " * 60}, 413, "the prefix and constraints of text has 61 tokens, over the limit of 40 "
                                   "(--max-tokens): send a shorter sentence, or start the server with a larger "
                                   "--max-tokens"),
    ({"mbr": 1}, 422, "mbr: MBR needs at least 2 candidates (0: off)"),
    ({"mbr": 4}, 422, 'mbr: 4 candidates from beam search need a beam of at least 4 (beam is 2): raise the beam, or '
                      'sample them ("sample": true)'),
    ({"sample": True, "nbest": 2}, 422, "nbest: with sampling the translations of a line are its num_samples "
                                        "samples; leave nbest out (it is 2)"),
    ({"sample": True, "mbr": 4, "num_samples": 2}, 422, "num_samples: with mbr the candidates are mbr=4 samples; "
                                                        "leave num_samples out (it is 2)"),
    ({"beam": 3, "mbr": 2, "nbest": 3}, 422, "nbest (3) cannot exceed the mbr=2 candidates"),
    ({"sample": True, "top_p": 0}, 422, "top_p must be above 0 and at most 1, got 0"),
    ({"sample": True, "temperature": 100}, 422, "temperature must be above 0 and below 100, got 100"),
    ({"sample": True, "epsilon": 1}, 422, "epsilon must be at least 0 and below 1, got 1"),
    ({"sample": True, "num_samples": 33}, 422, "num_samples must be between 1 and 32, got 33"),
    ({"sample": "yes"}, 422, "sample must be true or false, not a string"),
    ({"details": 1}, 422, "details must be true or false, not a number"),
    ({"mbr": 2, "beam": 2, "mbr_utility": "meteor"}, 422, 'mbr_utility must be one of chrf, bleu, got "meteor"'),
    ({"text": LINES[:4], "sample": True, "num_samples": 32}, 413, None),  # over --max-beam-tokens: samples x tokens
]


@pytest.mark.parametrize(("fields", "status", "message"), BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_mode_fields_are_a_4xx_and_one_line(port: int, fields: dict[str, Any], status: int,
                                                message: str | None) -> None:
    got, answer = call(port, {"text": "Oui.", **fields})
    assert got == status and list(answer) == ["error"] and "\n" not in answer["error"], answer
    if message is not None:
        assert answer["error"] == message
    else:
        assert answer["error"].startswith("this request asks for ") and "source tokens x samples" in answer["error"]


def test_requests_that_decode_differently_never_share_a_static_batch(port: int, engine: Recording) -> None:
    """Requests queued together while the worker is held: those with the same settings share one ``translate``
    call; a different sampling setting, or a prefix, makes a call of its own."""
    engine.gate.clear()
    engine.calls.clear()
    sampled = {"sample": True, "seed": 1}
    bodies = [{"text": "Oui."}, {"text": LINES[0], **sampled}, {"text": LINES[1], **sampled, "temperature": 0.5},
              {"text": LINES[2], **sampled}, {"text": LINES[3], "prefix": "The"}, {"text": LINES[4]}]
    answers: dict[int, tuple[int, Any]] = {}
    threads = [threading.Thread(target=lambda k=k, b=b: answers.__setitem__(k, call(port, b)))
               for k, b in enumerate(bodies)]
    threads[0].start()
    deadline = time.monotonic() + 30
    while not engine.calls:  # the first request holds the worker; the others queue behind it
        assert time.monotonic() < deadline
        time.sleep(0.01)
    for k, thread in enumerate(threads[1:], 2):
        thread.start()
        while call(port, {}, "/health", "GET")[1]["waiting"] < k - 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    engine.gate.set()
    for thread in threads:
        thread.join(30)
    assert all(answers[k][0] == 200 for k in range(len(bodies)))
    batches = [(texts, d.sample, d.temperature, prefixed) for texts, d, prefixed in engine.calls]
    assert batches == [(["Oui."], False, 1.0, False),  # alone, holding the worker; then one call per setting:
                       ([LINES[0], LINES[2]], True, 1.0, False), ([LINES[1]], True, 0.5, False),
                       ([LINES[3]], False, 1.0, True), ([LINES[4]], False, 1.0, False)]
    same(answers[2][1], expected(engine.run, [LINES[1]], sample=True, seed=1, temperature=0.5))


def test_the_continuous_decoder_never_batches_requests_that_decode_differently(run: Any) -> None:
    """Requests added at the same step: the same settings share a batch; another temperature, MBR, or a prefix
    start batches of their own; each answer is what ``translate`` gives it alone (MBR ranked as there)."""
    from utils.translation.continuous import ContinuousDecoder, Request
    from utils.translation.translate import encode_guides, encode_sources

    lines = LINES[:4]
    sources = encode_sources(run.tokenizer, lines, run.model.max_length, strict=False)
    base = run.cfg.decode
    sampled = base.model_copy(update=dict(sample=True, num_samples=2, seed=5))
    settings = [sampled, sampled, sampled.model_copy(update=dict(temperature=0.7)),
                base.model_copy(update=dict(sample=True, mbr=4, seed=5)), base]
    guides = [None, None, None, None, [Guide("The")] * len(lines)]
    decoder = ContinuousDecoder(run.model, run.tokenizer, join=0)
    got: list[dict[int, Any]] = [{} for _ in settings]
    decoder.add([Request(sources, d, got[k].__setitem__, lambda err: pytest.fail(str(err)),
                         None if g is None else encode_guides(run.tokenizer, g, run.model.max_length))
                 for k, (d, g) in enumerate(zip(settings, guides, strict=True))])
    while decoder.busy:
        decoder.step()
    assert decoder.batches == 4  # the first two together; the others alone
    for k, (d, g) in enumerate(zip(settings, guides, strict=True)):
        alone = translate(run.model, run.tokenizer, lines, d, strict=False, guides=g)
        assert [[h.text for h in got[k][i]] for i in range(len(lines))] == [[h.text for h in nb] for nb in alone]
        assert all(h.utility is not None for i in range(len(lines)) for h in got[k][i]) == bool(d.mbr)


def test_an_engine_without_a_mode_refuses_it_in_one_line_and_says_which_it_has() -> None:
    """A CTranslate2 export's stand-in: no PyTorch run; it declares the modes it does (here a prefix only)."""
    from types import SimpleNamespace

    from utils.config import from_dict
    from utils.translation.translate import Translation

    class Export:
        modes = ("prefix",)

        def __init__(self) -> None:
            self.cfg = from_dict({"decode": {"beam": 2}})
            self.tokenizer = SimpleNamespace(vocab_size=9)
            self.got: list[Any] = []

        def translate(self, texts: list[str], decode: Any, on_done: Any = None, guides: Any = None) -> list[list]:
            self.got.append(guides)
            return [[Translation(t.upper(), -1.0, -2.0, [])] for t in texts]

    export = Export()
    with serving(export) as port:
        assert call(port, {}, "/model", "GET")[1]["modes"] == ["prefix"]
        for fields, mode in (({"constraints": ["cat"]}, "constraints"), ({"sample": True}, "sample"),
                             ({"mbr": 2}, "mbr"), ({"details": True}, "details")):
            assert call(port, {"text": "Oui.", **fields}) == (422, {"error": NOT_HERE[mode]})
        assert ok(port, text="Oui.", prefix="Yes")["translations"][0]["translation"] == "OUI."
        assert export.got == [[Guide("Yes")]]  # the prefix handed over
        assert ok(port, text="Oui.")["translations"][0]["translation"] == "OUI." and export.got[-1] is None


def test_an_export_says_what_it_cannot_do_and_gives_its_own_details(run: Any) -> None:
    """A CTranslate2 export's stand-in with ``problem`` (why it cannot decode as asked) and ``translate(...,
    details=True)`` (hypotheses carrying their alignment): ``GET /model`` lists the modes it finds no problem with,
    a request it cannot do is refused with its own line, and details come from its hypotheses."""
    from dataclasses import dataclass, field

    from utils.translation.jsonl import hypothesis_record
    from utils.translation.translate import Translation, encode_sources

    @dataclass
    class Aligned(Translation):
        alignment: list[int] = field(default_factory=list)

    class Export:
        def __init__(self) -> None:
            self.cfg, self.tokenizer, self.max_length = run.cfg, run.tokenizer, run.model.max_length
            self.calls: list[tuple[Any, Any, bool]] = []

        def problem(self, decode: Any, prefix: bool = False, constraints: bool = False,
                    details: bool = False) -> str | None:
            if constraints:
                return "no constraints in this export"
            return "no epsilon in this export" if decode.sample and decode.epsilon else None

        def translate(self, texts: list[str], decode: Any, on_done: Any = None, guides: Any = None,
                      details: bool = False) -> list[list[Any]]:
            self.calls.append((decode, guides, details))
            out = []
            for text in texts:
                ids = self.tokenizer.encode_tgt([text.upper()])[0]
                out.append([Aligned(text.upper(), -1.0, -2.0, ids, [-0.5] * (len(ids) + 1),
                                    alignment=list(range(len(ids) + 1)) if details else [])])
            return out

    export = Export()
    with serving(export) as port:
        assert call(port, {}, "/model", "GET")[1]["modes"] == ["prefix", "sample", "mbr", "details"]
        assert call(port, {"text": "Oui.", "constraints": ["a"]}) == (422, {"error": "no constraints in this export"})
        assert call(port, {"text": "Oui.", "sample": True, "epsilon": 0.1}) == (
            422, {"error": "no epsilon in this export"})
        answer = ok(port, text=["Oui.", "Non merci."], details=True, prefix="Y")
        assert export.calls[-1][2] is True and export.calls[-1][1] == [Guide("Y")] * 2
        sources = encode_sources(run.tokenizer, ["Oui.", "Non merci."], run.model.max_length, strict=False)
        for line, src, text in zip(answer["translations"], sources, ["Oui.", "Non merci."], strict=True):
            hyp = export.translate([text], run.cfg.decode, details=True)[0][0]
            assert line["source_tokens"] == run.tokenizer.id_to_token(src)
            assert line["nbest"] == [hypothesis_record(run.tokenizer, hyp, hyp.alignment)]
        ok(port, text="Oui.")
        assert export.calls[-1][1:] == (None, False)  # neither guides nor details asked of it


@pytest.mark.slow
def test_an_ensemble_is_served_and_the_decoding_process_takes_every_mode(runs: dict[str, Path], run: Any) -> None:
    """An ensemble of the run and its copy, as ``inference.py --serve --model_path A B`` loads it: ``GET /model``
    names both; its decoding process (both models, checked) answers prefix, constraints and MBR jobs, static and
    joined, as ``translate`` of the run alone does (two identical models decode as one)."""
    from utils.run.ensemble import load_ensemble
    from utils.serve.worker import ProcessDecoder
    from utils.translation.engines import TorchEngine

    both = load_ensemble([runs["run"], runs["twin"]], device="cpu")
    with serving(TorchEngine(both)) as port:
        model = call(port, {}, "/model", "GET")[1]
        assert [m["run_dir"] for m in model["ensemble"]] == [str(runs["run"]), str(runs["twin"])]
        assert model["modes"] == list(MODES)
        answer = ok(port, text=LINES[:2], prefix="The", details=True)
        same(answer, expected(run, LINES[:2], [Guide("The")] * 2))
        assert call(port, {"text": "Oui."}, "/attention")[0] == 200  # its first model's attention
    members = [(m.checkpoint, m.step, m.run_dir) for m in both.members]
    decoder = ProcessDecoder(both.checkpoint, both.step, None, [], "cpu", join=0, members=members)
    try:
        lines = LINES[:3]
        prefixed = [Guide("The cat"), Guide(""), Guide("It")]
        ours = decoder.translate(lines, run.cfg.decode, guides=prefixed)  # a static batch
        assert [[h.text for h in nb] for nb in ours] == [[h.text for h in nb] for nb in expected(run, lines, prefixed)]
        jobs = [(run.cfg.decode.model_copy(update=dict(beam=4)), [Guide("", ("the cat",))] * 3),
                (run.cfg.decode.model_copy(update=dict(sample=True, mbr=4, seed=2)), None)]
        results: list[dict[int, Any]] = [{}, {}]
        done = threading.Semaphore(0)
        for k, (d, g) in enumerate(jobs):  # joined to the decoding in flight
            decoder.submit(lines, d, lambda i, nb, k=k: (results[k].__setitem__(i, nb), done.release()),
                           lambda err: pytest.fail(str(err)), guides=g)
        for _ in range(2 * len(lines)):
            assert done.acquire(timeout=60)
        for k, (d, g) in enumerate(jobs):
            alone = translate(run.model, run.tokenizer, lines, d, strict=False, guides=g)
            assert [[h.text for h in results[k][i]] for i in range(3)] == [[h.text for h in nb] for nb in alone]
        assert all(h.utility is not None for nb in results[1].values() for h in nb)
    finally:
        decoder.close()
