"""Anything load_config accepts works: random configs drawn over every key's declared range (edges included) either
are refused in one line by validation, or build, train two steps and decode. And every numeric key, found by walking
the config's sections, takes extreme values (0, -1, its bounds and past them, 1e12, 1e300, 2**63, nan, inf, "1e400"):
each is refused in one line, or accepted with a memory estimate under the limit and above what the model holds."""

from __future__ import annotations

import copy
import random
import re
from pathlib import Path
from types import UnionType
from typing import Any, Union, get_args, get_origin

import pytest
import torch
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from models.decoding import beam_search, greedy_search
from models.positional import REGISTRY, names
from models.transformer import Seq2SeqTransformer
from utils.config import Config, ConfigError, from_dict

PAD, BOS, EOS, V = 0, 1, 2, 40


def pick(rng: random.Random, usual: Any, *edges: Any) -> Any:
    """``usual`` three times in four, else one of the ``edges`` (range ends, odd combinations)."""
    return usual if not edges or rng.random() < 0.75 else rng.choice(edges)


def random_model(rng: random.Random) -> dict[str, Any]:
    n_heads = rng.choice([1, 2, 3, 4])
    head_dim = rng.choice([1, 2, 3, 4, 6, 8])
    return {
        "d_model": n_heads * head_dim * pick(rng, 8, 1) if rng.random() < 0.95 else rng.randint(1, 24),
        "n_heads": n_heads, "encoder_layers": rng.choice([1, 2]), "decoder_layers": rng.choice([1, 2]),
        "d_ff": pick(rng, 16, 1, 4), "dropout": pick(rng, 0.0, 0.5, 0.99), "attention_dropout": pick(rng, 0.0, 0.3),
        "activation_dropout": pick(rng, 0.0, 0.3), "activation": pick(rng, "relu", "gelu"),
        "norm": pick(rng, "pre", "post"), "tie_embeddings": pick(rng, True, False),
        "scale_embeddings": pick(rng, True, False), "input_pe": rng.choice(names("input")),
        "attention_pe": rng.choice(names("attention")), "cross_attention_pe": pick(rng, "none", *names("attention")),
        "max_positions": pick(rng, 1024, 1, 2, 3, 16, 64, 65), "gaussian_sigma": pick(rng, 1e-3, 2.0, 100.0),
        "rope": {"theta": pick(rng, 10000.0, 1e-3, 1.0, 1.5), "dim": pick(rng, None, None, 2, 4),
                 "scaling": rng.choice(["none", "linear", "ntk", "yarn"]), "factor": pick(rng, 1.0, 4.0),
                 "original_max_len": pick(rng, 16, 1), "beta_fast": pick(rng, 32.0, 2.0),
                 "beta_slow": pick(rng, 1.0, 0.5)},
        "shaw": {"max_distance": pick(rng, 4, 1), "values": pick(rng, True, False)},
        "t5": {"num_buckets": pick(rng, 32, 2, 3, 4), "max_distance": pick(rng, 128, 1, 2, 8, 17)},
    }


def random_augment(rng: random.Random) -> dict[str, Any]:
    """``model.augment``: a method one time in two, its settings at their range ends now and then."""
    return {"method": rng.choice(["none", "none", "none", "shape", "randomized", "cape"]),
            "shape": {"max_shift": pick(rng, 100, 1, 3)},
            "randomized": {"max_length": pick(rng, 128, None, 8, 65, 2048)},
            "cape": {"max_global_shift": pick(rng, 5.0, 0.0, 50.0), "max_local_shift": pick(rng, 1.0, 0.0, 1.5),
                     "max_global_scaling": pick(rng, 1.03, 1.0, 2.0)}}


