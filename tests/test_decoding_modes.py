"""Ensembles, sampling, MBR and the jsonl output: an ensemble of one model (or of identical copies) decodes as the
model, an ensemble scores tokens by the log of its members' mean probability; a seed repeats samples whatever the
batch; MBR picks what a brute-force expected utility picks; the jsonl fields agree with the text output's scores."""

from __future__ import annotations

import argparse
import copy
import io
import json
import math
import shutil
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT, f32_sum, run_script, train_tiny_run
from sacrebleu.metrics import BLEU, CHRF
from test_decoding import BOS, EOS, PAD, V, full_logprob, sources, trained_copy_model

from models.decoding import BeamSearch, GreedySearch, beam_search, decode_together, greedy_search, length_penalty
from models.ensemble import Ensemble
from models.sampling import draw, sample_search, sampling_logprobs
from models.transformer import Seq2SeqTransformer
from utils.config import ConfigError, ModelConfig, load_config
from utils.run.ensemble import LoadedEnsemble, load_ensemble
from utils.run.load import LoadedRun, load_run
from utils.translation.jsonl import jsonl_writer
from utils.translation.translate import encode_sources, translate, translate_stream

TEXTS = (ROOT / "data" / "demo" / "test.fr").read_text(encoding="utf-8").splitlines()


