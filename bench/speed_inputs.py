"""The inputs every bench/speed.py measurement gets: the tokenizer, the fixed training batches (the first
epoch-0 batches of the training split) and the decoding batches (the first sentences of TEST_SPLIT, longest
first, each with its length cap)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from bench.common import ROOT
from utils.run.layout import RunDir, latest_link_path

TEST_SPLIT = "test.iwslt-tst2010"


def get_tokenizer(cfg: Any, out: Path, corpus: Any) -> tuple[Any, Path]:
    """The tokenizer of runs/<name>_latest, else <out>/tokenizer, else train one on 50k pairs (saved there)."""
    from tokenizer import load_tokenizer, train_tokenizer

    for path in (RunDir(latest_link_path(ROOT / "runs", cfg.name)).tokenizer, out / "tokenizer"):
        if (path / "meta.json").is_file():
            return load_tokenizer(path), path
    path = out / "tokenizer"
    print(f"training a {cfg.tokenizer.type} tokenizer on 50k pairs -> {path}", flush=True)
    tcfg = cfg.tokenizer.model_copy(update=dict(train_max_sentences=50_000))
    train = corpus()["train"]
    tok = train_tokenizer(tcfg, train["src"], train["tgt"], seed=cfg.seed)
    tok.save(path)
    return tok, path


def make_inputs(cfg: Any, tok: Any, splits: dict, max_tokens: int, n_batches: int, n_sentences: int) -> dict:
    """The fixed training batches and decoding batches every worker loads."""
    import torch

    from data.batching import TokenBatchSampler, collate
    from models.decoding import max_lengths

    pad, bos, eos = tok.pad_id, tok.bos_id, tok.eos_id
    train = splits["train"]
    sampler = TokenBatchSampler(train.src_lengths, train.tgt_lengths, max_tokens, True, cfg.seed)
    order = sampler.epoch_batches(0)
    train_batches = []
    for i in range(n_batches):
        b = collate(train, order[i % len(order)].tolist(), pad, bos, eos)
        train_batches.append({"src": b.src, "tgt_in": b.tgt_in, "tgt_out": b.tgt_out,
                              "n_tgt_tokens": b.n_tgt_tokens})

    test = splits[TEST_SPLIT]
    rows = [i for i in range(len(test)) if test.src_lengths[i] > 0][:n_sentences]
    sources = [test.pair(i)[0].tolist() + [eos] for i in rows]
    sources.sort(key=len, reverse=True)
    decode_batches = []
    for start in range(0, len(sources), cfg.decode.batch_size):
        chunk = sources[start:start + cfg.decode.batch_size]
        src = torch.full((len(chunk), len(chunk[0])), pad, dtype=torch.long)
        for r, s in enumerate(chunk):
            src[r, :len(s)] = torch.tensor(s)
        cap = max_lengths(src != pad, cfg.decode.max_len_a, cfg.decode.max_len_b, SimpleNamespace(max_length=None))
        decode_batches.append({"src": src, "cap": cap})
    longest = max([b["src"].shape[1] for b in train_batches] + [b["tgt_in"].shape[1] for b in train_batches]
                  + [b["src"].shape[1] for b in decode_batches] + [int(b["cap"].max()) + 2 for b in decode_batches])
    return {"ids": {"pad": pad, "bos": bos, "eos": eos, "vocab": tok.vocab_size},
            "train": train_batches, "decode": decode_batches, "longest": longest,
            "decode_rows": rows}
