"""Model maths: masks, fast vs explicit attention, cached incremental decoding, positional encodings."""

from __future__ import annotations

import itertools

import pytest
import torch

from models.attention import MultiHeadAttention, build_mask
from models.config import StackPE
from models.positional import REGISTRY, PositionLimitError, build_input_pe
from models.positional.absolute import sinusoid_table
from models.positional.fire import FireConfig
from models.positional.rotary import RotaryPE, apply_rotary, rope_inv_freq
from models.transformer import Seq2SeqTransformer
from utils.config import ModelConfig, RopeConfig

INPUT = list(REGISTRY["input"])
ATTENTION = list(REGISTRY["attention"])
#: Attention encodings the encoder can hold (a causal-only one, e.g. xPos, is tested in the decoder).
BIDIRECTIONAL = [name for name, cls in REGISTRY["attention"].items() if cls is None or not cls.causal_only]
PAD = 0


def placed(attention_pe: str) -> dict:
    """The config keys that put ``attention_pe`` where it is defined: both stacks' self-attention through the
    shorthand, or for a causal-only encoding decoder self-attention alone (``model.decoder_pe.attention``)."""
    cls = REGISTRY["attention"][attention_pe]
    if cls is not None and cls.causal_only:
        return dict(attention_pe="none", decoder_pe=StackPE(attention=attention_pe))
    return dict(attention_pe=attention_pe)


def small_cfg(**kw) -> ModelConfig:
    base = dict(d_model=32, n_heads=4, encoder_layers=2, decoder_layers=2, d_ff=64, dropout=0.0, max_positions=64)
    if "attention_pe" in kw:
        kw = {**kw, **placed(kw["attention_pe"])}
    return ModelConfig(**{**base, **kw})


def causal_only(attention_pe: str) -> bool:
    cls = REGISTRY["attention"][attention_pe]
    return cls is not None and cls.causal_only


def make_model(input_pe: str = "sinusoidal", attention_pe: str = "none", seed: int = 0, **kw) -> Seq2SeqTransformer:
    torch.manual_seed(seed)
    model = Seq2SeqTransformer(small_cfg(input_pe=input_pe, **placed(attention_pe), **kw), 40, PAD).eval()
    for name, p in model.named_parameters():  # a table that starts at zeros (CoPE's E, as in its reference) would
        if ".pe." in name and p.abs().max() == 0:  # make its encoding a no-op here: draw it instead
            torch.nn.init.normal_(p)
    return model


def batch(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, 40, (3, 9), generator=g)
    src[1, 6:] = PAD  # a padded sentence
    tgt = torch.randint(4, 40, (3, 7), generator=g)
    return src, tgt


def test_build_mask_padding_and_causal() -> None:
    key_mask = torch.tensor([[True, True, False]])
    pos = torch.arange(3)
    m = build_mask(key_mask, pos, pos, causal=True)[0, 0]
    expected = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 0]], dtype=torch.bool)
    assert torch.equal(m, expected)
    # A query at offset 5 (incremental step) sees keys 0..5.
    step = build_mask(None, torch.tensor([5]), torch.arange(8), causal=True)[0, 0, 0]
    assert step.tolist() == [True] * 6 + [False] * 2


def test_padding_does_not_change_encoder_outputs() -> None:
    model = make_model("sinusoidal", "rope")
    src, _ = batch()
    memory, mask = model.encode(src)
    alone, _ = model.encode(src[1:2, :6])  # same sentence without its padding
    assert mask[1].sum() == 6
    torch.testing.assert_close(memory[1, :6], alone[0], atol=1e-5, rtol=1e-5)


def assert_incremental_equals_full(model: Seq2SeqTransformer) -> None:
    """Decoding one token at a time through the KV cache gives the teacher-forced logits."""
    src, tgt = batch()
    full = model(src, tgt)
    memory, src_mask = model.encode(src)
    cache = model.new_cache()
    steps = [model.decode(tgt[:, t : t + 1], memory, src_mask, cache=cache) for t in range(tgt.shape[1])]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    assert cache.length == tgt.shape[1]


