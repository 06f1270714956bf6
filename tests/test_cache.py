"""Preprocessing cache: hits, invalidation, corruption recovery, no pickle, filtering rules."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

import data.cache as cache_mod
from data.cache import TokenizedSplit, load_or_build, load_split, save_split
from data.lines import Pairs
from data.sources import DataError, load_corpus
from utils.config import Config, DataConfig


class FakeTokenizer:
    """One id per whitespace word (crc32-hashed into the vocabulary), ids 0-3 reserved."""

    pad_id, bos_id, eos_id, unk_id = 0, 1, 2, 3
    vocab_size = 1000

    def __init__(self, fingerprint: str = "fake-v1") -> None:
        self.fingerprint = fingerprint

    def _encode(self, texts: list[str]) -> list[list[int]]:
        return [[4 + zlib.crc32(w.encode()) % (self.vocab_size - 4) for w in t.split()] for t in texts]

    encode_src = _encode
    encode_tgt = _encode


def words(n: int, tag: str) -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


# (src words, tgt words) per split; comments give the fate under min_len=2, max_len=6,
# max_train_len=5, max_len_ratio=2.0
TRAIN = [(3, 3),  # 0 keep
         (1, 3),  # 1 drop: src < min_len
         (3, 1),  # 2 drop: tgt < min_len
         (5, 5),  # 3 keep: at max_train_len
         (6, 6),  # 4 drop: > max_train_len (but <= max_len)
         (2, 4),  # 5 keep: ratio 2.0
         (2, 5),  # 6 drop: ratio 2.5
         (9, 9),  # 7 drop: > max_len
         (4, 3)]  # 8 keep
VALID = [(1, 1), (6, 6), (7, 2), (2, 7), (3, 0)]  # drop rows 2 and 3 (> max_len); short/empty kept
TEST = [(1, 1), (20, 30), (0, 4)]  # all kept


def _write_split(folder: Path, name: str, pairs: list[tuple[int, int]]) -> None:
    src = [words(s, f"s{i}w") for i, (s, _) in enumerate(pairs)]
    tgt = [words(t, f"t{i}w") for i, (_, t) in enumerate(pairs)]
    # the loader drops empty train pairs before tokenizing: none of the train rows above is empty
    (folder / f"{name}.fr").write_text("\n".join(src) + "\n", encoding="utf-8")
    (folder / f"{name}.en").write_text("\n".join(tgt) + "\n", encoding="utf-8")


@pytest.fixture
def cfg(tmp_path: Path) -> Config:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    _write_split(corpus, "train", TRAIN)
    _write_split(corpus, "valid", VALID)
    _write_split(corpus, "test", TEST)
    data = DataConfig(source="text", path=str(corpus), test=["test"], min_len=2, max_len=6, max_train_len=5,
                      max_len_ratio=2.0, cache_dir=str(tmp_path / "cache"))
    return Config(data=data)


class CountingLoader:
    def __init__(self, cfg: Config) -> None:
        self.cfg, self.calls = cfg, 0

    def __call__(self) -> dict[str, Pairs]:
        self.calls += 1
        return load_corpus(self.cfg.data)


SPLITS = ["train", "validation", "test"]


def _arrays(splits: dict[str, TokenizedSplit]) -> dict[str, dict[str, np.ndarray]]:
    return {name: {k: np.array(v) for k, v in ts.arrays().items()} for name, ts in splits.items()}


def _assert_same(a: dict[str, dict[str, np.ndarray]], b: dict[str, dict[str, np.ndarray]]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        for k in a[name]:
            assert a[name][k].dtype == b[name][k].dtype, (name, k)
            np.testing.assert_array_equal(a[name][k], b[name][k], err_msg=f"{name}.{k}")


def _key_dirs(cfg: Config) -> list[Path]:
    return sorted(p for p in Path(cfg.data.cache_dir).iterdir() if p.is_dir())


def test_hit_after_build(cfg: Config, caplog: pytest.LogCaptureFixture) -> None:
    tok = FakeTokenizer()
    loader = CountingLoader(cfg)
    with caplog.at_level(logging.INFO, logger="data"):
        first = load_or_build(cfg, tok, loader, SPLITS)
    assert loader.calls == 1
    assert any("built" in r.getMessage() and cfg.data.cache_dir in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="data"):
        second = load_or_build(cfg, tok, loader, SPLITS)
    assert loader.calls == 1  # a hit never loads the corpus
    hits = [r.getMessage() for r in caplog.records if "hit" in r.getMessage()]
    assert len(hits) == 1 and cfg.data.cache_dir in hits[0]
    _assert_same(_arrays(first), _arrays(second))
    assert [p.name for p in _key_dirs(cfg)] == [cache_mod.cache_key(cfg, tok)[:16]]


def test_files_meta_and_no_pickle(cfg: Config) -> None:
    tok = FakeTokenizer()
    load_or_build(cfg, tok, CountingLoader(cfg), SPLITS)
    (root,) = _key_dirs(cfg)
    key = cache_mod.cache_key(cfg, tok)
    for split in SPLITS:
        meta = json.loads((root / split / "meta.json").read_text(encoding="utf-8"))
        assert meta["key"] == key and meta["split"] == split
        for name, dtype in cache_mod.ARRAYS.items():
            path = root / split / f"{name}.npy"
            assert meta["files"][name]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
            arr = np.load(path, allow_pickle=False)
            assert arr.dtype == np.dtype(dtype)
            assert list(arr.shape) == meta["files"][name]["shape"]
        assert meta["size"] == len(np.load(root / split / "index.npy", allow_pickle=False))
    assert not list(Path(cfg.data.cache_dir).rglob("*.pkl")) and not list(Path(cfg.data.cache_dir).rglob("*.tmp*"))


def test_filtering_rules(cfg: Config) -> None:
    tok = FakeTokenizer()
    out = load_or_build(cfg, tok, CountingLoader(cfg), SPLITS)
    assert out["train"].index.tolist() == [0, 3, 5, 8]
    assert out["validation"].index.tolist() == [0, 1, 4]
    assert out["test"].index.tolist() == [0, 1, 2]
    for name, pairs in (("train", TRAIN), ("validation", VALID), ("test", TEST)):
        ts = out[name]
        expect = [pairs[i] for i in ts.index]
        assert ts.src_lengths.tolist() == [s for s, _ in expect]
        assert ts.tgt_lengths.tolist() == [t for _, t in expect]
    # rows map back to the corpus: pair(i) is the tokenization of corpus row index[i]
    corpus = load_corpus(cfg.data)
    ts = out["train"]
    for i, row in enumerate(ts.index):
        src, tgt = ts.pair(i)
        assert src.tolist() == tok.encode_src([corpus["train"]["src"][int(row)]])[0]
        assert tgt.tolist() == tok.encode_tgt([corpus["train"]["tgt"][int(row)]])[0]


def test_no_ratio_or_train_cap(cfg: Config) -> None:
    cfg.data.max_train_len = None
    cfg.data.max_len_ratio = None
    out = load_or_build(cfg, FakeTokenizer(), CountingLoader(cfg), ["train"])
    assert out["train"].index.tolist() == [0, 3, 4, 5, 6, 8]


@pytest.mark.parametrize("change", ["tokenizer", "data_file", "max_len", "max_len_ratio"])
def test_rebuild_on_change(cfg: Config, change: str) -> None:
    tok = FakeTokenizer()
    loader = CountingLoader(cfg)
    load_or_build(cfg, tok, loader, SPLITS)
    if change == "tokenizer":
        tok = FakeTokenizer("fake-v2")
    elif change == "data_file":
        path = Path(cfg.data.path) / "test.en"  # type: ignore[arg-type]
        path.write_text(path.read_text(encoding="utf-8").replace("t1w0", "changed"), encoding="utf-8")
    elif change == "max_len":
        cfg.data.max_len = 7
    else:
        cfg.data.max_len_ratio = 3.0
    load_or_build(cfg, tok, loader, SPLITS)
    assert loader.calls == 2
    assert len(_key_dirs(cfg)) == 2
    load_or_build(cfg, tok, loader, SPLITS)
    assert loader.calls == 2


def test_same_length_edit_with_restored_times_rebuilds(cfg: Config) -> None:
    """A content change that keeps size and modification time (``touch -r``, some sync tools) is seen."""
    tok = FakeTokenizer()
    loader = CountingLoader(cfg)
    first = load_or_build(cfg, tok, loader, ["test"])
    path = Path(cfg.data.path) / "test.en"  # type: ignore[arg-type]
    st = path.stat()
    text = path.read_text(encoding="utf-8")
    edited = text.replace("t1w0", "t1w9", 1)
    assert edited != text and len(edited) == len(text)
    path.write_text(edited, encoding="utf-8")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # what touch -r does
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    second = load_or_build(cfg, tok, loader, ["test"])
    assert loader.calls == 2
    assert not np.array_equal(first["test"].arrays()["tgt_tokens"], second["test"].arrays()["tgt_tokens"])


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete", "meta"])
def test_corrupt_cache_rebuilt(cfg: Config, damage: str, caplog: pytest.LogCaptureFixture) -> None:
    tok = FakeTokenizer()
    loader = CountingLoader(cfg)
    original = _arrays(load_or_build(cfg, tok, loader, SPLITS))
    (root,) = _key_dirs(cfg)
    target = root / "train" / "src_tokens.npy"
    raw = target.read_bytes()
    if damage == "flip":
        target.write_bytes(raw[:-3] + bytes([raw[-3] ^ 0xFF]) + raw[-2:])
    elif damage == "truncate":
        target.write_bytes(raw[: len(raw) // 2])
    elif damage == "delete":
        target.unlink()
    else:
        (root / "train" / "meta.json").write_text("{not json", encoding="utf-8")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="data"):
        rebuilt = load_or_build(cfg, tok, loader, SPLITS)
    assert loader.calls == 2
    corrupt = [r.getMessage() for r in caplog.records if "is corrupt (" in r.getMessage()]
    assert len(corrupt) == 1 and "train" in corrupt[0] and "\n" not in corrupt[0]
    _assert_same(original, _arrays(rebuilt))
    assert target.read_bytes() == raw  # rewritten identically
    again = load_or_build(cfg, tok, loader, SPLITS)
    assert loader.calls == 2
    _assert_same(original, _arrays(again))


def test_corrupt_offsets_detected(tmp_path: Path) -> None:
    """A cache whose checksums match but whose offsets are inconsistent is rejected."""
    ts = TokenizedSplit.from_sequences([[5, 6], [7]], [[8], [9, 10]])
    save_split(ts, tmp_path, "test", "k" * 64, {})
    folder = tmp_path / "test"
    bad = np.array([0, 2, 9], dtype=np.int64)
    np.save(folder / "src_offsets.npy", bad, allow_pickle=False)
    meta = json.loads((folder / "meta.json").read_text())
    meta["files"]["src_offsets"]["sha256"] = hashlib.sha256((folder / "src_offsets.npy").read_bytes()).hexdigest()
    (folder / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(cache_mod.CacheCorrupt, match="src_offsets"):
        load_split(folder, "k" * 64, "test")
    with pytest.raises(cache_mod.CacheCorrupt, match="key"):
        load_split(folder, "x" * 64, "test")


def test_num_proc_matches_serial(cfg: Config, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache_mod, "CHUNK", 2)  # several chunks per side
    serial = load_or_build(cfg, FakeTokenizer("a"), CountingLoader(cfg), SPLITS)
    cfg.data.num_proc = 2
    parallel = load_or_build(cfg, FakeTokenizer("b"), CountingLoader(cfg), SPLITS)
    _assert_same(_arrays(serial), _arrays(parallel))


def test_errors(cfg: Config) -> None:
    with pytest.raises(DataError, match="'nope' is not in the corpus"):
        load_or_build(cfg, FakeTokenizer(), CountingLoader(cfg), ["nope"])
    with pytest.raises(DataError, match="invalid split name"):
        load_or_build(cfg, FakeTokenizer(), CountingLoader(cfg), ["../x"])

    class BadTokenizer(FakeTokenizer):
        vocab_size = 10

        def encode_src(self, texts: list[str]) -> list[list[int]]:
            return [[4, 10] for _ in texts]

    with pytest.raises(DataError, match=r"outside \[0, 10\)"):
        load_or_build(cfg, BadTokenizer(), CountingLoader(cfg), ["test"])


def test_tokenized_split_api() -> None:
    ts = TokenizedSplit.from_sequences([[5, 6, 7], [], [8]], [[9], [10, 11], []], index=[4, 7, 9])
    assert len(ts) == 3
    assert ts.src_lengths.tolist() == [3, 0, 1] and ts.tgt_lengths.tolist() == [1, 2, 0]
    assert ts.src_offsets.dtype == np.int64 and ts.index.tolist() == [4, 7, 9]
    s, t = ts.pair(1)
    assert s.tolist() == [] and t.tolist() == [10, 11]
    with pytest.raises(ValueError, match="offsets"):
        TokenizedSplit(np.zeros(3, np.int32), np.array([0, 2], np.int64), np.zeros(1, np.int32),
                       np.array([0, 1], np.int64), np.zeros(1, np.int64))


def test_large_split_loads_fast(tmp_path: Path) -> None:
    """A cached split of ~230k pairs (~27 tokens a side) loads and verifies well under 3 s."""
    rng = np.random.default_rng(0)
    n = 230_000
    s_len = rng.integers(1, 55, n)
    t_len = rng.integers(1, 55, n)
    ts = TokenizedSplit.from_lengths(rng.integers(4, 8000, int(s_len.sum())), s_len,
                                     rng.integers(4, 8000, int(t_len.sum())), t_len, np.arange(n))
    save_split(ts, tmp_path, "train", "k" * 64, {})
    start = time.perf_counter()
    loaded = load_split(tmp_path / "train", "k" * 64, "train")
    took = time.perf_counter() - start
    assert len(loaded) == n and int(loaded.src_lengths.sum()) == int(s_len.sum())
    assert took < 3.0, f"loading took {took:.2f}s"


def test_concurrent_writer_keeps_first(tmp_path: Path) -> None:
    """A second builder that finishes later leaves the first copy in place and no temp dirs behind."""
    first = TokenizedSplit.from_sequences([[5, 6]], [[7]])
    save_split(first, tmp_path, "test", "k" * 64, {})
    before = (tmp_path / "test" / "src_tokens.npy").read_bytes()
    save_split(TokenizedSplit.from_sequences([[9]], [[9]]), tmp_path, "test", "k" * 64, {})
    assert (tmp_path / "test" / "src_tokens.npy").read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["test"]
    assert load_split(tmp_path / "test", "k" * 64, "test").src_tokens.tolist() == [5, 6]
