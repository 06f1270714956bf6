"""xPos (Sun et al. 2022): the module's rotated q, k against the reference arithmetic, its relative scores and decay,
where it may be put (decoder self-attention only), its settings, figure, CTranslate2 refusal, and a tiny training
and translation through the command line."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT, train_cli, translate_cli

from models.config import StackPE
from models.positional import REGISTRY
from models.positional.rotary import RotaryPE
from models.positional.xpos import XposConfig, XposPE
from models.transformer import Seq2SeqTransformer
from utils.config import ConfigError, ModelConfig, RopeConfig, load_config

DEMO = ROOT / "configs" / "demo.yaml"
XPOS = ["model.input_pe=none", "model.encoder_pe.attention=rope", "model.decoder_pe.attention=xpos"]
SETTINGS = [(10000.0, 0.4, 512.0), (500.0, 0.7, 8.0)]  # torchscale's constants; others, with a strong decay


def xpos_layer(theta: float = 10000.0, gamma: float = 0.4, scale_base: float = 512.0, head_dim: int = 8) -> XposPE:
    cfg = ModelConfig(d_model=2 * head_dim, n_heads=2, attention_pe="none", decoder_pe=StackPE(attention="xpos"),
                      xpos=XposConfig(theta=theta, gamma=gamma, scale_base=scale_base))
    return XposPE(cfg, "decoder")


def torchscale_xpos(x: torch.Tensor, first: int, total: int, downscale: bool, theta: float = 10000.0,
                    gamma: float = 0.4, scale_base: float = 512.0) -> torch.Tensor:
    """The arithmetic of microsoft/torchscale ``torchscale/component/xpos_relative_position.py`` (``XPOS.forward``
    with ``offset = first``, ``length + offset = total``), written out per position and pair for small sizes.

    x ``[..., L, d]`` in torchscale's interleaved layout (pair i = dims 2i, 2i + 1) at positions first .. first+L-1
    of a sequence of ``total``: pair i rotates by n * theta^(-i/(d/2)) and is scaled by zeta_i^((n + min_pos)/B),
    zeta_i = (2i + gamma d) / ((1 + gamma) d), min_pos = -(total) // 2 = -ceil(total/2) (torchscale's centering), or
    by its inverse with ``downscale`` (keys). torchscale fixes theta = 10000 and gamma = 0.4; here they are arguments.
    """
    x = x.double()
    out = torch.empty_like(x)
    d = x.shape[-1]
    min_pos = -math.ceil(total / 2)
    for t in range(x.shape[-2]):
        n = first + t
        for i in range(d // 2):
            zeta = (2 * i + gamma * d) / ((1 + gamma) * d)
            s = zeta ** ((n + min_pos) / scale_base)
            s = 1 / s if downscale else s
            angle = n * theta ** (-i / (d // 2))
            a, b = x[..., t, 2 * i], x[..., t, 2 * i + 1]
            out[..., t, 2 * i] = s * (a * math.cos(angle) - b * math.sin(angle))
            out[..., t, 2 * i + 1] = s * (b * math.cos(angle) + a * math.sin(angle))
    return out


def interleaved(d: int) -> torch.Tensor:
    """Index that reads a rotate-half vector (pair i = dims i, i + d/2) in the interleaved layout (pair i = dims
    2i, 2i + 1): ``x[..., interleaved(d)]``; e.g. d = 8 -> [0, 4, 1, 5, 2, 6, 3, 7]."""
    return torch.stack((torch.arange(d // 2), torch.arange(d // 2) + d // 2), dim=1).flatten()


# The maths ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("theta,gamma,scale_base", SETTINGS)
def test_rotated_q_and_k_are_torchscales_up_to_its_centering(theta: float, gamma: float, scale_base: float) -> None:
    """Our q~, k~ are torchscale's (interleaved layout read in ours) times zeta^(+-c/B), c = ceil(T/2) its center;
    so every score q~_n . k~_m is torchscale's."""
    torch.manual_seed(0)
    pe, d, t = xpos_layer(theta, gamma, scale_base), 8, 7
    q, k = torch.randn(2, 2, t, d), torch.randn(2, 2, t, d)
    pos = torch.arange(t)
    rq, rk = pe.rotate(q, k, pos, pos)
    il = interleaved(d)
    ref_q = torchscale_xpos(q[..., il], 0, t, False, theta, gamma, scale_base)
    ref_k = torchscale_xpos(k[..., il], 0, t, True, theta, gamma, scale_base)
    zeta = torch.tensor([(2 * i + gamma * d) / ((1 + gamma) * d) for i in range(d // 2)], dtype=torch.float64)
    center = zeta.repeat_interleave(2) ** (math.ceil(t / 2) / scale_base)  # interleaved layout
    torch.testing.assert_close(rq[..., il].double(), ref_q * center, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(rk[..., il].double(), ref_k / center, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close((rq @ rk.transpose(-1, -2)).double(), ref_q @ ref_k.transpose(-1, -2),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("theta,gamma,scale_base", SETTINGS)
def test_a_decoding_step_over_keys_cached_rotated_scores_as_torchscales_step(theta: float, gamma: float,
                                                                             scale_base: float) -> None:
    """Keys rotated one step at a time at their own positions (our KV cache) and the query of step N - 1 give the
    scores of torchscale's step: query at offset N - 1, every key rotated again, both centered at ceil(N/2)."""
    torch.manual_seed(1)
    pe, d = xpos_layer(theta, gamma, scale_base), 8
    for n_keys in (1, 4, 9):
        q, k = torch.randn(1, 2, 1, d), torch.randn(1, 2, n_keys, d)
        cached = torch.cat([pe.rotate(k[:, :, m : m + 1], k[:, :, m : m + 1], torch.tensor([m]),
                                      torch.tensor([m]))[1] for m in range(n_keys)], dim=2)
        step = torch.tensor([n_keys - 1])
        rq, _ = pe.rotate(q, q, step, step)
        il = interleaved(d)
        ref_q = torchscale_xpos(q[..., il], n_keys - 1, n_keys, False, theta, gamma, scale_base)
        ref_k = torchscale_xpos(k[..., il], 0, n_keys, True, theta, gamma, scale_base)
        torch.testing.assert_close((rq @ cached.transpose(-1, -2)).double(), ref_q @ ref_k.transpose(-1, -2),
                                   atol=1e-5, rtol=1e-5)


def test_scores_depend_on_the_distance_only_and_each_pair_is_ropes_times_zeta_to_the_distance() -> None:
    """q~_n . k~_m depends on (n, m) only through n - m (shift-invariant); with q, k on one pair i of dims it is
    RoPE's score (same theta) times zeta_i^((n - m)/B): a decay with distance, faster for lower i."""
    gamma, scale_base, d, t = 0.4, 8.0, 8, 12
    pe = xpos_layer(500.0, gamma, scale_base)
    rope = RotaryPE(ModelConfig(d_model=16, n_heads=2, attention_pe="rope", rope=RopeConfig(theta=500.0)), "decoder")
    torch.manual_seed(2)
    q = torch.randn(1, 1, 1, d).expand(1, 1, t, d).contiguous()  # the same content at every position
    k = torch.randn(1, 1, 1, d).expand(1, 1, t, d).contiguous()
    pos = torch.arange(t)
    rq, rk = pe.rotate(q, k, pos, pos)
    scores = (rq @ rk.transpose(-1, -2))[0, 0]
    for shift in range(-(t - 1), t):
        diag = torch.diagonal(scores, offset=shift)
        torch.testing.assert_close(diag, diag[0].expand_as(diag), atol=1e-5, rtol=1e-5)
    rq2, rk2 = pe.rotate(q, k, pos + 37, pos + 37)
    torch.testing.assert_close(rq2 @ rk2.transpose(-1, -2), rq @ rk.transpose(-1, -2), atol=1e-4, rtol=1e-4)

    n, m = torch.meshgrid(pos, pos, indexing="ij")
    for i in range(d // 2):
        keep = torch.zeros(d)
        keep[[i, i + d // 2]] = 1.0  # pair i in the rotate-half layout
        qi, ki = q * keep, k * keep
        xq, xk = pe.rotate(qi, ki, pos, pos)
        oq, ok = rope.rotate(qi, ki, pos, pos)
        zeta = (i / (d / 2) + gamma) / (1 + gamma)
        expected = (oq @ ok.transpose(-1, -2))[0, 0].double() * zeta ** ((n - m).double() / scale_base)
        torch.testing.assert_close((xq @ xk.transpose(-1, -2))[0, 0].double(), expected, atol=1e-5, rtol=1e-5)


def test_the_xpos_tables_are_computed_once_per_forward(monkeypatch: pytest.MonkeyPatch) -> None:
    """2+3 layers, xPos in the decoder: one table per positions tensor and forward, also in a KV-cached step."""
    import models.positional.xpos as xpos

    cfg = load_config(DEMO, [*XPOS, "model.d_model=16", "model.n_heads=2", "model.decoder_layers=3"]).model
    torch.manual_seed(0)
    model = Seq2SeqTransformer(cfg, 50, 0).eval()
    calls: list[int] = []
    real = xpos.xpos_tables
    monkeypatch.setattr(xpos, "xpos_tables", lambda pos, *a: calls.append(len(pos)) or real(pos, *a))
    src, tgt = torch.randint(3, 50, (2, 6)), torch.randint(3, 50, (2, 4))
    with torch.no_grad():
        model(src, tgt)
        assert calls == [4]
        memory, mask = model.encode(src)
        cache = model.new_cache()
        for i in range(tgt.shape[1]):
            model.decode(tgt[:, i : i + 1], memory, mask, cache)
    assert calls == [4, 1, 1, 1, 1]


# Where it goes, its settings ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("key,where", [("model.attention_pe", "the encoder"),
                                       ("model.encoder_pe.attention", "the encoder"),
                                       ("model.cross_attention_pe", "cross-attention")])
def test_xpos_outside_decoder_self_attention_is_refused_in_one_line(key: str, where: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(DEMO, [f"{key}=xpos"])
    assert str(err.value) == (f"{key}=xpos puts it in {where}, but it is defined for causal (decoder) self-attention "
                              "only: set model.decoder_pe.attention=xpos")
    assert REGISTRY["attention"]["xpos"] is XposPE and XposPE.causal_only


def test_xpos_settings_are_its_own_section_checked_where_declared(caplog: pytest.LogCaptureFixture) -> None:
    m = load_config(DEMO, [*XPOS, "model.xpos.scale_base=256", "model.xpos.gamma=0.5"]).model
    assert (m.xpos.theta, m.xpos.gamma, m.xpos.scale_base) == (10000.0, 0.5, 256.0)
    assert m.describe_encodings() == "encoder rope, decoder xpos"
    model = Seq2SeqTransformer(m, 50, 0)
    assert all(isinstance(layer.self_attn.pe, XposPE) and layer.cross_attn.pe is None for layer in model.decoder)
    assert not any(isinstance(module, XposPE) for module in model.encoder.modules())
    with pytest.raises(ConfigError, match=r"^model.xpos.scale_base: "):
        load_config(DEMO, [*XPOS, "model.xpos.scale_base=0"])
    with pytest.raises(ConfigError, match=r"^model.decoder_pe.attention=xpos rotates pairs of dimensions, but the "
                                          r"head dimension model.d_model/model.n_heads = 6/2 = 3 is odd$"):
        load_config(DEMO, ["model.decoder_pe.attention=xpos", "model.d_model=6", "model.n_heads=2"])
    with caplog.at_level("WARNING", logger="config"):
        load_config(DEMO, ["model.xpos.gamma=0.5"])
    assert [r.getMessage() for r in caplog.records] == [
        "--set model.xpos.gamma=0.5 has no effect: model.xpos is read by xpos, which is in none of encoder input "
        "(sinusoidal), encoder self-attention (none), decoder input (sinusoidal), decoder self-attention (none), "
        "cross-attention (none)"]


@pytest.mark.parametrize("encoder", [name for name, cls in REGISTRY["attention"].items()
                                     if cls is None or not cls.causal_only])
def test_xpos_in_the_decoder_trains_beside_any_encoder_encoding(encoder: str) -> None:
    """A validated config per encoder encoding: forward, backward, finite gradients, 8 Adam steps lower the loss."""
    cfg = load_config(DEMO, ["model.input_pe=none", f"model.encoder_pe.attention={encoder}",
                             "model.decoder_pe.attention=xpos", "model.d_model=16", "model.n_heads=2", "model.d_ff=32",
                             "model.encoder_layers=1", "model.decoder_layers=1", "model.dropout=0"]).model
    assert cfg.encodings()["decoder self-attention"] == "xpos"
    torch.manual_seed(0)
    model = Seq2SeqTransformer(cfg, 30, 0)
    src, tgt = torch.randint(3, 30, (4, 7)), torch.randint(3, 30, (4, 6))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(8):
        logits = model(src, tgt[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 30), tgt[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        assert all(p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters())
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


# Figures, export, the command line ------------------------------------------------------------------------------------


def test_the_decay_figure_draws_the_modules_own_score() -> None:
    """position/decay plots xPos's all-ones score, mean_i zeta_i^(k/B) cos(k theta_i): the module's q~_k . k~_0 /
    q~_0 . k~_0 for q = k = ones; and nothing is said to be missing for the decoder."""
    from utils.figures import plots
    from utils.figures.maps import position_figures

    pe = xpos_layer(500.0, 0.4, 8.0, head_dim=8)
    t = 20
    ones = torch.ones(1, 1, t, 8)
    rq, rk = pe.rotate(ones, ones, torch.arange(t), torch.arange(t))
    ours = (rq[0, 0, :, :] @ rk[0, 0, 0, :]).double() / (rq[0, 0, 0] @ rk[0, 0, 0]).double()
    theirs = plots.xpos_score(pe.inv_freq, pe.zeta, 8.0, np.arange(t, dtype=np.float64))
    np.testing.assert_allclose(ours.numpy(), theirs, atol=1e-5)

    cfg = load_config(DEMO, [*XPOS, "model.d_model=16", "model.n_heads=2"])
    figs, notes = position_figures(Seq2SeqTransformer(cfg.model, 50, 0), cfg, length=16, bias_length=8)
    assert set(figs) == {"position/decay", "position/rope_scaling"}
    assert len(figs["position/decay"].axes) == 3  # scores; RoFormer bound (the encoder's RoPE); xPos's zeta^(k/B)
    assert not any("xpos" in note for note in notes), notes


def test_ctranslate2_export_is_refused_in_one_line() -> None:
    from utils.translation.export import ExportError, check_exportable

    for extra in ([], ["model.decoder_pe.input=sinusoidal"]):
        with pytest.raises(ExportError) as err:
            check_exportable(load_config(DEMO, [*XPOS, *extra]))
        assert str(err.value) == ("model.decoder_pe.attention=xpos: CTranslate2's rotary embedding has no xPos scale "
                                  "(zeta^(n/B) on queries, zeta^(-m/B) on keys)")


def test_train_and_translate_through_the_command_line(tmp_path: Path) -> None:
    """train.py with RoPE in the encoder and xPos in the decoder for 3 steps, then inference.py on its run."""
    res = train_cli(tmp_path, *XPOS)
    assert res.returncode == 0, res.stderr
    assert "positions: encoder rope, decoder xpos" in res.stderr + res.stdout
    res = translate_cli(tmp_path / "runs" / "demo_latest", ["Le chat dort.", "Bonjour."], "--beam", "2")
    assert res.returncode == 0, res.stderr
    assert len(res.stdout.splitlines()) == 2