@pytest.mark.parametrize("input_pe,attention_pe", list(itertools.product(INPUT, ATTENTION)))
def test_cached_incremental_decoding_equals_full(input_pe: str, attention_pe: str) -> None:
    assert_incremental_equals_full(make_model(input_pe, attention_pe))


def steps_alone(model: Seq2SeqTransformer, src: torch.Tensor, tgt: torch.Tensor) -> list[torch.Tensor]:
    """Each step's logits ``[B, V]`` of teacher-forced ``tgt`` decoded through the cache, this batch alone."""
    memory, src_mask = model.encode(src)
    cache = model.new_cache()
    return [model.decode(tgt[:, t : t + 1], memory, src_mask, cache=cache)[:, -1] for t in range(tgt.shape[1])]


@pytest.mark.parametrize("input_pe,attention_pe", list(itertools.product(INPUT, ATTENTION)))
def test_a_step_shared_by_batches_at_different_positions_equals_each_alone(input_pe: str, attention_pe: str) -> None:
    """``decode_step`` (iteration-level batching): batch B joins batch A's decoding 3 steps late, with other source
    lengths; sharing the step's matrix products changes no batch's logits, at any position, for every encoding."""
    from models.transformer import StepPart

    model = make_model(input_pe, attention_pe)
    src_a, tgt_a = batch(1)
    src_b, tgt_b = batch(2)
    src_b, tgt_b = src_b[:2, :5], tgt_b[:2, :4]
    alone_a, alone_b = steps_alone(model, src_a, tgt_a), steps_alone(model, src_b, tgt_b)
    mem_a, mask_a = model.encode(src_a)
    mem_b, mask_b = model.encode(src_b)
    cache_a, cache_b = model.new_cache(), model.new_cache()
    for t in range(tgt_a.shape[1]):
        parts = [StepPart(tgt_a[:, t : t + 1], mem_a, mask_a, cache_a)]
        joined = 0 <= t - 3 < tgt_b.shape[1]
        if joined:
            parts.append(StepPart(tgt_b[:, t - 3 : t - 2], mem_b, mask_b, cache_b))
        logits = model.decode_step(parts)
        assert [x.shape for x in logits] == [(3, 40)] + [(2, 40)] * joined
        torch.testing.assert_close(logits[0], alone_a[t], atol=1e-5, rtol=1e-5)
        if joined:
            torch.testing.assert_close(logits[1], alone_b[t - 3], atol=1e-5, rtol=1e-5)
    assert (cache_a.length, cache_b.length) == (7, 4)


@pytest.mark.parametrize("input_pe,attention_pe", list(itertools.product(INPUT, ATTENTION)))
def test_forward_backward_and_explicit_path_matches_fused(input_pe: str, attention_pe: str) -> None:
    model = make_model(input_pe, attention_pe)
    src, tgt = batch()
    logits = model(src, tgt)
    assert logits.shape == (3, 7, 40)
    logits.sum().backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    explicit, attn = model.forward_with_attention(src, tgt)
    torch.testing.assert_close(explicit, logits, atol=1e-5, rtol=1e-5)
    assert len(attn.encoder) == 2 and len(attn.decoder) == 2 and len(attn.cross) == 2
    # Rows are distributions; decoder self-attention is zero above the diagonal; no weight on pad keys.
    for w in attn.encoder + attn.decoder + attn.cross:
        torch.testing.assert_close(w.sum(-1), torch.ones_like(w.sum(-1)))
    assert attn.decoder[0].triu(1).abs().max() == 0
    assert attn.encoder[0][1, :, :, 6:].abs().max() == 0
    assert attn.cross[0][1, :, :, 6:].abs().max() == 0


