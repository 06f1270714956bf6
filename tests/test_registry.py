"""The registry's promise: a new encoding is one module plus one registry line. A throwaway encoding defined
here, registered by one dict entry, trains, translates, plots and exports (or is refused in one line) with no
other edit. And per-forward position data (RoPE's angles) is computed once per forward, not once per layer."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from conftest import make_tiny_config, run_script, train_cli, translate_cli
from pydantic import Field
from torch import nn

from models.positional import REGISTRY
from models.positional.absolute import sinusoid_table
from models.positional.base import AttentionPE, InputPE, Settings
from models.transformer import Seq2SeqTransformer
from utils.config import ConfigError, ModelConfig, from_dict

SENTENCE = "Le chat dort."


class ScaledSinusoidPE(InputPE):
    """x + a * PE[pos]: Vaswani et al.'s sinusoids ``[T, D]`` times one learned scalar a (init 1)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        self.alpha = nn.Parameter(torch.ones(()))

    def table(self, length: int) -> torch.Tensor:
        return (self.alpha * sinusoid_table(length, self.cfg.d_model).to(self.alpha.device)).detach()

    def embed(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        table = sinusoid_table(int(positions.max()) + 1, self.cfg.d_model).to(x.device)
        return x + (self.alpha * table[positions]).to(x.dtype)


class DistanceBiasPE(AttentionPE):
    """-s |i - j| added to every head's scores, s one learned scalar (init 0.1): ALiBi with a single slope."""

    def __init__(self, cfg: ModelConfig, kind: str) -> None:
        super().__init__(cfg, kind)  # type: ignore[arg-type]
        self.slope = nn.Parameter(torch.tensor(0.1))

    def bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor, q: torch.Tensor | None = None) -> torch.Tensor:
        """-> ``[1, 1, Tq, Tk]``."""
        return -self.slope * (q_pos[:, None] - k_pos[None, :]).abs().float()[None, None]


def _train_and_use(tmp_path: Path, overrides: list[str]) -> tuple[str, list[str], str | None]:
    """Train 2 steps, translate one sentence, plot, export: (translation, figure tags + notes, export refusal)."""
    from utils.figures.maps import position_figures
    from utils.run.load import load_run
    from utils.run.store import create_run_dir
    from utils.training.loop import train
    from utils.translation.export import ExportError, export
    from utils.translation.translate import translate

    base = make_tiny_config(tmp_path, max_steps=2, eval_every=2, valid_bleu_sentences=2)
    cfg = from_dict(base.to_dict(), ["decode.max_len_a=0", "decode.max_len_b=8", *overrides])
    run_dir = create_run_dir(cfg, tmp_path / "runs")
    train(cfg, run_dir)
    run = load_run(run_dir, device="cpu")
    hyp = translate(run.model, run.tokenizer, ["Le chat dort."], run.cfg.decode)[0][0]
    figs, notes = position_figures(run.model, run.cfg, length=16, bias_length=8)
    assert all("\n" not in note for note in notes)
    refusal = None
    if importlib.util.find_spec("ctranslate2") is not None:
        try:
            out = export(run.run_dir, run.checkpoint, run.model, run.cfg, run.tokenizer, tmp_path / "ct2")
        except ExportError as err:
            refusal = str(err)
            assert refusal and "\n" not in refusal
        else:
            from utils.translation.engines import CT2Model

            theirs = CT2Model(out).translate(["Le chat dort."], run.cfg.decode)[0][0]
            assert theirs.text == hyp.text
    return hyp.text, [*figs, *notes], refusal


