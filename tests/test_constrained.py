"""Target prefixes and terminology constraints (lexically constrained beam search with dynamic beam allocation) on
the small trained copy model, exact where it makes exactness easy; their files and command-line errors. The trained
demo model's checks are in test_beam_stop.py, beside its fixture."""

from __future__ import annotations

import io
import subprocess
from argparse import Namespace
from pathlib import Path

import pytest
import torch
from conftest import run_script

from models.constrained import ConstrainedBeamSearch, constrained_beam_search
from models.decoding import BeamSearch, GreedySearch, Hypothesis, beam_search, decode_together, greedy_search
from models.transformer import Seq2SeqTransformer
from tests.test_decoding import BOS, EOS, PAD, full_logprob, sources, trained_copy_model
from utils.translation.guides import Guides, counted, guide_report, guide_tag, load_guides, parse_constraints
from utils.translation.translate import InputError

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def model() -> Seq2SeqTransformer:
    return trained_copy_model()


def unpadded(src: torch.Tensor, i: int) -> torch.Tensor:
    return src[i][src[i] != PAD]


def contains(tokens: list[int], phrase: list[int]) -> bool:
    return any(tokens[k : k + len(phrase)] == phrase for k in range(len(tokens) - len(phrase) + 1))


def absent(src: torch.Tensor, i: int, n: int) -> list[int]:
    """``n`` tokens that sentence ``i``'s source lacks (its reversed copy lacks them too)."""
    return [t for t in range(3, 24) if t not in src[i].tolist()][:n]


# Per-row prefixes of different lengths in one batch: none, the copy's own first token, a wrong one, three tokens.
def prefixes(src: torch.Tensor) -> list[list[int]]:
    first = [int(unpadded(src, i)[-2]) for i in range(src.shape[0])]  # the reversed copy starts with the last token
    return [[], [first[1]], [absent(src, 2, 1)[0]], [first[3], *absent(src, 3, 2)], [], [first[5]], [9, 9], [4]]


@pytest.mark.parametrize("beam", [1, 3])
def test_a_target_prefix_is_kept_and_scored_as_teacher_forcing_and_the_search_goes_on(model: Seq2SeqTransformer,
                                                                                        beam: int) -> None:
    src = sources(8)
    forced = prefixes(src)

    def run(rows: torch.Tensor, pre: list[list[int]], use_cache: bool = True) -> list[list[Hypothesis]]:
        if beam == 1:
            return [[h] for h in greedy_search(model, rows, bos=BOS, eos=EOS, forced=pre, use_cache=use_cache)]
        return beam_search(model, rows, bos=BOS, eos=EOS, beam=beam, nbest=beam, forced=pre, use_cache=use_cache)

    free, out = run(src, None), run(src, forced)  # type: ignore[arg-type]
    for i, nbest in enumerate(out):
        for h in nbest:
            assert h.tokens[: len(forced[i])] == forced[i]
            assert len(h.tokens) > len(forced[i])  # the search went on after the prefix
            assert h.logprob == pytest.approx(full_logprob(model, unpadded(src, i), h), abs=1e-3)
        if not forced[i]:
            assert [h.tokens for h in nbest] == [h.tokens for h in free[i]]
    assert sum(out[i][0].tokens != free[i][0].tokens for i in range(8)) >= 4  # the prefixes changed the outputs
    uncached = run(src, forced, use_cache=False)
    assert [[h.tokens for h in nb] for nb in uncached] == [[h.tokens for h in nb] for nb in out]
    for i in (2, 3, 6):  # each alone, with its own prefix, as in the batch
        alone = run(src[i : i + 1, : len(unpadded(src, i))], [forced[i]])[0]
        assert [h.tokens for h in alone] == [h.tokens for h in out[i]]