@pytest.mark.parametrize("cross_pe", [n for n in ATTENTION if n != "none" and not causal_only(n)])
def test_cross_attention_encodings_pass_forward_backward_and_explicit_equals_fused(cross_pe: str) -> None:
    """Every encoding cross-attention takes (``model.cross_attention_pe``; the causal-only ones are refused there):
    finite gradients, and the explicit path (the weights the figures draw) equals the fused one."""
    model = make_model("sinusoidal", "none", cross_attention_pe=cross_pe)
    src, tgt = batch()
    logits = model(src, tgt)
    logits.sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad)
    explicit, attn = model.forward_with_attention(src, tgt)
    torch.testing.assert_close(explicit, logits, atol=1e-5, rtol=1e-5)
    assert attn.cross[0][1, :, :, 6:].abs().max() == 0  # no weight on the padded sentence's pad keys
    plain = make_model("sinusoidal", "none")
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if k in plain.state_dict()}, strict=False)
    assert not torch.allclose(plain(src, tgt), logits, atol=1e-4)  # the encoding acts in cross-attention


#: Encodings per stack (``model.encoder_pe``, ``model.decoder_pe``): (encoder, decoder), each (input, attention).
MIXED = [(("none", "rope"), ("none", "none")),  # decoder-nope: the causal mask alone carries the decoder's order
         (("none", "alibi"), ("sinusoidal", "none")),
         (("none", "kerple_power"), ("none", "cope")),
         (("none", "sandwich"), ("learnable", "xpos")),
         (("sinusoidal", "fire"), ("none", "t5")),
         (("binary", "dpb"), ("none", "shaw"))]


def mixed_model(encoder: tuple[str, str], decoder: tuple[str, str]) -> Seq2SeqTransformer:
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, n_heads=4, encoder_layers=2, decoder_layers=2, d_ff=64, dropout=0.0,
                      max_positions=64, input_pe="none", attention_pe="none",
                      encoder_pe=StackPE(input=encoder[0], attention=encoder[1]),
                      decoder_pe=StackPE(input=decoder[0], attention=decoder[1]))
    model = Seq2SeqTransformer(cfg, 40, PAD).eval()
    for name, p in model.named_parameters():  # tables that start at zeros or tiny: make positions distinct
        if ".pe." in name or name.startswith(("src_pe", "tgt_pe")):
            torch.nn.init.normal_(p)
    return model


