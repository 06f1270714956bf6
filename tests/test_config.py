"""Config loading: every shipped config is valid; overrides work; mistakes give one line naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from utils.config import Config, ConfigError, from_dict, load_config, save_config

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_shipped_configs_load(path: Path) -> None:
    cfg = load_config(path)
    assert cfg.name == path.stem
    assert cfg.model.d_model % cfg.model.n_heads == 0


def test_required_configs_exist() -> None:
    names = {p.stem for p in CONFIGS}
    for pe in ("sinusoidal", "learnable", "rope"):
        assert f"bench_small_{pe}" in names and f"iwslt2017_{pe}" in names
    assert "demo" in names


def test_reference_model_sizes() -> None:
    base = load_config(Path("configs/iwslt2017_rope.yaml"))
    assert (base.model.d_model, base.model.n_heads, base.model.encoder_layers, base.model.decoder_layers,
            base.model.d_ff, base.model.dropout, base.train.label_smoothing) == (512, 8, 6, 6, 2048, 0.1, 0.1)
    assert base.train.scheduler == "inverse_sqrt"
    small = load_config(Path("configs/bench_small_rope.yaml"))
    assert (small.model.d_model, small.model.n_heads, small.model.encoder_layers, small.model.d_ff,
            small.tokenizer.vocab_size) == (256, 4, 3, 1024, 8000)
    assert small.model.attention_pe == "rope"
    assert small.data.test == ["test.tatoeba", "test.multi30k-2016", "test.iwslt-tst2010"]


def test_overrides_are_typed() -> None:
    cfg = load_config(Path("configs/demo.yaml"), [
        "model.attention_pe=rope", "train.lr=0.01", "model.encoder_layers=3", "data.test=[a, b]",
        "model.rope.theta=500", "train.max_minutes=1.5",
    ])
    assert cfg.model.attention_pe == "rope" and cfg.train.lr == 0.01 and cfg.model.encoder_layers == 3
    assert cfg.data.test == ["a", "b"] and cfg.model.rope.theta == 500.0 and cfg.train.max_minutes == 1.5


@pytest.mark.parametrize("override,message", [
    ("model.attention_pe=rpoe", "model.attention_pe: 'rpoe' is not one of: none, rope, alibi, t5, shaw"),
    ("model.input_pe=fourier",
     "model.input_pe: 'fourier' is not one of: none, sinusoidal, learnable, learnable_ln, onehot, gaussian, binary"),
    ("model.dmodel=3", "unknown config key model.dmodel; allowed keys in model: d_model,"),
    ("trian.lr=1", "unknown config key trian; allowed keys in the top level: name, seed, data,"),
    ("model.norm=middle", "model.norm: 'middle' is not one of: pre, post"),
    ("model.d_model=abc", "model.d_model: expected an integer, got 'abc'"),
    ("model.n_heads=5", "model.d_model: 128 is not divisible by model.n_heads=5"),
    ("decode.nbest=9", "decode.nbest: 9 exceeds decode.beam=5"),
    ("model.dropout=1.5", "model.dropout: must be in [0, 1)"),
    ("data.source=hub", "data.source: 'hub' is not one of: demo, iwslt2017, wit3, text"),
    ("model", "expected key=value"),
])
def test_bad_values_name_the_key_and_allowed_values(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(Path("configs/demo.yaml"), [override])
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_env_expansion(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FR2EN_SHARED_DATA", "/somewhere")
    assert load_config(Path("configs/bench_small_rope.yaml")).data.path == "/somewhere/bench/fr-en"
    monkeypatch.delenv("FR2EN_SHARED_DATA")
    assert load_config(Path("configs/bench_small_rope.yaml")).data.path == "../shared/data/bench/fr-en"
    with pytest.raises(ConfigError, match="environment variable NOPE_NOT_SET is not set"):
        from_dict({"data": {"path": "${NOPE_NOT_SET}"}})


def test_save_and_reload_round_trip(tmp_path: Path) -> None:
    cfg = load_config(Path("configs/bench_small_learnable.yaml"), ["seed=7"])
    save_config(cfg, tmp_path / "c.yaml")
    again = load_config(tmp_path / "c.yaml")
    assert again == cfg and isinstance(again, Config)


def test_missing_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(bad)


def test_model_fingerprint_ignores_inference_keys_and_tracks_architecture() -> None:
    from utils.checkpoint import model_fingerprint
    from utils.config import ModelConfig, RopeConfig

    base = model_fingerprint(ModelConfig(attention_pe="rope"), 100)
    assert model_fingerprint(ModelConfig(attention_pe="rope", dropout=0.3), 100) == base
    assert model_fingerprint(ModelConfig(attention_pe="rope", rope=RopeConfig(scaling="yarn", factor=4.0)), 100) == base
    assert model_fingerprint(ModelConfig(attention_pe="none"), 100) != base
    assert model_fingerprint(ModelConfig(attention_pe="rope", norm="post"), 100) != base
    assert model_fingerprint(ModelConfig(attention_pe="rope"), 101) != base