def test_prefixes_and_constraints_decoded_together_give_each_search_its_own_results(model: Seq2SeqTransformer) -> None:
    """Iteration-level batching with forced steps per row: a greedy and a beam search with prefixes and a constrained
    beam search start at different steps and share every step after; each returns what it returns alone."""
    src = sources(12)
    a_src, b_src, c_src = src[:4], src[4:8], src[8:]
    pre_a, pre_b = prefixes(src)[:4], prefixes(src)[4:8]
    phrases = [[absent(c_src, i, 2)] for i in range(4)]
    alone_a = greedy_search(model, a_src, bos=BOS, eos=EOS, forced=pre_a)
    alone_b = beam_search(model, b_src, bos=BOS, eos=EOS, beam=3, nbest=2, forced=pre_b)
    alone_c = constrained_beam_search(model, c_src, bos=BOS, eos=EOS, beam=4, constraints=phrases, forced=pre_a)
    searches = [GreedySearch(model, a_src, bos=BOS, eos=EOS, forced=pre_a)]
    steps = 0
    while any(s.running for s in searches) or len(searches) < 3:
        if steps == 1:
            searches.append(BeamSearch(model, b_src, bos=BOS, eos=EOS, beam=3, nbest=2, forced=pre_b))
        if steps == 3:
            searches.append(ConstrainedBeamSearch(model, c_src, bos=BOS, eos=EOS, beam=4, constraints=phrases,
                                                  forced=pre_a))
        decode_together(model, searches)
        steps += 1
    a, b, c = searches
    assert isinstance(a, GreedySearch) and isinstance(b, BeamSearch) and isinstance(c, ConstrainedBeamSearch)
    assert [h.tokens for h in a.hypotheses] == [h.tokens for h in alone_a]
    assert [h.logprob for h in a.hypotheses] == pytest.approx([h.logprob for h in alone_a], abs=1e-5)
    for together, alone in ((b.nbest_lists, alone_b), (c.nbest_lists, alone_c)):
        assert [[h.tokens for h in nb] for nb in together] == [[h.tokens for h in nb] for nb in alone]
        assert [h.score for nb in together for h in nb] == pytest.approx([h.score for nb in alone for h in nb],
                                                                         abs=1e-5)


def test_every_constraint_appears_in_every_hypothesis_scored_as_teacher_forcing(model: Seq2SeqTransformer) -> None:
    """Phrases the copy never produces (tokens its source lacks): one or two per sentence, of one to three tokens,
    two of them sharing a first token; every n-best hypothesis holds each, contiguous, and meets them all."""
    src = sources(6)
    phrases = []
    for i in range(6):
        t = absent(src, i, 4)
        phrases.append([[t[0], t[1]], [t[0], t[2]]] if i % 3 == 0 else [[t[0]], [t[1], t[2], t[3]]] if i % 3 == 1
                       else [[t[3], t[0]]])
    free = beam_search(model, src, bos=BOS, eos=EOS, beam=4)
    assert sum(not contains(free[i][0].tokens, p) for i in range(6) for p in phrases[i]) >= 8  # of 10
    out = constrained_beam_search(model, src, bos=BOS, eos=EOS, beam=4, nbest=3, constraints=phrases)
    for i, nbest in enumerate(out):
        assert len(nbest) == 3
        for h in nbest:
            assert h.constraints_met
            assert all(contains(h.tokens, p) for p in phrases[i]), (h.tokens, phrases[i])
            assert h.logprob == pytest.approx(full_logprob(model, unpadded(src, i), h), abs=1e-3)
        assert [h.score for h in nbest] == sorted((h.score for h in nbest), reverse=True)


def test_an_abandoned_phrase_starts_over(model: Seq2SeqTransformer) -> None:
    """The prefix starts the phrase [a, b] with a, then leaves it (x): a later b alone must not complete it."""
    src = sources(4)
    out = []
    for i in range(4):
        a, b, x = absent(src, i, 3)
        row = src[i : i + 1, : len(unpadded(src, i))]
        h = constrained_beam_search(model, row, bos=BOS, eos=EOS, beam=3, constraints=[[[a, b]]], forced=[[a, x]])[0][0]
        assert h.tokens[:2] == [a, x] and h.constraints_met
        assert contains(h.tokens[1:], [a, b]), h.tokens  # produced again, whole, after the prefix
        out.append(h)
    assert len(out) == 4


