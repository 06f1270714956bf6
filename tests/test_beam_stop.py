"""Beam search stopping: "bound" stops only when no alive beam can beat the finished n-best.

Shown on a model whose next token depends on the last one alone (fairseq's "K finished" rule returns a worse
translation than greedy there, on any machine), and checked as guaranteed properties on the trained demo model and
on the small trained copy model of test_decoding.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from conftest import once

from models.decoding import beam_search
from tests.test_decoding import BOS, EOS, sources, trained_copy_model
from utils.config import DecodeConfig, load_config
from utils.run.load import load_run
from utils.run.store import create_run_dir
from utils.training.loop import train
from utils.translation.translate import translate

ROOT = Path(__file__).resolve().parents[1]


def demo_texts() -> list[str]:
    demo = ROOT / "data" / "demo"
    return [line.strip() for name in ("valid.fr", "test.fr") for line in (demo / name).open(encoding="utf-8")]


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory):
    """The demo config trained for 20 of its 60 epochs (about 25 s on one core): translating, not yet peaked."""
    def build():
        tmp = tmp_path_factory.mktemp("demo")
        overrides = [f"data.cache_dir={tmp / 'cache'}", "train.epochs=20", "train.log_attention_every=0",
                     "train.keep_checkpoints=0"]
        cfg = load_config(ROOT / "configs" / "demo.yaml", overrides)
        run_dir = create_run_dir(cfg, tmp / "runs")
        train(cfg, run_dir)
        return load_run(str(run_dir), None, [], "cpu")

    return once("test_beam_stop.demo_run", build)


def test_bound_never_loses_to_greedy_on_the_trained_demo_model(demo_run) -> None:
    texts = demo_texts()
    assert len(texts) == 80
    model, tok = demo_run.model, demo_run.tokenizer
    greedy = [n[0] for n in translate(model, tok, texts, DecodeConfig(beam=1))]
    bound = [n[0] for n in translate(model, tok, texts, DecodeConfig(beam=5, lenpen=0.0, beam_stop="bound"))]
    old = [n[0] for n in translate(model, tok, texts, DecodeConfig(beam=5, lenpen=0.0, beam_stop="k_finished"))]
    worse_bound = [t for t, b, g in zip(texts, bound, greedy, strict=True) if b.logprob < g.logprob - 1e-4]
    assert worse_bound == []  # where the old rule loses to greedy depends on the trained weights' last bits
    for b, o in zip(bound, old, strict=True):  # never worse than the old rule
        assert b.logprob >= o.logprob - 1e-4


class LastTokenModel(torch.nn.Module):
    """A decoder whose next-token probabilities depend on the last token alone, ``table[last] = {token: p}``."""

    max_length = None

    def __init__(self, table: dict[int, dict[int, float]], vocab: int) -> None:
        super().__init__()
        self.logp = torch.full((vocab, vocab), -1e9)
        for last, row in table.items():
            for token, p in row.items():
                self.logp[last, token] = math.log(p)

    def encode(self, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.zeros(*src.shape, 1), src != 0

    def decode(self, prefix: torch.Tensor, memory: torch.Tensor, src_mask: torch.Tensor,
               cache: object = None) -> torch.Tensor:
        return self.logp[prefix]  # [N, T, V]: the last position's row is the next token's


def test_k_finished_stops_on_two_poor_endings_while_the_greedy_path_is_better() -> None:
    """Beam 2: "K finished" takes the lone EOS (p 0.3) and b EOS, then stops, returning p 0.3 while greedy's a c EOS
    has p 0.6 x 0.9 x 0.9; "bound" goes on while an alive beam can beat 0.3 and returns greedy's."""
    bos, eos, a, b, c = 1, 2, 3, 4, 5
    model = LastTokenModel({bos: {a: 0.6, eos: 0.3, b: 0.1}, a: {c: 0.9, eos: 0.05, b: 0.05},
                            c: {eos: 0.9, c: 0.05, b: 0.05}, b: {eos: 0.99, c: 0.01}}, vocab=6)
    src = torch.tensor([[4, 5, 2]])
    kw = dict(bos=bos, eos=eos, beam=2, lenpen=0.0, use_cache=False)
    (old,), (bound,) = beam_search(model, src, stop="k_finished", **kw), beam_search(model, src, stop="bound", **kw)
    assert old[0].tokens == [eos] or old[0].tokens == []  # the lone EOS
    assert old[0].logprob == pytest.approx(math.log(0.3), abs=1e-5)
    assert bound[0].logprob == pytest.approx(math.log(0.6 * 0.9 * 0.9), abs=1e-5)
    assert bound[0].tokens[:2] == [a, c]


