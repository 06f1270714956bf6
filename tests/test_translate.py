"""Text-level translation: batching keeps order, bad inputs give clear errors or safe outputs."""

from __future__ import annotations

import pytest
import torch

from models.transformer import Seq2SeqTransformer
from tokenizer import train_tokenizer
from utils.config import DecodeConfig, ModelConfig, TokenizerConfig
from utils.translation.translate import MAX_GUIDE_TOKENS, Guide, InputError, encode_guides, translate

SENTENCES = ["le chat dort", "le chien mange une pomme", "je vois un oiseau", "bonjour", "merci beaucoup"] * 20


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(TokenizerConfig(vocab_size=376, min_frequency=1), SENTENCES, SENTENCES)


def model_for(tok, input_pe: str = "learnable", max_positions: int = 12) -> Seq2SeqTransformer:
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=16, n_heads=2, encoder_layers=1, decoder_layers=1, d_ff=32, dropout=0.0,
                      input_pe=input_pe, max_positions=max_positions)
    return Seq2SeqTransformer(cfg, tok.vocab_size, tok.pad_id).eval()


def test_batching_does_not_change_results(tok) -> None:
    model = model_for(tok, "sinusoidal")
    texts = ["le chat dort", "bonjour", "le chien mange une pomme", "merci"]
    together = translate(model, tok, texts, DecodeConfig(beam=3, nbest=2, batch_size=4))
    for text, expected in zip(texts, together, strict=True):
        alone = translate(model, tok, [text], DecodeConfig(beam=3, nbest=2, batch_size=1))[0]
        assert [h.tokens for h in alone] == [h.tokens for h in expected]
        assert len(expected) == 2


def test_over_long_input_is_a_clear_error_or_truncated(tok) -> None:
    """The limit is the input encoding's, whichever key sets it (a learned table's model.max_positions, a one-hot
    code's model.d_model): the message names none of them wrongly."""
    long = " ".join(["le chien mange une pomme"] * 5)
    for name, sets, limit in (("learnable", {"max_positions": 12}, 12), ("onehot", {}, 16)):
        with pytest.raises(InputError, match=rf"sentence 2 has \d+ tokens, over the model's limit of {limit} \(the "
                           r"positions its input position encoding represents\)$"):
            translate(model_for(tok, name, **sets), tok, ["bonjour", long], DecodeConfig(beam=2))
    model = model_for(tok, "learnable", max_positions=12)
    out = translate(model, tok, ["bonjour", long], DecodeConfig(beam=2), strict=False)
    assert len(out) == 2  # truncated with a warning, never an index error
    for nbest in out:
        assert all(len(h.tokens) <= 11 for h in nbest)  # outputs stay inside the position table too


def test_a_guide_longer_than_a_translation_may_hold_is_one_line(tok) -> None:
    """A target prefix and constraints stretch the decoder's length cap to hold them: under an encoding with no
    position limit (sinusoidal), a 7 KB phrase decoded for thousands of steps. Beyond the model's positions, or
    ``MAX_GUIDE_TOKENS`` where those allow more, it is one line."""
    long = " ".join(["le chien mange une pomme"] * 400)
    with pytest.raises(InputError, match=rf"^sentence 1: its prefix and constraints have \d+ tokens with bos, over "
                       rf"the limit of {MAX_GUIDE_TOKENS} \(what a guide may hold\)$"):
        encode_guides(tok, [Guide("", (long,))], None)
    with pytest.raises(InputError, match=r"over the limit of 12 \(the model's positions\)$"):
        encode_guides(tok, [Guide(" ".join(["le chien mange une pomme"] * 5), ())], 12)
    (ids,) = encode_guides(tok, [Guide("le chien", ("pomme",))], None)
    assert ids.prefix and len(ids.constraints) == 1


def test_empty_input(tok) -> None:
    model = model_for(tok, "sinusoidal")
    with pytest.raises(InputError, match="sentence 1 is empty"):
        translate(model, tok, ["  "], DecodeConfig(beam=1))
    out = translate(model, tok, ["", "bonjour"], DecodeConfig(beam=2), strict=False)
    assert out[0][0].text == "" and out[0][0].tokens == []