def test_a_phrase_the_model_cannot_produce_fails_at_the_cap_and_is_marked(model: Seq2SeqTransformer) -> None:
    decode = model.decode
    banned = absent(sources(3), 0, 1)[0]

    def never(*args: object, **kwargs: object) -> torch.Tensor:
        logits = decode(*args, **kwargs)
        logits[..., banned] = float("-inf")
        return logits

    model.decode = never  # type: ignore[method-assign]
    try:
        src = sources(3)
        out = constrained_beam_search(model, src, bos=BOS, eos=EOS, beam=3, nbest=2, max_len_a=1.0, max_len_b=2,
                                      constraints=[[[banned]], [], [[banned, 5]]])
    finally:
        del model.decode
    caps = ((src != PAD).sum(1) - 1 + 2).tolist()
    for i in (0, 2):  # EOS was blocked until the cap; marked as failing
        assert all(not h.constraints_met and len(h.tokens) == caps[i] for h in out[i])
    assert all(h.constraints_met for h in out[1])


@pytest.mark.parametrize("stop", ["bound", "k_finished"])
def test_without_constraints_the_constrained_search_is_plain_beam_search_byte_for_byte(model: Seq2SeqTransformer,
                                                                                        stop: str) -> None:
    src = sources(10)
    plain = beam_search(model, src, bos=BOS, eos=EOS, beam=3, nbest=3, lenpen=0.6, stop=stop)
    none = constrained_beam_search(model, src, bos=BOS, eos=EOS, beam=3, nbest=3, lenpen=0.6, stop=stop,
                                   constraints=[[] for _ in range(10)])
    assert [[(h.tokens, h.logprob, h.score, h.constraints_met) for h in nb] for nb in none] == \
        [[(h.tokens, h.logprob, h.score, True) for h in nb] for nb in plain]
    # Sentences without constraints in a batch with some: the same hypotheses as plain beam search.
    mixed = constrained_beam_search(model, src, bos=BOS, eos=EOS, beam=3, nbest=3, lenpen=0.6, stop=stop,
                                    constraints=[[absent(src, 0, 2)]] + [[] for _ in range(9)])
    assert [[h.tokens for h in nb] for nb in mixed[1:]] == [[h.tokens for h in nb] for nb in plain[1:]]
    assert [h.score for nb in mixed[1:] for h in nb] == pytest.approx([h.score for nb in plain[1:] for h in nb],
                                                                      abs=1e-5)


def test_greedy_search_takes_no_constraints(model: Seq2SeqTransformer) -> None:
    with pytest.raises(ValueError, match="^constrained decoding needs a beam of 2 or more"):
        ConstrainedBeamSearch(model, sources(2), bos=BOS, eos=EOS, beam=1, constraints=[[[5]], []])


# ---- files ---------------------------------------------------------------------------------------------------------

def test_constraint_files_as_json_lines_or_tab_separated() -> None:
    assert parse_constraints(['["the  cat", "sofa"]', "[]", '["dog"]']) == [("the cat", "sofa"), (), ("dog",)]
    assert parse_constraints(["the cat\tsofa", "", "dog"]) == [("the cat", "sofa"), (), ("dog",)]
    assert parse_constraints(["", "[nice]"], fmt="tsv") == [(), ("[nice]",)]  # told: tab-separated
    with pytest.raises(InputError, match="line 1: empty"):  # auto: JSON lines (its first non-blank line)
        parse_constraints(["", '  ["a"]'])
    with pytest.raises(InputError, match=r'line 1: expected a JSON list of strings \(\[\] for none\), got \{"a": 1\}'):
        parse_constraints(['{"a": 1}', "[]"])  # a JSON object: JSON lines, refused (not a TSV phrase)


@pytest.mark.parametrize("lines, fmt, message", [
    (['["a"]', '["a", 3]'], "auto", 'line 2: expected a JSON list of strings ([] for none), got ["a", 3]'),
    (['["a"]', "[oops"], "auto", "line 2: not JSON (Expecting value at column 2); each line holds a JSON list of "
                                 "phrases ([] for none)"),
    (['["a"]', ""], "jsonl", "line 2: empty; each line holds a JSON list of phrases ([] for none)"),
    (['["a", " "]'], "jsonl", "line 1: phrase 2 is empty"),
    (["a\t\tb"], "auto", "line 1: phrase 2 is empty (two tabs in a row, or a tab at an end of the line)"),
])
def test_a_bad_constraint_line_is_one_line_naming_it(lines: list[str], fmt: str, message: str) -> None:
    with pytest.raises(InputError) as err:
        parse_constraints(lines, fmt, name="--constraints terms")
    assert str(err.value) == f"--constraints terms {message}"


