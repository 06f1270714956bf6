"""Preprocessing cache: tokenized, filtered splits stored as NumPy ``.npy`` arrays (never pickle).

Layout: ``<cache_dir>/<key[:16]>/<split>/`` holds ``src_tokens.npy`` (int32, flat), ``src_offsets.npy``
(int64, n+1), ``tgt_tokens.npy``, ``tgt_offsets.npy`` and ``index.npy`` (int64, row of each pair in
the corpus split) plus ``meta.json`` (key, size, sha256/dtype/shape of each array file). Each split
directory is built in a temporary directory next to it and renamed into place, so a reader never
sees a half-written split and concurrent builders are safe (the first rename wins). The key hashes
the corpus fingerprint, the tokenizer fingerprint, the length limits and :data:`CACHE_VERSION`.

Filtering (lengths in subword tokens, bos/eos not counted):

- ``train``: drop pairs with a side shorter than ``min_len`` or longer than ``max_len`` (and
  ``max_train_len`` if set), or whose length ratio max/min exceeds ``max_len_ratio`` if set;
- ``validation``: drop pairs with a side longer than ``max_len`` (the loss is computed on them);
- every other split (test sets): keep everything, so ``index`` is ``arange(n)``.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import multiprocessing
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from data.sources import DataError, corpus_fingerprint

if TYPE_CHECKING:
    from data.config import DataConfig
    from data.config import Experiment as Config
    from data.lines import Pairs

logger = logging.getLogger("data")


class Tokenizer(Protocol):
    """What the cache needs of a tokenizer (``tokenizer.Tokenizer`` is one; data/ does not import tokenizer/)."""

    vocab_size: int
    fingerprint: Any

    def encode_src(self, texts: list[str]) -> list[list[int]]: ...

    def encode_tgt(self, texts: list[str]) -> list[list[int]]: ...

CACHE_VERSION = 2  # 2: corpus keyed on file contents; text lines cleaned by data.lines.clean_text
ARRAYS: dict[str, type[np.integer[Any]]] = {
    "src_tokens": np.int32,
    "src_offsets": np.int64,
    "tgt_tokens": np.int32,
    "tgt_offsets": np.int64,
    "index": np.int64,
}
CHUNK = 4096  # sentences per tokenizer call
_SPLIT_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")


class CacheCorrupt(Exception):
    """A cached split failed verification (internal: it is deleted and rebuilt)."""


class TokenizedSplit:
    """A tokenized split in flat arrays: pair ``i`` is ``src_tokens[src_offsets[i]:src_offsets[i+1]]``.

    ``src_tokens``/``tgt_tokens``: int32 [total tokens]; ``*_offsets``: int64 [n+1], starting at 0;
    ``index``: int64 [n], the row of each pair in the corpus split (to find raw references).
    """

    def __init__(self, src_tokens: np.ndarray, src_offsets: np.ndarray, tgt_tokens: np.ndarray,
                 tgt_offsets: np.ndarray, index: np.ndarray) -> None:
        self.src_tokens = src_tokens
        self.src_offsets = src_offsets
        self.tgt_tokens = tgt_tokens
        self.tgt_offsets = tgt_offsets
        self.index = index
        self._check()
        self._src_lengths: np.ndarray | None = None
        self._tgt_lengths: np.ndarray | None = None

    def _check(self) -> None:
        n = len(self.index)
        for side in ("src", "tgt"):
            tokens, offsets = getattr(self, f"{side}_tokens"), getattr(self, f"{side}_offsets")
            if tokens.ndim != 1 or offsets.ndim != 1 or self.index.ndim != 1:
                raise ValueError(f"{side}: token, offset and index arrays must be 1-D")
            if len(offsets) != n + 1:
                raise ValueError(f"{side}_offsets has {len(offsets)} entries for {n} pairs (expected {n + 1})")
            if offsets[0] != 0 or offsets[-1] != len(tokens):
                raise ValueError(f"{side}_offsets must run from 0 to {len(tokens)}, got {offsets[0]}..{offsets[-1]}")
            if n and np.any(np.diff(offsets) < 0):
                raise ValueError(f"{side}_offsets is not non-decreasing")

    @classmethod
    def from_sequences(cls, src: Sequence[Sequence[int]], tgt: Sequence[Sequence[int]],
                       index: Sequence[int] | np.ndarray | None = None) -> TokenizedSplit:
        """Build from per-pair token lists (``index`` defaults to 0..n-1)."""
        s_tok, s_len = _flatten(src)
        t_tok, t_len = _flatten(tgt)
        idx = np.arange(len(src), dtype=np.int64) if index is None else np.asarray(index, dtype=np.int64)
        return cls.from_lengths(s_tok, s_len, t_tok, t_len, idx)

    @classmethod
    def from_lengths(cls, src_tokens: np.ndarray, src_lengths: np.ndarray, tgt_tokens: np.ndarray,
                     tgt_lengths: np.ndarray, index: np.ndarray) -> TokenizedSplit:
        """Build from flat tokens and per-pair lengths (``src_lengths`` [n] summing to ``len(src_tokens)``)."""
        return cls(np.asarray(src_tokens, dtype=np.int32), _offsets(src_lengths),
                   np.asarray(tgt_tokens, dtype=np.int32), _offsets(tgt_lengths), np.asarray(index, dtype=np.int64))

    @property
    def src_lengths(self) -> np.ndarray:
        """int64 [n]: source tokens per pair (no eos)."""
        if self._src_lengths is None:
            self._src_lengths = np.diff(self.src_offsets)
        return self._src_lengths

    @property
    def tgt_lengths(self) -> np.ndarray:
        """int64 [n]: target tokens per pair (no bos/eos)."""
        if self._tgt_lengths is None:
            self._tgt_lengths = np.diff(self.tgt_offsets)
        return self._tgt_lengths

    def __len__(self) -> int:
        return len(self.index)

    def pair(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """(source tokens [S_i], target tokens [T_i]) of pair ``i``."""
        so, to = self.src_offsets, self.tgt_offsets
        return self.src_tokens[so[i]:so[i + 1]], self.tgt_tokens[to[i]:to[i + 1]]

    def arrays(self) -> dict[str, np.ndarray]:
        return {name: getattr(self, name) for name in ARRAYS}

    def __repr__(self) -> str:
        return (f"TokenizedSplit(pairs={len(self)}, src_tokens={len(self.src_tokens)}, "
                f"tgt_tokens={len(self.tgt_tokens)})")


def _flatten(seqs: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """(int64 flat tokens [sum L_i], int64 lengths [n]) of a list of token lists."""
    lengths = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))
    tokens = np.fromiter(itertools.chain.from_iterable(seqs), dtype=np.int64, count=int(lengths.sum()))
    return tokens, lengths


def _offsets(lengths: np.ndarray) -> np.ndarray:
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


# ----------------------------------------------------------------------------------------------
# Key and paths


def cache_key(cfg: Config, tokenizer: Tokenizer) -> str:
    """sha256 hex of corpus fingerprint + tokenizer fingerprint + length limits + format version."""
    d = cfg.data
    desc = {
        "version": CACHE_VERSION,
        "corpus": corpus_fingerprint(d),
        "tokenizer": str(tokenizer.fingerprint),
        "limits": {"min_len": d.min_len, "max_len": d.max_len, "max_train_len": d.max_train_len,
                   "max_len_ratio": d.max_len_ratio},
    }
    return hashlib.sha256(json.dumps(desc, sort_keys=True).encode("utf-8")).hexdigest()


def cache_root(cfg: Config, key: str) -> Path:
    """``<cache_dir>/<key[:16]>``."""
    return Path(cfg.data.cache_dir).expanduser() / key[:16]


def _check_split_name(split: str) -> None:
    if not _SPLIT_NAME.fullmatch(split):
        raise DataError(f"invalid split name {split!r} (letters, digits, '_', '.', '-' only)")


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


# ----------------------------------------------------------------------------------------------
# Loading and writing one split


def load_split(folder: Path, key: str, split: str) -> TokenizedSplit:
    """Load and verify one cached split (meta.json, checksums, dtypes, shapes, offsets); CacheCorrupt if bad."""
    try:
        meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CacheCorrupt(f"meta.json unreadable ({type(e).__name__})") from None
    if not isinstance(meta, dict) or meta.get("version") != CACHE_VERSION or meta.get("key") != key \
            or meta.get("split") != split or not isinstance(meta.get("files"), dict):
        raise CacheCorrupt("meta.json does not match this cache key/version")
    arrays = {}
    for name, dtype in ARRAYS.items():
        path = folder / f"{name}.npy"
        info = meta["files"].get(name)
        if not isinstance(info, dict):
            raise CacheCorrupt(f"meta.json lacks {name}")
        try:
            if _sha256_file(path) != info.get("sha256"):
                raise CacheCorrupt(f"checksum mismatch in {path.name}")
            arr = np.load(path, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as e:
            raise CacheCorrupt(f"{path.name} unreadable ({type(e).__name__})") from None
        if arr.dtype != np.dtype(dtype) or list(arr.shape) != info.get("shape"):
            raise CacheCorrupt(f"{path.name} has dtype {arr.dtype} shape {arr.shape}, expected {info}")
        arrays[name] = arr
    try:
        ts = TokenizedSplit(**arrays)
    except ValueError as e:
        raise CacheCorrupt(str(e)) from None
    if len(ts) != meta.get("size"):
        raise CacheCorrupt(f"{len(ts)} pairs but meta.json says {meta.get('size')}")
    return ts


def save_split(ts: TokenizedSplit, root: Path, split: str, key: str, extra: dict[str, Any] | None = None) -> None:
    """Write ``ts`` to ``root/split`` atomically (temp dir + rename), as ``load_split`` reads it back with ``key``:
    one ``.npy`` per array and ``meta.json`` (cache version, key, size, each file's SHA-256, dtype and shape, and
    ``extra``). A concurrent winner is kept."""
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{split}.tmp-", dir=root))
    try:
        files = {}
        for name, dtype in ARRAYS.items():
            arr = np.ascontiguousarray(getattr(ts, name), dtype=dtype)
            path = tmp / f"{name}.npy"
            with open(path, "wb") as f:
                np.save(f, arr, allow_pickle=False)
                f.flush()
                os.fsync(f.fileno())
            files[name] = {"sha256": _sha256_file(path), "dtype": np.dtype(dtype).name, "shape": list(arr.shape)}
        meta = {"version": CACHE_VERSION, "key": key, "split": split, "size": len(ts), "files": files, **(extra or {})}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True), encoding="utf-8")
        try:
            os.rename(tmp, root / split)
        except OSError:
            if not (root / split).is_dir():
                raise
            logger.info("data cache: %s was written concurrently by another process; keeping that copy", root / split)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _remove(folder: Path) -> None:
    """Delete a cached split (renamed away first so a concurrent builder can take its place)."""
    trash = folder.with_name(f".{folder.name}.trash-{os.getpid()}-{time.monotonic_ns()}")
    try:
        os.rename(folder, trash)
    except OSError:
        return
    shutil.rmtree(trash, ignore_errors=True)


# ----------------------------------------------------------------------------------------------
# Building


_WORKER_TOKENIZER: Tokenizer | None = None


def _encode_chunk(task: tuple[str, list[str]]) -> tuple[np.ndarray, np.ndarray]:
    """(flat int64 tokens, int64 lengths) of one chunk; side is "src" or "tgt"."""
    side, texts = task
    tok = _WORKER_TOKENIZER
    assert tok is not None
    seqs = tok.encode_src(texts) if side == "src" else tok.encode_tgt(texts)
    if len(seqs) != len(texts):
        raise DataError(f"tokenizer returned {len(seqs)} sequences for {len(texts)} texts")
    return _flatten(seqs)


def _encode(tokenizer: Tokenizer, src: list[str], tgt: list[str], num_proc: int) -> dict[str, tuple[np.ndarray, ...]]:
    """Tokenize both sides in chunks (a fork pool when ``num_proc > 1``): {side: (tokens, lengths)}."""
    global _WORKER_TOKENIZER
    tasks = [(side, texts[i:i + CHUNK]) for side, texts in (("src", src), ("tgt", tgt))
             for i in range(0, len(texts), CHUNK)]
    _WORKER_TOKENIZER = tokenizer
    try:
        use_pool = num_proc > 1 and len(tasks) > 2 and "fork" in multiprocessing.get_all_start_methods()
        if use_pool:
            with multiprocessing.get_context("fork").Pool(min(num_proc, len(tasks))) as pool:
                results = pool.map(_encode_chunk, tasks)
        else:
            results = [_encode_chunk(t) for t in tasks]
    finally:
        _WORKER_TOKENIZER = None
    out = {}
    for side in ("src", "tgt"):
        parts = [r for t, r in zip(tasks, results, strict=True) if t[0] == side]
        tokens = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, np.int64)
        lengths = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0, np.int64)
        out[side] = (tokens, lengths)
    return out


def keep_mask(split: str, src_len: np.ndarray, tgt_len: np.ndarray, d: DataConfig) -> np.ndarray:
    """bool [n]: which pairs the filtering rules keep for ``split`` (see the module docstring)."""
    keep = np.ones(len(src_len), dtype=bool)
    if split == "train":
        cap = d.max_len if d.max_train_len is None else min(d.max_len, d.max_train_len)
        keep &= (src_len >= d.min_len) & (tgt_len >= d.min_len) & (src_len <= cap) & (tgt_len <= cap)
        if d.max_len_ratio is not None:
            longer = np.maximum(src_len, tgt_len)
            shorter = np.maximum(np.minimum(src_len, tgt_len), 1)
            keep &= longer <= d.max_len_ratio * shorter
    elif split == "validation":
        keep &= (src_len <= d.max_len) & (tgt_len <= d.max_len)
    return keep


def build_split(dataset: Pairs, split: str, d: DataConfig, tokenizer: Tokenizer) -> TokenizedSplit:
    """Tokenize and filter one corpus split (columns ``src``, ``tgt``)."""
    src, tgt = list(dataset["src"]), list(dataset["tgt"])
    enc = _encode(tokenizer, src, tgt, max(1, d.num_proc))
    (s_tok, s_len), (t_tok, t_len) = enc["src"], enc["tgt"]
    for side, tok in (("source", s_tok), ("target", t_tok)):
        if len(tok) and (tok.min() < 0 or tok.max() >= tokenizer.vocab_size):
            raise DataError(f"tokenizer produced {side} ids outside [0, {tokenizer.vocab_size}) "
                            f"(min {tok.min()}, max {tok.max()})")
    keep = keep_mask(split, s_len, t_len, d)
    if not keep.all():
        s_tok, t_tok = s_tok[np.repeat(keep, s_len)], t_tok[np.repeat(keep, t_len)]
        s_len, t_len = s_len[keep], t_len[keep]
        logger.info("split %s: kept %d of %d pairs after length filtering", split, int(keep.sum()), len(keep))
    return TokenizedSplit.from_lengths(s_tok, s_len, t_tok, t_len, np.flatnonzero(keep))


# ----------------------------------------------------------------------------------------------
# Entry point


def load_or_build(cfg: Config, tokenizer: Tokenizer, corpus_loader: Callable[[], dict[str, Pairs]],
                  splits: list[str]) -> dict[str, TokenizedSplit]:
    """Tokenized splits from the cache, building (and caching) the missing or corrupt ones.

    ``corpus_loader`` is called at most once, and only when a split must be built.
    """
    start = time.perf_counter()
    key = cache_key(cfg, tokenizer)
    root = cache_root(cfg, key)
    out: dict[str, TokenizedSplit] = {}
    missing: list[str] = []
    for split in dict.fromkeys(splits):
        _check_split_name(split)
        folder = root / split
        if not folder.is_dir():
            missing.append(split)
            continue
        try:
            out[split] = load_split(folder, key, split)
        except CacheCorrupt as e:
            logger.warning("data cache %s is corrupt (%s): deleting and rebuilding it", folder, e)
            _remove(folder)
            missing.append(split)
    if missing:
        corpus = corpus_loader()
        absent = [s for s in missing if s not in corpus]
        if absent:
            raise DataError(f"split {absent[0]!r} is not in the corpus (available: {', '.join(corpus)})")
        extra = {"tokenizer": str(tokenizer.fingerprint), "source": cfg.data.source}
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise DataError(f"data.cache_dir {cfg.data.cache_dir}: cannot write the cache there "
                            f"({e.strerror or type(e).__name__})") from None
        for split in missing:
            ts = build_split(corpus[split], split, cfg.data, tokenizer)
            save_split(ts, root, split, key, extra)
            out[split] = ts
    hit = [s for s in out if s not in missing]
    took = time.perf_counter() - start
    if missing:
        logger.info("data cache built %s%s in %s (%.1fs)", ", ".join(missing),
                    f" (hit {', '.join(hit)})" if hit else "", root, took)
    else:
        logger.info("data cache hit %s from %s (%.1fs)", ", ".join(hit), root, took)
    return {s: out[s] for s in splits}
