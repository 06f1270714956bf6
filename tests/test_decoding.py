"""Greedy and beam search: beam 1 is greedy, beam never scores below greedy, length caps, n-best order."""

from __future__ import annotations

import copy
import functools

import pytest
import torch

from models.decoding import Hypothesis, beam_search, greedy_search, length_penalty
from models.transformer import Seq2SeqTransformer
from utils.config import ModelConfig

PAD, BOS, EOS = 0, 1, 2
V = 24


def trained_copy_model() -> Seq2SeqTransformer:
    """A tiny model fitted for a few hundred steps to reverse-copy sequences: peaked but imperfect. Trained once per
    process; each call returns a copy of its own, with torch's global random state where training left it (as if
    trained again)."""
    model, rng = _trained_copy_model()
    torch.set_rng_state(rng)
    return copy.deepcopy(model)


@functools.cache
def _trained_copy_model() -> tuple[Seq2SeqTransformer, torch.Tensor]:
    torch.manual_seed(0)
    cfg = ModelConfig(
        d_model=32,
        n_heads=4,
        encoder_layers=1,
        decoder_layers=1,
        d_ff=64,
        dropout=0.0,
        input_pe="sinusoidal",
        attention_pe="rope",
    )
    model = Seq2SeqTransformer(cfg, V, PAD)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        body = torch.randint(3, V, (32, 5), generator=g)
        src = torch.cat([body, torch.full((32, 1), EOS)], 1)
        tgt = torch.cat([torch.full((32, 1), BOS), body.flip(1), torch.full((32, 1), EOS)], 1)
        logits = model(src, tgt[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval(), torch.get_rng_state()


@pytest.fixture(scope="module")
def model() -> Seq2SeqTransformer:
    return trained_copy_model()


def sources(n: int = 12, seed: int = 3) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, V, (n, 6), generator=g)  # 5 tokens + eos, as in training
    src[:, -1] = EOS
    src[0, 4], src[0, 5:] = EOS, PAD  # a shorter, padded sentence
    return src


def full_logprob(model: Seq2SeqTransformer, src: torch.Tensor, hyp: Hypothesis, ended: bool = True) -> float:
    """Score a hypothesis by teacher forcing (independent of the search code)."""
    tokens = hyp.tokens + ([EOS] if ended else [])
    tgt = torch.tensor([[BOS] + tokens])
    logp = model(src[None], tgt[:, :-1]).log_softmax(-1)[0]
    return float(logp.detach().gather(1, torch.tensor(tokens)[:, None]).sum())


def test_greedy_learned_the_task(model: Seq2SeqTransformer) -> None:
    src = sources()
    hyps = greedy_search(model, src, bos=BOS, eos=EOS)
    correct = sum(h.tokens == src[i][src[i] > EOS].flip(0).tolist() for i, h in enumerate(hyps))
    assert correct >= 6  # the fixture is a real (if small) model


def test_beam_one_equals_greedy(model: Seq2SeqTransformer) -> None:
    src = sources()
    greedy = greedy_search(model, src, bos=BOS, eos=EOS)
    beam = beam_search(model, src, bos=BOS, eos=EOS, beam=1, lenpen=0.0)
    for g, b in zip(greedy, beam, strict=True):
        assert g.tokens == b[0].tokens
        assert g.logprob == pytest.approx(b[0].logprob, abs=1e-4)


@pytest.mark.parametrize("k", [2, 4, 8])
def test_beam_best_score_never_below_greedy(model: Seq2SeqTransformer, k: int) -> None:
    src = sources(16, seed=k)
    greedy = greedy_search(model, src, bos=BOS, eos=EOS)
    beam = beam_search(model, src, bos=BOS, eos=EOS, beam=k, lenpen=0.0)
    for g, b in zip(greedy, beam, strict=True):
        assert b[0].logprob >= g.logprob - 1e-4


def test_scores_are_summed_log_probabilities(model: Seq2SeqTransformer) -> None:
    src = sources(4)
    for i, nbest in enumerate(beam_search(model, src, bos=BOS, eos=EOS, beam=4, nbest=4, lenpen=1.0)):
        for h in nbest:
            assert h.logprob <= 0
            assert h.logprob == pytest.approx(full_logprob(model, src[i][src[i] != PAD], h), abs=1e-3)
            assert h.score == pytest.approx(h.logprob / length_penalty(len(h.tokens) + 1, 1.0), abs=1e-5)
        assert [h.score for h in nbest] == sorted((h.score for h in nbest), reverse=True)
        assert len({tuple(h.tokens) for h in nbest}) == len(nbest)  # distinct hypotheses


def test_greedy_scores_match_teacher_forcing(model: Seq2SeqTransformer) -> None:
    src = sources(4)
    for i, h in enumerate(greedy_search(model, src, bos=BOS, eos=EOS)):
        assert h.logprob == pytest.approx(full_logprob(model, src[i][src[i] != PAD], h), abs=1e-3)


def test_length_cap_is_a_times_src_len_plus_b() -> None:
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=16, n_heads=2, encoder_layers=1, decoder_layers=1, d_ff=32, dropout=0.0)
    model = Seq2SeqTransformer(cfg, V, PAD).eval()
    decode = model.decode

    def never_stop(*args, **kwargs):  # a model that never wants to emit EOS on its own
        logits = decode(*args, **kwargs)
        logits[..., EOS] -= 1e4
        return logits

    model.decode = never_stop
    src = sources(3)
    src_len = (src != PAD).sum(1) - 1
    for a, b in ((1.0, 2), (0.5, 3)):
        caps = (a * src_len + b).long().tolist()
        for h, cap in zip(greedy_search(model, src, bos=BOS, eos=EOS, max_len_a=a, max_len_b=b), caps, strict=True):
            assert len(h.tokens) == cap
        for nb, cap in zip(
            beam_search(model, src, bos=BOS, eos=EOS, beam=3, max_len_a=a, max_len_b=b), caps, strict=True
        ):
            assert len(nb[0].tokens) == cap


