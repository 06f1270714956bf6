"""The memory estimate of a config (models/memory.py): an upper bound on what the built model holds, computed before
anything is allocated, and held to the machine's memory (or ``FR2EN_MEMORY_GIB``): a config asking for more is
refused in one line naming the setting that weighs most; so is ``visualize.py --length`` beyond the machine."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from conftest import ROOT, run_script

from models.memory import LIMIT_ENV, check, estimate_config, machine_memory, memory_limit
from models.positional import REGISTRY
from models.transformer import Seq2SeqTransformer
from utils.config import Config, ConfigError, apply_overrides, from_dict, load_config

DEMO = ROOT / "configs" / "demo.yaml"
#: A small model (d 32, 4 heads, 2+1 layers) on sentences of 20 tokens.
SMALL = ["model.d_model=32", "model.n_heads=4", "model.encoder_layers=2", "model.decoder_layers=1", "model.d_ff=48",
         "tokenizer.vocab_size=300", "data.max_len=20", "data.max_tokens=200"]


def held(model: torch.nn.Module) -> int:
    """Bytes of the model's parameters and buffers."""
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


def every_encoding() -> list[list[str]]:
    """One config per registry encoding (causal-only ones in the decoder), and a few other shapes."""
    out = [[f"model.input_pe={name}"] for name in REGISTRY["input"]]
    for name, cls in REGISTRY["attention"].items():
        out.append(["model.input_pe=none", f"model.decoder_pe.attention={name}" if cls is not None and cls.causal_only
                    else f"model.attention_pe={name}"])
    return out + [["model.cross_attention_pe=t5"], ["model.tie_embeddings=false", "model.norm=post"],
                  ["model.attention_pe=shaw", "model.shaw.values=true"],
                  ["model.attention_pe=dpb", "model.dpb.norm=true", "model.dpb.depth=3"],
                  ["model.input_pe=learnable_ln", "model.augment.method=shape", "model.augment.shape.max_shift=7"]]


@pytest.mark.parametrize("sets", every_encoding(), ids=lambda s: " ".join(s))
def test_the_estimate_bounds_the_built_model_from_above_and_closely(sets: list[str]) -> None:
    cfg = load_config(DEMO, [*SMALL, *sets], warn=False)
    estimate = estimate_config(cfg)
    real = held(Seq2SeqTransformer(cfg.model, cfg.tokenizer.vocab_size, 0))
    assert real <= estimate.model <= 1.05 * real
    assert estimate.total >= 5 * estimate.model  # parameters, gradients, AdamW's moments and its step


@pytest.mark.parametrize("sets", [
    ["model.decoder_pe.attention=cope", "model.cope.npos_max=1000000", "model.d_model=512", "model.n_heads=8"],
    ["model.attention_pe=shaw", "model.shaw.max_distance=1000000", "model.shaw.values=true"],
    ["model.input_pe=learnable", "model.max_positions=1000000", "model.d_model=1024", "model.n_heads=8"],
    ["model.input_pe=sinusoidal", "model.max_positions=1000000", "model.d_model=1024", "model.n_heads=8"],
    ["model.attention_pe=fire", "model.fire.mlp_width=65536"],
    ["model.attention_pe=dpb", "model.dpb.mlp_width=8192", "model.dpb.depth=8", "model.dpb.norm=true"],
    ["model.attention_pe=t5", "model.t5.num_buckets=65536", "model.t5.max_distance=1000000"],
    ["tokenizer.vocab_size=1000000", "model.d_model=1024", "model.n_heads=8", "model.tie_embeddings=false"],
    ["model.d_ff=1000000", "model.encoder_layers=12"],
], ids=lambda s: " ".join(s))
def test_at_sizes_too_large_to_allocate_the_estimate_still_bounds_the_model_built_on_the_meta_device(
        sets: list[str]) -> None:
    # typed but not validated: validation would refuse most of these on a small machine
    cfg = Config.model_validate(apply_overrides(yaml.safe_load(DEMO.read_text()), [*SMALL, *sets]))
    with torch.device("meta"):  # shapes without memory: the same modules, nothing allocated
        real = held(Seq2SeqTransformer(cfg.model, cfg.tokenizer.vocab_size, 0))
    estimate = estimate_config(cfg)
    assert real <= estimate.model <= 1.05 * real


