"""Config loading: every shipped config is valid; overrides work; mistakes give one line naming the key."""

from __future__ import annotations

import json
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


@pytest.mark.parametrize("text,value", [
    ("7e-4", 7e-4), ("7E-4", 7e-4), ("7.0e-4", 7e-4), ("1e3", 1000.0), ("+5e+2", 500.0), (".5", 0.5), ("5.", 5.0),
    ("1_000", 1000.0), ("0.001", 0.001), ("3", 3.0),
])
def test_numbers_in_every_notation_in_set_and_yaml(text: str, value: float, tmp_path: Path) -> None:
    """YAML 1.1 reads 7e-4 as a string; number fields take it as the number it spells, in --set and in files."""
    assert load_config(Path("configs/demo.yaml"), [f"train.clip_norm={text}"]).train.clip_norm == pytest.approx(value)
    path = tmp_path / "c.yaml"
    path.write_text(f"train:\n  clip_norm: {text}\n  warmup_tokens: 1.5e6\n")
    cfg = load_config(path)
    assert cfg.train.clip_norm == pytest.approx(value)
    assert cfg.train.warmup_tokens == 1_500_000 and isinstance(cfg.train.warmup_tokens, int)


def test_text_that_only_looks_like_a_number_stays_text_in_string_keys() -> None:
    cfg = load_config(Path("configs/demo.yaml"), ["data.train=1e5", "name=7e-4"])
    assert (cfg.data.train, cfg.name) == ("1e5", "7e-4")


