"""CTranslate2 export: every encoding maps exactly (teacher-forced log-probs), impossible ones are refused in
one line, and an exported trained model translates like the run through inference.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import ROOT, make_tiny_config, run_script

ctranslate2 = pytest.importorskip("ctranslate2")

from models.transformer import Seq2SeqTransformer  # noqa: E402
from utils.config import from_dict  # noqa: E402
from utils.translation.export import ExportError, build_spec, check_exportable  # noqa: E402

V = 40
TOKENS = ["<pad>", "<s>", "</s>", "<unk>"] + [f"t{i}" for i in range(4, V)]
SPECIALS = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "decoder_start_token": "<s>"}
CASES = [{"input_pe": pe} for pe in ("sinusoidal", "learnable", "learnable_ln", "onehot", "gaussian", "binary",
                                     "none")]
CASES += [{"input_pe": "none", "attention_pe": a, **extra} for a, extra in (
    ("rope", {}), ("rope", {"rope": {"scaling": "linear", "factor": 2.0}}),
    ("rope", {"rope": {"scaling": "ntk", "factor": 2.0}}), ("rope", {"rope": {"dim": 4}}), ("alibi", {}),
    ("t5", {}), ("shaw", {}), ("shaw", {"shaw": {"values": True}}), ("kerple_log", {}), ("kerple_power", {}),
    ("sandwich", {}), ("sandwich", {"sandwich": {"dim": 8}}), ("dpb", {}),
    ("dpb", {"dpb": {"log_distance": True, "norm": True, "depth": 1}}))]
CASES += [{"norm": "post", "activation": "gelu", "tie_embeddings": False}]


@pytest.mark.parametrize("model_cfg", CASES, ids=[str(c) for c in CASES])
def test_every_encoding_exports_exactly(model_cfg: dict, tmp_path: Path) -> None:
    torch.manual_seed(0)
    cfg = from_dict({"model": {"d_model": 32, "n_heads": 4, "encoder_layers": 2, "decoder_layers": 2, "d_ff": 64,
                               "dropout": 0.0, "max_positions": 64, **model_cfg},
                     "data": {"max_len": 24}})  # tables of 32-64 positions must hold the longest sentence
    model = Seq2SeqTransformer(cfg.model, V, 0).eval()
    spec = build_spec(model, cfg, TOKENS, SPECIALS)
    spec.validate()
    spec.optimize(quantization=None)
    spec.save(str(tmp_path))
    translator = ctranslate2.Translator(str(tmp_path), device="cpu", compute_type="float32")
    g = torch.Generator().manual_seed(1)
    for n in range(4):  # lengths 4..24: relative schemes see distances past their exact buckets / clipping
        src = torch.randint(4, V, (3 + 7 * n,), generator=g).tolist() + [2]
        tgt = torch.randint(4, V, (2 + 6 * n,), generator=g).tolist() + [2]
        theirs = translator.score_batch([[TOKENS[i] for i in src]], [[TOKENS[i] for i in tgt[:-1]]])[0].log_probs
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([src]), torch.tensor([[1, *tgt[:-1]]]))[0], -1)
        ours = [logp[i, t].item() for i, t in enumerate(tgt)]
        assert len(theirs) == len(ours)
        assert max(abs(a - b) for a, b in zip(theirs, ours, strict=True)) < 2e-5


@pytest.mark.parametrize("model_cfg,message", [
    ({"input_pe": "sinusoidal", "attention_pe": "rope"}, "drops the position table"),
    ({"input_pe": "none", "attention_pe": "none", "cross_attention_pe": "alibi"}, "cross-attention has no"),
    ({"input_pe": "none", "attention_pe": "sandwich", "cross_attention_pe": "kerple_log"}, "cross-attention has no"),
    ({"input_pe": "none", "attention_pe": "rope", "rope": {"scaling": "yarn", "factor": 2.0}}, "no YaRN"),
    # FIRE: an MLP bias normalised by the query position, no table of j - i
    ({"input_pe": "none", "attention_pe": "fire"}, "^model.attention_pe=fire: CTranslate2 has no equivalent of this "
                                                   "encoding$"),
    ({"input_pe": "none", "attention_pe": "rope", "decoder_pe": {"attention": "cope"}},
     r"^model.decoder_pe.attention=cope: CTranslate2 has no equivalent of this encoding$"),
    ({"input_pe": "none", "decoder_pe": {"attention": "xpos"}}, r"^model.decoder_pe.attention=xpos: CTranslate2's "
                                                                r"rotary embedding has no xPos scale"),
])
def test_what_ctranslate2_cannot_compute_is_refused_in_one_line(model_cfg: dict, message: str) -> None:
    with pytest.raises(ExportError, match=message) as err:
        check_exportable(from_dict({"model": model_cfg}))
    assert "\n" not in str(err.value)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from utils.run.store import create_run_dir
    from utils.training.loop import train

    tmp = tmp_path_factory.mktemp("ct2")
    base = make_tiny_config(tmp, max_steps=150, eval_every=150, lr=0.005)
    cfg = from_dict(base.to_dict(), ["model.input_pe=none", "tokenizer.byte_fallback=false"])  # RoPE alone
    run = create_run_dir(cfg, tmp / "runs")
    train(cfg, run)
    return run


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``inference.py ARGS`` (``run_script``): a run decodes and exports in this process (CTranslate2's converter
    starts no thread pool), and a command given an export runs in a process of its own."""
    return run_script("inference.py", *args)