@pytest.mark.parametrize(("sets", "message"), [
    # the hostile values, each refused by its key's bound before anything is estimated or built
    (["model.decoder_pe.attention=cope", "model.cope.npos_max=1e8"],
     "model.cope.npos_max: must be >= 2 and <= 1000000, got 100000000"),
    (["model.augment.method=shape", "model.augment.shape.max_shift=1e12"],
     "model.augment.shape.max_shift: must be >= 1 and <= 1000000, got 1000000000000"),
    (["model.augment.method=randomized", "model.augment.randomized.max_length=1e11"],
     "model.augment.randomized.max_length: must be >= 1 and <= 1000000, got 100000000000"),
    (["model.attention_pe=sandwich", "model.sandwich.dim=1e8"],
     "model.sandwich.dim: must be >= 2 and <= 65536, got 100000000"),
    (["model.attention_pe=shaw", "model.shaw.max_distance=1e8"],
     "model.shaw.max_distance: must be >= 1 and <= 1000000, got 100000000"),
    (["model.attention_pe=fire", "model.fire.mlp_width=1e6"],
     "model.fire.mlp_width: must be >= 1 and <= 65536, got 1000000"),
    (["model.max_positions=1e9"],
     "model.max_positions: must be >= 1 and <= 1000000, got 1000000000"),
    (["model.attention_pe=rope", "model.rope.scaling=ntk", "model.rope.factor=1e300"],
     "model.rope.factor: must be >= 1 and <= 10000, got 1e+300"),
])
def test_the_hostile_sizes_are_refused_in_one_line_by_their_bound(sets: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(DEMO, sets)
    assert str(err.value) == message


@pytest.mark.parametrize(("sets", "message"), [
    (["model.decoder_pe.attention=cope", "model.cope.npos_max=1000000"],
     "model.cope.npos_max: 1000000 would need ~12.1 GiB for cope in decoder self-attention (training in all: "
     "~12.1 GiB; limit: 2.0 GiB from FR2EN_MEMORY_GIB)"),
    (["model.attention_pe=fire", "model.fire.mlp_width=65536"],
     "model.fire.mlp_width: 65536 would need ~2.4 GiB for fire in encoder self-attention, fire in decoder "
     "self-attention (training in all: ~2.4 GiB; limit: 2.0 GiB from FR2EN_MEMORY_GIB)"),
    (["model.input_pe=sinusoidal", "model.augment.method=shape", "model.augment.shape.max_shift=1000000",
      "model.d_model=256"],
     "model.augment.shape.max_shift: 1000000 would need ~9.5 GiB for sinusoidal (encoder input), sinusoidal "
     "(decoder input) (training in all: ~9.6 GiB; limit: 2.0 GiB from FR2EN_MEMORY_GIB)"),
    (["model.d_ff=1000000"], "model.d_ff: 1000000 would need ~9.6 GiB for the layers, the activations of a batch "
     "(training in all: ~9.6 GiB; limit: 2.0 GiB from FR2EN_MEMORY_GIB)"),
    (["tokenizer.vocab_size=1000000", "model.d_model=512", "model.n_heads=8"],
     "tokenizer.vocab_size: 1000000 would need ~13.4 GiB for the token embeddings, the logits (training in all: "
     "~13.5 GiB; limit: 2.0 GiB from FR2EN_MEMORY_GIB)"),
])
def test_a_size_within_its_bound_but_beyond_the_limit_is_refused_naming_the_key_that_weighs_most(
        sets: list[str], message: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LIMIT_ENV, "2")
    cfg = load_config(DEMO, [*SMALL, *sets])  # a run's config loads (to decode it needs far less)
    with pytest.raises(ConfigError) as err:
        check(cfg)  # training it is refused
    assert str(err.value) == message


def test_the_limit_is_the_machine_or_the_lower_env_value(monkeypatch: pytest.MonkeyPatch) -> None:
    machine, where = machine_memory()
    assert machine > 2**28 and where.startswith("this machine")
    monkeypatch.setenv(LIMIT_ENV, "0.5")
    assert memory_limit() == (2**29, "limit: 0.5 GiB from FR2EN_MEMORY_GIB")
    monkeypatch.setenv(LIMIT_ENV, "1e9")
    assert memory_limit() == (machine, where)
    for bad in ("abc", "0", "-1", "nan", "inf"):
        monkeypatch.setenv(LIMIT_ENV, bad)
        with pytest.raises(ConfigError) as err:
            check(load_config(DEMO))
        assert str(err.value) == f"FR2EN_MEMORY_GIB={bad!r}: expected a positive number of GiB"


def test_every_shipped_config_trains_within_8_gib_by_its_estimate_and_the_gpu_ones_within_an_h100() -> None:
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        limit = 80 if path.name.startswith("gpu_") else 8
        assert estimate_config(load_config(path, warn=False)).total < limit * 2**30, path.name


def test_a_gpu_training_is_checked_against_the_gpus_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """train.device cuda (or auto with a GPU): the limit is the GPU's memory, not the host's; on the CPU the same
    GPU-sized batch is refused in one line naming the key."""
    import types

    import torch

    import models.memory

    gpu = load_config(ROOT / "configs" / "gpu_base.yaml", warn=False)
    need = estimate_config(gpu).total
    host = (16 * 2**30, "this machine: 16.0 GiB total")
    monkeypatch.setattr(models.memory, "machine_memory", lambda: host)
    monkeypatch.delenv(LIMIT_ENV, raising=False)
    assert 16 * 2**30 < need < 80 * 2**30
    with pytest.raises(ConfigError, match=r"^data.max_tokens: 45056 would need"):
        check(load_config(ROOT / "configs" / "gpu_base.yaml", ["train.device=cpu"], warn=False))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: types.SimpleNamespace(total_memory=80 * 2**30, name="NVIDIA H100"))
    assert memory_limit("cuda") == (80 * 2**30, "this GPU (NVIDIA H100): 80.0 GiB")
    assert memory_limit("cpu") == host
    assert check(gpu).total == need  # auto: the GPU's 80 GiB