@pytest.mark.parametrize("beam", [1, 3])
def test_a_length_floor_blocks_eos_until_a_times_src_len_plus_b_within_the_cap(model: Seq2SeqTransformer,
                                                                                beam: int) -> None:
    """The copy model stops after about its source's length; a floor of 2 * src_len + 1 keeps every hypothesis
    (greedy, and every one of the beam's n-best) going to at least that, or to the cap where the cap is lower; the
    log-probabilities are the model's own (EOS blocked, nothing renormalised: teacher forcing gives the same)."""
    src = sources(8)
    src_len = ((src != PAD).sum(1) - 1).tolist()

    def decode(**kw: float) -> list[list[Hypothesis]]:
        if beam == 1:
            return [[h] for h in greedy_search(model, src, bos=BOS, eos=EOS, **kw)]
        return beam_search(model, src, bos=BOS, eos=EOS, beam=beam, nbest=beam, **kw)

    free = decode()
    assert all(len(nb[0].tokens) < 2 * n + 1 for nb, n in zip(free, src_len, strict=True))  # the floor binds
    floored = decode(min_len_a=2.0, min_len_b=1)
    capped = decode(min_len_a=2.0, min_len_b=1, max_len_a=1.0, max_len_b=3)  # a cap below the floor wins
    for i, n in enumerate(src_len):
        assert all(2 * n + 1 <= len(h.tokens) <= int(1.5 * n + 10) for h in floored[i])
        assert [len(h.tokens) for h in capped[i]] == [n + 3] * len(capped[i])
        for h in (floored[i][0], capped[i][0]):
            assert h.logprob == pytest.approx(full_logprob(model, src[i][src[i] != PAD], h), abs=1e-3)
    # A floor that never binds (one token) changes nothing: the same tokens and scores as without one.
    same = decode(min_len_b=1)
    assert [[(h.tokens, h.logprob, h.score) for h in nb] for nb in same] == \
        [[(h.tokens, h.logprob, h.score) for h in nb] for nb in free]


def test_length_penalty_prefers_longer_with_larger_alpha() -> None:
    assert length_penalty(1, 0.0) == 1.0
    assert length_penalty(7, 1.0) == pytest.approx(2.0)
    assert length_penalty(10, 0.6) > length_penalty(5, 0.6) > 1.0


def test_batch_results_match_single_sentence_decoding(model: Seq2SeqTransformer) -> None:
    src = sources(6)
    batched = beam_search(model, src, bos=BOS, eos=EOS, beam=3, nbest=2)
    for i in range(6):
        row = src[i : i + 1]
        row = row[:, : int((row != PAD).sum())]
        single = beam_search(model, row, bos=BOS, eos=EOS, beam=3, nbest=2)[0]
        assert [h.tokens for h in single] == [h.tokens for h in batched[i]]