@pytest.mark.parametrize("override,message", [
    ("model.attention_pe=rpoe",
     "model.attention_pe: 'rpoe' is not one of: none, rope, alibi, t5, shaw, kerple_log, kerple_power, sandwich, "
     "fire, dpb, cope, xpos"),
    ("model.input_pe=fourier",
     "model.input_pe: 'fourier' is not one of: none, sinusoidal, learnable, learnable_ln, onehot, gaussian, binary"),
    ("model.dmodel=3", "unknown config key model.dmodel; allowed keys in model: d_model,"),
    ("trian.lr=1", "unknown config key trian; allowed keys in the top level: name, seed, data,"),
    ("model.norm=middle", "model.norm: 'middle' is not one of: pre, post"),
    ("model.d_model=abc", "model.d_model: expected an integer, got 'abc'"),
    ("model.n_heads=5", "model.d_model: 128 is not divisible by model.n_heads=5"),
    ("decode.nbest=9", "decode.nbest: 9 exceeds decode.beam=5"),
    ("model.dropout=1.5", "model.dropout: must be >= 0 and < 1, got 1.5"),
    ("train.lr=-7e-4", "train.lr: must be >= 0, got -0.0007"),
    ("train.lr=.nan", "train.lr: must be >= 0, got nan"),
    ("train.eps=0", "train.eps: must be > 0 and <= 1, got 0.0"),
    ("train.warmup_steps=-1", "train.warmup_steps: must be >= 0 and <= 10000000000, got -1"),
    ("train.max_minutes=0", "train.max_minutes: must be > 0 and <= 100000000, got 0.0"),
    ("train.betas=[0.9,1.5]", "train.betas: each must be in [0, 1), got [0.9, 1.5]"),
    ("decode.lenpen=-1", "decode.lenpen: must be >= 0 and <= 100, got -1.0"),
    ("model.rope.factor=0.5", "model.rope.factor: must be >= 1 and <= 10000, got 0.5"),
    ("data.max_len_ratio=0.5", "data.max_len_ratio: must be >= 1, got 0.5"),
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


@pytest.mark.parametrize("depth", [1000, 100_000])
def test_a_config_nested_thousands_deep_is_one_line(tmp_path: Path, depth: int) -> None:
    for opened, closed in (("[", "]"), ("{a: ", "}")):
        deep = tmp_path / "deep.yaml"
        deep.write_text("model: " + opened * depth + "1" + closed * depth + "\n")
        with pytest.raises(ConfigError, match=r"deep\.yaml: nested too deeply to be a config$"):
            load_config(deep)


def test_missing_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(bad)
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes("name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"latin1.yaml: not a UTF-8 text file \(byte 9\)"):
        load_config(latin1)
    with pytest.raises(ConfigError, match="is a folder, not a config file"):
        load_config(tmp_path)


def test_model_fingerprint_ignores_inference_keys_and_tracks_architecture() -> None:
    from utils.config import ModelConfig, RopeConfig
    from utils.run.checkpoint import model_fingerprint

    base = model_fingerprint(ModelConfig(attention_pe="rope"), 100)
    assert model_fingerprint(ModelConfig(attention_pe="rope", dropout=0.3), 100) == base
    assert model_fingerprint(ModelConfig(attention_pe="rope", rope=RopeConfig(scaling="yarn", factor=4.0)), 100) == base
    assert model_fingerprint(ModelConfig(attention_pe="none"), 100) != base
    assert model_fingerprint(ModelConfig(attention_pe="rope", norm="post"), 100) != base
    assert model_fingerprint(ModelConfig(attention_pe="rope"), 101) != base


def test_a_config_inherits_its_base_and_overrides_keys(tmp_path: Path) -> None:
    (tmp_path / "family").mkdir()
    (tmp_path / "family" / "base.yaml").write_text(
        "name: not_inherited\ndata:\n  max_len: 50\n  test: [a, b]\nmodel:\n  d_model: 64\n  n_heads: 4\n"
        "  rope:\n    theta: 500\n    factor: 2\n")
    (tmp_path / "family" / "mid.yaml").write_text("base: base.yaml\nmodel:\n  attention_pe: rope\n  rope:\n"
                                                  "    factor: 4\n")
    (tmp_path / "leaf.yaml").write_text("base: family/mid.yaml\ndata:\n  test: [c]\ntrain:\n  lr: 3e-4\n")
    cfg = load_config(tmp_path / "leaf.yaml", ["model.n_heads=2"])
    assert cfg.name == "leaf"  # the file named, never a base's name
    assert (cfg.data.max_len, cfg.data.test) == (50, ["c"])  # mappings merged, lists replaced
    assert (cfg.model.d_model, cfg.model.n_heads, cfg.model.attention_pe) == (64, 2, "rope")
    assert (cfg.model.rope.theta, cfg.model.rope.factor) == (500.0, 4.0)  # nested mappings merged key by key
    assert cfg.train.lr == 3e-4


def test_base_mistakes_are_one_line(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("base: b.yaml\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\n")
    with pytest.raises(ConfigError, match=r"base configs form a cycle \(a.yaml -> b.yaml -> a.yaml\)"):
        load_config(tmp_path / "a.yaml")
    (tmp_path / "c.yaml").write_text("base: missing.yaml\n")
    with pytest.raises(ConfigError, match="base config not found"):
        load_config(tmp_path / "c.yaml")
    (tmp_path / "d.yaml").write_text("base: [x]\n")
    with pytest.raises(ConfigError, match="base must be the path of another config file"):
        load_config(tmp_path / "d.yaml")


def test_encoding_families_are_one_base_plus_short_variants() -> None:
    """Every per-encoding config states only what differs from its family's base."""
    root = Path(__file__).resolve().parents[1] / "configs"
    for family in ("bench_small", "bench_short", "iwslt2017"):
        variants = sorted(root.glob(f"{family}_*.yaml"))
        assert len(variants) >= 10, family
        for path in variants:
            body = [ln for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
            assert body[0].startswith("base: ") and len(body) <= 8, path.name
            cfg = load_config(path)
            base = load_config(root / body[0].split(": ", 1)[1])
            assert cfg.data == base.data and cfg.train == base.train and cfg.tokenizer == base.tokenizer, path.name


def test_every_shipped_config_resolves_as_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A change to a base config (or a default) changes every config that inherits it: the record makes
    that a reviewed diff (regenerate it with ``python tests/resolved_configs.py``), not a silent one."""
    from resolved_configs import RECORD, resolved_configs

    monkeypatch.delenv("FR2EN_SHARED_DATA", raising=False)
    recorded, now = json.loads(RECORD.read_text()), resolved_configs()
    assert sorted(now) == sorted(recorded), "configs added or removed: regenerate tests/data/resolved_configs.json"
    changed = {name: {k: (recorded[name].get(k), v.get(k)) for k in {*v, *recorded[name]}
                      if recorded[name].get(k) != v.get(k)} for name, v in now.items()}
    diff = {n: d for n, d in changed.items() if d}
    assert not diff, f"resolved configs changed (recorded, now): {diff}; regenerate the record if intended"
    assert now["bench_small_rope.yaml"]["model.attention_pe"] == "rope"  # inherited from bench_small, then set
    assert now["bench_small_rope.yaml"]["train.warmup_tokens"] == 750000


def test_lower_layers_do_not_import_utils_config() -> None:
    """models/, data/ and tokenizer/ declare their own sections: importing them loads no ``utils.config``."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    code = ("import sys, models.transformer, models.decoding, models.positional, data.cache, data.sources, "
            "data.batching, tokenizer.factory, tokenizer.joint; "
            "print(sorted(m for m in sys.modules if m.startswith('utils.config')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_sections_keep_the_dataclass_api() -> None:
    """Equality, copies with changes, plain dicts (what run directories and checkpoints store)."""
    from utils.config import DecodeConfig, ModelConfig

    cfg = load_config(Path("configs/demo.yaml"))
    assert cfg.to_dict()["model"]["rope"] == ModelConfig().rope.to_dict()
    greedy = cfg.decode.model_copy(update=dict(beam=1, nbest=1))
    assert (greedy.beam, cfg.decode.beam) == (1, 5) and greedy != cfg.decode
    assert DecodeConfig(**{**cfg.decode.to_dict(), "beam": 5}) == cfg.decode
    assert from_dict(cfg.to_dict()) == cfg


def test_a_recursive_yaml_alias_is_one_line(tmp_path: Path) -> None:
    """``&x [test, *x]`` is a list that contains itself: ConfigError naming the key, not a RecursionError."""
    from conftest import run_script

    root = Path(__file__).resolve().parents[1]
    path = tmp_path / "x.yaml"
    path.write_text(f"base: {root / 'configs' / 'demo.yaml'}\ndata:\n  test: &x [test, *x]\n")
    with pytest.raises(ConfigError, match=r"x\.yaml: data\.test refers to itself \(a recursive YAML alias\)$"):
        load_config(path)
    (tmp_path / "top.yaml").write_text("&y\nname: top\nself: *y\n")
    with pytest.raises(ConfigError, match=r"top\.yaml: the config refers to itself \(a recursive YAML alias\)$"):
        load_config(tmp_path / "top.yaml")
    res = run_script("train.py", "--config", str(path), "--runs", str(tmp_path / "runs"))
    assert res.returncode != 0 and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines() == [f"error: {path}: data.test refers to itself (a recursive YAML alias)"]


def test_values_are_read_by_pydantics_lax_mode_plus_what_yaml_needs() -> None:
    """pydantic coerces (``"1_000"`` and ``3.0`` in an integer key, ``1`` and ``"yes"`` in a true/false key, a number
    in a text key); the schema adds exponent notation in integer keys (YAML 1.1 reads ``1.5e6`` as text), one value
    where a list is expected, and refuses a number that is not finite with every bound of its key."""
    cfg = load_config(Path("configs/demo.yaml"), ["model.d_model=1_024", "model.n_heads=4.0", "name=5",
                                                   "model.tie_embeddings=0", "train.warmup_tokens=2e5",
                                                   "data.test=test"])
    assert (cfg.model.d_model, cfg.model.n_heads, cfg.name, cfg.model.tie_embeddings) == (1024, 4, "5", False)
    assert (cfg.train.warmup_tokens, cfg.data.test) == (200_000, ["test"])
    assert isinstance(cfg.model.n_heads, int) and isinstance(cfg.train.warmup_tokens, int)
    for sets, message in ((["model.d_model=2.5e0"], "model.d_model: expected an integer, got 2.5"),
                          (["model.tie_embeddings=maybe"], "model.tie_embeddings: expected true or false, got 'maybe'"),
                          (["train.lr=1e400"], "train.lr: must be >= 0, got inf"),
                          (["train.betas=[0.9, .inf]"], "train.betas[1]: must be a finite number, got inf")):
        with pytest.raises(ConfigError) as err:
            load_config(Path("configs/demo.yaml"), sets)
        assert str(err.value) == message