def test_per_line_files_must_match_the_input_and_a_pipe_is_counted_before_anything_is_translated(
        tmp_path: Path) -> None:
    (tmp_path / "pre.txt").write_text("The cat\n\nA dog\n", encoding="utf-8")
    (tmp_path / "terms.tsv").write_text("sofa\n\ncat\tdog\n", encoding="utf-8")
    args = Namespace(prefix=None, prefix_file=str(tmp_path / "pre.txt"), constraints=str(tmp_path / "terms.tsv"),
                     constraints_format=None)
    guides = load_guides(args)
    assert [(g.prefix, g.constraints) for g in guides] == [("The cat", ("sofa",)), ("", ()), ("A dog", ("cat", "dog"))]
    guides.check_count(3, "in.fr")
    with pytest.raises(InputError, match=rf"^--prefix_file {tmp_path}/pre.txt has 3 lines but in.fr has 4: give one "
                                         "line per input line$"):
        guides.check_count(4, "in.fr")

    class Pipe(io.BytesIO):
        def seekable(self) -> bool:
            return False

    stream, n = counted(Pipe(b"a\nb\nc"))  # a last line without a line feed counts
    assert n == 3 and stream.read() == b"a\nb\nc"


def test_what_test_py_records_of_the_constraints_met() -> None:
    guides = Guides(constraints=[("sofa",), (), ("red cat", "Bed")], files=("terms.tsv",))
    entry, line = guide_report(guides, ["The cat on the sofa.", "Hello.", "A red cat in bed."], [True, True, False],
                               lowercase=True)
    record = entry["constraints"]
    assert isinstance(record, dict) and len(record.pop("sha256")) == 64
    assert record == {"path": "terms.tsv", "sentences": 2, "sentences_met": 1, "phrases": 3, "phrases_found": 3}
    assert line == "  constraints: 1/2 sentences meet all theirs; 3/3 phrases appear in the translations"
    assert guide_report(guides, ["The cat on the sofa.", "", "A red cat in bed."], [True] * 3)[0]["constraints"][
        "phrases_found"] == 2  # case-sensitive unless the tokenizer lowercases
    tags = guide_tag(guides) + guide_tag(Guides(prefix="The"))
    assert [t.split("-")[0] for t in tags] == ["constraints", "prefix"] and all(len(t.split("-")[1]) == 8 for t in tags)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_script(*args)


def test_bad_guide_files_stop_the_command_line_in_one_line_before_the_model_loads(tmp_path: Path) -> None:
    """inference.py: a prefix file of another length than the input; test.py: a constraint line that is not a list.
    Nothing is written, and the run (which does not exist) is never loaded: the files fail first."""
    (tmp_path / "terms.jsonl").write_text('["sofa"]\n{"a": 1}\n', encoding="utf-8")
    (tmp_path / "pre.txt").write_text("The\nA\n", encoding="utf-8")
    run = str(tmp_path / "no_such_run")
    for args, message in (
        (["inference.py", "--input", "data/demo/test.fr", "--prefix_file", str(tmp_path / "pre.txt")],
         f"--prefix_file {tmp_path}/pre.txt has 2 lines but data/demo/test.fr has 40: give one line per input line"),
        (["test.py", "--constraints", str(tmp_path / "terms.jsonl")],
         f'--constraints {tmp_path}/terms.jsonl line 2: expected a JSON list of strings ([] for none), got {{"a": 1}}'),
    ):
        res = cli(*args, "--model_path", run)
        assert res.returncode == 2 and res.stdout == "" and "Traceback" not in res.stderr, res.stderr
        assert res.stderr.strip().splitlines()[-1] == f"error: {message}"
