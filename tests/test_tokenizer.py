"""Tokenizers: joint BPE/Unigram trained on a small made-up corpus, and the pretrained Marian one."""

from __future__ import annotations

import functools
import itertools
import json
from pathlib import Path

import pytest

from tokenizer import (
    JointSubwordTokenizer,
    MarianTokenizerWrapper,
    Tokenizer,
    TokenizerError,
    build_tokenizer,
    load_tokenizer,
    train_tokenizer,
)
from tokenizer.joint import subsample
from utils.config import TokenizerConfig

MARIAN_DIR = "opus-mt-tc-big-fr-en"

FR_GREET = ["Bonjour", "Salut", "Merci", "Ça va", "Où"]
FR_SUBJ = ["le chat", "la souris", "mon frère", "l'élève", "notre équipe", "ce garçon", "une fée", "le château"]
FR_VERB = ["mange", "regarde", "aime", "préfère", "achète", "voit", "est"]
FR_OBJ = ["une pomme", "le fromage", "la forêt", "un gâteau", "les étoiles", "la mer", "le monde", "très bien"]
FR_END = [".", " !", " ?", ", n'est-ce pas ?"]
EN_SUBJ = ["The cat", "The mouse", "My brother", "The pupil", "Our team", "This boy", "A fairy"]
EN_VERB = ["eats", "watches", "likes", "prefers", "buys", "sees"]
EN_OBJ = ["an apple", "the cheese", "the forest", "a cake", "the stars", "the sea", "the world"]
EN_END = [".", "!", "?", ", doesn't it?"]

# Held out from training, but made of training words and characters.
ROUND_TRIP = [
    "Bonjour le monde.",
    "L'élève préfère le château, n'est-ce pas ?",
    "Où est la forêt ? Ça va très bien !",
    "Merci, notre équipe achète un gâteau.",
    "The pupil likes the stars, doesn't it?",
]


def _corpus() -> tuple[list[str], list[str]]:
    """About 650 French and 240 English short sentences built by combining words."""
    # strides coprime with the list lengths, so every word and ending is used
    fr = [f"{g}, {s} {v} {o}{e}" for g, s, v, o, e in itertools.product(FR_GREET, FR_SUBJ, FR_VERB, FR_OBJ, FR_END)]
    fr = (
        fr[::31]
        + [f"{s[0].upper()}{s[1:]} {v} {o}{e}" for s, v, o, e in itertools.product(FR_SUBJ, FR_VERB, FR_OBJ, FR_END)][
            ::5
        ]
    )
    en = [f"{s} {v} {o}{e}" for s, v, o, e in itertools.product(EN_SUBJ, EN_VERB, EN_OBJ, EN_END)][::5]
    held_out = set(ROUND_TRIP)
    return [x for x in fr if x not in held_out], [x for x in en if x not in held_out]


@functools.cache
def _trained(kind: str, vocab_size: int = 456, lowercase: bool = False, seed: int = 0,
             byte_fallback: bool = True) -> Tokenizer:
    fr, en = _corpus()
    cfg = TokenizerConfig(type=kind, vocab_size=vocab_size, min_frequency=2, lowercase=lowercase,  # type: ignore[arg-type]
                          byte_fallback=byte_fallback)
    return train_tokenizer(cfg, fr, en, seed=seed)


def test_corpus_is_a_few_hundred_sentences() -> None:
    fr, en = _corpus()
    assert 500 <= len(fr) <= 800 and 200 <= len(en) <= 300
    assert not set(ROUND_TRIP) & set(fr + en)


@pytest.mark.parametrize("kind", ["bpe", "unigram"])
def test_joint_special_ids_and_vocab_size(kind: str) -> None:
    tok = _trained(kind)
    assert isinstance(tok, JointSubwordTokenizer)
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id) == (0, 1, 2, 3)
    assert tok.id_to_token([0, 1, 2, 3]) == ["<pad>", "<s>", "</s>", "<unk>"]
    assert 256 + 50 < tok.vocab_size <= 456  # 256 byte tokens + what the corpus supports
    assert tok.id_to_token([4, 259]) == ["<0x00>", "<0xFF>"]
    assert len(tok.fingerprint) == 64 and int(tok.fingerprint, 16) >= 0


@pytest.mark.parametrize("kind", ["bpe", "unigram"])
def test_joint_round_trip(kind: str) -> None:
    tok = _trained(kind)
    ids = tok.encode_src(ROUND_TRIP)
    assert ids == tok.encode_tgt(ROUND_TRIP)  # joint vocabulary
    assert all(ids_ and tok.unk_id not in ids_ and tok.bos_id not in ids_ and tok.eos_id not in ids_ for ids_ in ids)
    assert [tok.decode(x) for x in ids] == ROUND_TRIP
    assert tok.decode_batch(ids) == ROUND_TRIP
    assert tok.encode_src([]) == [] and tok.decode_batch([]) == []
    assert tok.encode_src([""]) == [[]] and tok.decode([]) == ""


