"""Joint French+English vocabulary trained with Hugging Face ``tokenizers``: subwords (BPE, Unigram),
characters or words.

- ``bpe`` / ``unigram``: subword models (Sennrich et al. 2016; Kudo 2018) with byte fallback.
- ``char``: the ``vocab_size`` most frequent characters (``min_frequency`` or more), a BPE model with no
  merges, with byte fallback: unseen characters become their UTF-8 bytes.
- ``word``: words and punctuation marks split apart (``l'homme`` -> ``l ' homme``), the ``vocab_size``
  most frequent ones (``min_frequency`` or more). Unknown-word policy: a word outside the vocabulary is
  encoded as ``<unk>``, and an ``<unk>`` the model outputs is left out of the detokenized text.
"""

from __future__ import annotations

import bisect
import collections
import itertools
import json
import random
from collections.abc import Iterable, Sequence
from pathlib import Path

from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers, trainers
from tokenizers import Tokenizer as HFTokenizer

from tokenizer.config import TokenizerConfig
from utils.io import atomic_write_text

from .base import Tokenizer, TokenizerError, canonical_json, sha256_hex

SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>"]  # ids 0, 1, 2, 3
# Byte fallback (as SentencePiece's): ids 4..259 are the 256 bytes, so a character the training text never had is
# encoded as its UTF-8 bytes instead of <unk>, and every input decodes back to itself (after normalisation).
BYTE_TOKENS = [f"<0x{b:02X}>" for b in range(256)]
MODEL_FILE = "tokenizer.json"
JOINT_TYPES = ("bpe", "unigram", "char", "word")
_PENALTY_STEP = 1e-4  # score step of characters the Unigram trainer appends (tokenizers trainer.rs)


def subsample(src: Iterable[str], tgt: Iterable[str], n: int | None, seed: int) -> tuple[Iterable[str], Iterable[str]]:
    """Deterministic (seeded) subsample of at most ``n`` sentences per side, in corpus order.

    Sides of equal length are treated as parallel and keep the same indices.
    """
    if n is None:
        return src, tgt
    if n <= 0:
        raise TokenizerError(f"tokenizer.train_max_sentences must be positive, got {n}")
    src_l, tgt_l = list(src), list(tgt)
    rng = random.Random(seed)

    def pick(size: int) -> list[int]:
        return list(range(size)) if size <= n else sorted(rng.sample(range(size), n))

    if len(src_l) == len(tgt_l):
        idx = pick(len(src_l))
        return [src_l[i] for i in idx], [tgt_l[i] for i in idx]
    return [src_l[i] for i in pick(len(src_l))], [tgt_l[i] for i in pick(len(tgt_l))]


def _canonical_unigram(tok: HFTokenizer, reserved: int) -> HFTokenizer:
    """Make a trained Unigram model reproducible: round scores, fix the order of tied pieces.

    The Rust trainer sums floats in hash-map order, so scores vary in the last bits from run to run; and the
    characters it must add although the EM model dropped them get scores ``min + k * 1e-4`` in hash-set order.
    Here those characters get the same scores in sorted order, and pieces are ordered by (score desc, piece).
    """
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    n = reserved  # special (and byte) tokens keep their ids
    pieces = [(piece, float(f"{score:.9g}")) for piece, score in vocab[n:]]
    single_scores = sorted(score for piece, score in pieces if len(piece) == 1)

    def has_neighbour(score: float) -> bool:  # another single char exactly 1e-4 away
        for target in (score - _PENALTY_STEP, score + _PENALTY_STEP):
            k = bisect.bisect_left(single_scores, target - 1e-7)
            if k < len(single_scores) and single_scores[k] <= target + 1e-7:
                return True
        return False

    added = sorted(piece for piece, score in pieces if len(piece) == 1 and has_neighbour(score))
    added_set = set(added)
    remap = dict(
        zip(added, sorted((score for piece, score in pieces if piece in added_set), reverse=True), strict=True)
    )
    pieces = sorted(((piece, remap.get(piece, score)) for piece, score in pieces), key=lambda x: (-x[1], x[0]))
    data["model"]["vocab"] = [list(x) for x in vocab[:n]] + [list(x) for x in pieces]
    return HFTokenizer.from_str(json.dumps(data, ensure_ascii=False))


def _frequent_characters(texts: Iterable[str], normalizer: normalizers.Normalizer, limit: int,
                         min_frequency: int) -> list[str]:
    """The ``limit`` most frequent characters of the normalised ``texts`` (spaces as "▁", one before each
    sentence as the Metaspace pre-tokenizer adds), at least ``min_frequency`` times; ties by character."""
    counts: collections.Counter[str] = collections.Counter()
    for text in texts:
        counts.update("▁" + normalizer.normalize_str(text).replace(" ", "▁"))
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return [c for c, n in ranked if n >= max(min_frequency, 1)][:limit]