@pytest.fixture(scope="module")
def model() -> Seq2SeqTransformer:
    return trained_copy_model()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny run trained for 20 steps (outputs still varied: samples and n-best lists differ), a copy of it, and a
    copy whose tokenizer was swapped for another vocabulary."""
    tmp = tmp_path_factory.mktemp("modes")
    run = train_tiny_run(tmp, ["model.input_pe=none", "decode.max_len_a=0", "decode.max_len_b=10"], epochs=1,
                         max_steps=20, eval_every=1000, lr=0.005)
    twin = shutil.copytree(run, tmp / "twin")
    other = shutil.copytree(run, tmp / "other_tokenizer")
    from tokenizer import train_tokenizer
    from utils.config import TokenizerConfig

    shutil.rmtree(other / "tokenizer")
    train_tokenizer(TokenizerConfig(vocab_size=300, min_frequency=1), TEXTS, TEXTS).save(other / "tokenizer")
    return {"run": run, "twin": twin, "other": other}


@pytest.fixture(scope="module")
def loaded(runs: dict[str, Path]) -> LoadedRun:
    return load_run(runs["run"], device="cpu")


def decode_all(m: Seq2SeqTransformer | Ensemble, src: torch.Tensor) -> list[list[list[tuple]]]:
    """Greedy, beam (4, 3-best) and sampling (3 samples, seeded) outputs: (tokens, logprob, score, token logprobs)."""
    greedy = [[h] for h in greedy_search(m, src, bos=BOS, eos=EOS)]
    beam = beam_search(m, src, bos=BOS, eos=EOS, beam=4, nbest=3)
    samples = sample_search(m, src, bos=BOS, eos=EOS, num_samples=3, seed=11, temperature=1.3)
    return [[[(h.tokens, h.logprob, h.score, h.token_logprobs) for h in nb] for nb in out]
            for out in (greedy, beam, samples)]


def test_an_ensemble_of_one_model_or_of_identical_copies_decodes_as_the_model(model: Seq2SeqTransformer) -> None:
    src = sources(8)
    alone = decode_all(model, src)
    assert decode_all(Ensemble([model]), src) == alone  # exactly: the same tokens, scores and token scores
    copies = decode_all(Ensemble([model, copy.deepcopy(model), copy.deepcopy(model)]), src)
    for out_alone, out_copies in zip(alone, copies, strict=True):
        assert [[h[0] for h in nb] for nb in out_copies] == [[h[0] for h in nb] for nb in out_alone]
        for nb_alone, nb_copies in zip(out_alone, out_copies, strict=True):
            assert [x for h in nb_copies for x in h[1:3]] == pytest.approx([x for h in nb_alone for x in h[1:3]],
                                                                           abs=1e-5)


def test_an_ensemble_scores_each_token_by_the_log_of_its_members_mean_probability(model: Seq2SeqTransformer) -> None:
    """Members of other sizes and encodings (d 32 RoPE and d 16 sinusoidal): every n-best hypothesis's token scores
    are log(mean_i p_i) under teacher forcing of each member; stepped together with other searches
    (``decode_together``) the ensemble gives what it gives alone."""
    torch.manual_seed(3)
    other = Seq2SeqTransformer(ModelConfig(d_model=16, n_heads=2, encoder_layers=1, decoder_layers=2, d_ff=32,
                                           dropout=0.0, input_pe="sinusoidal", attention_pe="none"), V, PAD).eval()
    ensemble = Ensemble([model, other])
    src = sources(6)
    nbest_lists = beam_search(ensemble, src, bos=BOS, eos=EOS, beam=3, nbest=3)
    for i, nbest in enumerate(nbest_lists):
        s = src[i][src[i] != PAD]
        for h in nbest:
            tokens = h.tokens + [EOS]
            tgt = torch.tensor([[BOS] + tokens[:-1]])
            with torch.no_grad():
                logps = torch.stack([m(s[None], tgt).log_softmax(-1)[0] for m in (model, other)])
            expected = (torch.logsumexp(logps, 0) - math.log(2)).gather(1, torch.tensor(tokens)[:, None]).squeeze(1)
            assert h.token_logprobs == pytest.approx(expected.tolist(), abs=1e-4)
            assert f32_sum(h.token_logprobs) == h.logprob
    greedy_alone = greedy_search(ensemble, src[:3], bos=BOS, eos=EOS)
    searches = [GreedySearch(ensemble, src[:3], bos=BOS, eos=EOS), BeamSearch(ensemble, src[3:], bos=BOS, eos=EOS,
                                                                              beam=3, nbest=3)]
    while any(s.running for s in searches):
        decode_together(ensemble, searches)
    assert [h.tokens for h in searches[0].hypotheses] == [h.tokens for h in greedy_alone]
    assert [[h.tokens for h in nb] for nb in searches[1].nbest_lists] == [[h.tokens for h in nb]
                                                                          for nb in nbest_lists[3:]]


def test_a_seed_repeats_the_samples_whatever_the_batch_and_samples_score_as_the_model_scores_them(
        model: Seq2SeqTransformer) -> None:
    src = sources(6)
    kw = dict(bos=BOS, eos=EOS, num_samples=4, seed=5, temperature=1.5, top_p=0.95)
    first = sample_search(model, src, **kw)
    assert sample_search(model, src, **kw) == first
    for i in (0, 3):  # alone, a sentence draws what it drew in the batch
        row = src[i: i + 1, : int((src[i] != PAD).sum())]
        assert [h.tokens for h in sample_search(model, row, **kw)[0]] == [h.tokens for h in first[i]]
    reseeded = sample_search(model, src, **{**kw, "seed": 6})
    assert [[h.tokens for h in nb] for nb in reseeded] != [[h.tokens for h in nb] for nb in first]
    assert len({tuple(h.tokens) for nb in first for h in nb}) > len(first)  # samples differ
    for i, nbest in enumerate(first):
        assert len(nbest) == 4 and [h.score for h in nbest] == sorted((h.score for h in nbest), reverse=True)
        for h in nbest:  # the model's own (untempered, untruncated) log-probabilities, EOS included
            assert h.logprob == pytest.approx(full_logprob(model, src[i][src[i] != PAD], h), abs=1e-3)
            assert f32_sum(h.token_logprobs) == h.logprob and len(h.token_logprobs) == len(h.tokens) + 1
            assert h.score == pytest.approx(h.logprob / length_penalty(len(h.tokens) + 1, 0.6), rel=1e-6)
    # A target prefix: every sample starts with it, its tokens scored as teacher forcing scores them.
    prefixed = sample_search(model, src, **kw, forced=[[5, 9]] * len(src))
    for i, nbest in enumerate(prefixed):
        for h in nbest:
            assert h.tokens[:2] == [5, 9]
            assert h.logprob == pytest.approx(full_logprob(model, src[i][src[i] != PAD], h), abs=1e-3)


def test_temperature_top_k_top_p_and_epsilon_keep_exactly_the_tokens_each_allows() -> None:
    probs = torch.tensor([[0.5, 0.25, 0.15, 0.07, 0.03]])
    logp = probs.log()

    def support(**kw: float) -> list[int]:
        return (sampling_logprobs(logp, **kw).exp()[0] > 0).nonzero().squeeze(1).tolist()

    assert support() == [0, 1, 2, 3, 4]
    assert support(top_k=2) == [0, 1]
    assert support(top_p=0.75) == [0, 1] and support(top_p=0.8) == [0, 1, 2]
    assert support(epsilon=0.1) == [0, 1, 2] and support(epsilon=0.9) == [0]  # the argmax always stays
    assert support(top_k=3, epsilon=0.2) == [0, 1]  # every rule on must keep a token
    kept = sampling_logprobs(logp, top_k=2).exp()[0]
    assert kept[:2].tolist() == pytest.approx([2 / 3, 1 / 3])
    tempered = sampling_logprobs(logp, temperature=2.0).exp()[0]
    assert tempered.tolist() == pytest.approx((probs[0] ** 0.5 / (probs[0] ** 0.5).sum()).tolist())
    # Inverting the cumulative distribution: [0, .5) -> 0, [.5, .75) -> 1, [.75, .9) -> 2, ...
    u = torch.tensor([0.0, 0.49, 0.5, 0.74, 0.76, 0.95, 0.999])
    assert draw(logp.expand(7, -1), u).tolist() == [0, 0, 1, 1, 2, 3, 4]
    assert draw(sampling_logprobs(logp, top_k=2).expand(2, -1), torch.tensor([0.6, 0.999])).tolist() == [0, 1]


def test_mbr_picks_the_candidate_a_brute_force_expected_utility_picks(loaded: LoadedRun) -> None:
    """Over 6 seeded samples and over the beam's 4-best, with chrF and BLEU: the expected utility of each candidate
    is its mean sentence-level score against every candidate, itself included; MBR's pick has the highest (the
    first candidate among equals) and reports it."""
    model, tok, base = loaded.model, loaded.tokenizer, loaded.cfg.decode
    texts = TEXTS[:6]
    metrics = {"chrf": CHRF(), "bleu": BLEU(effective_order=True)}
    moved = 0
    for mode, n in ((dict(sample=True, seed=3), 6), (dict(beam=4), 4)):
        pool = dict(num_samples=n) if "sample" in mode else dict(nbest=n)
        candidates = translate(model, tok, texts, base.model_copy(update={**mode, **pool}))
        for utility, metric in metrics.items():
            picked = translate(model, tok, texts, base.model_copy(update={**mode, "mbr": n, "mbr_utility": utility}))
            for cands, pick in zip(candidates, picked, strict=True):
                hyps = [c.text for c in cands]
                assert len(hyps) == n
                expected = [sum(metric.sentence_score(h, [r]).score for r in hyps) / n for h in hyps]
                best = next(k for k in range(n) if expected[k] >= max(expected) - 1e-9)  # the first of the best
                assert len(pick) == 1 and pick[0].text == hyps[best]
                assert pick[0].utility == pytest.approx(expected[best], abs=1e-9)
                assert (pick[0].score, pick[0].logprob) == (cands[best].score, cands[best].logprob)
                moved += hyps[best] != hyps[0]
    assert moved >= 2  # MBR did not just return the model's best


def test_jsonl_records_agree_with_the_text_output_and_align_every_token(loaded: LoadedRun) -> None:
    model, tok = loaded.model, loaded.tokenizer
    lines = TEXTS[:5] + [""]
    data = ("\n".join(lines) + "\n").encode()
    eos = tok.id_to_token([tok.eos_id])[0]

    def both(**update: object) -> tuple[list[str], list[dict]]:
        decode = loaded.cfg.decode.model_copy(update=update)
        fn = lambda texts, d: translate(model, tok, texts, d, strict=False)  # noqa: E731
        text_out, json_out = io.StringIO(), io.StringIO()
        translate_stream(fn, io.BytesIO(data), text_out, decode)
        translate_stream(fn, io.BytesIO(data), json_out, decode, write=jsonl_writer(model, tok))
        return text_out.getvalue().splitlines(), [json.loads(line) for line in json_out.getvalue().splitlines()]

    rows, records = both(beam=3, nbest=3, lenpen=0.6)
    assert [r["index"] for r in records] == list(range(len(lines)))
    assert [f"{r['index']}\t{h['score']:.4f}\t{h['text']}" for r in records for h in r["nbest"]] == rows
    sources = encode_sources(tok, lines, model.max_length, strict=False)
    for r, src in zip(records[:-1], sources, strict=False):
        assert r["source_tokens"] == tok.id_to_token(src) and r["source_tokens"][-1] == eos
        assert {k: r[k] for k in r["nbest"][0]} == r["nbest"][0]  # the best's fields at the top
        for h in r["nbest"]:
            n = len(h["tokens"])
            assert h["tokens"][-1] == eos and len(h["token_logprobs"]) == n == len(h["alignment"])
            assert all(0 <= a < len(src) for a in h["alignment"])
            assert f32_sum(h["token_logprobs"]) == h["logprob"]  # exactly: the running sum the search made
            assert h["score"] == pytest.approx(h["logprob"] / length_penalty(n, 0.6), rel=1e-6)
    assert records[-1] | {"nbest": None} == {"index": 5, "text": "", "score": 0.0, "logprob": 0.0, "tokens": [],
                                             "token_logprobs": [], "alignment": [], "source_tokens": [],
                                             "nbest": None}
    # The alignment is the argmax of the last decoder layer's cross-attention, averaged over heads.
    best = translate(model, tok, lines[:1], loaded.cfg.decode.model_copy(update=dict(beam=3, nbest=3)))[0][0]
    with torch.no_grad():
        attention = model.forward_with_attention(torch.tensor([sources[0]]), torch.tensor([[tok.bos_id] + best.tokens]))
    assert attention[1].cross[-1][0].mean(0).argmax(-1).tolist() == records[0]["nbest"][0]["alignment"]
    # Greedy: one record per line, no n-best list, the score is the log-probability.
    rows, records = both(beam=1, nbest=1)
    assert [r["text"] for r in records] == rows and "nbest" not in records[0]
    assert all(r["score"] == r["logprob"] == f32_sum(r["token_logprobs"]) for r in records)


def test_the_command_line_decodes_an_ensemble_by_sampling_into_jsonl(runs: dict[str, Path],
                                                                     loaded: LoadedRun) -> None:
    """inference.py --model_path RUN COPY --sample --num_samples 2 --seed 4 --format jsonl: the samples the run alone
    draws in this process (the copies' mean probability is the run's), two per line."""
    res = run_script("inference.py", "--model_path", str(runs["run"]), str(runs["twin"]), "--input", "-", "--threads",
                     "1", "--sample", "--num_samples", "2", "--seed", "4", "--format", "jsonl",
                     stdin="".join(f"{t}\n" for t in TEXTS[:3]))
    assert res.returncode == 0, res.stderr
    records = [json.loads(line) for line in res.stdout.splitlines()]
    decode = loaded.cfg.decode.model_copy(update=dict(sample=True, num_samples=2, seed=4))
    alone = translate(loaded.model, loaded.tokenizer, TEXTS[:3], decode)
    assert [[h["text"] for h in r["nbest"]] for r in records] == [[t.text for t in nb] for nb in alone]


def test_an_ensemble_needs_one_tokenizer_and_test_py_records_its_members(runs: dict[str, Path],
                                                                        loaded: LoadedRun,
                                                                        monkeypatch: pytest.MonkeyPatch,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from utils.cli import run_main

    with pytest.raises(SystemExit) as e:
        run_main(lambda: load_ensemble([runs["run"], runs["twin"], runs["other"]], device="cpu"))
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: --model_path {runs['other']}: its tokenizer differs from that of {runs['run']} (its vocabulary); "
        "the models of an ensemble must share one tokenizer"]
    ensemble = load_ensemble([runs["run"], runs["twin"]], device="cpu")
    assert isinstance(ensemble, LoadedEnsemble) and len(ensemble.model) == 2
    import importlib.util

    spec = importlib.util.spec_from_file_location("fr2en_test_script_modes", ROOT / "test.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    monkeypatch.setattr(sys, "argv", ["test.py", "--model_path", str(runs["run"]), str(runs["twin"]), "--beam", "1",
                                      "--max_sentences", "4", "--device", "cpu"])
    assert script.main() == 0
    out = capsys.readouterr().out
    assert "ensemble of 2, greedy" in out
    [score_file] = (runs["run"] / "eval").glob("*ensemble2-*.json")
    entry = json.loads(score_file.read_text())
    assert [(m["run_dir"], m["step"]) for m in entry["ensemble"]] == [(str(runs["run"].resolve()), loaded.step),
                                                                      (str(runs["twin"].resolve()), loaded.step)]
    hyps = score_file.with_suffix(".hyp").read_text().splitlines()
    alone = [nb[0].text for nb in translate(loaded.model, loaded.tokenizer, TEXTS[:4],
                                            loaded.cfg.decode.model_copy(update=dict(beam=1, nbest=1)))]
    assert hyps == alone


def test_a_study_variants_folder_decodes_its_seeds_as_one_ensemble(runs: dict[str, Path], tmp_path: Path) -> None:
    """--model_path runs/study_NAME/runs/VARIANT: its seed<k>/ runs (each by its *_latest link), in seed order, decode
    as --model_path SEED1 SEED2 does; the study folder itself and a seed without one run are one line each."""
    study = tmp_path / "study_s"
    variant = study / "runs" / "rope"
    for k, run in ((2, runs["twin"]), (1, runs["run"])):
        (variant / f"seed{k}").mkdir(parents=True)
        (variant / f"seed{k}" / "demo_latest").symlink_to(run)
    (study / "study.json").write_text("{}")
    from utils.run.ensemble import expand_model_paths

    assert expand_model_paths([variant, runs["run"]]) == [str(variant / "seed1" / "demo_latest"),
                                                          str(variant / "seed2" / "demo_latest"), str(runs["run"])]
    args = ["--src_text", TEXTS[0], "--beam", "2", "--threads", "1"]
    by_folder = run_script("inference.py", "--model_path", str(variant), *args)
    one_by_one = run_script("inference.py", "--model_path", str(runs["run"]), str(runs["twin"]), *args)
    assert by_folder.returncode == 0 and by_folder.stdout == one_by_one.stdout, by_folder.stderr
    whole = run_script("inference.py", "--model_path", str(study), *args)
    assert (whole.returncode, whole.stderr.strip().splitlines()) == (2, [
        f"error: --model_path {study}: a study folder; name one of its variants, whose seeds decode as an ensemble: "
        f"{study / 'runs'}/<variant> (one of rope)"])
    (variant / "seed1" / "demo_latest").unlink()
    empty = run_script("inference.py", "--model_path", str(variant), *args)
    assert (empty.returncode, empty.stderr.strip().splitlines()) == (2, [
        f"error: --model_path {variant}: seed1 holds 0 runs, not one; give the runs of the ensemble one by one"])


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--temperature", "0", "argument --temperature: must be a finite number in (0, 100), got 0"),
    ("--top_p", "1.5", "argument --top_p/--top-p: must be a finite number in (0, 1], got 1.5"),
    ("--epsilon", "1", "argument --epsilon: must be a finite number in [0, 1), got 1"),
    ("--top_k", "-1", "argument --top_k/--top-k: must be an integer in [0, 1000000], got -1"),
    ("--num_samples", "0", "argument --num_samples/--num-samples: must be an integer in [1, 1024], got 0"),
    ("--seed", "x", "argument --seed: must be an integer in [0, 9223372036854775807], got 'x'"),
    ("--mbr", "1", "argument --mbr: must be an integer in [2, 1024], got 1"),
    ("--mbr_utility", "ter", "argument --mbr_utility/--mbr-utility: invalid choice: 'ter' (choose from 'chrf', "
                             "'bleu')"),
])
def test_bad_sampling_and_mbr_values_are_one_line(flag: str, value: str, message: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.util

    for name in ("inference", "test"):
        spec = importlib.util.spec_from_file_location(f"fr2en_{name}_modes", ROOT / f"{name}.py")
        script = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(script)
        with pytest.raises(SystemExit) as e:
            script.build_parser().parse_args(["--model_path", "run", flag, value])
        assert e.value.code == 2
        assert capsys.readouterr().err.strip().splitlines()[-1].endswith(message)


def test_settings_that_do_not_go_together_are_one_line(runs: dict[str, Path]) -> None:
    from utils.translation.flags import check_mode_flags

    config = runs["run"] / "config.yaml"  # decode.beam 2
    for sets, message in (
        (["decode.mbr=4"], "decode.mbr: 4 candidates from beam search need decode.beam >= 4 (it is 2): raise the "
                           "beam, or sample them (--sample)"),
        (["decode.sample=true", "decode.mbr=4", "decode.num_samples=3"],
         "decode.num_samples: with decode.mbr the candidates are decode.mbr=4 samples; leave num_samples at 1 (it is "
         "3)"),
        (["decode.sample=true", "decode.nbest=2"],
         "decode.nbest: with decode.sample the outputs per sentence are decode.num_samples; leave nbest at 1 (it is "
         "2)"),
        (["decode.beam=4", "decode.mbr=3", "decode.nbest=4"], "decode.nbest: 4 exceeds the decode.mbr=3 candidates"),
    ):
        with pytest.raises(ConfigError) as e:
            load_config(config, sets)
        assert str(e.value) == message
    decode = load_config(config).decode
    with pytest.raises(ConfigError, match=r"^--top_p applies to sampling: add --sample \(or set decode.sample=true\)$"):
        check_mode_flags(argparse.Namespace(top_p=0.9), decode)
    with pytest.raises(ConfigError, match=r"^--mbr_utility applies to MBR decoding: add --mbr N$"):
        check_mode_flags(argparse.Namespace(mbr_utility="bleu"), decode)