@pytest.mark.parametrize("encoder,decoder", MIXED, ids=[f"{e[1]}-{d[1]}" for e, d in MIXED])
def test_per_stack_encodings_pass_the_registry_wide_tests(encoder: tuple[str, str], decoder: tuple[str, str]) -> None:
    """Each stack builds its own encodings: cached decoding equals full decoding, fused attention equals the
    explicit path with finite gradients, and each stack's output depends on its word order (the decoder's through
    its own encoding, or the causal mask alone where it has none)."""
    model = mixed_model(encoder, decoder)
    built = {name: type(m) for name, m in model.named_modules() if name.endswith(".pe") or name in ("src_pe", "tgt_pe")}
    assert built["src_pe"] is REGISTRY["input"][encoder[0]] and built["tgt_pe"] is REGISTRY["input"][decoder[0]]
    for stack, (_, attention) in (("encoder", encoder), ("decoder", decoder)):  # each stack's layers, its own
        cls = REGISTRY["attention"][attention]
        assert [t for n, t in built.items() if n.startswith(f"{stack}.")] == ([cls, cls] if cls else [])
    assert_incremental_equals_full(model)
    src, tgt = batch()
    model.train()
    logits = model(src, tgt)
    explicit, _ = model.forward_with_attention(src, tgt)
    torch.testing.assert_close(explicit, logits, atol=1e-5, rtol=1e-5)
    logits.sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad)
    model.eval()
    perm = torch.tensor([3, 0, 6, 1, 7, 2, 5, 4])
    one = torch.randint(4, 40, (1, 8), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        out, _ = model.encode(one)
        out_perm, _ = model.encode(one[:, perm])
        assert (out_perm - out[:, perm]).abs().max() > 1e-3  # the encoder is order-aware
        tgt = torch.cat((tgt, tgt[:, :1]), dim=1)
        last = model(src, tgt)[:, -1]
        shuffled = model(src, torch.cat((tgt[:, :-1][:, torch.tensor([3, 0, 6, 1, 2, 5, 4])], tgt[:, -1:]), dim=1))
    assert (shuffled[:, -1] - last).abs().max() > 1e-3  # the decoder's last token depends on the order before it
    # (without a decoder encoding too: two causal layers, NoPE)


def test_encoder_without_positions_is_permutation_equivariant() -> None:
    model = make_model("none", "none")
    src = torch.randint(4, 40, (1, 8))
    perm = torch.randperm(8)
    out, _ = model.encode(src)
    out_perm, _ = model.encode(src[:, perm])
    torch.testing.assert_close(out_perm, out[:, perm], atol=1e-5, rtol=1e-5)


ORDER_AWARE = [(name, "none") for name in INPUT if name != "none"]
ORDER_AWARE += [("none", name) for name in ATTENTION if name != "none" and not causal_only(name)]


@pytest.mark.parametrize("input_pe,attention_pe", ORDER_AWARE)
def test_position_aware_encoders_are_not_permutation_equivariant(input_pe: str, attention_pe: str) -> None:
    """Every encoding but `none` makes the encoder's output depend on word order."""
    model = make_model(input_pe, attention_pe)
    for name, p in model.named_parameters():  # fresh learned tables/biases are tiny: make positions distinct
        if name.startswith(("src_pe", "tgt_pe")) or ".pe." in name:
            torch.nn.init.normal_(p, std=1.0)
    src = torch.randint(4, 40, (1, 8))
    perm = torch.tensor([3, 0, 6, 1, 7, 2, 5, 4])  # not a reversal (see the ALiBi test below)
    out, _ = model.encode(src)
    out_perm, _ = model.encode(src[:, perm])
    assert (out_perm - out[:, perm]).abs().max() > 1e-3


@pytest.mark.parametrize("attention_pe", ATTENTION)
def test_decoder_self_attention_encodings_make_the_last_token_depend_on_the_order_before_it(attention_pe: str) -> None:
    """One decoder layer, no input encoding: without an attention encoding the last position attends to a *set* of
    earlier tokens (its output is invariant to permuting them); every attention encoding, in the decoder where it is
    defined (xPos there only), makes it depend on their order."""
    model = make_model("none", attention_pe, decoder_layers=1)
    for name, p in model.named_parameters():  # fresh learned tables/biases are tiny: make positions distinct
        if ".pe." in name:
            torch.nn.init.normal_(p, std=1.0)
    src, tgt = batch()
    perm = torch.tensor([3, 0, 6, 1, 2, 5, 4])  # the first 7 target tokens, shuffled; the 8th stays last
    tgt = torch.cat((tgt, tgt[:, :1]), dim=1)
    with torch.no_grad():
        last = model(src, tgt)[:, -1]
        shuffled = model(src, torch.cat((tgt[:, :-1][:, perm], tgt[:, -1:]), dim=1))[:, -1]
    if attention_pe == "none":
        torch.testing.assert_close(shuffled, last, atol=1e-5, rtol=1e-5)
    else:
        assert (shuffled - last).abs().max() > 1e-3


def test_symmetric_alibi_encoder_cannot_tell_a_sentence_from_its_reverse() -> None:
    """ALiBi's encoder bias depends only on |i - j|, which reversal preserves."""
    model = make_model("none", "alibi")
    src = torch.randint(4, 40, (1, 8))
    out, _ = model.encode(src)
    out_rev, _ = model.encode(src.flip(1))
    torch.testing.assert_close(out_rev, out.flip(1), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("attention_pe", ["fire", "dpb"])
def test_fire_and_dpb_encoders_tell_a_sentence_from_its_reverse(attention_pe: str) -> None:
    """FIRE's encoder has one MLP for keys before the query and one for keys after it, DPB one MLP of the signed
    distance: unlike ALiBi's |i - j|, reversal changes the output."""
    model = make_model("none", attention_pe)
    src = torch.randint(4, 40, (1, 8))
    out, _ = model.encode(src)
    out_rev, _ = model.encode(src.flip(1))
    assert (out_rev - out.flip(1)).abs().max() > 1e-3


def test_fire_cached_decoding_equals_full_past_its_threshold() -> None:
    """With L = 2 the normaliser psi(max(L, i)) changes with every target position: cached steps must pass their true
    offsets (decoder self- and cross-attention) to match the teacher-forced logits."""
    model = make_model("none", "fire", cross_attention_pe="fire", fire=FireConfig(init_threshold=2.0))
    assert_incremental_equals_full(model)


def test_sinusoidal_shift_is_a_fixed_linear_map() -> None:
    """Vaswani et al.: PE(t + k) = M_k PE(t), M_k block-diagonal rotations by k * w_i, the same for every t."""
    d, k = 16, 5
    table = sinusoid_table(80, d).double()
    w = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    m = torch.zeros(d, d, dtype=torch.float64)
    for i, wi in enumerate(w):  # [sin, cos](t + k) = [[cos kw, sin kw], [-sin kw, cos kw]] [sin, cos](t)
        c, s = torch.cos(k * wi), torch.sin(k * wi)
        m[2 * i, 2 * i], m[2 * i, 2 * i + 1], m[2 * i + 1, 2 * i], m[2 * i + 1, 2 * i + 1] = c, s, -s, c
    torch.testing.assert_close(table[:-k] @ m.T, table[k:], atol=1e-5, rtol=1e-5)
    assert table[0, 0::2].abs().max() == 0 and torch.all(table[0, 1::2] == 1)


def test_rope_scores_depend_only_on_relative_position() -> None:
    cfg = small_cfg(attention_pe="rope")
    rope = RotaryPE(cfg, "encoder")
    torch.manual_seed(0)
    q = torch.randn(1, 1, 1, 8).expand(1, 1, 6, 8).contiguous()
    k = torch.randn(1, 1, 1, 8).expand(1, 1, 6, 8).contiguous()
    pos = torch.arange(6)
    rq, rk = rope.rotate(q, k, pos, pos)
    scores = (rq @ rk.transpose(-1, -2))[0, 0]  # same content at every position
    for shift in range(-5, 6):
        diag = torch.diagonal(scores, offset=shift)
        torch.testing.assert_close(diag, diag[0].expand_as(diag), atol=1e-5, rtol=1e-5)
    # Shifting every position by a constant leaves all scores unchanged.
    rq2, rk2 = rope.rotate(q, k, pos + 37, pos + 37)
    torch.testing.assert_close(rq2 @ rk2.transpose(-1, -2), rq @ rk.transpose(-1, -2), atol=1e-4, rtol=1e-4)
    # Rotation preserves norms.
    torch.testing.assert_close(rq.norm(dim=-1), q.norm(dim=-1))


def test_rope_frequencies_and_partial_rotary() -> None:
    inv = rope_inv_freq(8, 10000.0)
    torch.testing.assert_close(inv, torch.tensor([1.0, 0.1, 0.01, 0.001], dtype=torch.float64))
    cfg = small_cfg(attention_pe="rope", rope=RopeConfig(theta=10000.0, dim=4))
    rope = RotaryPE(cfg, "encoder")
    q = torch.randn(1, 1, 3, 8)
    rq, _ = rope.rotate(q, q, torch.arange(3), torch.arange(3))
    torch.testing.assert_close(rq[..., 4:], q[..., 4:])  # un-rotated tail passes through
    assert not torch.allclose(rq[..., 1:, :4], q[..., 1:, :4])
    cos, sin = rope.angles(torch.tensor([0]))
    torch.testing.assert_close(apply_rotary(q[..., :1, :], cos, sin), q[..., :1, :])  # position 0 = identity


def test_learnable_table_has_a_clear_length_limit() -> None:
    model = make_model("learnable", "none", max_positions=10)
    with pytest.raises(PositionLimitError, match="model.max_positions=10"):
        model.encode(torch.randint(4, 40, (1, 11)))
    model.encode(torch.randint(4, 40, (1, 10)))  # exactly at the limit is fine
    assert model.max_length == 10


def test_sinusoidal_has_no_length_limit() -> None:
    pe = build_input_pe(small_cfg(input_pe="sinusoidal", max_positions=8))
    x = torch.zeros(1, 20, 32)
    out = pe(x, torch.arange(20))
    torch.testing.assert_close(out[0], sinusoid_table(20, 32))


def test_cross_attention_kv_are_computed_once_and_cached() -> None:
    attn = MultiHeadAttention(small_cfg(), "cross").eval()
    memory = torch.randn(2, 5, 32)
    cache: dict[str, torch.Tensor] = {}
    x = torch.randn(2, 1, 32)
    out1, _ = attn(x, memory=memory, q_pos=torch.tensor([0]), cache=cache)
    k_id = id(cache["k"])
    out2, _ = attn(x, memory=None, q_pos=torch.tensor([1]), cache=cache)  # memory not needed any more
    assert id(cache["k"]) == k_id
    torch.testing.assert_close(out1, out2)


def test_tied_embeddings_share_one_table() -> None:
    model = make_model()
    assert model.src_embed.weight is model.tgt_embed.weight and model.output is None
    untied = Seq2SeqTransformer(small_cfg(tie_embeddings=False), 40, PAD)
    assert untied.src_embed.weight is not untied.tgt_embed.weight and untied.output is not None


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_pre_and_post_layer_norm(norm: str) -> None:
    model = make_model("sinusoidal", "rope", norm=norm)
    assert_incremental_equals_full(model)
    has_final_norm = isinstance(model.encoder_norm, torch.nn.LayerNorm)
    assert has_final_norm == (norm == "pre")


@pytest.mark.parametrize("tie", [True, False])
def test_output_layer_on_kept_positions_only_matches_full_logits_and_loss(tie: bool) -> None:
    from utils.training.evaluation import token_loss

    torch.manual_seed(0)
    model = Seq2SeqTransformer(small_cfg(input_pe="sinusoidal", attention_pe="rope", tie_embeddings=tie), 40, PAD)
    src, tgt = batch()
    tgt[0, 4:] = PAD  # padded targets
    keep = tgt != PAD
    full = model(src, tgt)
    kept = model(src, tgt, keep)
    assert kept.shape == (int(keep.sum()), 40)
    torch.testing.assert_close(kept, full[keep])
    # The training loss (summed, label-smoothed, pad ignored) is the same either way, and so are its gradients.
    loss_full = token_loss(full, tgt, PAD, 0.1)
    loss_kept = token_loss(kept, tgt[keep], PAD, 0.1)
    torch.testing.assert_close(loss_kept, loss_full)
    g_full = torch.autograd.grad(loss_full, model.src_embed.weight)[0]
    g_kept = torch.autograd.grad(loss_kept, model.src_embed.weight)[0]
    torch.testing.assert_close(g_kept, g_full)


def test_cpu_attention_kernel_runs_in_fp32_under_bf16_autocast(monkeypatch: pytest.MonkeyPatch) -> None:
    """Autocast casts scaled_dot_product_attention's inputs to bf16, whose CPU flash backward is 6x slower than
    fp32's: the model turns autocast off around it, so the kernel sees (and returns) fp32, and the layer bf16."""
    import torch.nn.functional as F

    real_sdpa, seen = F.scaled_dot_product_attention, []

    def spy(*args, **kwargs):
        out = real_sdpa(*args, **kwargs)
        seen.append(out.dtype)
        return out

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    model = Seq2SeqTransformer(small_cfg(attention_pe="rope"), 50, 0).train()
    src, tgt = torch.randint(1, 50, (3, 7)), torch.randint(1, 50, (3, 6))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(src, tgt)
    logits.float().sum().backward()
    assert seen and set(seen) == {torch.float32}
    assert logits.dtype == torch.bfloat16