@pytest.mark.parametrize("kind", ["bpe", "unigram"])
def test_joint_decode_stops_at_eos_and_drops_specials(kind: str) -> None:
    tok = _trained(kind)
    a, b = tok.encode_tgt(["Bonjour le monde.", "Merci, le chat mange une pomme."])
    ids = [tok.bos_id, *a, tok.eos_id, *b, tok.eos_id, tok.pad_id]
    assert tok.decode(ids) == "Bonjour le monde."
    assert tok.decode([tok.bos_id, *b, tok.pad_id, tok.pad_id]) == "Merci, le chat mange une pomme."
    assert tok.decode_batch([ids, [tok.bos_id, *b, tok.eos_id, *a]]) == [
        "Bonjour le monde.",
        "Merci, le chat mange une pomme.",
    ]
    assert tok.decode([tok.eos_id, *a]) == ""
    # without byte fallback, unknown characters become <unk> and are dropped on decode
    plain = _trained(kind, byte_fallback=False)
    (z,) = plain.encode_src(["Bonjour ☃ le monde."])
    assert plain.unk_id in z
    assert "☃" not in plain.decode(z) and "<unk>" not in plain.decode(z)
    # an <unk> the model generates is dropped too
    assert tok.decode([*a[:1], tok.unk_id, *a[1:]]) == "Bonjour le monde."


@pytest.mark.parametrize("kind", ["bpe", "unigram"])
def test_joint_id_to_token(kind: str) -> None:
    tok = _trained(kind)
    (ids,) = tok.encode_src(["L'élève préfère le château, n'est-ce pas ?"])
    pieces = tok.id_to_token(ids)
    assert len(pieces) == len(ids) and all(isinstance(p, str) and p for p in pieces)
    assert "".join(pieces).replace("▁", " ").strip() == "L'élève préfère le château, n'est-ce pas ?"
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        tok.id_to_token([tok.vocab_size])


@pytest.mark.parametrize("kind", ["bpe", "unigram"])
def test_joint_save_load(kind: str, tmp_path: Path) -> None:
    tok = _trained(kind)
    tok.save(tmp_path / "tok")
    assert (tmp_path / "tok" / "tokenizer.json").is_file()
    meta = json.loads((tmp_path / "tok" / "meta.json").read_text())
    assert meta["type"] == kind and meta["fingerprint"] == tok.fingerprint
    loaded = load_tokenizer(tmp_path / "tok")
    assert isinstance(loaded, JointSubwordTokenizer) and loaded.kind == kind
    assert loaded.fingerprint == tok.fingerprint
    assert loaded.vocab_size == tok.vocab_size
    assert loaded.encode_src(ROUND_TRIP) == tok.encode_src(ROUND_TRIP)
    assert loaded.decode_batch(tok.encode_tgt(ROUND_TRIP)) == ROUND_TRIP
    # saving the reloaded tokenizer again gives the same fingerprint
    loaded.save(tmp_path / "again")
    assert load_tokenizer(tmp_path / "again").fingerprint == tok.fingerprint


@pytest.mark.parametrize("kind", ["bpe", "unigram"])
def test_joint_fingerprint_tracks_vocabulary(kind: str) -> None:
    small, big = _trained(kind, vocab_size=376), _trained(kind)
    assert small.vocab_size < big.vocab_size
    assert small.fingerprint != big.fingerprint
    fr, en = _corpus()
    again = train_tokenizer(TokenizerConfig(type=kind, vocab_size=456), fr, en)  # type: ignore[arg-type]
    assert again.fingerprint == big.fingerprint  # deterministic training
    assert again.encode_src(ROUND_TRIP) == big.encode_src(ROUND_TRIP)


def test_bpe_and_unigram_fingerprints_differ() -> None:
    assert _trained("bpe").fingerprint != _trained("unigram").fingerprint


@pytest.mark.parametrize("kind", ["bpe", "unigram"])
def test_joint_lowercase(kind: str) -> None:
    tok = _trained(kind, lowercase=True)
    assert tok.decode(tok.encode_src(["Bonjour LE Monde."])[0]) == "bonjour le monde."
    assert tok.encode_src(["ÉLÈVE"]) == tok.encode_src(["élève"])
    assert tok.fingerprint != _trained(kind).fingerprint


