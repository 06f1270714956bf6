"""The decoding modes on a CTranslate2 export: a target prefix, seeded sampling, MBR and the jsonl output where
CTranslate2 has them (the prefix kept, samples repeated by a seed, MBR's pick the brute-force one, the jsonl of a
greedy export the run's jsonl), and one line, exit 2, nothing written, where it has not (ensembles, constraints,
epsilon sampling, top-k with top-p, test.py)."""

from __future__ import annotations

import importlib.util
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, f32_sum, train_tiny_run
from sacrebleu.metrics import BLEU, CHRF

pytest.importorskip("ctranslate2")

from models.decoding import length_penalty  # noqa: E402
from utils.translation.engines import CT2Model, ct2_jsonl_writer  # noqa: E402
from utils.translation.translate import Guide, translate_stream  # noqa: E402

TEXTS = (ROOT / "data" / "demo" / "test.fr").read_text(encoding="utf-8").splitlines()


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny run trained for 20 steps (outputs still varied) with a short cap, and its export."""
    from utils.run.load import load_run
    from utils.translation.export import export

    tmp = tmp_path_factory.mktemp("ct2_modes")
    run = train_tiny_run(tmp, ["model.input_pe=none", "tokenizer.byte_fallback=false", "decode.max_len_a=0",
                               "decode.max_len_b=8"], epochs=1, max_steps=20, eval_every=1000, lr=0.005)
    loaded = load_run(str(run), device="cpu")
    out = export(loaded.run_dir, loaded.checkpoint, loaded.model, loaded.cfg, loaded.tokenizer, tmp / "ct2", None)
    return {"run": run, "export": out}


@pytest.fixture(scope="module")
def engine(exported: dict[str, Path]) -> CT2Model:
    return CT2Model(exported["export"], threads=1)


def cli(script: str, *args: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> tuple[int, str, list[str]]:
    """``script`` (inference or test) run in this process with ``args``: (exit status, standard output, the lines of
    standard error)."""
    from utils.cli import run_main

    spec = importlib.util.spec_from_file_location(f"fr2en_{script}_ct2_modes", ROOT / f"{script}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(sys, "argv", [f"{script}.py", *args])
    with pytest.raises(SystemExit) as e:
        run_main(module.main)
    out = capsys.readouterr()
    return int(e.value.code or 0), out.out, out.err.strip().splitlines()


def test_seeded_samples_repeat_and_are_scored_as_teacher_forcing_scores_them(engine: CT2Model) -> None:
    texts = TEXTS[:6]
    decode = engine.cfg.decode.model_copy(update=dict(sample=True, num_samples=3, seed=5, temperature=1.3))
    first = engine.translate(texts, decode)

    def tokens(results: list) -> list[list[list[int]]]:
        return [[h.tokens for h in nbest] for nbest in results]

    again = engine.translate(texts, decode)
    assert [[(h.tokens, h.score, h.logprob) for h in nb] for nb in again] == \
        [[(h.tokens, h.score, h.logprob) for h in nb] for nb in first]
    assert tokens(engine.translate(texts, decode.model_copy(update=dict(seed=6)))) != tokens(first)
    assert tokens(engine.translate(texts, decode.model_copy(update=dict(seed=None)))) != tokens(first)
    assert len({tuple(h.tokens) for nb in first for h in nb}) > len(texts)  # samples differ
    sources = [engine.tokenizer.id_to_token(engine.tokenizer.encode_src([t])[0] + [engine.tokenizer.eos_id])
               for t in texts]
    eos = engine.tokenizer.eos_id
    for src, nbest in zip(sources, first, strict=True):
        assert len(nbest) == 3 and [h.score for h in nbest] == sorted((h.score for h in nbest), reverse=True)
        for h in nbest:  # the model's own log-probabilities (untempered), EOS included where it was output
            forced = engine.translator.score_batch([src], [engine.tokenizer.id_to_token(h.tokens)],
                                                   max_input_length=0)[0].log_probs
            ended = len(h.token_logprobs) == len(h.tokens) + 1
            assert h.token_logprobs == pytest.approx(forced if ended else forced[:-1], abs=1e-6)
            assert ended or len(h.tokens) == 8  # only a sample at the cap has no EOS
            assert f32_sum(h.token_logprobs) == h.logprob
            assert h.score == pytest.approx(h.logprob / length_penalty(len(h.tokens) + 1, decode.lenpen), rel=1e-6)
    assert eos not in [t for nb in first for h in nb for t in h.tokens]
    # top-k 1 is the argmax: every sample is the greedy translation
    greedy = engine.translate(texts, decode.model_copy(update=dict(sample=False, beam=1, nbest=1)))
    argmax = engine.translate(texts, decode.model_copy(update=dict(top_k=1)))
    assert [[h.text for h in nb] for nb in argmax] == [[nb[0].text] * 3 for nb in greedy]


def test_a_target_prefix_is_kept_and_scored(engine: CT2Model) -> None:
    texts = TEXTS[:5]
    prefix = engine.tokenizer.encode_tgt(["The cat"])[0]
    guides = [Guide("The cat"), None, Guide("The cat"), Guide(), Guide("The cat")]
    for beam in (1, 3):
        decode = engine.cfg.decode.model_copy(update=dict(beam=beam, nbest=beam))
        plain = engine.translate(texts, decode)
        guided = engine.translate(texts, decode, guides=guides)
        for guide, nbest, alone in zip(guides, guided, plain, strict=True):
            if guide is None or not guide.prefix:  # no prefix: as without guides
                assert [h.text for h in nbest] == [h.text for h in alone]
                continue
            assert len(nbest) == beam and [h.score for h in nbest] == sorted((h.score for h in nbest), reverse=True)
            for h in nbest:
                assert h.tokens[: len(prefix)] == prefix and h.text.startswith("The cat")
                assert len(h.token_logprobs) in (len(h.tokens), len(h.tokens) + 1)
                assert f32_sum(h.token_logprobs) == h.logprob  # the prefix's tokens counted (CTranslate2: 0 each)
                assert sum(h.token_logprobs[: len(prefix)]) < -0.5
                if beam > 1:
                    assert h.score == pytest.approx(h.logprob / length_penalty(len(h.tokens) + 1, decode.lenpen))


def test_mbr_picks_the_candidate_a_brute_force_expected_utility_picks(engine: CT2Model) -> None:
    texts = TEXTS[:6]
    base = engine.cfg.decode
    metrics = {"chrf": CHRF(), "bleu": BLEU(effective_order=True)}
    moved = 0
    for mode, n in ((dict(sample=True, seed=3), 6), (dict(beam=4), 4)):
        pool = dict(num_samples=n) if "sample" in mode else dict(nbest=n)
        candidates = engine.translate(texts, base.model_copy(update={**mode, **pool}))
        for utility, metric in metrics.items():
            picked = engine.translate(texts, base.model_copy(update={**mode, "mbr": n, "mbr_utility": utility}))
            for cands, pick in zip(candidates, picked, strict=True):
                hyps = [c.text for c in cands]
                assert len(hyps) == n
                expected = [sum(metric.sentence_score(h, [r]).score for r in hyps) / n for h in hyps]
                best = next(k for k in range(n) if expected[k] >= max(expected) - 1e-9)
                assert len(pick) == 1 and pick[0].text == hyps[best]
                assert pick[0].utility == pytest.approx(expected[best], abs=1e-9)
                assert (pick[0].score, pick[0].logprob) == (cands[best].score, cands[best].logprob)
                moved += hyps[best] != hyps[0]
    assert moved >= 2  # MBR did not just return the model's best


def test_jsonl_of_an_export_aligns_every_token(engine: CT2Model) -> None:
    lines = TEXTS[:4] + [""]
    decode = engine.cfg.decode.model_copy(update=dict(beam=3, nbest=2))
    out = io.StringIO()
    translate_stream(lambda texts, d: engine.translate(texts, d, details=True), io.BytesIO(
        ("\n".join(lines) + "\n").encode()), out, decode, write=ct2_jsonl_writer(engine))
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [r["index"] for r in records] == list(range(5))
    eos = engine.tokenizer.id_to_token([engine.tokenizer.eos_id])[0]
    for r in records[:-1]:
        assert r["source_tokens"][-1] == eos and len(r["nbest"]) == 2
        assert {k: r[k] for k in r["nbest"][0]} == r["nbest"][0]
        for h in r["nbest"]:
            n = len(h["tokens"])
            assert len(h["token_logprobs"]) == n == len(h["alignment"]) and n >= 1
            assert h["tokens"][-1] == eos or n == 8
            assert all(0 <= a < len(r["source_tokens"]) for a in h["alignment"])
            assert f32_sum(h["token_logprobs"]) == h["logprob"]
            with_eos = len(h["tokens"]) + (h["tokens"][-1] != eos)  # |Y| counts an EOS, output or not
            assert h["score"] == pytest.approx(h["logprob"] / length_penalty(with_eos, decode.lenpen), rel=1e-6)
    assert records[-1] | {"nbest": None} == {"index": 4, "text": "", "score": 0.0, "logprob": 0.0, "tokens": [],
                                             "token_logprobs": [], "alignment": [], "source_tokens": [],
                                             "nbest": None}


@pytest.mark.slow
def test_greedy_jsonl_of_the_export_is_the_runs_with_and_without_a_prefix(exported: dict[str, Path],
                                                                         tmp_path: Path) -> None:
    """inference.py --beam 1 --format jsonl --prefix_file (and a length floor) on the run and on its export, each in
    its own process: the same tokens, token log-probabilities (to 1e-4), scores and alignments, but where a
    translation reaches the cap (the run ends it with a forced EOS, the export stops without)."""
    src, prefixes = tmp_path / "src.fr", tmp_path / "prefixes.en"
    src.write_text("\n".join(TEXTS[:12]) + "\n", encoding="utf-8")
    prefixes.write_text("\n".join(["", "The", "", "I am"] * 3) + "\n", encoding="utf-8")

    def jsonl(model: Path) -> list[dict]:
        res = subprocess.run([sys.executable, "inference.py", "--model_path", str(model), "--input", str(src),
                              "--prefix_file", str(prefixes), "--beam", "1", "--format", "jsonl", "--threads", "1",
                              "--set", "decode.min_len_b=4"],  # a floor: this model would end most lines at once
                             cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr
        return [json.loads(line) for line in res.stdout.splitlines()]

    ours, theirs = jsonl(exported["run"]), jsonl(exported["export"])
    assert len(ours) == len(theirs) == 12
    ended = 0
    for k, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        n = len(b["tokens"])
        assert a["source_tokens"] == b["source_tokens"]
        assert b["tokens"] == a["tokens"][:n] and n in (len(a["tokens"]), len(a["tokens"]) - 1)
        if k % 2:
            assert b["text"].startswith(("The", "I am"))
        assert b["token_logprobs"] == pytest.approx(a["token_logprobs"][:n], abs=1e-4)
        assert b["alignment"] == a["alignment"][:n]
        assert f32_sum(b["token_logprobs"]) == b["logprob"] == b["score"]
        if n == len(a["tokens"]):  # it ended with EOS in both
            ended += 1
            assert b["text"] == a["text"] and b["score"] == pytest.approx(a["score"], abs=1e-4)
    assert ended >= 1


def test_what_ctranslate2_lacks_is_refused_in_one_line(exported: dict[str, Path], tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    export, run = str(exported["export"]), str(exported["run"])
    src = tmp_path / "src.fr"
    src.write_text("Le chat dort.\nOui.\n", encoding="utf-8")
    terms = tmp_path / "terms.tsv"
    terms.write_text("cat\n\n", encoding="utf-8")
    old = Path(shutil.copytree(export, tmp_path / "old"))  # an export made before the alignment heads were
    marker = old / "fr2en_ctranslate2.json"
    marker.write_text(json.dumps({k: v for k, v in json.loads(marker.read_text()).items() if k != "attention"}))
    common = ["--input", str(src), "--threads", "1"]
    for args, line in (
        (["--model_path", export, run, *common], f"--model_path {export} is a CTranslate2 export: an ensemble takes "
                                                 "PyTorch runs"),
        (["--model_path", run, export, *common], f"--model_path {export} is a CTranslate2 export: an ensemble takes "
                                                 "PyTorch runs"),
        (["--model_path", export, "--constraints", str(terms), "--beam", "3", *common],
         "terminology constraints (--constraints) need a PyTorch run: CTranslate2 has no constrained beam search"),
        (["--model_path", export, "--sample", "--epsilon", "0.02", *common],
         "epsilon sampling (--epsilon) needs a PyTorch run: CTranslate2 has no epsilon sampling"),
        (["--model_path", export, "--sample", "--top_k", "5", "--top_p", "0.9", *common],
         "--top_k with --top_p needs a PyTorch run: CTranslate2 applies top-p to the renormalised top-k tokens, not "
         "to the whole distribution; give one of them"),
        (["--model_path", export, "--sample", "--prefix", "The", *common],
         "a target prefix or constraints go with greedy or beam search, not with sampling"),
        (["--model_path", str(old), "--format", "jsonl", *common],
         "--format jsonl: this export predates its alignment heads (its attention is one head's); export the run "
         "again"),
    ):
        code, out, err = cli("inference", *args, capsys=capsys, monkeypatch=monkeypatch)
        assert (code, out, err) == (2, "", [f"error: {line}"]), args
    code, out, err = cli("test", "--model_path", export, "--max_sentences", "2", capsys=capsys,
                         monkeypatch=monkeypatch)
    assert (code, out) == (2, "") and err == [
        f"error: --model_path {export} is a CTranslate2 export: test.py scores PyTorch runs (translate a split with "
        "inference.py --model_path EXPORT --input FILE and score it with sacrebleu)"]
    assert not (exported["export"] / "eval").exists()
    # What it has, through the same command line: a prefix, seeded samples (the same twice), MBR, jsonl.
    for args in (["--prefix", "The"], ["--sample", "--num_samples", "2", "--seed", "1"], ["--sample", "--mbr", "3"],
                 ["--beam", "2", "--nbest", "2", "--format", "jsonl"]):
        code, out, err = cli("inference", "--model_path", export, *common, *args, capsys=capsys,
                             monkeypatch=monkeypatch)
        assert code == 0 and out, (args, err)
        if args[0] == "--prefix":
            assert all(line.startswith("The") for line in out.splitlines())
        if "--seed" in args:
            assert cli("inference", "--model_path", export, *common, *args, capsys=capsys,
                       monkeypatch=monkeypatch)[1] == out
            assert len(out.splitlines()) == 4
        if "--format" in args:
            assert [len(json.loads(line)["nbest"]) for line in out.splitlines()] == [2, 2]


def test_repeated_ngrams_are_blocked_in_the_export_too(engine: CT2Model) -> None:
    """decode.no_repeat_ngram_size reaches CTranslate2 (its ``no_repeat_ngram_size``): no hypothesis repeats a
    bigram, where the same decoding without it does (a length floor: this model would end most lines at once)."""
    def repeats(tokens: list[int]) -> bool:
        grams = list(zip(tokens, tokens[1:], strict=False))
        return len(set(grams)) < len(grams)

    texts = TEXTS[:12]
    for beam in (1, 3):
        decode = engine.cfg.decode.model_copy(update=dict(beam=beam, nbest=beam, min_len_b=6))
        plain = engine.translate(texts, decode)
        blocked = engine.translate(texts, decode.model_copy(update=dict(no_repeat_ngram_size=2)))
        assert any(repeats(h.tokens) for hyps in plain for h in hyps)
        assert not any(repeats(h.tokens) for hyps in blocked for h in hyps)
        for hyp in (h for hyps in blocked for h in hyps):  # scored again: the model's log-probabilities
            assert len(hyp.token_logprobs) in (len(hyp.tokens), len(hyp.tokens) + 1)
            assert f32_sum(hyp.token_logprobs) == hyp.logprob