def test_an_exported_trained_model_translates_like_the_run(trained: Path, tmp_path: Path) -> None:
    out = tmp_path / "ct2"
    res = cli("--model_path", str(trained), "--export-ctranslate2", str(out))
    assert res.returncode == 0, res.stderr
    assert (out / "model.bin").is_file() and (out / "tokenizer" / "meta.json").is_file()
    again = cli("--model_path", str(trained), "--export-ctranslate2", str(out))  # replaces the earlier export whole
    assert again.returncode == 0 and not [p for p in tmp_path.iterdir() if p.name.startswith(".")], again.stderr
    refused = cli("--model_path", str(trained), "--export-ctranslate2", str(trained))  # never into a run directory
    assert refused.returncode != 0 and "holds something other than an export" in refused.stderr
    assert "Traceback" not in refused.stderr and (trained / "checkpoints" / "best.pt").is_file()
    from utils.translation.engines import CT2Model

    assert CT2Model(out).max_length == 2048  # its position table: sources and caps are cut to fit in it
    long = cli("--model_path", str(out), "--src_text", " ".join(["chat"] * 3000), "--beam", "1")
    assert long.returncode == 0 and "(logprob" in long.stdout.splitlines()[-1], long.stderr
    assert "truncated 1 source sentences to the model's 2048 positions" in long.stderr
    src = ROOT / "data" / "demo" / "test.fr"
    # Greedy: identical but where a hypothesis reaches the cap. Beam 5 (K-finished, CTranslate2's rule): a few
    # lines of this d-32 model reach the cap; on the 44-minute bench model 497/500 TED lines are identical.
    exported = {}
    for flags, least in ((["--beam", "1"], 38), (["--beam", "5", "--set", "decode.beam_stop=k_finished"], 36)):
        ours = cli("--model_path", str(trained), "--input", str(src), *flags)
        theirs = exported[flags[1]] = cli("--model_path", str(out), "--input", str(src), *flags)
        assert ours.returncode == theirs.returncode == 0, theirs.stderr
        a, b = ours.stdout.split("\n"), theirs.stdout.split("\n")
        assert len(a) == len(b) == 41
        same = sum(x == y for x, y in zip(a, b, strict=True))
        assert same >= least, (flags, same)
    res = cli("--model_path", str(trained), "--export-ctranslate2", str(tmp_path / "int8"), "--quantization", "int8")
    assert res.returncode == 0, res.stderr
    int8 = cli("--model_path", str(tmp_path / "int8"), "--input", str(src), "--beam", "1")
    fp32 = exported["1"]  # the float32 export's greedy lines, above
    agree = sum(x == y for x, y in zip(int8.stdout.split("\n"), fp32.stdout.split("\n"), strict=True))
    assert int8.returncode == 0 and agree >= 15  # int8 weights of a d-32 model change many greedy choices (23/41)
    line = cli("--model_path", str(out), "--src_text", "Oui.", "--average", "2").stderr.strip().splitlines()[-1]
    assert "apply to runs, not to an exported CTranslate2 model" in line
    # What CTranslate2 itself refuses is one line too: a compute type the device lacks, a damaged model.
    res = cli("--model_path", str(out), "--src_text", "Oui.", "--compute_type", "float16")
    assert res.returncode != 0 and "cannot load the CTranslate2 model" in res.stderr and "Traceback" not in res.stderr
    (tmp_path / "int8" / "model.bin").write_bytes(b"not a model")
    res = cli("--model_path", str(tmp_path / "int8"), "--src_text", "Oui.")
    assert res.returncode != 0 and "cannot load the CTranslate2 model" in res.stderr and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_device_auto_lets_ctranslate2_choose_as_a_run_does(trained: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """``--device auto`` (the default) on an export is CTranslate2's auto, its GPU where it has one, as a PyTorch
    run takes the GPU when present (it meant the CPU); the engine says which it got. Loaded only, not decoding."""
    import inference

    out = tmp_path / "ct2"
    assert cli("--model_path", str(trained), "--export-ctranslate2", str(out)).returncode == 0
    asked, real = [], ctranslate2.Translator

    def spy(*args: Any, **kwargs: Any) -> Any:
        asked.append(kwargs["device"])
        return real(*args, **kwargs)

    monkeypatch.setattr(ctranslate2, "Translator", spy)
    parser = inference.build_parser()
    for device in ("auto", "cpu"):
        args = parser.parse_args(["--model_path", str(out), "--src_text", "Oui.", "--device", device])
        paths = inference.model_paths(parser, args)
        assert inference.load_engine(parser, args, [], paths).device == "cpu"  # CTranslate2's choice here: no GPU
    assert asked == ["auto", "cpu"]


def test_the_translator_is_freed_before_the_interpreter_exits(trained: Path, tmp_path: Path) -> None:
    """CTranslate2's worker frees a finished job, and with it our greedy ``stop_at_cap`` callback, which takes the
    GIL; if that happens once the interpreter is exiting, Python ends the thread and the process aborts
    ("terminate called without an active exception": about a third of the CLI runs of a tiny model, once in CI).
    ``CT2Model`` frees its translator (joining its worker) at exit before that: a finalizer made before the model
    runs after the model's and finds the worker gone."""
    import os

    from utils.run.load import load_run
    from utils.translation.export import export

    run = load_run(str(trained))
    out = export(run.run_dir, run.checkpoint, run.model, run.cfg, run.tokenizer, tmp_path / "ct2", None)
    code = """
import os, sys, weakref
threads = lambda: len(os.listdir("/proc/self/task"))
class Anchor: pass
anchor = Anchor()
weakref.finalize(anchor, lambda: print("at exit", threads()))  # runs at exit, after finalizers made later
from utils.translation.engines import CT2Model
engine = CT2Model(sys.argv[1], threads=1)
engine.translate(["Le chat dort.", "Oui."], engine.cfg.decode.model_copy(update=dict(beam=1, nbest=1)))
print("decoding", threads())
"""
    res = subprocess.run([sys.executable, "-c", code, str(out)], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, res.stderr
    counts = dict(line.rsplit(" ", 1) for line in res.stdout.splitlines())
    assert int(counts["at exit"]) < int(counts["decoding"]), counts  # the worker thread was joined


def test_sentences_of_every_length_share_a_batch_and_decode_as_alone(trained: Path, tmp_path: Path) -> None:
    """Greedy: one ``translate_batch`` for sentences of every length cap (one per cap made CTranslate2's greedy
    1.6x slower); beam: one per cap. Every n-best list is what the sentence decoded alone, with its cap, gives."""

    from utils.run.load import load_run
    from utils.translation.engines import CT2Model, ctranslate2_penalty
    from utils.translation.export import export
    from utils.translation.translate import encode_sources

    run = load_run(str(trained))
    export(run.run_dir, run.checkpoint, run.model, run.cfg, run.tokenizer, tmp_path / "ct2", None)
    engine = CT2Model(tmp_path / "ct2")
    lines = (ROOT / "data" / "demo" / "test.fr").read_text(encoding="utf-8").splitlines()[:30]
    calls: list[int] = []
    inner = engine.translator

    class Counting:
        def translate_batch(self, batch: list[list[str]], **kwargs: object) -> list:
            calls.append(len(batch))
            return inner.translate_batch(batch, **kwargs)

    engine.translator = Counting()
    ids = encode_sources(engine.tokenizer, lines, None)
    for beam, batch_size in ((1, 64), (1, 7), (5, 64)):
        decode = engine.cfg.decode.model_copy(update=dict(beam=beam, nbest=beam, batch_size=batch_size))
        caps = [int(decode.max_len_a * (len(seq) - 1) + decode.max_len_b) for seq in ids]
        calls.clear()
        reported: dict[int, object] = {}
        together = engine.translate(lines, decode, on_done=reported.__setitem__)
        assert reported == dict(enumerate(together))  # each sentence passed on when its call returned
        assert len(set(caps)) > 5
        if beam == 1:
            assert calls == [len(lines)]  # CTranslate2 splits it into batches of batch_size itself
        else:
            assert len(calls) == len(set(caps))
        # The reference: each sentence alone, its cap as max_decoding_length, no callback.
        alone = [engine._hypotheses(inner.translate_batch(
            [engine.tokenizer.id_to_token(seq)], beam_size=beam, num_hypotheses=beam, max_decoding_length=cap,
            min_decoding_length=0, length_penalty=ctranslate2_penalty(decode.lenpen), return_scores=True,
            return_end_token=True, max_input_length=0)[0], decode) for seq, cap in zip(ids, caps, strict=True)]
        for a, b in zip(together, alone, strict=True):
            assert [h.text for h in a] == [h.text for h in b]
            assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-3)
        # Some hypotheses run to their own cap, below the longest: the cap is per sentence, not per batch.
        assert any(len(h[0].tokens) == cap < max(caps) for h, cap in zip(together, caps, strict=True))
        assert all(len(h.tokens) <= cap for hyps, cap in zip(together, caps, strict=True) for h in hyps)


def test_a_length_floor_holds_in_every_decoder_of_a_trained_model(trained: Path, tmp_path: Path) -> None:
    """decode.min_len_a = 1: every output of the trained demo model, greedy and beam 5, has at least as many tokens
    as its source (its cap is longer), whichever path decodes it: static batches (test.py, inference.py), the
    server's continuous batching, and the CTranslate2 export (min_decoding_length, one call per floor). Without the
    floor some stop earlier; with no floor the export decodes in the calls it always made."""
    from utils.run.load import load_run
    from utils.translation.continuous import ContinuousDecoder, Request
    from utils.translation.engines import CT2Model
    from utils.translation.export import export
    from utils.translation.translate import encode_sources, translate_ids

    run = load_run(str(trained))
    export(run.run_dir, run.checkpoint, run.model, run.cfg, run.tokenizer, tmp_path / "ct2", None)
    engine = CT2Model(tmp_path / "ct2", threads=1)
    lines = (ROOT / "data" / "demo" / "test.fr").read_text(encoding="utf-8").splitlines()
    ids = encode_sources(run.tokenizer, lines, run.model.max_length)
    src_len = [len(seq) - 1 for seq in ids]

    def continuous(decode: object) -> list[list[object]]:
        got: dict[int, list[object]] = {}
        decoder = ContinuousDecoder(run.model, run.tokenizer, join=0)
        decoder.add([Request(ids, decode, got.__setitem__, on_error=pytest.fail)])
        while decoder.busy:
            decoder.step()
        return [got[i] for i in range(len(ids))]

    calls: list[int] = []
    inner = engine.translator

    class Counting:
        def translate_batch(self, batch: list[list[str]], **kwargs: object) -> list:
            calls.append(int(kwargs["min_decoding_length"]))  # type: ignore[call-overload]
            return inner.translate_batch(batch, **kwargs)

    engine.translator = Counting()
    for beam in (1, 5):
        free = run.cfg.decode.model_copy(update=dict(beam=beam, nbest=1))
        floored = free.model_copy(update=dict(min_len_a=1.0))
        assert sum(len(h[0].tokens) < n for h, n in zip(translate_ids(run.model, run.tokenizer, ids, free), src_len,
                                                          strict=True)) >= 2  # the floor binds
        calls.clear()
        engine.translate(lines, free)
        assert set(calls) == {0}
        calls.clear()
        outputs = {"static": translate_ids(run.model, run.tokenizer, ids, floored), "continuous": continuous(floored),
                   "ctranslate2": engine.translate(lines, floored)}
        assert sorted(set(calls)) == sorted(set(src_len))  # one call per floor (beam: per cap and floor)
        for name, out in outputs.items():
            short = [i for i, (h, n) in enumerate(zip(out, src_len, strict=True)) if len(h[0].tokens) < n]
            assert not short, (beam, name, short)


def test_peers_decodes_an_export_of_our_run_next_to_the_others(trained: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """bench/peers.py --ctranslate2: the run exported and decoded by inference.py on each test set; a column."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import peers

    bench = tmp_path / "data" / "bench" / "fr-en"
    bench.mkdir(parents=True)
    src = (ROOT / "data" / "demo" / "test.fr").read_text(encoding="utf-8").splitlines()
    ref = (ROOT / "data" / "demo" / "test.en").read_text(encoding="utf-8").splitlines()
    for k, name in enumerate(peers.TEST_SETS):
        (bench / f"{name}.fr").write_text("\n".join(src[k * 10 : k * 10 + 10]) + "\n", encoding="utf-8")
        (bench / f"{name}.en").write_text("\n".join(ref[k * 10 : k * 10 + 10]) + "\n", encoding="utf-8")
    result = peers.decode_ctranslate2(tmp_path / "ours.ct2", trained, sys.executable, tmp_path / "data")
    assert (tmp_path / "ours.ct2" / "export" / "model.bin").is_file()
    for name in peers.TEST_SETS:
        assert result["tests"][name]["sentences_per_s"] > 0 and 0 <= result["tests"][name]["bleu"] <= 100
    peers.add_output_lengths(tmp_path, "ours.ct2", result)
    assert [result["tests"][n]["lines"] for n in peers.TEST_SETS] == [10, 10, 10]
    eole = {"steps": 100, "target_tokens_per_s": 1000.0, "valid_ppl": 9.0, "peak_rss_mb": 900.0, "tests": {
        n: {**t, "sentences_per_s": t["sentences_per_s"] / 2} for n, t in result["tests"].items()}}
    report = peers.table({"ours.ct2": result, "eole": eole}, 44)
    assert "| 44 min, then beam 5 | ours.ct2 | eole | ours.ct2/eole |" in report
    assert "| optimizer steps | - | 100 | - |" in report  # the export has no training of its own
    assert "| beam-5 sentences/s test.tatoeba |" in report and "| 2.00x |" in report


def test_speed_times_the_export_in_a_fresh_process(trained: Path) -> None:
    """bench/speed.py's CTranslate2 rows (bench/speed_runs.py): timed in a spawned process (PyTorch's thread pool,
    once used, slows CTranslate2 in the same process); greedy outputs are ours, float32 and int8 both timed."""
    from bench.speed_runs import time_ctranslate2
    from utils.run.load import load_run
    from utils.translation.translate import encode_sources, translate_ids

    run = load_run(str(trained))
    lines = (ROOT / "data" / "demo" / "test.fr").read_text(encoding="utf-8").splitlines()[:12]
    refs = (ROOT / "data" / "demo" / "test.en").read_text(encoding="utf-8").splitlines()[:12]
    decoders = {"greedy": run.cfg.decode.model_copy(update=dict(beam=1, nbest=1))}
    for rule in ("bound", "k_finished"):
        decoders[f"beam 5, stop={rule}"] = run.cfg.decode.model_copy(update=dict(beam=5, nbest=1, beam_stop=rule))
    ids = encode_sources(run.tokenizer, lines, run.model.max_length, strict=False)
    ours = {label: [best[0].text for best in translate_ids(run.model, run.tokenizer, ids, d)]
            for label, d in decoders.items()}
    rows = time_ctranslate2(run, lines, refs, decoders, ours)
    assert set(rows) == {f"CTranslate2 {q}, {d}" for q in ("float32", "int8") for d in ("greedy", "beam 5")}
    assert all(r["sent_per_s"] > 0 and r["seconds"] > 0 for r in rows.values())
    assert rows["CTranslate2 float32, greedy"]["same_as_ours"] >= 11  # of 12: greedy is ours but where a cap is hit