def test_subsample_is_seeded_parallel_and_ordered() -> None:
    src = [f"s{i}" for i in range(100)]
    tgt = [f"t{i}" for i in range(100)]
    a_src, a_tgt = subsample(src, tgt, 10, seed=3)
    b_src, b_tgt = subsample(iter(src), iter(tgt), 10, seed=3)
    assert list(a_src) == list(b_src) and list(a_tgt) == list(b_tgt)
    assert len(list(a_src)) == 10 and [s[1:] for s in a_src] == [t[1:] for t in a_tgt]
    assert [int(s[1:]) for s in a_src] == sorted(int(s[1:]) for s in a_src)
    assert list(subsample(src, tgt, 10, seed=4)[0]) != list(a_src)
    assert subsample(src, tgt, None, seed=0) == (src, tgt)
    assert list(subsample(src, tgt, 1000, seed=0)[0]) == src


def test_train_max_sentences() -> None:
    fr, en = _corpus()
    cfg = TokenizerConfig(type="bpe", vocab_size=456, train_max_sentences=60)
    a = train_tokenizer(cfg, fr, en, seed=1)
    assert a.fingerprint == train_tokenizer(cfg, fr, en, seed=1).fingerprint
    assert a.fingerprint != _trained("bpe").fingerprint


def test_train_errors() -> None:
    fr, en = _corpus()
    with pytest.raises(TokenizerError, match="vocab_size"):
        train_tokenizer(TokenizerConfig(type="bpe", vocab_size=4, byte_fallback=False), fr, en)
    with pytest.raises(TokenizerError, match=r"must be > 260 \(256 byte tokens"):
        train_tokenizer(TokenizerConfig(type="bpe", vocab_size=200), fr, en)
    with pytest.raises(TokenizerError, match="no sentences"):
        train_tokenizer(TokenizerConfig(type="unigram", vocab_size=400), [], [])
    with pytest.raises(TokenizerError, match="cannot be trained"):
        train_tokenizer(TokenizerConfig(type="marian"), fr, en)


def test_build_tokenizer_trains_joint_types() -> None:
    calls: list[int] = []

    def texts() -> tuple[list[str], list[str]]:
        calls.append(1)
        return _corpus()

    tok = build_tokenizer(TokenizerConfig(type="bpe", vocab_size=456), texts)
    assert calls == [1] and tok.fingerprint == _trained("bpe").fingerprint