def random_raw(rng: random.Random) -> dict[str, Any]:
    max_len = pick(rng, 64, 1, 8)
    raw = {
        "name": "prop", "seed": pick(rng, 1, 0, 2**31 - 1, -1),
        "data": {"source": "demo", "min_len": pick(rng, 1, 0, 3), "max_len": max_len,
                 "max_train_len": pick(rng, None, 1, 16), "max_len_ratio": pick(rng, None, 1.0, 3.0),
                 "max_tokens": pick(rng, max_len + 2, 300, 2000), "valid_max_tokens": pick(rng, None, 3, 300)},
        "tokenizer": {"type": rng.choice(["bpe", "unigram", "char", "word"]), "vocab_size": pick(rng, 300, 1, 50, 2000),
                      "min_frequency": pick(rng, 0, 1, 5), "lowercase": pick(rng, True, False),
                      "byte_fallback": pick(rng, True, False)},
        "model": random_model(rng),
        "train": {"lr": pick(rng, 1e-3, 0.0, 1.0), "scheduler": rng.choice(["inverse_sqrt", "constant"]),
                  "warmup_steps": pick(rng, 100, 0, 1), "accumulate": pick(rng, 1, 2), "clip_norm": pick(rng, 0.0, 1.0),
                  "label_smoothing": pick(rng, 0.0, 0.5, 0.99), "weight_decay": pick(rng, 0.0, 0.1),
                  "keep_checkpoints": pick(rng, 0, 2), "checkpoint_every": pick(rng, 0, 1),
                  "log_attention_every": pick(rng, 0, 1), "valid_beam": pick(rng, 1, 3)},
        "decode": {"beam": rng.choice([1, 2, 5]), "nbest": pick(rng, 1, 2), "lenpen": pick(rng, 0.0, 0.6, 5.0),
                   "max_len_a": pick(rng, 1.5, 0.0), "max_len_b": pick(rng, 10, 0), "batch_size": pick(rng, 64, 1),
                   "beam_stop": rng.choice(["bound", "k_finished"])},
    }
    raw["model"]["augment"] = random_augment(rng)  # drawn last: every other key is drawn as before it existed
    return raw


def accepted(raw: dict[str, Any]) -> Config | None:
    try:
        return from_dict(raw)
    except ConfigError as e:
        assert "\n" not in str(e)
        return None