def test_visualize_refuses_a_length_beyond_the_machine_in_one_line_before_loading_anything(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from utils.run.layout import RunDir
    from utils.run.store import create_run_dir

    cfg = from_dict(load_config(DEMO, SMALL).to_dict())
    run = create_run_dir(cfg, tmp_path / "runs")
    RunDir(run).last.write_bytes(b"not a checkpoint: never read")
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    monkeypatch.setenv(LIMIT_ENV, "1")
    out = run_script("visualize.py", "--model_path", str(run), "--src_text", "Bonjour.", "--length", "300000")
    assert out.returncode == 2, out.stderr
    assert out.stderr.splitlines() == ["error: --length 300000: the position figures would need ~8047.1 GiB "
                                       "(limit: 1.0 GiB from FR2EN_MEMORY_GIB); --length 3335 fits"]
    assert out.stdout == ""
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before  # nothing written


def test_a_moving_average_of_the_weights_adds_one_copy_of_the_parameters() -> None:
    """train.ema_decay keeps a second model: the estimate grows by exactly the parameters' bytes."""
    plain = estimate_config(load_config(DEMO, SMALL))
    averaged = estimate_config(load_config(DEMO, [*SMALL, "train.ema_decay=0.999"]))
    params = sum(p.numel() * p.element_size() for p in Seq2SeqTransformer(
        load_config(DEMO, SMALL).model, 300, 0).parameters())
    assert averaged.total - plain.total == pytest.approx(params, rel=0.01)


def test_train_refuses_a_run_beyond_the_limit_in_one_line_and_writes_nothing(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LIMIT_ENV, "1")
    res = run_script("train.py", "--config", str(DEMO), "--runs", str(tmp_path / "runs"), "--set",
                     "model.d_ff=1000000")
    assert res.returncode == 2 and res.stderr.startswith("error: model.d_ff: 1000000 would need ~"), res.stderr
    assert len(res.stderr.splitlines()) == 1 and res.stderr.rstrip().endswith("limit: 1.0 GiB from FR2EN_MEMORY_GIB)")
    assert not (tmp_path / "runs").exists()