@pytest.mark.parametrize("lenpen", [0.0, 0.6, 1.0])
@pytest.mark.parametrize("nbest", [1, 3])
def test_bound_nbest_is_never_worse_than_k_finished(lenpen: float, nbest: int) -> None:
    """Both rules follow one trajectory until one stops; what "K finished" finds later cannot beat "bound"."""
    model = trained_copy_model()
    with torch.no_grad():  # noisier weights: more sentences where the rules differ
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    src = sources(n=24, seed=7)
    kw = dict(bos=BOS, eos=EOS, beam=4, nbest=nbest, lenpen=lenpen)
    bound = beam_search(model, src, stop="bound", **kw)
    old = beam_search(model, src, stop="k_finished", **kw)
    for b, o in zip(bound, old, strict=True):
        assert len(b) == nbest
        assert [h.score for h in b] == sorted((h.score for h in b), reverse=True)
        for hb, ho in zip(b, o, strict=True):
            assert hb.score >= ho.score - 1e-5


def test_unknown_stop_rule_is_refused() -> None:
    model = trained_copy_model()
    with pytest.raises(ValueError, match="stop must be one of bound, k_finished"):
        beam_search(model, sources(2), bos=BOS, eos=EOS, stop="early")


# ---- Target prefixes and terminology constraints on the trained demo model (models/constrained.py) ----------------

def teacher_forced(run, text: str, tokens: list[int]) -> float:
    """The summed log-probability of ``tokens`` and EOS after ``text``, the whole output fed to the model at once."""
    from utils.translation.translate import encode_sources

    tok = run.tokenizer
    src = torch.tensor([encode_sources(tok, [text], run.model.max_length)[0]])
    tgt = torch.tensor([[tok.bos_id, *tokens, tok.eos_id]])
    with torch.no_grad():
        logp = run.model(src, tgt[:, :-1]).float().log_softmax(-1)[0]
    return float(logp.gather(1, tgt[0, 1:, None]).sum())


def demo_pairs(n: int) -> list[tuple[str, str]]:
    demo = ROOT / "data" / "demo"
    fr = (demo / "test.fr").read_text(encoding="utf-8").splitlines()
    en = (demo / "test.en").read_text(encoding="utf-8").splitlines()
    return list(zip(fr, en, strict=True))[:n]


@pytest.mark.parametrize("beam", [1, 5])
def test_a_target_prefix_is_kept_and_scored_as_teacher_forcing_on_the_demo_model(demo_run, beam: int) -> None:
    from utils.translation.translate import Guide

    pairs = demo_pairs(10)
    texts = [fr for fr, _ in pairs]
    # The reference's first two words, or a start the model would not choose.
    starts = [" ".join(en.split()[:2]) if i % 2 else "In fact," for i, (_, en) in enumerate(pairs)]
    decode = DecodeConfig(beam=beam, nbest=min(beam, 3))
    free = translate(demo_run.model, demo_run.tokenizer, texts, decode)
    out = translate(demo_run.model, demo_run.tokenizer, texts, decode, guides=[Guide(prefix=s) for s in starts])
    for text, start, nbest in zip(texts, starts, out, strict=True):
        ids = demo_run.tokenizer.encode_tgt([start])[0]
        for h in nbest:
            assert h.tokens[: len(ids)] == ids and h.text.startswith(start)
            assert len(h.tokens) > len(ids)  # the search went on after the prefix
            assert h.logprob == pytest.approx(teacher_forced(demo_run, text, h.tokens), abs=2e-3)
    assert sum(o[0].text != f[0].text for o, f in zip(out, free, strict=True)) >= 5


