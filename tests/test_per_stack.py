"""A different positional encoding per stack: ``model.encoder_pe`` / ``model.decoder_pe`` (input and attention
level each) beside the shorthand ``model.input_pe`` / ``model.attention_pe``; validated, built, saved, named in
the run's log and summary, plotted per stack and exported per stack (or refused in one line)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from conftest import make_tiny_config, train_cli, translate_cli

from models.positional import REGISTRY
from models.positional.absolute import LearnablePE, SinusoidalPE
from models.positional.alibi import ALiBiPE
from models.positional.base import NoInputPE
from models.positional.rotary import RotaryPE
from models.transformer import Seq2SeqTransformer
from utils.config import ConfigError, from_dict, load_config

DEMO = Path(__file__).resolve().parents[1] / "configs" / "demo.yaml"
NOPE = ["model.input_pe=none", "model.attention_pe=rope", "model.decoder_pe.attention=none"]


def test_the_shorthand_serves_both_stacks_and_a_stack_key_overrides_it() -> None:
    m = load_config(DEMO, ["model.attention_pe=alibi"]).model
    assert m.pe("encoder", "attention") == m.pe("decoder", "attention") == "alibi"
    assert m.pe_key("decoder", "attention") == "model.attention_pe" and m.describe_encodings() == "sinusoidal + alibi"
    m = load_config(DEMO, NOPE).model
    assert m.encodings() == {"encoder input": "none", "encoder self-attention": "rope", "decoder input": "none",
                             "decoder self-attention": "none", "cross-attention": "none"}
    assert m.pe_key("decoder", "attention") == "model.decoder_pe.attention"
    assert m.describe_encodings() == "encoder rope, decoder none"
    model = Seq2SeqTransformer(m, 50, 0)
    assert all(isinstance(layer.self_attn.pe, RotaryPE) for layer in model.encoder)
    assert all(layer.self_attn.pe is None and layer.cross_attn.pe is None for layer in model.decoder)
    assert isinstance(model.src_pe, NoInputPE) and isinstance(model.tgt_pe, NoInputPE)

    m = load_config(DEMO, ["model.encoder_pe.input=learnable", "model.decoder_pe.input=sinusoidal",
                           "model.max_positions=70", "model.encoder_pe.attention=alibi"]).model
    model = Seq2SeqTransformer(m, 50, 0)
    assert isinstance(model.src_pe, LearnablePE) and isinstance(model.tgt_pe, SinusoidalPE)
    assert isinstance(model.encoder[0].self_attn.pe, ALiBiPE) and model.decoder[0].self_attn.pe is None
    assert model.max_length == 70  # the learned table bounds the source; decoding caps the target to it too
    assert m.describe_encodings() == "encoder learnable + alibi, decoder sinusoidal"


def test_stack_keys_are_validated_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match=r"^model.encoder_pe.attention: 'rpoe' is not one of: none, rope, "):
        load_config(DEMO, ["model.encoder_pe.attention=rpoe"])
    with pytest.raises(ConfigError, match=r"^unknown config key model.decoder_pe.self; allowed keys in "
                                          r"model.decoder_pe: input, attention$"):
        load_config(DEMO, ["model.decoder_pe.self=rope"])
    # checked where it is put, and named so
    with pytest.raises(ConfigError, match=r"^model.decoder_pe.input=binary needs 10 bits for model.max_positions="):
        load_config(DEMO, ["model.decoder_pe.input=binary", "model.d_model=8", "model.n_heads=2",
                           "model.max_positions=1024"])

    class CausalOnlyPE(ALiBiPE):
        causal_only = True

    monkeypatch.setitem(REGISTRY["attention"], "causal", CausalOnlyPE)
    with pytest.raises(ConfigError, match=r"^model.attention_pe=causal puts it in the encoder, but it is defined "
                                          r"for causal \(decoder\) self-attention only: set "
                                          r"model.decoder_pe.attention=causal$"):
        load_config(DEMO, ["model.attention_pe=causal"])
    with pytest.raises(ConfigError, match=r"^model.cross_attention_pe=causal puts it in cross-attention"):
        load_config(DEMO, ["model.cross_attention_pe=causal"])
    ok = load_config(DEMO, ["model.decoder_pe.attention=causal"]).model
    assert ok.pe("encoder", "attention") == "none" and ok.pe("decoder", "attention") == "causal"


@pytest.mark.parametrize("key,where", [("model.attention_pe", "the encoder"),
                                       ("model.encoder_pe.attention", "the encoder"),
                                       ("model.cross_attention_pe", "cross-attention")])
def test_cope_is_refused_outside_decoder_self_attention_in_one_line(key: str, where: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(DEMO, [f"{key}=cope"])
    assert str(err.value) == (f"{key}=cope puts it in {where}, but it is defined for causal (decoder) self-attention "
                              "only: set model.decoder_pe.attention=cope")
    m = load_config(DEMO, ["model.decoder_pe.attention=cope", "model.cope.npos_max=8"]).model
    assert m.encodings()["decoder self-attention"] == "cope" and m.cope.npos_max == 8


def test_a_set_for_an_encoding_no_stack_uses_is_said(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="config"):
        load_config(DEMO, [*NOPE, "model.t5.num_buckets=16", "model.rope.theta=500"])
    assert [r.getMessage() for r in caplog.records] == [
        "--set model.t5.num_buckets=16 has no effect: model.t5 is read by t5, which is in none of encoder input "
        "(none), encoder self-attention (rope), decoder input (none), decoder self-attention (none), "
        "cross-attention (none)"]  # model.rope is read: the encoder uses it


def _train(tmp_path: Path, overrides: list[str]):
    from utils.run.load import load_run
    from utils.run.store import create_run_dir
    from utils.training.loop import train

    base = make_tiny_config(tmp_path, max_steps=3, eval_every=3, valid_bleu_sentences=2)
    cfg = from_dict(base.to_dict(), ["decode.max_len_a=0", "decode.max_len_b=8", *overrides])
    run_dir = create_run_dir(cfg, tmp_path / "runs")
    train(cfg, run_dir)
    return load_run(run_dir, device="cpu")


ALIBI_SINUSOID = ["model.input_pe=none", "model.attention_pe=none", "model.encoder_pe.attention=alibi",
                  "model.decoder_pe.input=sinusoidal"]


@pytest.mark.parametrize("overrides", [NOPE, ALIBI_SINUSOID], ids=["decoder-nope", "alibi-encoder-sinusoid-decoder"])
def test_a_per_stack_model_trains_names_itself_translates_and_exports(tmp_path: Path, overrides: list[str],
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    from utils.translation.translate import translate

    with caplog.at_level("INFO"):
        run = _train(tmp_path, overrides)
    places = run.cfg.model.encodings()
    assert json.loads((run.run_dir / "summary.json").read_text())["encodings"] == places
    assert f"positions: {run.cfg.model.describe_encodings()}" in caplog.text  # the run's log gets these lines
    assert load_config(run.run_dir / "config.yaml").model.encodings() == places  # saved with the run
    sources = ["Le chat dort.", "Il fait beau aujourd'hui."]
    ours = [n[0].text for n in translate(run.model, run.tokenizer, sources, run.cfg.decode.model_copy(
        update={"beam": 1}))]
    if importlib.util.find_spec("ctranslate2") is None:
        return
    from utils.translation.engines import CT2Model
    from utils.translation.export import export

    out = export(run.run_dir, run.checkpoint, run.model, run.cfg, run.tokenizer, tmp_path / "ct2")
    theirs = [n[0].text for n in CT2Model(out).translate(sources, run.cfg.decode.model_copy(update={"beam": 1}))]
    assert theirs == ours


ROPE_COPE = ["model.input_pe=none", "model.encoder_pe.attention=rope", "model.decoder_pe.attention=cope"]


def test_a_rope_encoder_cope_decoder_model_trains_and_translates(tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """The tiny proof: RoPE in the encoder, CoPE in the decoder, a few steps, then greedy and beam translations."""
    from models.positional.cope import CopePE
    from utils.translation.translate import translate

    with caplog.at_level("INFO"):
        run = _train(tmp_path, ROPE_COPE)
    assert "positions: encoder rope, decoder cope" in caplog.text
    assert all(isinstance(layer.self_attn.pe, CopePE) and layer.cross_attn.pe is None for layer in run.model.decoder)
    assert all(isinstance(layer.self_attn.pe, RotaryPE) for layer in run.model.encoder)
    assert run.model.decoder[0].self_attn.pe.pos_embed.abs().max() > 0  # trained away from its zeros
    sources = ["Le chat dort.", "Il fait beau aujourd'hui."]
    for beam in (1, 2):
        out = translate(run.model, run.tokenizer, sources, run.cfg.decode.model_copy(update={"beam": beam}))
        assert len(out) == 2 and all(len(n) >= 1 and isinstance(n[0].text, str) for n in out)


KERPLE_COPE = ["model.input_pe=none", "model.attention_pe=none", "model.encoder_pe.attention=kerple_power",
               "model.decoder_pe.attention=cope", "model.cross_attention_pe=kerple_log"]
SANDWICH_NOPE = ["model.input_pe=none", "model.attention_pe=sandwich", "model.decoder_pe.attention=none"]


@pytest.mark.parametrize("overrides,described,decoder", [
    (KERPLE_COPE, "encoder kerple_power, decoder cope + kerple_log in cross-attention", "cope"),
    (SANDWICH_NOPE, "encoder sandwich, decoder none", "none")], ids=["kerple-encoder-cope-decoder", "sandwich-nope"])
def test_per_stack_choices_train_and_translate_through_the_command_line(tmp_path: Path, overrides: list[str],
                                                                        described: str, decoder: str) -> None:
    """train.py then inference.py, as a user runs them: the run names its five places, the loaded model holds those
    encodings, and inference.py prints the in-process translations of the loaded model (greedy and beam 2)."""
    from utils.run.load import load_run
    from utils.translation.translate import translate

    res = train_cli(tmp_path, *overrides)
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"positions: {described}" in res.stderr + res.stdout
    run = load_run(tmp_path / "runs" / "demo_latest", device="cpu")
    places = json.loads((run.run_dir / "summary.json").read_text())["encodings"]
    assert places == run.cfg.model.encodings() and places["decoder self-attention"] == decoder
    encoder_pe = REGISTRY["attention"][places["encoder self-attention"]]
    decoder_pe = REGISTRY["attention"][decoder]
    cross_pe = REGISTRY["attention"][places["cross-attention"]]
    assert all(type(layer.self_attn.pe) is encoder_pe for layer in run.model.encoder)
    for layer in run.model.decoder:
        assert (layer.self_attn.pe is None) if decoder_pe is None else type(layer.self_attn.pe) is decoder_pe
        assert (layer.cross_attn.pe is None) if cross_pe is None else type(layer.cross_attn.pe) is cross_pe
    sources = ["Le chat dort.", "Il fait beau aujourd'hui."]
    for beam in ("1", "2"):
        res = translate_cli(run.run_dir, sources, "--beam", beam)
        assert res.returncode == 0, res.stderr[-3000:]
        decode = run.cfg.decode.model_copy(update={"beam": int(beam)})
        assert res.stdout.splitlines() == [n[0].text for n in translate(run.model, run.tokenizer, sources, decode)]


def test_export_refusals_name_the_stack_key() -> None:
    from utils.translation.export import ExportError, check_exportable

    with pytest.raises(ExportError, match=r"^model.decoder_pe.input=sinusoidal with model.decoder_pe.attention=alibi: "
                                          r"CTranslate2 drops the position table"):
        check_exportable(load_config(DEMO, ["model.input_pe=none", "model.decoder_pe.input=sinusoidal",
                                            "model.decoder_pe.attention=alibi"]))
    check_exportable(load_config(DEMO, NOPE))  # RoPE encoder, nothing in the decoder: exact


def test_figures_plot_each_stacks_own_input_encoding() -> None:
    from utils.figures.maps import position_figures

    cfg = load_config(DEMO, ["model.encoder_pe.input=learnable", "model.decoder_pe.input=sinusoidal",
                             "model.d_model=16", "model.n_heads=2", "model.max_positions=70",
                             "model.decoder_pe.attention=alibi"])
    torch.manual_seed(0)
    figs, notes = position_figures(Seq2SeqTransformer(cfg.model, 50, 0), cfg, length=16, bias_length=8)
    assert {"position/input/encoder/heatmap", "position/input/encoder/mds", "position/input/decoder/heatmap",
            "position/input/decoder/cosine", "position/bias/decoder"} <= set(figs)
    assert "position/bias/encoder" not in figs
    assert "model.attention_pe=none: no attention-level positional encoding in encoder self-attention" in notes