def exercise_model(cfg: Config, seed: int) -> None:
    """Build, two optimizer steps, greedy and beam decoding: finite loss, one hypothesis each within its cap."""
    torch.manual_seed(seed)
    model = Seq2SeqTransformer(cfg.model, V, PAD)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    length = min(6, (model.max_length or 64) - 1, cfg.data.max_len + 1)  # what training feeds it (eos included)
    for _ in range(2):
        body = torch.randint(3, V, (3, max(length - 1, 1)))
        src = torch.cat([body, torch.full((3, 1), EOS)], 1)[:, :length]
        tgt = torch.cat([torch.full((3, 1), BOS), body[:, : length - 1], torch.full((3, 1), EOS)], 1)
        logits = model(src, tgt[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten())
        assert torch.isfinite(loss)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    d = cfg.decode
    caps = dict(max_len_a=d.max_len_a, max_len_b=d.max_len_b)
    assert len(greedy_search(model, src, bos=BOS, eos=EOS, **caps)) == 3
    nbest = beam_search(model, src, bos=BOS, eos=EOS, beam=d.beam, nbest=d.nbest, lenpen=d.lenpen, stop=d.beam_stop,
                        **caps)
    assert all(1 <= len(h) <= d.nbest for h in nbest)


@pytest.mark.parametrize("seed", range(200))
def test_a_random_accepted_model_config_builds_trains_and_decodes(seed: int) -> None:
    cfg = accepted(random_raw(random.Random(seed)))
    if cfg is not None:
        exercise_model(cfg, seed)


def accepted_seeds(count: int, start: int = 1000) -> list[int]:
    seeds, seed = [], start
    while len(seeds) < count:
        if accepted(random_raw(random.Random(seed))) is not None:
            seeds.append(seed)
        seed += 1
    return seeds


@pytest.mark.parametrize("seed", accepted_seeds(8))
def test_a_random_accepted_config_trains_two_steps_and_translates(seed: int, tmp_path: Path) -> None:
    """The whole path train.py and inference.py take, data, tokenizer and schedule keys included."""
    from data.sources import DataError
    from utils.run.load import load_run
    from utils.run.store import create_run_dir
    from utils.training.loop import train
    from utils.translation.translate import translate

    raw = random_raw(random.Random(seed))
    raw["data"]["cache_dir"] = str(tmp_path / "cache")
    raw["train"].update(max_steps=2, eval_every=2, valid_bleu_sentences=4, epochs=2, num_threads=1)
    cfg = from_dict(raw)
    run = create_run_dir(cfg, tmp_path / "runs")
    try:
        train(cfg, run)
    except DataError as e:  # the one outcome that depends on the corpus, not the config: a clear line, before step 1
        assert re.fullmatch(r"no (training|validation) pairs left after length filtering \(see data.min_len / "
                            r"data.max_len\)", str(e)), e
        return
    loaded = load_run(run)
    for beam in (1, cfg.decode.beam):
        decode = cfg.decode.__class__(**{**cfg.decode.__dict__, "beam": beam, "nbest": min(cfg.decode.nbest, beam)})
        out = translate(loaded.model, loaded.tokenizer, ["Bonjour le monde.", "Le chat dort."], decode)
        assert [len(n) >= 1 for n in out] == [True, True]


@pytest.mark.parametrize(("sets", "message"), [
    (["seed=-1"], "seed: must be >= 0 and < 2147483648, got -1"),
    (["model.input_pe=binary", "model.d_model=8", "model.n_heads=2"],
     "model.input_pe=binary needs 10 bits for model.max_positions=1024, which leaves no room in model.d_model=8"),
    (["model.attention_pe=rope", "model.d_model=12", "model.n_heads=4"],
     "model.attention_pe=rope rotates pairs of dimensions, but the head dimension model.d_model/model.n_heads = "
     "12/4 = 3 is odd (or set an even model.rope.dim)"),
    (["model.input_pe=onehot", "model.d_model=32", "model.n_heads=4"],
     "model.input_pe=onehot represents 32 positions (model.d_model=32), fewer than the 65 of a data.max_len=64 "
     "sentence with its eos"),
    (["model.attention_pe=t5", "model.t5.num_buckets=2"], "model.attention_pe=t5 needs model.t5.num_buckets >= 4"),
    (["model.cross_attention_pe=t5", "model.t5.max_distance=16"],
     "model.t5.max_distance: must exceed the 16 exact distances of model.t5.num_buckets=32, got 16"),
    (["model.attention_pe=rope", "model.rope.theta=1"], "model.rope.theta: must be > 1 and <= 1e+12, got 1.0"),
    (["tokenizer.vocab_size=200"], "tokenizer.vocab_size: must be > 260 (256 byte tokens with tokenizer.byte_fa"),
    (["data.min_len=70"], "data.min_len: 70 exceeds the longest training pair allowed"),
    (["data.valid_max_tokens=10"], "data.valid_max_tokens: 10 cannot hold one sentence of data.max_len=64"),
])
def test_values_that_used_to_crash_deep_inside_are_refused_where_declared(sets: list[str], message: str) -> None:
    from utils.config import load_config

    with pytest.raises(ConfigError) as err:
        load_config(Path(__file__).resolve().parents[1] / "configs" / "demo.yaml", sets)
    assert str(err.value).startswith(message)


def test_a_set_that_would_be_silently_ignored_is_refused_or_reported(caplog) -> None:
    from utils.config import load_config

    bench = Path(__file__).resolve().parents[1] / "configs" / "bench_small.yaml"
    with pytest.raises(ConfigError, match=r"^--set train.warmup_steps=500 would be ignored: train.warmup_tokens="
                       r"750000 sets the warmup \(add --set train.warmup_tokens=null to count it in steps\)$"):
        load_config(bench, ["train.warmup_steps=500"])
    assert load_config(bench, ["train.warmup_steps=500", "train.warmup_tokens=null"]).train.warmup_steps == 500
    with caplog.at_level("WARNING", logger="config"):
        cfg = load_config(bench, ["model.rope.scaling=yarn", "train.keep_checkpoints=0", "train.checkpoint_every=7"])
    assert cfg.model.rope.scaling == "yarn"  # inert, kept, and said
    assert [r.getMessage() for r in caplog.records] == [
        "--set model.rope.scaling=yarn has no effect: model.rope is read by rope, which is in none of encoder input "
        "(sinusoidal), encoder self-attention (none), decoder input (sinusoidal), decoder self-attention (none), "
        "cross-attention (none)",
        "--set train.checkpoint_every=7 has no effect: train.keep_checkpoints=0 keeps no periodic checkpoints"]


def test_a_config_path_that_is_a_device_is_named_as_such() -> None:
    from utils.config import load_config

    with pytest.raises(ConfigError, match=r"^/dev/null is not a regular file \(a device or a pipe\), not a config"):
        load_config("/dev/null")


# ---------------------------------------------------------------------------------------------- every numeric key
# Extreme values, one key at a time, on a small config where that key is read: refused in one ConfigError line, or
# accepted with a memory estimate under the limit that is an upper bound on the model it builds.

EXTREMES: list[Any] = [0, -1, 1e12, 1e300, 2**63, float("nan"), float("inf"), "1e400"]
#: The small config the extremes are set on; each key's own encoding or augmentation is switched on (``base_for``).
SMALL: dict[str, Any] = {
    "name": "extreme", "data": {"source": "demo", "max_len": 8, "max_tokens": 64},
    "tokenizer": {"type": "bpe", "vocab_size": V, "byte_fallback": False},
    "model": {"d_model": 16, "n_heads": 2, "encoder_layers": 1, "decoder_layers": 1, "d_ff": 32},
}


def numeric_keys(section: type[BaseModel] = Config, prefix: str = "") -> list[tuple[str, FieldInfo]]:
    """(dotted key, field) of every number, optional number or list of numbers below ``section``, walked through
    pydantic: a key added later is found with no edit here."""
    out = []
    for name, field in section.model_fields.items():
        tp = field.annotation
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            out += numeric_keys(tp, f"{prefix}{name}.")
            continue
        options = [a for a in get_args(tp) if a is not type(None)] if get_origin(tp) in (Union, UnionType) else [tp]
        items = [get_args(o)[0] for o in options if get_origin(o) is list] or options
        if all(o in (int, float) for o in items):
            out.append((f"{prefix}{name}", field))
    return out


def bounds(field: FieldInfo) -> list[Any]:
    """The field's own bounds, and one past its upper bound."""
    out = []
    for meta in field.metadata:
        for name in ("ge", "gt", "le", "lt"):
            if hasattr(meta, name):
                out.append(getattr(meta, name))
                if name in ("le", "lt"):
                    out.append(getattr(meta, name) + 1)
    return out


def base_for(key: str) -> dict[str, Any]:
    """``SMALL`` with the encoding that reads ``key`` in use (its settings section, or ``reads``), or the
    augmentation method whose settings it is."""
    raw = copy.deepcopy(SMALL)
    parts = key.split(".")
    if parts[0] != "model":
        return raw
    m = raw["model"]
    if parts[1] == "augment" and len(parts) == 4:
        m["augment"] = {"method": parts[2], "randomized": {"max_length": 64}}
        return raw
    for level, classes in REGISTRY.items():
        for name, cls in classes.items():
            if cls is not None and ((cls.settings or ("",))[0] == parts[1] or parts[1] in cls.reads):
                if level == "input":
                    m["input_pe"] = name
                elif cls.causal_only:
                    m["decoder_pe"] = {"attention": name}
                else:
                    m["attention_pe"] = name
                return raw
    return raw


def set_key(raw: dict[str, Any], key: str, value: Any, field: FieldInfo) -> None:
    *path, last = key.split(".")
    node = raw
    for part in path:
        node = node.setdefault(part, {})
    default = field.get_default(call_default_factory=True)
    node[last] = [value, *default[1:]] if isinstance(default, list) else value


def held_bytes(model: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


NUMERIC = numeric_keys()


@pytest.fixture(scope="module")
def limit() -> int:
    """A limit below any test machine's memory, so that the outcomes do not depend on the machine."""
    from models.memory import LIMIT_ENV, memory_limit

    mp = pytest.MonkeyPatch()
    mp.setenv(LIMIT_ENV, "4")
    yield memory_limit()[0]
    mp.undo()


@pytest.mark.parametrize(("key", "field"), NUMERIC, ids=[k for k, _ in NUMERIC])
def test_extreme_values_of_every_numeric_key_are_refused_in_one_line_or_fit_the_estimate(
        key: str, field: FieldInfo, limit: int) -> None:
    from models.memory import check, estimate_config

    small = []
    for value in [*EXTREMES, *bounds(field)]:
        raw = base_for(key)
        set_key(raw, key, value, field)
        try:
            cfg = from_dict(raw, warn=False)
            check(cfg)  # train.py's check before anything is allocated
        except ConfigError as e:  # any other exception fails the test
            assert "\n" not in str(e) and str(e), (key, value)
            continue
        estimate = estimate_config(cfg)
        assert estimate.total <= limit, (key, value)
        layers = cfg.model.encoder_layers + cfg.model.decoder_layers  # each takes ~1 ms to build, even on meta
        if layers <= 100:
            with torch.device("meta"):  # the model's shapes, nothing allocated: at any accepted size
                assert held_bytes(Seq2SeqTransformer(cfg.model, cfg.tokenizer.vocab_size, PAD)) <= estimate.model
        if estimate.model < 2**24 and layers <= 24:
            small.append((value, cfg, estimate.model))
    if small:  # one accepted value, built for real
        value, cfg, model_bytes = random.Random(key).choice(small)
        assert held_bytes(Seq2SeqTransformer(cfg.model, cfg.tokenizer.vocab_size, PAD)) <= model_bytes, (key, value)


def test_the_hostile_sizes_are_within_reach_of_the_extremes() -> None:
    """The keys of the sizes that took the machine down are among those walked, with an upper bound each."""
    walked = dict(NUMERIC)
    for key in ("model.cope.npos_max", "model.augment.shape.max_shift", "model.augment.randomized.max_length",
                "model.sandwich.dim", "model.shaw.max_distance", "model.fire.mlp_width", "model.max_positions",
                "model.rope.factor", "model.rope.theta", "model.gaussian_sigma", "model.d_model", "model.d_ff",
                "model.encoder_layers", "model.decoder_layers", "model.n_heads", "tokenizer.vocab_size",
                "data.max_tokens", "data.max_len"):
        assert any(hasattr(m, "le") for m in walked[key].metadata), key