@pytest.mark.parametrize("beam", [1, 3])
def test_each_sentence_is_reported_once_as_it_leaves_the_batch_with_its_final_list(model: Seq2SeqTransformer,
                                                                                   beam: int) -> None:
    src = sources(8)
    src[1, 2], src[1, 3:] = EOS, PAD  # 2 tokens: its cap (a = 1, b = 0) ends it before the 5-token sentences
    reported: list[tuple[int, list[Hypothesis]]] = []
    steps: list[int] = []  # decoder steps run when each sentence was reported
    calls = 0
    decode = model.decode

    def counting(*args: object, **kwargs: object) -> torch.Tensor:
        nonlocal calls
        calls += 1
        return decode(*args, **kwargs)

    model.decode = counting  # type: ignore[method-assign]
    try:
        def on_done(i: int, nbest: list[Hypothesis]) -> None:
            reported.append((i, nbest))
            steps.append(calls)

        cap = dict(bos=BOS, eos=EOS, max_len_a=1.0, max_len_b=0, on_done=on_done)
        if beam == 1:
            results = [[h] for h in greedy_search(model, src, **cap)]
        else:
            results = beam_search(model, src, beam=beam, nbest=2, **cap)
    finally:
        del model.decode
    assert sorted(i for i, _ in reported) == list(range(8))  # each sentence once
    assert all(nbest == results[i] for i, nbest in reported)  # with exactly the list returned at the end
    short = steps[[i for i, _ in reported].index(1)]
    assert short <= 3 < max(steps)  # when it ends (2 tokens and EOS), before the batch does


def test_decoding_without_the_cache_gives_the_same_hypotheses(model: Seq2SeqTransformer) -> None:
    src = sources(6)
    for cached, uncached in zip(
        greedy_search(model, src, bos=BOS, eos=EOS),
        greedy_search(model, src, bos=BOS, eos=EOS, use_cache=False),
        strict=True,
    ):
        assert cached.tokens == uncached.tokens and cached.logprob == pytest.approx(uncached.logprob, abs=1e-4)
    with_cache = beam_search(model, src, bos=BOS, eos=EOS, beam=3, nbest=3)
    without = beam_search(model, src, bos=BOS, eos=EOS, beam=3, nbest=3, use_cache=False)
    assert [[h.tokens for h in nb] for nb in with_cache] == [[h.tokens for h in nb] for nb in without]


@pytest.mark.parametrize("cross_pe", ["none", "alibi", "t5", "shaw", "kerple_log", "kerple_power", "sandwich",
                                      "fire", "dpb"])
def test_beams_sharing_their_sentence_cross_attention_score_as_teacher_forcing(cross_pe: str) -> None:
    """Beams attend to one K/V per sentence (grouped queries; per-row K/V where a cross-attention encoding
    needs them): every n-best hypothesis, of sentences leaving at different steps, scores as teacher forcing."""
    torch.manual_seed(1)
    cfg = ModelConfig(d_model=32, n_heads=4, encoder_layers=1, decoder_layers=2, d_ff=64, dropout=0.0,
                      input_pe="sinusoidal", attention_pe="rope", cross_attention_pe=cross_pe)
    model = Seq2SeqTransformer(cfg, V, PAD).eval()
    src = sources(6)
    for use_cache in (True, False):
        results = beam_search(model, src, bos=BOS, eos=EOS, beam=3, nbest=3, lenpen=0.6, max_len_b=4,
                              use_cache=use_cache)
        lengths = set()
        for i, nbest in enumerate(results):
            assert len(nbest) == 3
            for h in nbest:
                assert h.logprob == pytest.approx(full_logprob(model, src[i][src[i] != PAD], h), abs=1e-3)
                lengths.add(len(h.tokens))
        assert len(lengths) > 1  # hypotheses (and sentences) ended at different steps


def test_beam_search_keeps_one_cross_attention_kv_per_sentence(monkeypatch: pytest.MonkeyPatch) -> None:
    from models.attention import MultiHeadAttention

    seen: list[tuple[int, int]] = []
    grouped = MultiHeadAttention._grouped_cross

    def spy(self, q, k, v, key_mask):
        seen.append((q.shape[0], k.shape[0]))
        return grouped(self, q, k, v, key_mask)

    monkeypatch.setattr(MultiHeadAttention, "_grouped_cross", spy)
    model = trained_copy_model()
    beam_search(model, sources(5), bos=BOS, eos=EOS, beam=4)
    assert seen and all(rows == 4 * sentences for rows, sentences in seen)
    assert seen[0] == (20, 5)  # the second step: 4 beams of each of the 5 sentences, 5 cached K/V