class JointSubwordTokenizer(Tokenizer):
    """One vocabulary for both languages: NFKC (+lowercase), Metaspace pre-tokenizer/decoder, <pad>=0 <s>=1 </s>=2
    <unk>=3. ``encode_src`` and ``encode_tgt`` are identical."""

    def __init__(self, tok: HFTokenizer, kind: str) -> None:
        if kind not in JOINT_TYPES:
            raise TokenizerError(f"joint tokenizer type {kind!r} is not one of: {', '.join(JOINT_TYPES)}")
        for want, token in enumerate(SPECIAL_TOKENS):
            got = tok.token_to_id(token)
            if got != want:
                raise TokenizerError(f"{token} has id {got}, expected {want}: not a tokenizer built by this toolkit")
        self._tok = tok
        self.kind = kind
        self.pad_id, self.bos_id, self.eos_id, self.unk_id = 0, 1, 2, 3
        self.vocab_size = tok.get_vocab_size(with_added_tokens=True)
        self.fingerprint = sha256_hex(kind, canonical_json(json.loads(tok.to_str()), float_digits=9))

    @classmethod
    def train(
        cls, cfg: TokenizerConfig, src_texts: Iterable[str], tgt_texts: Iterable[str], seed: int = 0
    ) -> JointSubwordTokenizer:
        """Train a ``cfg.type`` ("bpe"/"unigram") vocabulary of at most ``cfg.vocab_size`` on both sides."""
        if cfg.type not in JOINT_TYPES:
            raise TokenizerError(
                f"tokenizer.type {cfg.type!r} cannot be trained (use one of: {', '.join(JOINT_TYPES)})"
            )
        reserved = SPECIAL_TOKENS + (BYTE_TOKENS if cfg.byte_fallback and cfg.type != "word" else [])
        if cfg.vocab_size <= len(reserved):
            why = " (256 byte tokens with tokenizer.byte_fallback)" if cfg.byte_fallback else ""
            raise TokenizerError(f"tokenizer.vocab_size must be > {len(reserved)}{why}, got {cfg.vocab_size}")
        src, tgt = subsample(src_texts, tgt_texts, cfg.train_max_sentences, seed)
        count = 0

        def sentences() -> Iterable[str]:
            nonlocal count
            for s in itertools.chain(src, tgt):
                count += 1
                yield s

        # Whitespace runs of any kind (\r, tabs, no-break spaces...) become one space, as data.lines.clean_text
        # does, so no input reaches the model as a lone "▁" or an <unk>, whoever calls encode.
        norm = [normalizers.NFKC(), normalizers.Replace(Regex(r"\s+"), " "), normalizers.Strip()]
        norm += [normalizers.Lowercase()] if cfg.lowercase else []
        trainer: trainers.Trainer | None = None
        byte_fallback = cfg.byte_fallback and cfg.type != "word"
        if cfg.type == "bpe":
            tok = HFTokenizer(models.BPE(unk_token="<unk>", byte_fallback=byte_fallback))
            trainer = trainers.BpeTrainer(
                vocab_size=cfg.vocab_size,
                min_frequency=cfg.min_frequency,
                special_tokens=reserved,
                show_progress=False,
            )
        elif cfg.type == "unigram":
            tok = HFTokenizer(models.Unigram())
            trainer = trainers.UnigramTrainer(
                vocab_size=cfg.vocab_size, special_tokens=reserved, unk_token="<unk>", show_progress=False
            )
        elif cfg.type == "char":
            chars = _frequent_characters(sentences(), normalizers.Sequence(norm), cfg.vocab_size - len(reserved),
                                         cfg.min_frequency)
            vocab = {t: i for i, t in enumerate(reserved + chars)}
            tok = HFTokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=byte_fallback))
        else:
            tok = HFTokenizer(models.WordLevel(unk_token="<unk>"))
            trainer = trainers.WordLevelTrainer(vocab_size=cfg.vocab_size, min_frequency=cfg.min_frequency,
                                                special_tokens=SPECIAL_TOKENS, show_progress=False)
        tok.normalizer = normalizers.Sequence(norm)
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
        if cfg.type == "word":
            tok.pre_tokenizer = pre_tokenizers.Sequence([tok.pre_tokenizer, pre_tokenizers.Punctuation("isolated")])
        metaspace = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True)
        tok.decoder = decoders.Sequence([decoders.ByteFallback(), metaspace]) if byte_fallback else metaspace
        if trainer is not None:
            try:
                tok.train_from_iterator(sentences(), trainer=trainer)
            except Exception as e:  # the Rust trainer raises bare Exceptions
                raise TokenizerError(f"training the {cfg.type} tokenizer failed: {e}") from e
        if count == 0:
            raise TokenizerError("no sentences to train the tokenizer on")
        if cfg.type == "unigram":
            tok = _canonical_unigram(tok, len(reserved))
            if cfg.byte_fallback:  # the Unigram trainer does not set the flag itself
                data = json.loads(tok.to_str())
                data["model"]["byte_fallback"] = True
                tok = HFTokenizer.from_str(json.dumps(data, ensure_ascii=False))
        return cls(tok, cfg.type)

    @classmethod
    def load(cls, directory: Path, kind: str) -> JointSubwordTokenizer:
        """Reload from ``directory/tokenizer.json``."""
        path = Path(directory) / MODEL_FILE
        if not path.is_file():
            raise TokenizerError(f"{path} not found")
        try:
            tok = HFTokenizer.from_file(str(path))
        except Exception as e:
            raise TokenizerError(f"cannot read {path}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from e
        return cls(tok, kind)

    def _encode(self, texts: list[str]) -> list[list[int]]:
        if not texts:
            return []
        return [e.ids for e in self._tok.encode_batch_fast(list(texts), add_special_tokens=False)]

    def encode_src(self, texts: list[str]) -> list[list[int]]:
        return self._encode(texts)

    def encode_tgt(self, texts: list[str]) -> list[list[int]]:
        return self._encode(texts)

    def _detokenize(self, batch: list[list[int]]) -> list[str]:
        # The four special ids are already gone (_clean); byte tokens are "special" to the library but are text.
        return self._tok.decode_batch(batch, skip_special_tokens=False)

    def id_to_token(self, ids: Sequence[int]) -> list[str]:
        out = []
        for i in ids:
            token = self._tok.id_to_token(int(i))
            if token is None:
                raise TokenizerError(f"id {int(i)} is outside the vocabulary (size {self.vocab_size})")
            out.append(token)
        return out

    def _save_files(self, directory: Path) -> None:
        atomic_write_text(directory / MODEL_FILE, self._tok.to_str(pretty=True))