def test_load_tokenizer_errors(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="meta.json is missing"):
        load_tokenizer(tmp_path)
    (tmp_path / "meta.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="corrupt"):
        load_tokenizer(tmp_path)
    (tmp_path / "meta.json").write_text(json.dumps({"type": "wordpiece"}))
    with pytest.raises(TokenizerError, match="not one of"):
        load_tokenizer(tmp_path)
    (tmp_path / "meta.json").write_text(json.dumps({"type": "bpe"}))
    with pytest.raises(TokenizerError, match="tokenizer.json not found"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(TokenizerError, match="cannot read"):
        load_tokenizer(tmp_path)


# --- Marian -------------------------------------------------------------------------------------------------------


@functools.cache
def _marian(path: str) -> MarianTokenizerWrapper:
    return MarianTokenizerWrapper.from_path(path)


@pytest.fixture
def marian(shared_data: Path) -> MarianTokenizerWrapper:
    path = shared_data / MARIAN_DIR
    if not path.is_dir():
        pytest.skip(f"{path} not found")
    return _marian(str(path))


def test_marian_source_and_target(marian: MarianTokenizerWrapper) -> None:
    text = "Bonjour le monde, ça va très bien."
    (src,) = marian.encode_src([text])
    (tgt,) = marian.encode_tgt([text])
    assert src and tgt and src != tgt  # source.spm vs target.spm segment differently
    assert marian.eos_id not in src + tgt and marian.pad_id not in src + tgt
    assert marian.bos_id == marian.pad_id  # decoder_start_token_id
    assert marian.id_to_token([marian.eos_id, marian.unk_id, marian.pad_id]) == ["</s>", "<unk>", "<pad>"]
    assert marian.vocab_size > max(src + tgt) and marian.vocab_size > 50_000
    assert marian.decode(tgt) == text and marian.decode(src) == text
    assert marian.decode([marian.pad_id, *tgt, marian.eos_id, *src, marian.pad_id]) == text
    assert marian.decode_batch([tgt, [marian.pad_id, *src, marian.eos_id]]) == [text, text]
    pieces = marian.id_to_token(src)
    assert pieces[0] == "▁Bonjour" and all(isinstance(p, str) for p in pieces)


def test_marian_round_trip_sentences(marian: MarianTokenizerWrapper) -> None:
    sents = ["L'élève préfère le château, n'est-ce pas ?", "The pupil likes the stars, doesn't it?"]
    assert marian.decode_batch(marian.encode_tgt(sents)) == sents
    assert marian.decode_batch(marian.encode_src(sents)) == sents


def test_marian_save_load(marian: MarianTokenizerWrapper, tmp_path: Path) -> None:
    marian.save(tmp_path / "tok")
    assert json.loads((tmp_path / "tok" / "meta.json").read_text())["type"] == "marian"
    assert (tmp_path / "tok" / "source.spm").is_file() and (tmp_path / "tok" / "target.spm").is_file()
    loaded = load_tokenizer(tmp_path / "tok")
    assert isinstance(loaded, MarianTokenizerWrapper)
    assert loaded.fingerprint == marian.fingerprint
    assert (loaded.pad_id, loaded.bos_id, loaded.eos_id, loaded.unk_id, loaded.vocab_size) == (
        marian.pad_id,
        marian.bos_id,
        marian.eos_id,
        marian.unk_id,
        marian.vocab_size,
    )
    assert loaded.encode_src(ROUND_TRIP) == marian.encode_src(ROUND_TRIP)
    assert loaded.encode_tgt(ROUND_TRIP) == marian.encode_tgt(ROUND_TRIP)
    assert marian.fingerprint != _trained("bpe").fingerprint


def test_build_tokenizer_marian_needs_no_training_data(shared_data: Path) -> None:
    path = shared_data / MARIAN_DIR
    if not path.is_dir():
        pytest.skip(f"{path} not found")

    def texts() -> tuple[list[str], list[str]]:
        raise AssertionError("marian must not ask for training data")

    tok = build_tokenizer(TokenizerConfig(type="marian", path=str(path)), texts)
    assert tok.kind == "marian"


def test_marian_hub_id_offline_is_one_clear_line() -> None:
    # conftest sets HF_HUB_OFFLINE=1 and an empty HF_HOME, so nothing can be found or downloaded
    with pytest.raises(TokenizerError) as info:
        build_tokenizer(TokenizerConfig(type="marian", path="Helsinki-NLP/opus-mt-fr-en"), lambda: ([], []))
    msg = str(info.value)
    assert "\n" not in msg
    assert "Hub is unreachable" in msg and "local folder" in msg and "opus-mt-tc-big-fr-en" in msg


def test_marian_bad_paths(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="tokenizer.path is required"):
        MarianTokenizerWrapper.from_path(None)
    with pytest.raises(TokenizerError, match="no such folder"):
        MarianTokenizerWrapper.from_path(str(tmp_path / "missing"))
    with pytest.raises(TokenizerError, match="missing source.spm"):
        MarianTokenizerWrapper.from_path(str(tmp_path))


@pytest.mark.parametrize("kind", ["bpe", "unigram"])
def test_joint_whitespace_of_any_kind_encodes_like_one_space(kind: str) -> None:
    """\\r (CRLF input), tabs, no-break spaces and runs of spaces give no lone "▁" and no <unk>."""
    tok = _trained(kind)
    plain = tok.encode_src(["le chat est noir"])[0]
    for messy in ("le chat est noir\r", " le  chat\test\u00a0noir ", "le\u2028chat   est\r\nnoir"):
        assert tok.encode_src([messy])[0] == plain, repr(messy)
    assert tok.unk_id not in tok.encode_src(["le chat\r"])[0]


@pytest.mark.parametrize("kind", ["bpe", "unigram"])
def test_unseen_characters_round_trip_through_byte_fallback(kind: str) -> None:
    """A character the training text never had is encoded as its UTF-8 bytes, not <unk>: nothing vanishes."""
    tok = _trained(kind)
    text = "Bartók joue du 🎻 à Łódź, Ærø."
    ids = tok.encode_src([text])[0]
    assert tok.unk_id not in ids and tok.decode(ids) == text
    plain = _trained(kind, byte_fallback=False)
    assert plain.decode(plain.encode_src([text])[0]) != text  # without it, unseen characters are lost


@pytest.mark.parametrize("kind", ["bpe", "unigram"])
def test_byte_tokens_for_newlines_and_tabs_never_split_an_output_line(kind: str) -> None:
    """A model may emit the byte tokens of a newline or tab: a hypothesis must stay one line of clean text."""
    tok = _trained(kind)
    vocab = tok.id_to_token(list(range(tok.vocab_size)))
    newline, tab = vocab.index("<0x0A>"), vocab.index("<0x09>")
    ids = tok.encode_tgt(["le chat est noir"])[0]
    middle = len(ids) // 2
    noisy = ids[:middle] + [newline, tab, newline] + ids[middle:]
    for text in (tok.decode(noisy), tok.decode_batch([noisy])[0]):
        assert "\n" not in text and "\t" not in text and "  " not in text and text == text.strip()
        assert text.replace(" ", "") == "lechatestnoir"


@pytest.mark.parametrize("kind", ["bpe", "unigram", "char"])
def test_every_bench_test_line_round_trips(shared_data: Path, kind: str) -> None:
    """A vocabulary trained on 20,000 training pairs sees every line of the three bench test sets (both
    languages) come back from decode(encode(line)) as the normalised line, with no <unk>."""
    bench = shared_data / "bench" / "fr-en"
    fr = (bench / "train.fr").read_text(encoding="utf-8").splitlines()
    en = (bench / "train.en").read_text(encoding="utf-8").splitlines()
    size = 360 if kind == "char" else 4000  # char: 256 bytes, 4 specials, the 100 most frequent characters
    tok = train_tokenizer(TokenizerConfig(type=kind, vocab_size=size, train_max_sentences=20000), fr, en)
    normalizer = tok._tok.normalizer
    lines = [line for name in ("test.tatoeba", "test.multi30k-2016", "test.iwslt-tst2010") for lang in ("fr", "en")
             for line in (bench / f"{name}.{lang}").read_text(encoding="utf-8").splitlines() if line.strip()]
    assert len(lines) > 5000
    ids = tok.encode_src(lines)
    assert not [line for line, x in zip(lines, ids, strict=True) if tok.unk_id in x]
    decoded = tok.decode_batch(ids)
    bad = [(a, b) for a, b in zip(lines, decoded, strict=True) if normalizer.normalize_str(a) != b]
    assert not bad, bad[:3]
    assert sum(256 + 4 > i >= 4 for x in ids for i in x) > 0  # some characters needed their bytes


def test_char_tokenizer_keeps_the_most_frequent_characters_and_falls_back_to_bytes(tmp_path: Path) -> None:
    fr, en = _corpus()
    tok = train_tokenizer(TokenizerConfig(type="char", vocab_size=300), fr, en)
    assert tok.vocab_size == 300 and tok.kind == "char"
    pieces = tok.id_to_token(list(range(260, 300)))
    assert all(len(p) == 1 for p in pieces) and "▁" in pieces and "e" in pieces  # single characters only
    text = "Le chat dort, Bartók joue du 🎻."
    ids = tok.encode_src([text])[0]
    assert tok.decode(ids) == text and tok.unk_id not in ids
    assert len(ids) >= len(text)  # one id per character (or more: bytes of unseen ones)
    tok.save(tmp_path / "char")
    again = load_tokenizer(tmp_path / "char")
    assert again.fingerprint == tok.fingerprint and again.encode_src([text]) == [ids]
    every = train_tokenizer(TokenizerConfig(type="char", vocab_size=10_000, min_frequency=1), fr, en)
    common = train_tokenizer(TokenizerConfig(type="char", vocab_size=10_000, min_frequency=50), fr, en)
    assert 260 < common.vocab_size < every.vocab_size < 10_000  # min_frequency drops rare characters


def test_word_tokenizer_splits_punctuation_limits_its_vocabulary_and_drops_unknown_words(tmp_path: Path) -> None:
    fr, en = _corpus()
    tok = train_tokenizer(TokenizerConfig(type="word", vocab_size=10_000, min_frequency=1), fr, en)
    assert 50 < tok.vocab_size < 10_000 and tok.kind == "word"  # every word of the corpus, no more
    known = "Le chat mange."
    ids = tok.encode_src([known])[0]
    assert tok.id_to_token(ids) == ["▁Le", "▁chat", "▁mange", "."] and tok.decode(ids) == known
    ids = tok.encode_src(["Le chat xylophonique mange."])[0]
    assert tok.unk_id in ids  # the unknown-word policy: <unk> in, left out of the text
    assert tok.decode(ids) == "Le chat mange."
    tok.save(tmp_path / "word")
    assert load_tokenizer(tmp_path / "word").fingerprint == tok.fingerprint
    small = train_tokenizer(TokenizerConfig(type="word", vocab_size=40, min_frequency=1), fr, en)
    rare = tok.id_to_token([tok.vocab_size - 1])[0].lstrip("▁")  # the least frequent word of the corpus
    assert tok.encode_src([rare]) != [[tok.unk_id]]
    assert small.vocab_size == 40 and small.encode_src([rare]) == [[small.unk_id]]  # the limit holds