def test_every_constraint_appears_in_the_demo_model_outputs(demo_run) -> None:
    """Several sentences, one or two phrases each: words of the reference, lacking in the unconstrained output
    where the reference has one, a phrase from its end, or a word no reference asks for; every phrase appears, as
    whole words, in every n-best translation, which meets its constraints and scores as teacher forcing; the
    sentences without constraints decode as plain beam search."""
    import re

    from utils.translation.translate import Guide

    pairs = demo_pairs(12)
    texts = [fr for fr, _ in pairs]
    decode = DecodeConfig(beam=5, nbest=2)
    free = translate(demo_run.model, demo_run.tokenizer, texts, decode)
    terms: list[tuple[str, ...]] = []
    for i, ((_, en), nbest) in enumerate(zip(pairs, free, strict=True)):
        words = sorted((w for w in re.findall(r"[A-Za-z]+", en) if len(w) > 3), key=lambda w: w in nbest[0].text)
        word, bigram = words[0], " ".join(en.rstrip(".?!").split()[-2:])  # a word the output lacks, if any
        terms.append([(word,), (word, bigram) if word not in bigram else (word,), ("today",), ()][i % 4])
    lacking = [t for i, phrases in enumerate(terms) for t in phrases if t not in free[i][0].text]
    assert len(lacking) >= 4  # the constraints ask for what the model would not write
    out = translate(demo_run.model, demo_run.tokenizer, texts, decode, guides=[Guide(constraints=t) for t in terms])
    for text, phrases, nbest, plain in zip(texts, terms, out, free, strict=True):
        if not phrases:
            assert [h.tokens for h in nbest] == [h.tokens for h in plain]
            assert [h.score for h in nbest] == pytest.approx([h.score for h in plain], abs=1e-5)
            continue
        for h in nbest:
            assert h.constraints_met, (h.text, phrases)
            # Each phrase whole (a subword path written before punctuation counts: "water." is not "water" + "."):
            assert all(re.search(rf"(?<!\w){re.escape(p)}(?!\w)", h.text) for p in phrases), (h.text, phrases)
            assert h.logprob == pytest.approx(teacher_forced(demo_run, text, h.tokens), abs=2e-3)


def test_a_phrase_written_before_punctuation_counts_as_the_tokenizer_writes_it(demo_run) -> None:
    """The demo tokenizer writes "bed" as two tokens but "bed." as one: a phrase counts written either way. With
    each unconstrained translation as the prefix and its last two words as the phrase, the phrase is met inside the
    prefix and the translation is the prefix (it was read as unmet, and repeated, before)."""
    from utils.translation.translate import Guide

    texts = [fr for fr, _ in demo_pairs(12)]
    free = [n[0].text for n in translate(demo_run.model, demo_run.tokenizer, texts, DecodeConfig(beam=5))]
    guides = [Guide(prefix=t, constraints=(" ".join(t.rstrip(".?!").split()[-2:]),)) for t in free]
    out = translate(demo_run.model, demo_run.tokenizer, texts, DecodeConfig(beam=5), guides=guides)
    assert [n[0].text for n in out] == free and all(n[0].constraints_met for n in out)


def test_with_no_constraints_the_demo_model_decodes_as_plain_beam_search_byte_for_byte(demo_run) -> None:
    import re

    from models.constrained import constrained_beam_search
    from utils.translation.translate import GREEDY_CONSTRAINTS, Guide, encode_sources

    tok, model = demo_run.tokenizer, demo_run.model
    ids = encode_sources(tok, [fr for fr, _ in demo_pairs(16)], model.max_length)
    src = torch.full((len(ids), max(map(len, ids))), tok.pad_id, dtype=torch.long)
    for r, seq in enumerate(ids):
        src[r, : len(seq)] = torch.tensor(seq)
    kw = dict(bos=tok.bos_id, eos=tok.eos_id, beam=5, nbest=3, lenpen=0.6)
    plain = beam_search(model, src, **kw)
    none = constrained_beam_search(model, src, constraints=[[] for _ in ids], **kw)
    assert [[(h.tokens, h.logprob, h.score) for h in nb] for nb in none] == \
        [[(h.tokens, h.logprob, h.score) for h in nb] for nb in plain]
    with pytest.raises(ValueError, match=f"^{re.escape(GREEDY_CONSTRAINTS)}$"):
        translate(model, tok, ["Le chien dort."], DecodeConfig(beam=1), guides=[Guide(constraints=("dog",))])
