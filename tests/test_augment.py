"""Training-time position augmentation (``model.augment``: SHAPE, randomized positions, CAPE): the positions each
method draws have its paper's distribution; eval mode and KV-cached decoding see plain positions (outputs
identical with and without the setting); a method an encoding in use cannot take is refused in one line naming
both keys; a tiny model trains with each method through train.py and translates."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import pytest
import torch
from conftest import train_cli, translate_cli

import models.transformer as transformer_module
from models.positional.absolute import sinusoid_table, sinusoids
from models.positional.augment import (
    AugmentConfig,
    CapeConfig,
    augmented_positions,
    cape_positions,
    randomized_positions,
    shape_positions,
)
from models.transformer import Seq2SeqTransformer
from utils.config import ConfigError, ModelConfig, load_config

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "configs" / "demo.yaml"
PAD = 0


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------------------------------------- the draws


def test_sinusoids_at_real_positions_extend_the_table() -> None:
    """The sinusoidal encoding takes real positions (CAPE): at integers they are the table's rows, bit for bit."""
    assert torch.equal(sinusoids(torch.arange(50, dtype=torch.float64), 33), sinusoid_table(50, 33))
    half = sinusoids(torch.tensor([2.5]), 8)[0]
    freqs = torch.exp(-math.log(10000.0) * torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    torch.testing.assert_close(half[0::2], torch.sin(2.5 * freqs).float())
    torch.testing.assert_close(half[1::2], torch.cos(2.5 * freqs).float())


def test_shape_shifts_every_position_by_one_offset_uniform_in_0_to_k() -> None:
    """Kiyono et al.: p_i = i + k, k ~ U{0..K}: consecutive integers from an offset that takes every value 0..K
    about equally often."""
    g = gen()
    offsets = Counter()
    for _ in range(2000):
        pos = shape_positions(7, 4, g)
        assert pos.dtype == torch.long and torch.equal(pos - pos[0], torch.arange(7))
        offsets[int(pos[0])] += 1
    assert sorted(offsets) == [0, 1, 2, 3, 4]
    assert all(abs(n - 400) < 100 for n in offsets.values()), offsets


def test_randomized_positions_are_a_sorted_uniform_subset_of_0_to_l() -> None:
    """Ruoss et al.: a sorted random subset of size T of {0..L-1}: strictly increasing, in range, and every
    position equally likely (T / L)."""
    g = gen()
    seen = Counter()
    draws = 3000
    for _ in range(draws):
        pos = randomized_positions(5, 12, g)
        assert pos.dtype == torch.long and len(pos) == 5
        assert (pos.diff() > 0).all() and 0 <= pos.min() and pos.max() < 12
        seen.update(pos.tolist())
    assert sorted(seen) == list(range(12))
    assert all(abs(n / draws - 5 / 12) < 0.05 for n in seen.values()), seen
    assert torch.equal(randomized_positions(12, 12, g), torch.arange(12))  # T = L: all of them
    # Uniform over subsets, not only over positions (the reference's choice(arange(L), (T,), replace=False)): each
    # of the C(6, 3) = 20 subsets about equally often (a chi-square test, seeded, so the same draws every run).
    from itertools import combinations

    from scipy.stats import chisquare

    subsets = Counter(tuple(randomized_positions(3, 6, g).tolist()) for _ in range(4000))
    assert sorted(subsets) == list(combinations(range(6), 3))
    assert chisquare(list(subsets.values())).pvalue > 0.01, subsets
    with pytest.raises(ValueError, match="needs more positions than model.augment.randomized.max_length=4"):
        randomized_positions(5, 4, g)


def test_cape_shift_jitter_and_scaling_stay_within_their_bounds() -> None:
    """Likhomanenko et al.: p_i = lambda (i + Delta + eps_i); each part checked alone, then all together
    (strictly increasing: the decoder's causal mask compares positions)."""
    g = gen()
    i = torch.arange(20, dtype=torch.float64)
    scales, shifts = [], []
    for _ in range(500):  # no jitter: lambda and Delta can be read back
        pos = cape_positions(20, CapeConfig(max_global_shift=5, max_local_shift=0, max_global_scaling=1.03), g)
        scale = float(pos[1] - pos[0])
        torch.testing.assert_close(pos, scale * (i + pos[0] / scale))
        scales.append(scale)
        shifts.append(float(pos[0]) / scale)
    assert 1 / 1.03 <= min(scales) < 0.98 and 1.02 < max(scales) <= 1.03
    assert -5 <= min(shifts) < -4.5 and 4.5 < max(shifts) <= 5
    jitter = torch.stack([cape_positions(20, CapeConfig(max_global_shift=0, max_local_shift=1,
                                                        max_global_scaling=1), g) - i for _ in range(500)])
    assert -0.5 <= jitter.min() < -0.45 and 0.45 < jitter.max() < 0.5  # eps_i ~ U[-w/2, w/2), w = 1
    assert jitter.std(0).min() > 0.2  # one eps per position
    for _ in range(500):
        pos = cape_positions(30, CapeConfig(), g)
        assert pos.dtype == torch.float64 and (pos.diff() > 0).all()
    still = cape_positions(9, CapeConfig(max_global_shift=0, max_local_shift=0, max_global_scaling=1), g)
    assert torch.equal(still, torch.arange(9, dtype=torch.float64))


def reference_cape_row(n_tokens: int, max_global_shift: float, max_local_shift: float, max_global_scaling: float,
                       u_shift: float, u_local: torch.Tensor, u_scale: float, pos_scale: float = 1.0) -> torch.Tensor:
    """One sequence of gcambara/cape's ``CAPE1d._augment_positions`` (training, ``normalize=False``), written out
    here with its uniform draws given as u in [0, 1) (``uniform_(a, b)`` is a + (b - a) u): positions
    pos_scale * t, delta ~ U(-max_global_shift, max_global_shift), delta_local ~ U(-eps/2, eps/2) with
    eps = pos_scale * max_local_shift, log_lambda ~ U(-log s, log s); (positions + delta + delta_local) *
    exp(log_lambda)."""
    positions = pos_scale * torch.arange(n_tokens, dtype=torch.float64)
    delta = -max_global_shift + 2 * max_global_shift * u_shift
    epsilon = pos_scale * max_local_shift
    delta_local = -epsilon / 2 + epsilon * u_local
    log_l = math.log(max_global_scaling)
    log_lambda = -log_l + 2 * log_l * u_scale
    return (positions + delta + delta_local) * math.exp(log_lambda)


@pytest.mark.parametrize("shift,local,scaling", [(5.0, 1.0, 1.03), (3.0, 0.5, 2.0), (0.0, 1.0, 1.5)])
def test_cape_positions_are_the_reference_codes_on_the_same_draws(shift: float, local: float, scaling: float) -> None:
    """``cape_positions`` against gcambara/cape's augmentation (above, per sequence) fed the same uniform draws, in
    the order ours takes them from its generator (Delta, the T jitters, lambda): the same positions, the global
    shift inside the scaling (lambda (i + Delta), not lambda i + Delta) and the jitter's width w = max_local_shift."""
    for seed in range(20):
        g = gen(seed)
        u_shift = float(torch.rand((), dtype=torch.float64, generator=g))
        u_local = torch.rand(13, dtype=torch.float64, generator=g)
        u_scale = float(torch.rand((), dtype=torch.float64, generator=g))
        ours = cape_positions(13, CapeConfig(max_global_shift=shift, max_local_shift=local,
                                             max_global_scaling=scaling), gen(seed))
        reference = reference_cape_row(13, shift, local, scaling, u_shift, u_local, u_scale)
        torch.testing.assert_close(ours, reference, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("cfg", [{"method": "shape"}, {"method": "randomized", "randomized": {"max_length": 40}},
                                 {"method": "cape"}], ids=["shape", "randomized", "cape"])
def test_a_seed_fixes_the_draws(cfg: dict) -> None:
    """The draws come from torch's global generator (seeded by train.py and checkpointed): same seed, same
    positions; the next draw differs."""
    aug = AugmentConfig(**cfg)
    torch.manual_seed(7)
    first, second = augmented_positions(aug, 11), augmented_positions(aug, 11)
    torch.manual_seed(7)
    assert torch.equal(augmented_positions(aug, 11), first) and torch.equal(augmented_positions(aug, 11), second)
    assert not torch.equal(first, second)


# ---------------------------------------------------------------------------------------------- the model


def model(augment: dict | None = None, input_pe: str = "sinusoidal", attention_pe: str = "none",
          **kw) -> Seq2SeqTransformer:
    torch.manual_seed(0)
    cfg = dict(d_model=32, n_heads=4, encoder_layers=2, decoder_layers=2, d_ff=64, dropout=0.0, max_positions=64,
               input_pe=input_pe, attention_pe=attention_pe, augment=augment or {}, **kw)
    return Seq2SeqTransformer(ModelConfig(**cfg), 40, PAD)


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = gen(1)
    src = torch.randint(4, 40, (3, 9), generator=g)
    src[1, 6:] = PAD
    return src, torch.randint(4, 40, (3, 7), generator=g)


CASES = {  # method -> (augment, input_pe, attention_pe, extra model keys): encodings each method may train with
    "shape-sinusoidal": ({"method": "shape"}, "sinusoidal", "none", {}),
    "shape-learnable+alibi": ({"method": "shape", "shape": {"max_shift": 40}}, "learnable", "alibi", {}),
    "shape-binary": ({"method": "shape", "shape": {"max_shift": 40}}, "binary", "none", {}),
    "randomized-learnable+t5": ({"method": "randomized", "randomized": {"max_length": 64}}, "learnable", "t5", {}),
    "randomized-sinusoidal+shaw": ({"method": "randomized", "randomized": {"max_length": 200}}, "sinusoidal",
                                   "shaw", {}),
    "randomized-rope": ({"method": "randomized", "randomized": {"max_length": 200}}, "none", "rope", {}),
    "cape-sinusoidal": ({"method": "cape"}, "sinusoidal", "none", {}),
    "cape-rope": ({"method": "cape"}, "none", "rope", {}),
    "cape-sinusoidal+alibi": ({"method": "cape"}, "sinusoidal", "alibi", {}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_eval_and_cached_decoding_are_unchanged_by_the_setting(case: str) -> None:
    """In eval mode the model with the setting computes what the model without it does, bit for bit (also after
    training-mode forwards that drew other positions); KV-cached decoding equals full decoding; in training mode
    the positions differ (the augmentation acts)."""
    augment, input_pe, attention_pe, kw = CASES[case]
    ours, plain = model(augment, input_pe, attention_pe, **kw), model(None, input_pe, attention_pe, **kw)
    src, tgt = batch()
    trained = ours.train()(src, tgt)
    ours.eval()
    plain.eval()
    full = ours(src, tgt)
    assert torch.equal(full, plain(src, tgt))
    assert not torch.allclose(trained, full, atol=1e-4)
    memory, src_mask = ours.encode(src)
    cache = ours.new_cache()
    steps = [ours.decode(tgt[:, t : t + 1], memory, src_mask, cache=cache) for t in range(tgt.shape[1])]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    ours.train()  # a cached step is never augmented, in training mode either
    cache = ours.new_cache()
    steps = [ours.decode(tgt[:, t : t + 1], memory, src_mask, cache=cache) for t in range(tgt.shape[1])]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


def test_each_stack_draws_its_own_positions_in_training_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Encoder and decoder draw independently (SHAPE: as the authors' code, one offset per embedding module);
    eval mode draws nothing."""
    drawn: list[tuple[int, int]] = []

    def spy(cfg: AugmentConfig, length: int, device: torch.device | str | None = None) -> torch.Tensor:
        pos = augmented_positions(cfg, length, device)
        drawn.append((length, int(pos[0])))
        return pos

    monkeypatch.setattr(transformer_module, "augmented_positions", spy)
    m = model({"method": "shape", "shape": {"max_shift": 3}})
    src, tgt = batch()
    m.eval()(src, tgt)
    assert drawn == []
    m.train()
    for _ in range(200):
        m(src, tgt)
    assert [length for length, _ in drawn[:2]] == [9, 7] and len(drawn) == 400  # encoder, then decoder
    pairs = Counter((drawn[i][1], drawn[i + 1][1]) for i in range(0, 400, 2))
    assert len(pairs) == 16  # every (encoder offset, decoder offset) pair: not one shared offset


# ---------------------------------------------------------------------------------------------- validation


REFUSED = [
    (["model.augment.method=cape", "model.input_pe=learnable"],
     r"^model.augment.method=cape draws real-valued positions, but model.input_pe=learnable takes integer "
     r"positions only \(CAPE needs encodings defined on real positions: sinusoidal, rope, alibi, kerple_log, "
     r"kerple_power, sandwich, fire, dpb, cope, xpos\)$"),
    (["model.augment.method=cape", "model.input_pe=none", "model.attention_pe=t5"],
     r"^model.augment.method=cape draws real-valued positions, but model.attention_pe=t5 takes integer"),
    (["model.augment.method=cape", "model.input_pe=none", "model.attention_pe=shaw"],
     r"^model.augment.method=cape draws real-valued positions, but model.attention_pe=shaw takes integer"),
    (["model.augment.method=cape", "model.decoder_pe.input=onehot"],
     r"^model.augment.method=cape draws real-valued positions, but model.decoder_pe.input=onehot takes integer"),
    (["model.augment.method=randomized", "model.augment.randomized.max_length=2048", "model.input_pe=learnable"],
     r"^model.augment.randomized.max_length=2048 draws positions up to 2047, but model.input_pe=learnable "
     r"represents 1024 positions \(model.max_positions=1024\)$"),
    (["model.augment.method=randomized"], r"^model.augment.randomized.max_length: required with "
                                          r"model.augment.method=randomized \(L: positions are drawn from 0..L-1"),
    (["model.augment.method=randomized", "model.augment.randomized.max_length=20"],
     r"^model.augment.randomized.max_length: 20 is fewer than the 65 positions of a training sentence with its "
     r"eos \(data.max_len=64 and the eos\)$"),
    (["model.augment.method=shape", "model.input_pe=onehot", "model.d_model=128"],
     r"^model.augment.shape.max_shift=100 shifts positions up to 164 \(data.max_len=64 and the eos, plus 100\), "
     r"but model.input_pe=onehot represents 128 positions \(model.d_model=128\)$"),
    (["model.augment.method=shape", "model.input_pe=none", "model.attention_pe=rope"],
     r"^model.augment.method=shape changes nothing here: it adds one offset to every position of a sequence, and "
     r"the encodings in use \(model.input_pe=none, model.attention_pe=rope\) depend on position differences only"),
    (["model.augment.method=shape", "model.cross_attention_pe=alibi"],
     r"^model.augment.method=shape with model.cross_attention_pe=alibi: cross-attention relates target to source"),
    (["model.augment.method=cape", "model.input_pe=none"],
     r"^model.augment.method=cape: no encoding in use reads positions \(model.input_pe=none, "
     r"model.attention_pe=none\)$"),
    (["model.augment.method=cape", "model.input_pe=none", "model.decoder_pe.attention=cope"],
     r"^model.augment.method=cape: no encoding in use reads positions \(model.input_pe=none, model.attention_pe=none, "
     r"model.decoder_pe.attention=cope; cope reads only their order, which every method keeps\)$"),
    (["model.augment.method=cape", "model.augment.cape.max_local_shift=1.5"],
     r"^model.augment.cape.max_local_shift: must be <= 1 \(a jitter of at most half a position either way keeps "
     r"positions in order, which the decoder's causal mask needs\), got 1.5$"),
    (["model.augment.cape.max_global_scaling=0.9"],
     r"^model.augment.cape.max_global_scaling: must be >= 1 and <= 100, got 0.9$"),
    (["model.augment.shape.max_shift=0"], r"^model.augment.shape.max_shift: must be >= 1 and <= 1000000, got 0$"),
    (["model.augment.method=shap"], r"^model.augment.method: 'shap' is not one of: none, shape, randomized, cape$"),
]


@pytest.mark.parametrize("overrides,line", REFUSED, ids=[f"refused{i}" for i in range(len(REFUSED))])
def test_a_method_an_encoding_cannot_take_is_refused_in_one_line(overrides: list[str], line: str) -> None:
    with pytest.raises(ConfigError, match=line) as err:
        load_config(DEMO, overrides)
    assert "\n" not in str(err.value)


def test_what_each_method_accepts() -> None:
    """SHAPE with a table large enough, or beside a shift-invariant one in the other stack; randomized with integer
    relative encodings; CAPE with the real-position ones; training length from data.max_train_len if stricter."""
    for overrides in (["model.input_pe=learnable", "model.max_positions=165"],
                      ["model.input_pe=none", "model.attention_pe=rope", "model.decoder_pe.input=sinusoidal"]):
        assert load_config(DEMO, ["model.augment.method=shape", *overrides]).model.augment.method == "shape"
    load_config(DEMO, ["model.augment.method=shape", "model.input_pe=onehot", "model.d_model=128",
                       "data.max_train_len=16"])  # 17 + 100 positions fit in 128
    load_config(DEMO, ["model.augment.method=randomized", "model.augment.randomized.max_length=1024",
                       "model.input_pe=learnable", "model.attention_pe=t5"])
    load_config(DEMO, ["model.augment.method=cape", "model.input_pe=none", "model.encoder_pe.attention=rope",
                       "model.decoder_pe.attention=alibi"])


def test_the_setting_shapes_no_parameter_and_unused_keys_are_said(caplog: pytest.LogCaptureFixture) -> None:
    """A model trained with augmentation loads under a config without it (same fingerprint: it changes only
    training); a method's key set while another method is chosen is reported as without effect."""
    from utils.run.checkpoint import model_fingerprint
    from utils.run.load import check_compatible

    plain = load_config(DEMO)
    shaped = load_config(DEMO, ["model.augment.method=shape", "model.augment.shape.max_shift=7"])
    assert model_fingerprint(shaped.model, 500) == model_fingerprint(plain.model, 500)
    check_compatible(shaped, plain, "test")
    with caplog.at_level("WARNING", logger="config"):
        load_config(DEMO, ["model.augment.cape.max_global_shift=2"])
    assert [r.getMessage() for r in caplog.records] == [
        "--set model.augment.cape.max_global_shift=2 has no effect: model.augment.method=none"]


# ---------------------------------------------------------------------------------------------- train.py


TRAINED = {
    "shape": (["model.augment.method=shape"], "shape (k ~ U{0..100})"),
    "randomized": (["model.augment.method=randomized", "model.augment.randomized.max_length=256",
                    "model.input_pe=learnable", "model.attention_pe=t5"], "randomized (sorted subset of 0..255)"),
    "cape": (["model.augment.method=cape", "model.attention_pe=rope"],
             "cape (global shift 5, local shift 1, global scaling 1.03)"),
}


@pytest.mark.parametrize("method", list(TRAINED))
def test_train_py_trains_with_each_method_and_inference_py_translates(tmp_path: Path, method: str) -> None:
    """train.py with each method, then inference.py: its lines are the in-process translations of the loaded model
    (the command line's wiring; that eval mode ignores the setting: test_eval_and_cached_decoding_are_unchanged...)."""
    from utils.run.load import load_run
    from utils.translation.translate import translate

    sets, described = TRAINED[method]
    res = train_cli(tmp_path, *sets)
    assert res.returncode == 0, res.stderr[-3000:]
    run_dir = next(p for p in (tmp_path / "runs").glob("demo_2*") if p.is_dir())
    log = (run_dir / "train.log").read_text()
    assert f"; in training {described}" in log
    assert json.loads((run_dir / "summary.json").read_text())["augment"] == described  # what the run trained with
    run = load_run(run_dir, device="cpu")
    assert run.cfg.model.augment.method == method and run.step == 3 and not run.model.training
    sources = ["Le chat dort.", "Il fait beau aujourd'hui."]
    res = translate_cli(run_dir, sources, "--beam", "1")
    assert res.returncode == 0, res.stderr[-3000:]
    decode = run.cfg.decode.model_copy(update={"beam": 1})
    assert res.stdout.splitlines() == [n[0].text for n in translate(run.model, run.tokenizer, sources, decode)]


@pytest.mark.parametrize("sets,exportable", [
    (["model.augment.method=shape"], True),
    (["model.augment.method=cape", "model.input_pe=none", "model.attention_pe=rope"], True),
    (["model.augment.method=randomized", "model.augment.randomized.max_length=256", "model.input_pe=learnable"], True),
    (TRAINED["randomized"][0], False), (TRAINED["cape"][0], False)],  # an input- and an attention-level encoding
    ids=["shape", "cape-rope", "randomized", "learnable-t5", "sinusoidal-rope"])
def test_an_augmented_model_exports_as_its_encoding_does(sets: list[str], exportable: bool) -> None:
    """CTranslate2 export ignores the augmentation: the same verdict (accepted, or the same one-line refusal) with
    and without it."""
    from utils.translation.export import ExportError, check_exportable

    def verdict(overrides: list[str]) -> str:
        try:
            check_exportable(load_config(DEMO, overrides))
        except ExportError as err:
            return str(err)
        return "exportable"

    assert verdict(sets) == verdict([s for s in sets if not s.startswith("model.augment.")])
    assert (verdict(sets) == "exportable") == exportable


def test_train_py_refuses_an_encoding_the_method_cannot_take_in_one_line(tmp_path: Path) -> None:
    res = train_cli(tmp_path, "model.augment.method=cape", "model.input_pe=learnable")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines()[-1].endswith(
        "model.augment.method=cape draws real-valued positions, but model.input_pe=learnable takes integer "
        "positions only (CAPE needs encodings defined on real positions: sinusoidal, rope, alibi, kerple_log, "
        "kerple_power, sandwich, fire, dpb, cope, xpos)")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


@pytest.mark.parametrize("name", ["kerple_log", "kerple_power", "sandwich", "fire", "dpb", "xpos", "cope"])
def test_the_newer_attention_encodings_take_real_positions_from_cape(name: str) -> None:
    """Each declares ``positions = "real"``: CAPE's real positions validate and give a finite forward in training,
    and eval is what the model without the setting computes (causal-only ones in decoder self-attention)."""
    from models.positional import REGISTRY

    placed = ({"attention_pe": "none", "decoder_pe": {"attention": name}} if REGISTRY["attention"][name].causal_only
              else {"attention_pe": name})
    input_pe = "sinusoidal" if REGISTRY["attention"][name].order_only else "none"  # CoPE alone: refused (above)
    sets = [f"model.{k}={v}" for k, v in placed.items() if k == "attention_pe"]
    sets += [f"model.decoder_pe.attention={name}"] if "decoder_pe" in placed else []
    load_config(Path(__file__).resolve().parents[1] / "configs" / "demo.yaml",
                [f"model.input_pe={input_pe}", "model.augment.method=cape", *sets])  # validates
    ours, plain = model({"method": "cape"}, input_pe, **placed), model(None, input_pe, **placed)
    src, tgt = batch()
    assert torch.isfinite(ours.train()(src, tgt)).all()
    assert torch.equal(ours.eval()(src, tgt), plain.eval()(src, tgt))


# ---------------------------------------------------------------------------------------------- registry-wide


def _augmented_cases() -> list[tuple[str, str, str]]:
    """(method, input encoding, attention encoding): each encoding of the registry with each method validation
    accepts it with on the tiny model's sizes, beside the first partner that makes the pair valid (an input
    encoding beside no attention encoding or else RoPE; an attention encoding, causal-only ones in decoder
    self-attention, beside no input encoding or else the sinusoids)."""
    from models.positional import REGISTRY

    def valid(method: str, inp: str, att: str) -> bool:
        try:
            load_config(DEMO, [*_sets(method, inp, att), "data.max_len=24", "data.max_train_len=16"])
        except ConfigError:
            return False
        return True

    cases = []
    for method in AUGMENT:
        pairs = [[(inp, att) for att in ("none", "rope")] for inp in REGISTRY["input"]]
        pairs += [[(inp, att) for inp in ("none", "sinusoidal")] for att in REGISTRY["attention"]]
        for options in pairs:
            chosen = next(((method, i, a) for i, a in options if valid(method, i, a)), None)
            if chosen is not None and chosen not in cases:
                cases.append(chosen)
    return cases


AUGMENT = {"shape": {"method": "shape", "shape": {"max_shift": 10}},  # 17 + 10 positions: one-hot's 32 hold them
           "randomized": {"method": "randomized", "randomized": {"max_length": 30}},
           "cape": {"method": "cape"}}


def _placed(att: str) -> dict:
    from models.positional import REGISTRY

    cls = REGISTRY["attention"][att]
    return {"attention_pe": "none", "decoder_pe": {"attention": att}} if cls and cls.causal_only else {
        "attention_pe": att}


def _sets(method: str, inp: str, att: str) -> list[str]:
    """The overrides that give demo.yaml the tiny model's encodings, sizes and augmentation."""
    sets = [f"model.input_pe={inp}", "model.d_model=32", "model.n_heads=4", "model.max_positions=128",
            *(f"model.{k}={v}" if not isinstance(v, dict) else f"model.decoder_pe.attention={v['attention']}"
              for k, v in _placed(att).items())]
    for key, value in AUGMENT[method].items():
        sets += [f"model.augment.{key}.{k}={v}" for k, v in value.items()] if isinstance(value, dict) else [
            f"model.augment.{key}={value}"]
    return sets


AUGMENTED = _augmented_cases()


def test_every_method_is_covered_with_every_encoding_it_can_take() -> None:
    """The registry-wide test below covers each encoding with each method validation accepts it with: CAPE with
    every real-position encoding, randomized positions and SHAPE with every encoding (SHAPE with a shift-invariant
    attention encoding beside the sinusoids: they are what it shifts)."""
    from models.positional import REGISTRY

    by = {m: [(i, a) for mm, i, a in AUGMENTED if mm == m] for m in AUGMENT}
    real = {n for level in REGISTRY.values() for n, c in level.items() if c is not None and c.positions == "real"}
    assert {x for pair in by["cape"] for x in pair} == real | {"none"}
    every = set(REGISTRY["input"]) | set(REGISTRY["attention"])
    assert {x for pair in by["randomized"] for x in pair} == every
    assert {x for pair in by["shape"] for x in pair} == every
    assert {a for i, a in by["shape"] if i == "none"} == {"fire"}  # the one attention encoding SHAPE changes alone


@pytest.mark.parametrize("method,input_pe,attention_pe", AUGMENTED,
                         ids=[f"{m}-{i}-{a}" for m, i, a in AUGMENTED])
def test_every_accepted_encoding_trains_and_decodes_with_every_method(method: str, input_pe: str,
                                                                      attention_pe: str) -> None:
    """The registry-wide tests under augmentation: in training mode (positions drawn) the fused attention equals the
    explicit path on the same draw and gradients are finite; in eval mode the model equals the one without the
    setting, bit for bit, and KV-cached decoding equals full decoding."""
    def tiny(augment: dict | None) -> Seq2SeqTransformer:
        torch.manual_seed(0)
        cfg = dict(d_model=32, n_heads=4, encoder_layers=2, decoder_layers=2, d_ff=64, dropout=0.0, max_positions=128,
                   input_pe=input_pe, augment=augment or {}, **_placed(attention_pe))
        return Seq2SeqTransformer(ModelConfig(**cfg), 40, PAD)

    ours = tiny(AUGMENT[method])
    for name, p in ours.named_parameters():  # a table that starts at zeros (CoPE's) would hide its positions
        if ".pe." in name and p.abs().max() == 0:
            torch.nn.init.normal_(p)
    plain = tiny(None)
    plain.load_state_dict(ours.state_dict())
    src, tgt = batch()
    ours.train()
    torch.manual_seed(3)
    fused = ours(src, tgt)
    torch.manual_seed(3)
    explicit, _ = ours.forward_with_attention(src, tgt)
    torch.testing.assert_close(explicit, fused, atol=1e-5, rtol=1e-5)
    acts = not torch.allclose(fused, plain.train()(src, tgt), atol=1e-5)
    # The augmentation acts, but SHAPE on FIRE alone: below its threshold L (512) FIRE's normaliser is constant and
    # its bias depends on i - j only, so a shift of every position changes nothing.
    assert acts == ((method, input_pe, attention_pe) != ("shape", "none", "fire"))
    fused.sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in ours.parameters() if p.requires_grad)
    ours.eval()
    plain.eval()
    with torch.no_grad():
        full = ours(src, tgt)
        assert torch.equal(full, plain(src, tgt))
        memory, src_mask = ours.encode(src)
        cache = ours.new_cache()
        steps = [ours.decode(tgt[:, t : t + 1], memory, src_mask, cache=cache) for t in range(tgt.shape[1])]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