def test_a_new_input_encoding_is_one_class_and_one_registry_line(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(REGISTRY["input"], "scaled_sinusoid", ScaledSinusoidPE)  # the one line
    text, shown, refusal = _train_and_use(tmp_path, ["model.input_pe=scaled_sinusoid", "model.attention_pe=none"])
    assert isinstance(text, str)
    # learned (alpha): a table per side, as for model.input_pe=learnable
    assert {f"position/input/{side}/{k}" for side in ("encoder", "decoder") for k in ("heatmap", "cosine", "mds")} \
        <= set(shown)
    assert refusal is None  # additive: exported as CTranslate2's position table, and translates the same


def test_a_new_attention_encoding_is_one_class_and_one_registry_line(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(REGISTRY["attention"], "distance", DistanceBiasPE)  # the one line
    text, shown, refusal = _train_and_use(tmp_path, ["model.input_pe=none", "model.attention_pe=distance"])
    assert isinstance(text, str)
    assert "distance in encoder self-attention: this encoding has nothing to plot" in shown
    if importlib.util.find_spec("ctranslate2") is not None:
        assert refusal == "model.attention_pe=distance: CTranslate2 has no equivalent of this encoding"


class WindowSettings(Settings):
    """The throwaway encoding's own settings (``model.window``), with a rule of their own."""

    scale: float = Field(1.0, gt=0)  # the bias's initial scale, learned

    def check(self, model: ModelConfig) -> None:
        if self.scale > model.n_heads:
            raise ConfigError(f"model.window.scale: at most model.n_heads={model.n_heads}, got {self.scale:g}")


class GaussianWindowPE(AttentionPE):
    """-a (i - j)^2 / (2 sigma^2) added to every head's scores, sigma = ``model.gaussian_sigma``, a learned."""

    settings = ("window", WindowSettings)
    owns = ("gaussian_sigma",)  # with input_pe=gaussian, which owns it too
    title = "Gaussian window bias"
    paper = "Ada Lovelace, Alan Turing (2031). Windows on Positions. arXiv:3101.00001."
    formula = r"b(i, j) = -a \frac{(i - j)^2}{2\sigma^2}"

    def __init__(self, cfg: ModelConfig, kind: str) -> None:
        super().__init__(cfg, kind)  # type: ignore[arg-type]
        self.scale = nn.Parameter(torch.tensor(cfg.window.scale))  # type: ignore[attr-defined]

    @classmethod
    def check(cls, cfg: Any, key: str) -> None:
        if cfg.model.gaussian_sigma < 0.5:
            raise ConfigError(f"{key}=window needs model.gaussian_sigma >= 0.5, got {cfg.model.gaussian_sigma:g}")

    @classmethod
    def describe(cls, cfg: ModelConfig, name: str) -> str:
        return f"{name} (sigma {cfg.gaussian_sigma:g})"

    def bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor, q: torch.Tensor | None = None) -> torch.Tensor:
        d = (q_pos[:, None] - k_pos[None, :]).float()
        return (-self.scale * d**2 / (2 * self.cfg.gaussian_sigma**2))[None, None]


def test_a_new_encoding_declares_its_checks_effects_description_and_docs_row_and_joins_no_preset(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Registered by one line, with nothing else edited: validation applies its ``check`` and its settings
    section's, a ``--set`` of a key it owns or of its section is reported inert exactly where it is not in use, the
    run's description and the reference index come from its class, and no study preset grows."""
    from docs.reference_encodings import describe, encoding_page, index_page
    from models.config import model_config_class
    from utils.config import Config, effect_rules, validate
    from utils.study.presets import presets

    def variants() -> dict[str, list[tuple[str, list[str]]]]:
        return {name: [(v.label, v.overrides) for v in p.variants] for name, p in presets().items()}

    before = variants()
    monkeypatch.setitem(REGISTRY["attention"], "window", GaussianWindowPE)  # the one line
    assert variants() == before  # a preset names its encodings: none joins one by being registered
    with pytest.raises(ConfigError, match=r"^model.attention_pe=window needs model.gaussian_sigma >= 0.5, got 0.1$"):
        from_dict({}, ["model.attention_pe=window", "model.gaussian_sigma=0.1"])
    cfg = from_dict({}, ["model.attention_pe=window", "model.gaussian_sigma=3"])
    assert cfg.model.describe_encodings() == "sinusoidal + window (sigma 3)"
    caplog.clear()
    with caplog.at_level("WARNING", logger="config"):
        from_dict({}, ["model.attention_pe=window", "model.input_pe=none", "model.gaussian_sigma=3"])
        assert caplog.messages == []  # model.gaussian_sigma acts through window
        from_dict({}, ["model.gaussian_sigma=3"])
    assert caplog.messages == [
        "--set model.gaussian_sigma=3 has no effect: model.gaussian_sigma is read by gaussian or window, which is in "
        "none of encoder input (sinusoidal), encoder self-attention (none), decoder input (sinusoidal), decoder "
        "self-attention (none), cross-attention (none)"]
    # Its section: what models/config.py composes from the registry at import, so built here after the fact.
    built = model_config_class(REGISTRY)
    with pytest.raises(ConfigError, match=r"^model.window.scale: at most model.n_heads=8, got 9$"):
        validate(Config.model_construct(model=built(window={"scale": 9})))
    rules = {key: why for key, _, why in effect_rules()}
    assert rules["model.window"](Config.model_construct(model=built(attention_pe="window"))) is None
    assert rules["model.window"](Config.model_construct(model=built(cross_attention_pe="window"))) is None
    assert rules["model.window"](Config.model_construct(model=built())).startswith(
        "model.window is read by window, which is in none of encoder input (sinusoidal)")
    # Its documentation row and page: from the class (title, paper, formula) and from validation and export.
    enc = describe("window", "attention")
    assert index_page({"window": [enc]}).splitlines()[-1] == (
        "| [`window`](window.md) | attention | encoder self, decoder self, cross | Lovelace and Turing 2031 | no | "
        "shape, randomized |")  # integer positions (the default): not CAPE's
    page = encoding_page("window", [enc], (None, ""))
    assert page.startswith("# Gaussian window bias (`window`)\n") and GaussianWindowPE.formula in page
    assert "| `model.window.scale` | number, > 0 | `1.0` | the bias's initial scale, learned |" in page


def test_the_rules_of_rope_live_with_its_settings() -> None:
    """RoPE's checks are its section's (``RopeConfig.check``), the same lines validation gives."""
    from models.positional.rotary import RopeConfig

    model = ModelConfig(d_model=64, n_heads=4)
    with pytest.raises(ConfigError, match=r"^model.rope.beta_fast: must be larger than model.rope.beta_slow$"):
        RopeConfig(beta_fast=1.0, beta_slow=1.0).check(model)
    with pytest.raises(ConfigError, match=r"^model.rope.dim: must be even and in 2..16 \(the head dim\), got 18$"):
        RopeConfig(dim=18).check(model)
    with pytest.raises(ConfigError, match=r"^model.rope.dim: must be even and in 2..16 \(the head dim\), got 18$"):
        from_dict({}, ["model.d_model=64", "model.n_heads=4", "model.rope.dim=18"])
    RopeConfig(dim=16).check(model)


@pytest.mark.parametrize("name", ["kerple_log", "kerple_power", "sandwich", "dpb"])
def test_distance_biases_train_translate_through_the_cli_plot_and_export(name: str, tmp_path: Path) -> None:
    """The registered distance biases (KERPLE, Sandwich, DPB) end to end: 2 training steps by train.py, inference.py
    on the run,
    their bias figures, and a CTranslate2 export whose (KV-cached) greedy decoding picks our greedy tokens and scores
    them as our model does teacher-forced. (Not the text of beam search: an untrained model's hypotheses all reach
    the length cap, where ours add the forced EOS to the score and CTranslate2 does not, so the two may rank them
    differently.)"""
    from utils.figures.maps import position_figures
    from utils.run.load import load_run
    from utils.translation.translate import encode_sources, translate

    base = make_tiny_config(tmp_path, max_steps=2, eval_every=2, valid_bleu_sentences=2)
    cfg = from_dict(base.to_dict(), ["decode.max_len_a=0", "decode.max_len_b=8", "model.input_pe=none",
                                     f"model.attention_pe={name}"])
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(cfg.to_dict()))
    res = run_script("train.py", "--config", str(config), "--runs", str(tmp_path / "runs"))
    assert res.returncode == 0, res.stderr[-3000:]
    run_dir = (tmp_path / "runs" / "tiny_latest").resolve()
    res = run_script("inference.py", "--model_path", str(run_dir), "--src_text", SENTENCE, "--beam", "2")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == f"source: {SENTENCE}" and lines[1].startswith("greedy: ") and "(logprob -" in lines[1]
    assert lines[2] == "beam 2 (lenpen 0.6), 2-best:"
    run = load_run(run_dir, device="cpu")
    figs, _ = position_figures(run.model, run.cfg, length=16, bias_length=8)
    assert {"position/bias/encoder", "position/bias/decoder"} <= set(figs)
    if importlib.util.find_spec("ctranslate2") is None:
        return
    from utils.translation.engines import CT2Model
    from utils.translation.export import export

    engine = CT2Model(export(run.run_dir, run.checkpoint, run.model, run.cfg, run.tokenizer, tmp_path / "ct2"))
    greedy = run.cfg.decode.model_copy(update=dict(beam=1, nbest=1))
    theirs = engine.translate([SENTENCE], greedy)[0][0]
    assert translate(run.model, run.tokenizer, [SENTENCE], greedy)[0][0].tokens == theirs.tokens
    tok = run.tokenizer
    src = encode_sources(tok, [SENTENCE], None)[0]
    tgt = theirs.tokens + ([tok.eos_id] if len(theirs.tokens) < 8 else [])  # CTranslate2 counts a returned EOS
    with torch.no_grad():
        logp = torch.log_softmax(run.model(torch.tensor([src]), torch.tensor([[tok.bos_id, *tgt[:-1]]]))[0], -1)
    assert sum(logp[i, t].item() for i, t in enumerate(tgt)) == pytest.approx(theirs.logprob, abs=1e-3)


def test_rope_angles_are_computed_once_per_forward(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """3+3 layers with RoPE in self- and cross-attention: one angle table per positions tensor per forward
    (source, target), not one per layer; and the logits are those of per-layer computation."""
    import models.positional.rotary as rotary

    cfg = make_tiny_config(tmp_path).model.model_copy(update=dict(
        encoder_layers=3, decoder_layers=3, input_pe="none", attention_pe="rope", cross_attention_pe="rope",
        dropout=0.0))
    torch.manual_seed(0)
    model = Seq2SeqTransformer(cfg, 50, 0).eval()
    src, tgt = torch.randint(3, 50, (2, 7)), torch.randint(3, 50, (2, 5))
    calls: list[int] = []
    real = rotary.rope_angles
    monkeypatch.setattr(rotary, "rope_angles", lambda pos, *a: calls.append(len(pos)) or real(pos, *a))
    with torch.no_grad():
        shared = model(src, tgt)
    assert sorted(calls) == [5, 7, 7]  # encoder positions; decoder positions; the source's, read by cross-attention
    calls.clear()
    with torch.no_grad():  # KV-cached decoding: once per step, at the step's true offset
        memory, mask = model.encode(src)
        cache = model.new_cache()
        steps = [model.decode(tgt[:, i : i + 1], memory, mask, cache) for i in range(tgt.shape[1])]
    assert sorted(calls) == [1] * 5 + [7] * 6  # the encoder; then each step: its position, and the source's
    assert torch.allclose(torch.cat(steps, 1), shared, atol=1e-5)
    for module in model.modules():  # every layer on its own: what the model computed before sharing
        if isinstance(module, AttentionPE):
            module.shared = type(module.shared)()
    with torch.no_grad():
        alone = model(src, tgt)
    assert torch.equal(alone, shared)


def test_an_encodings_own_settings_live_beside_it_and_become_one_model_section() -> None:
    """fairseq's pattern: the settings Section is declared on the encoding class (``settings``), in its module, and
    ``ModelConfig`` is the Transformer's fields plus one ``model.<key>`` section per key of the registry."""
    from pydantic import Field, ValidationError

    from models.config import TransformerConfig, model_config_class
    from utils.schema import Section, config_error

    for level in REGISTRY.values():
        for enc in (c for c in level.values() if c is not None and c.settings is not None):
            key, section = enc.settings
            assert section.__module__ == enc.__module__  # beside the encoding, not in a config file
            assert ModelConfig.model_fields[key].annotation is section and getattr(ModelConfig(), key) == section()
    assert {"rope", "shaw", "t5", "sandwich"} <= set(ModelConfig.model_fields) - set(TransformerConfig.model_fields)

    class DistanceSettings(Section):
        init: float = Field(0.1, gt=0)  # the slope's initial value

    class SetDistanceBiasPE(DistanceBiasPE):
        settings = ("distance", DistanceSettings)

    registry = {**REGISTRY, "attention": {**REGISTRY["attention"], "distance": SetDistanceBiasPE}}
    built = model_config_class(registry)  # what models/config.py does with the registry at import
    assert built().distance.init == 0.1 and built(distance={"init": "2e-1"}).distance.init == 0.2
    assert built(attention_pe="rope").rope == ModelConfig().rope
    with pytest.raises(ValidationError) as err:
        built(distance={"init": 0})
    assert str(config_error(err.value, built, {"distance": {"init": 0}}, "model.")) == \
        "model.distance.init: must be > 0, got 0.0"  # the schema's one-line wording
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        built(distance={"slope": 1})

    class Clash(DistanceBiasPE):
        settings = ("rope", DistanceSettings)  # another encoding's key

    with pytest.raises(TypeError, match=r"Clash.settings: model.rope is already another setting"):
        model_config_class({**REGISTRY, "attention": {**REGISTRY["attention"], "clash": Clash}})


def test_the_keys_a_trained_model_may_change_are_declared_by_each_encodings_settings() -> None:
    """A checkpoint's fingerprint leaves out the model keys that shape no parameter: dropout, the training-time
    augmentation, and those an encoding's settings declare ``inference_only`` (RoPE's scalings). A new encoding
    declares its own beside it; no list elsewhere names encodings, and the set is what earlier versions used."""
    from pydantic import Field

    from models.config import inference_only_keys
    from utils.run.checkpoint import model_fingerprint

    class TemperatureSettings(Settings):
        gain: float = Field(1.0, gt=0)  # applied at inference: no parameter
        width: int = Field(4, ge=1)  # shapes a parameter
        inference_only = ("gain",)

    class TemperaturePE(DistanceBiasPE):
        settings = ("temperature", TemperatureSettings)

    keys = inference_only_keys({**REGISTRY, "attention": {**REGISTRY["attention"], "temperature": TemperaturePE}})
    assert "temperature.gain" in keys and "temperature.width" not in keys
    assert set(inference_only_keys()) == {
        "dropout", "attention_dropout", "activation_dropout", "augment.method", "augment.shape", "augment.randomized",
        "augment.cape", "rope.scaling", "rope.factor", "rope.original_max_len", "rope.beta_fast", "rope.beta_slow"}
    rope = ModelConfig(input_pe="none", attention_pe="rope")
    yarn = ModelConfig(input_pe="none", attention_pe="rope", rope={"scaling": "yarn", "factor": 8})
    theta = ModelConfig(input_pe="none", attention_pe="rope", rope={"theta": 500})
    assert model_fingerprint(yarn, 100) == model_fingerprint(rope, 100) != model_fingerprint(theta, 100)


def test_fire_trains_and_translates_through_the_cli(tmp_path: Path) -> None:
    """The registered ``fire`` end to end, as a user runs it: train.py (3 steps of a d 32 model, FIRE alone, one of its
    settings set), inference.py on the run; and the export refused in one line (CTranslate2 has no MLP bias)."""
    res = train_cli(tmp_path, "model.input_pe=none", "model.attention_pe=fire", "model.fire.mlp_width=16")
    assert res.returncode == 0, res.stderr
    assert "has no effect" not in res.stderr  # model.fire.* acts under attention_pe=fire
    run = (tmp_path / "runs" / "demo_latest").resolve()
    assert (run / "checkpoints" / "best.pt").is_file()
    res = run_script("inference.py", "--model_path", str(run), "--src_text", "Le chat dort.", "--beam", "2")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == "source: Le chat dort." and lines[1].startswith("greedy: ")
    if importlib.util.find_spec("ctranslate2") is not None:  # what --export-ctranslate2 calls, in this process
        from utils.run.load import load_run
        from utils.translation.export import ExportError, export

        loaded = load_run(run, device="cpu")
        with pytest.raises(ExportError) as err:
            export(loaded.run_dir, loaded.checkpoint, loaded.model, loaded.cfg, loaded.tokenizer, tmp_path / "ct2")
        assert str(err.value) == "model.attention_pe=fire: CTranslate2 has no equivalent of this encoding"
        assert not (tmp_path / "ct2").exists()


def test_dpb_with_its_settings_trains_translates_and_exports_through_the_cli(tmp_path: Path) -> None:
    """``dpb`` as a user runs it, every one of its settings away from the default: train.py (3 steps) saves them and
    builds that MLP (depth 3 of width 16, LayerNorm, log distance); inference.py prints the loaded model's in-process
    translations; ``--export-ctranslate2`` exports it (an exact relative-bias table) and the export translates."""
    from models.positional.dpb import DpbPE
    from utils.run.load import load_run
    from utils.translation.translate import translate

    sets = ["model.input_pe=none", "model.attention_pe=dpb", "model.dpb.mlp_width=16", "model.dpb.depth=3",
            "model.dpb.norm=true", "model.dpb.log_distance=true"]
    res = train_cli(tmp_path, *sets)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "has no effect" not in res.stderr  # model.dpb.* acts under attention_pe=dpb
    run_dir = (tmp_path / "runs" / "demo_latest").resolve()
    run = load_run(run_dir, device="cpu")
    assert run.cfg.model.dpb.model_dump() == {"mlp_width": 16, "depth": 3, "log_distance": True, "norm": True}
    layers = [m for m in run.model.modules() if isinstance(m, DpbPE)]
    m_cfg = run.cfg.model  # one per self-attention layer, none in cross-attention
    assert len(layers) == m_cfg.encoder_layers + m_cfg.decoder_layers and {m.kind for m in layers} == {"encoder",
                                                                                                        "decoder"}
    assert all(m.log_distance and sum(isinstance(x, nn.LayerNorm) for x in m.mlp) == 3 for m in layers)
    assert [x.out_features for x in layers[0].mlp if isinstance(x, nn.Linear)] == [16, 16, 16, m_cfg.n_heads]
    sources = ["Le chat dort.", "Il fait beau aujourd'hui."]
    res = translate_cli(run_dir, sources, "--beam", "1")
    assert res.returncode == 0, res.stderr[-3000:]
    decode = run.cfg.decode.model_copy(update={"beam": 1})
    ours = [n[0].text for n in translate(run.model, run.tokenizer, sources, decode)]
    assert res.stdout.splitlines() == ours
    if importlib.util.find_spec("ctranslate2") is None:
        return
    res = run_script("inference.py", "--model_path", str(run_dir), "--export-ctranslate2", str(tmp_path / "ct2"))
    assert res.returncode == 0, res.stderr[-3000:]
    res = translate_cli(tmp_path / "ct2", sources, "--beam", "1")  # a fresh process: no PyTorch decoding beside it
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.splitlines() == ours
