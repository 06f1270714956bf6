"""decode.no_repeat_ngram_size (``models.decoding.repeated_ngrams``): a token that would complete an n-gram the
hypothesis already holds is never chosen, in greedy, beam and sampled search; a target prefix is kept as it is;
without repeats to block the output is unchanged; the flag of inference.py and test.py, and its refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import run_script, train_tiny_run
from test_decoding import BOS, EOS, trained_copy_model

from models.decoding import beam_search, greedy_search, repeated_ngrams
from models.sampling import sample_search
from models.transformer import Seq2SeqTransformer


@pytest.fixture(scope="module")
def model() -> Seq2SeqTransformer:
    return trained_copy_model()


def _ngrams(tokens: list[int], n: int) -> list[tuple[int, ...]]:
    return [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]


def _repeats(tokens: list[int], n: int) -> bool:
    grams = _ngrams(tokens, n)
    return len(set(grams)) < len(grams)


def test_the_tokens_that_would_complete_a_seen_ngram_are_marked() -> None:
    rows = torch.tensor([[5, 6, 5], [7, 7, 7]])
    assert [r.nonzero().flatten().tolist() for r in repeated_ngrams(rows, 2, 10)] == [[6], [7]]
    assert [r.nonzero().flatten().tolist() for r in repeated_ngrams(rows, 1, 10)] == [[5, 6], [7]]
    assert repeated_ngrams(torch.tensor([[1, 2, 3, 1, 2]]), 3, 10)[0].nonzero().flatten().tolist() == [3]
    assert not repeated_ngrams(torch.tensor([[1, 2, 3, 4]]), 2, 10).any()
    assert repeated_ngrams(rows, 4, 10) is None and repeated_ngrams(rows[:, :0], 1, 10) is None


def test_no_search_repeats_an_ngram_and_a_sentence_without_repeats_is_unchanged(model: Seq2SeqTransformer) -> None:
    src = torch.tensor([[5, 6, 5, 6, 5, EOS], [3, 4, 5, 6, 7, EOS]])  # the model copies each source reversed
    plain = greedy_search(model, src, bos=BOS, eos=EOS)
    assert _repeats(plain[0].tokens, 2) and not _repeats(plain[1].tokens, 1)  # what the blocking must change
    for n in (1, 2, 3):
        greedy = greedy_search(model, src, bos=BOS, eos=EOS, no_repeat_ngram=n)
        beams = beam_search(model, src, bos=BOS, eos=EOS, beam=4, nbest=3, no_repeat_ngram=n)
        samples = sample_search(model, src, bos=BOS, eos=EOS, num_samples=3, seed=1, no_repeat_ngram=n)
        for hyp in [*greedy, *(h for hyps in [*beams, *samples] for h in hyps)]:
            assert not _repeats(hyp.tokens, n), (n, hyp.tokens)
        assert greedy[0].tokens != plain[0].tokens
        assert greedy[1].tokens == plain[1].tokens and greedy[1].logprob == plain[1].logprob
    assert beam_search(model, src[1:], bos=BOS, eos=EOS, beam=4, no_repeat_ngram=2)[0][0].tokens == \
        beam_search(model, src[1:], bos=BOS, eos=EOS, beam=4)[0][0].tokens
    with pytest.raises(ValueError, match="no_repeat_ngram must be >= 0"):
        greedy_search(model, src, bos=BOS, eos=EOS, no_repeat_ngram=-1)


def test_a_target_prefix_is_kept_even_where_it_repeats(model: Seq2SeqTransformer) -> None:
    src = torch.tensor([[3, 4, 5, 6, 7, EOS]])
    prefix = [8, 9, 8, 9]
    for hyp in [*greedy_search(model, src, bos=BOS, eos=EOS, forced=[prefix], no_repeat_ngram=2),
                *beam_search(model, src, bos=BOS, eos=EOS, beam=4, nbest=2, forced=[prefix], no_repeat_ngram=2)[0]]:
        assert hyp.tokens[:4] == prefix
        seen = set(_ngrams(prefix, 2))
        assert not any(g in seen for g in _ngrams(hyp.tokens[3:], 2))  # nothing after it repeats a bigram


def test_the_command_line_flag_decodes_records_and_refuses(tmp_path_factory: pytest.TempPathFactory) -> None:
    tmp = tmp_path_factory.mktemp("ngram")
    run = train_tiny_run(tmp, ["model.input_pe=none", "decode.max_len_a=0", "decode.max_len_b=12"], epochs=1,
                         max_steps=20, eval_every=1000, lr=0.005)
    lines = ["Le chat dort sur le canapé.", "Il fait beau aujourd'hui.", "Je voudrais une chambre."]
    plain = run_script("inference.py", "--model_path", str(run), "--input", "-", "--format", "jsonl", "--threads", "1",
                       stdin="\n".join(lines) + "\n")
    blocked = run_script("inference.py", "--model_path", str(run), "--input", "-", "--format", "jsonl",
                         "--threads", "1", "--no-repeat-ngram-size", "2", stdin="\n".join(lines) + "\n")
    assert plain.returncode == blocked.returncode == 0, blocked.stderr
    before = [json.loads(x)["tokens"] for x in plain.stdout.splitlines()]
    after = [json.loads(x)["tokens"] for x in blocked.stdout.splitlines()]
    assert any(_repeats(t, 2) for t in before) and not any(_repeats(t, 2) for t in after)
    scored = run_script("test.py", "--model_path", str(run), "--no_repeat_ngram_size", "2", "--tag", "nr",
                        "--threads", "1")
    assert scored.returncode == 0, scored.stderr
    assert "beam 5, lenpen 0.6, no repeated 2-grams" in scored.stdout
    record = json.loads(next(Path(run, "eval").glob("test.best.beam5.nr.json")).read_text())
    assert record["no_repeat_ngram_size"] == 2
    bad = run_script("inference.py", "--model_path", str(run), "--src_text", "Oui.", "--no_repeat_ngram_size", "-1")
    assert bad.returncode == 2 and "decode.no_repeat_ngram_size" in bad.stderr and "Traceback" not in bad.stderr
    terms = tmp / "terms.tsv"
    terms.write_text("cat\n", encoding="utf-8")
    both = run_script("inference.py", "--model_path", str(run), "--src_text", "Le chat.", "--constraints", str(terms),
                      "--no_repeat_ngram_size", "2")
    assert both.returncode == 2 and both.stderr.strip().splitlines()[-1] == (
        "error: terminology constraints and decode.no_repeat_ngram_size exclude each other: a phrase may need an "
        "n-gram the output already holds; give one or the other")