@pytest.mark.parametrize("poison", [float("nan"), float("inf")])
def test_every_decoder_honours_its_length_cap_whatever_the_scores(poison: float) -> None:
    """A diverged model (NaN or inf logits) never picks EOS by argmax: the cap still ends every sentence, and beam
    search still returns one hypothesis per sentence (it used to loop forever, or return an empty n-best list)."""
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=16, n_heads=2, encoder_layers=1, decoder_layers=1, d_ff=32, dropout=0.0)
    model = Seq2SeqTransformer(cfg, V, PAD).eval()
    decode = model.decode
    model.decode = lambda *a, **k: decode(*a, **k) * poison  # type: ignore[method-assign]
    src = sources(4)
    caps = ((src != PAD).sum(1) - 1 + 3).tolist()  # a = 1, b = 3
    greedy = greedy_search(model, src, bos=BOS, eos=EOS, max_len_a=1.0, max_len_b=3)
    assert [len(h.tokens) for h in greedy] == caps
    for stop in ("bound", "k_finished"):
        nbest = beam_search(model, src, bos=BOS, eos=EOS, beam=3, nbest=2, max_len_a=1.0, max_len_b=3, stop=stop)
        assert len(nbest) == 4
        assert all(1 <= len(hyps) <= 2 and len(hyps[0].tokens) <= cap for hyps, cap in zip(nbest, caps, strict=True))


def test_a_huge_length_cap_does_not_overflow_to_one_token() -> None:
    from models.decoding import max_lengths

    model = Seq2SeqTransformer(ModelConfig(d_model=16, n_heads=2, encoder_layers=1, decoder_layers=1, d_ff=32), V, PAD)
    cap = max_lengths(sources(2) != PAD, 1e30, 10, model)
    assert cap.tolist() == [2**31, 2**31]  # it used to wrap around to a negative number, then 1


def test_searches_begun_at_different_steps_and_stepped_together_give_each_ones_own_results(
        model: Seq2SeqTransformer) -> None:
    """Iteration-level batching: a beam search (beam 3, 2-best), a greedy search and a beam-5 search start two and
    four steps apart and share every step after (``decode_together``); each returns exactly the hypotheses and
    scores it returns alone, and reports each sentence once as it leaves."""
    from models.decoding import BeamSearch, GreedySearch, decode_together

    src = sources(12)
    a_src, b_src, c_src = src[:5], src[5:9, :5], src[9:]
    b_src[:, -1] = EOS
    alone_a = beam_search(model, a_src, bos=BOS, eos=EOS, beam=3, nbest=2)
    alone_b = greedy_search(model, b_src, bos=BOS, eos=EOS)
    alone_c = beam_search(model, c_src, bos=BOS, eos=EOS, beam=5, nbest=1, lenpen=1.0)
    reported: dict[str, list[int]] = {"a": [], "b": [], "c": []}
    a = BeamSearch(model, a_src, bos=BOS, eos=EOS, beam=3, nbest=2, on_done=lambda i, _: reported["a"].append(i))
    searches = [a]
    steps = 0
    while any(s.running for s in searches) or len(searches) < 3:
        if steps == 2:
            searches.append(GreedySearch(model, b_src, bos=BOS, eos=EOS, on_done=lambda i, _: reported["b"].append(i)))
        if steps == 4:
            searches.append(BeamSearch(model, c_src, bos=BOS, eos=EOS, beam=5, lenpen=1.0,
                                       on_done=lambda i, _: reported["c"].append(i)))
        decode_together(model, searches)
        steps += 1
    b, c = searches[1], searches[2]
    assert isinstance(b, GreedySearch) and isinstance(c, BeamSearch)
    assert steps > 6  # all three were running together for a while
    for together, alone in ((a.nbest_lists, alone_a), (c.nbest_lists, alone_c)):
        assert [[h.tokens for h in nb] for nb in together] == [[h.tokens for h in nb] for nb in alone]
        for nb, nb_alone in zip(together, alone, strict=True):
            assert [h.score for h in nb] == pytest.approx([h.score for h in nb_alone], abs=1e-5)
    assert [h.tokens for h in b.hypotheses] == [h.tokens for h in alone_b]
    assert [h.logprob for h in b.hypotheses] == pytest.approx([h.logprob for h in alone_b], abs=1e-5)
    assert {k: sorted(v) for k, v in reported.items()} == {"a": list(range(5)), "b": list(range(4)),
                                                           "c": list(range(3))}
