"""Speed and memory of our Transformer against Hugging Face Marian and torch.nn.Transformer, same sizes, same batches.

    python bench/speed.py [--device cpu|cuda] [--config configs/bench_small_rope.yaml] [--out runs/bench] [--quick]

Three models are built from ``model:`` of the config, at equal d_model, layers, heads, FFN width,
dropout and vocabulary (one shared embedding table, tied to the output layer), randomly initialised:

- ours: ``models.transformer.Seq2SeqTransformer`` exactly as the config describes it;
- Marian: ``transformers.MarianMTModel(MarianConfig(...))`` (post-LN, sinusoidal positions, SDPA);
- nn.Transformer: ``torch.nn.Transformer`` plus token embeddings, sinusoidal positions and the tied
  output layer (:class:`TorchTransformer` below; pre-/post-LN as the config's ``model.norm``).

Inputs come from the project's own pipeline: the tokenizer of ``runs/<config name>_latest`` (else
one trained on 50k pairs, kept in ``<out>/tokenizer``), the data cache, ``TokenBatchSampler`` with
the config's seed and ``collate``. The parent process prepares the inputs once and saves the
tensors; every measurement then runs in a fresh subprocess of this script (``--_worker``) that
loads those same tensors, so that peak memory is measured per model and per measurement.

Measurements (each model, each one in its own process):

- training step: forward, label-smoothed (``train.label_smoothing``) summed cross-entropy / target
  tokens, backward, gradient clipping (``train.clip_norm``), AdamW step, on a fixed list of
  ``--warmup`` + ``--steps`` batches of ``--max-tokens`` (the first epoch-0 batches of the training
  split); target tokens/s over the timed steps; fp32, then ``torch.autocast(bfloat16)``. Marian gets
  ``input_ids``/``attention_mask`` = our source and ``decoder_input_ids`` = our ``tgt_in`` with the
  bos replaced by its decoder start (pad), so all three see identical token counts; its loss is
  computed from its logits by the same function as ours (its built-in loss has no label smoothing).
- decoding, fp32 (TF32 off, PyTorch's default), sentences/s: the first ``--sentences`` non-empty sentences of
  test.iwslt-tst2010 (TED talks), sorted longest first, batches of ``decode.batch_size``; one
  warm-up call on 8 sentences. Ours: ``greedy_search``/``beam_search`` with and without the
  key/value cache; Marian: ``generate(num_beams=1|beam, do_sample=False, use_cache=...)``;
  nn.Transformer (no incremental decoding): our ``greedy_search`` without the cache, run on it.
  The models are untrained, so for equal work every hypothesis gets exactly its length cap
  ``floor(decode.max_len_a * source length + decode.max_len_b)`` tokens and then EOS: EOS is
  suppressed before the cap and forced at it (ours and nn.Transformer: a logit offset on EOS;
  Marian: a ``LogitsProcessor`` with the same per-sentence caps). Our search drops finished
  sentences from the batch; ``generate`` keeps them (padding) until the whole batch is done.
- peak memory: CUDA: ``max_memory_allocated`` after ``reset_peak_memory_stats`` minus what was
  allocated at that point (the input tensors); CPU: growth of the peak resident set size (VmHWM,
  reset through ``/proc/self/clear_refs``; ``ru_maxrss`` where that is unavailable) over the RSS
  once torch, transformers and the inputs are loaded, less the file-backed pages (library code,
  about 20 MiB) mapped meanwhile. Model, optimizer state, activations and allocator slack count.
- CUDA only: model FLOP utilisation of the bf16 training step,
  ``6 * trainable parameters * target tokens/s / (--peak-tflops * 1e12)``.
- data path: a warm load of the cached bench splits (``data.cache.load_or_build`` on a cache hit,
  fresh process); a synthetic 232k-pair corpus (the bench training pairs repeated and shuffled, the
  size of IWSLT2017 fr-en train) tokenized cold with ``num_proc`` 1 and 2 into a temporary cache,
  then loaded warm (target: under 3 s).

Prints one Markdown table and writes ``<out>/speed.md`` and all raw numbers in ``<out>/speed.json``.
``--quick`` shrinks everything (1 warm-up + 3 timed steps of 1000 tokens, 20 sentences, a 20k-pair
synthetic corpus) to check that the script runs. On CPU, ``--threads`` defaults to
``$OMP_NUM_THREADS`` if set, else every core.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from utils.run.layout import RunDir, latest_link_path  # noqa: E402

MODELS = ("ours", "marian", "torch")
LABELS = {"ours": "ours", "marian": "Marian", "torch": "nn.Transformer"}
TEST_SPLIT = "test.iwslt-tst2010"
SYNTH_PAIRS = 232_000
EOS_OFFSET = 1e4  # subtracted from the EOS logit before a hypothesis reaches its length cap


# ----------------------------------------------------------------------------------------------
# Models


def _torch_transformer_class() -> type:
    import torch
    import torch.nn.functional as F
    from torch import nn

    from models.positional.absolute import sinusoid_table  # the one sinusoid table (Vaswani et al. 2017)

    class TorchTransformer(nn.Module):
        """``nn.Transformer`` + scaled token embeddings + sinusoidal positions + tied output layer.

        Offers ``encode``/``decode`` like ``Seq2SeqTransformer`` (without a cache), so that our
        ``greedy_search`` can drive it.
        """

        def __init__(self, m: Any, vocab_size: int, pad_id: int, max_positions: int) -> None:
            super().__init__()
            self.pad_id = pad_id
            self.embed = nn.Embedding(vocab_size, m.d_model)
            self.scale = math.sqrt(m.d_model)
            self.dropout = nn.Dropout(m.dropout)
            self.transformer = nn.Transformer(
                d_model=m.d_model, nhead=m.n_heads, num_encoder_layers=m.encoder_layers,
                num_decoder_layers=m.decoder_layers, dim_feedforward=m.d_ff, dropout=m.dropout,
                activation=m.activation, batch_first=True, norm_first=m.norm == "pre",
            )
            nn.init.normal_(self.embed.weight, 0.0, m.d_model**-0.5)
            self.register_buffer("pe", sinusoid_table(max_positions, m.d_model), persistent=False)

        max_length = None

        def _embed(self, ids: torch.Tensor) -> torch.Tensor:
            return self.dropout(self.embed(ids) * self.scale + self.pe[: ids.shape[1]])

        def encode(self, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            src_mask = src != self.pad_id
            return self.transformer.encoder(self._embed(src), src_key_padding_mask=~src_mask), src_mask

        def decode(self, tgt: torch.Tensor, memory: torch.Tensor, src_mask: torch.Tensor,
                   cache: None = None) -> torch.Tensor:
            if cache is not None:
                raise ValueError("nn.Transformer has no incremental decoding")
            causal = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1], device=tgt.device)
            x = self.transformer.decoder(self._embed(tgt), memory, tgt_mask=causal, tgt_is_causal=True,
                                         memory_key_padding_mask=~src_mask)
            return F.linear(x, self.embed.weight)

        def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
            memory, src_mask = self.encode(src)
            return self.decode(tgt, memory, src_mask)

    return TorchTransformer


def build_model(name: str, cfg: Any, vocab: int, pad: int, eos: int, max_positions: int) -> Any:
    """One of the three models, randomly initialised from ``cfg.model``."""
    m = cfg.model
    if name == "ours":
        from models.transformer import Seq2SeqTransformer

        return Seq2SeqTransformer(m, vocab, pad)
    if name == "marian":
        from transformers import GenerationConfig, MarianConfig, MarianMTModel

        mc = MarianConfig(
            vocab_size=vocab, decoder_vocab_size=vocab, d_model=m.d_model,
            encoder_layers=m.encoder_layers, decoder_layers=m.decoder_layers,
            encoder_attention_heads=m.n_heads, decoder_attention_heads=m.n_heads,
            encoder_ffn_dim=m.d_ff, decoder_ffn_dim=m.d_ff, activation_function=m.activation,
            dropout=m.dropout, attention_dropout=m.attention_dropout, activation_dropout=m.activation_dropout,
            max_position_embeddings=max_positions, scale_embedding=True,
            pad_token_id=pad, eos_token_id=eos, decoder_start_token_id=pad, bos_token_id=None,
            forced_eos_token_id=None, share_encoder_decoder_embeddings=True, tie_word_embeddings=True,
        )
        mc._attn_implementation = "sdpa"
        model = MarianMTModel(mc)
        model.generation_config = GenerationConfig(
            decoder_start_token_id=pad, pad_token_id=pad, eos_token_id=eos, bos_token_id=None,
            forced_eos_token_id=None,
        )
        return model
    if name == "torch":
        return _torch_transformer_class()(m, vocab, pad, max_positions)
    raise ValueError(name)


class SuppressEos:
    """Wraps a model with ``encode``/``decode``: EOS logit lowered by EOS_OFFSET (our search forces it at the cap)."""

    def __init__(self, model: Any, eos: int) -> None:
        self.model, self.eos = model, eos

    @property
    def max_length(self) -> int | None:
        return self.model.max_length

    def encode(self, src: Any) -> Any:
        return self.model.encode(src)

    def new_cache(self) -> Any:
        return self.model.new_cache()

    def decode(self, tgt: Any, memory: Any, src_mask: Any, cache: Any = None) -> Any:
        logits = self.model.decode(tgt, memory, src_mask, cache=cache)
        logits[..., self.eos] -= EOS_OFFSET
        return logits


def _length_cap_processor(caps: Any, eos: int) -> Any:
    """A ``LogitsProcessor``: row r may not emit EOS before ``caps[r]`` generated tokens and must emit it then."""
    import torch
    from transformers import LogitsProcessor

    class LengthCap(LogitsProcessor):
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            generated = input_ids.shape[1] - 1  # the decoder start token is not counted
            cap = caps.repeat_interleave(input_ids.shape[0] // caps.shape[0])
            before, at = generated < cap, generated >= cap
            eos_col = scores[:, eos].masked_fill(before, float("-inf"))
            scores = scores.masked_fill(at[:, None], float("-inf"))
            scores[:, eos] = torch.where(at, torch.zeros_like(eos_col), eos_col)
            return scores

    return LengthCap()


# ----------------------------------------------------------------------------------------------
# Worker: one measurement in a fresh process


def _proc_status_kib(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def _maxrss_bytes() -> int:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024


class MemoryMeter:
    """Peak memory growth from ``start()`` on: CUDA allocator peak, or the peak resident set size on CPU."""

    def __init__(self, device: Any) -> None:
        self.cuda = device.type == "cuda"
        self.file_growth = 0  # CPU: file-backed pages (library code) mapped since start(), not counted

    def start(self) -> None:
        import torch

        gc.collect()
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
            self.method = "cuda max_memory_allocated - memory_allocated at start"
            return
        try:
            Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
            hwm_reset = _proc_status_kib("VmHWM") is not None
        except OSError:
            hwm_reset = False
        rss = _proc_status_kib("VmRSS")
        self.file_base = _proc_status_kib("RssFile")
        if hwm_reset and rss is not None:
            self.base = rss * 1024
            self.method = "VmHWM (reset at start) - VmRSS at start - file-backed pages (library code) mapped since"
        else:
            self.base = rss * 1024 if rss is not None else _maxrss_bytes()
            self.method = "ru_maxrss - RSS at start - file-backed pages mapped since (peak not resettable: upper bound)"
        self.hwm_reset = hwm_reset

    def peak_bytes(self) -> int:
        import torch

        if self.cuda:
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated() - self.base
        peak = _proc_status_kib("VmHWM") * 1024 if self.hwm_reset else _maxrss_bytes()
        file_now = _proc_status_kib("RssFile")
        if self.file_base is not None and file_now is not None:
            self.file_growth = max(0, file_now - self.file_base) * 1024
        return peak - self.base - self.file_growth


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def time_training(name: str, model: Any, batches: list[dict], warmup: int, precision: str, cfg: Any,
                  device: Any, pad: int) -> dict[str, Any]:
    import torch

    from utils.training.evaluation import token_loss

    t = cfg.train
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=t.lr, betas=tuple(t.betas), eps=t.eps, weight_decay=t.weight_decay)

    def autocast() -> contextlib.AbstractContextManager:
        return torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()

    if name == "marian":
        def forward(b: dict) -> torch.Tensor:
            return model(input_ids=b["src"], attention_mask=b["src_mask"], decoder_input_ids=b["dec_in"],
                         use_cache=False).logits
    else:
        def forward(b: dict) -> torch.Tensor:
            return model(b["src"], b["tgt_in"])

    def step(b: dict) -> torch.Tensor:
        with autocast():
            logits = forward(b)
        loss = token_loss(logits, b["tgt_out"], pad, t.label_smoothing) / b["n_tgt_tokens"]
        loss.backward()
        if t.clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(params, t.clip_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    model.train()
    for b in batches[:warmup]:
        step(b)
    _sync(device)
    start = time.perf_counter()
    losses = [step(b) for b in batches[warmup:]]
    _sync(device)
    seconds = time.perf_counter() - start
    tokens = sum(b["n_tgt_tokens"] for b in batches[warmup:])
    return {"steps": len(batches) - warmup, "warmup": warmup, "tgt_tokens": tokens, "seconds": seconds,
            "tok_per_s": tokens / seconds, "loss_first": float(losses[0]), "loss_last": float(losses[-1])}


def time_decoding(name: str, model: Any, batches: list[dict], beam: int, use_cache: bool, cfg: Any,
                  device: Any, ids: dict[str, int]) -> dict[str, Any]:
    import torch

    from models.decoding import beam_search, greedy_search

    d = cfg.decode
    pad, bos, eos = ids["pad"], ids["bos"], ids["eos"]

    @torch.no_grad()
    def run(b: dict) -> int:
        src, cap = b["src"], b["cap"]
        if name == "marian":
            from transformers import LogitsProcessorList

            extra = {"early_stopping": True, "length_penalty": d.lenpen} if beam > 1 else {}
            out = model.generate(
                input_ids=src, attention_mask=src != pad, num_beams=beam, do_sample=False,
                max_new_tokens=int(cap.max()) + 1, num_return_sequences=1, use_cache=use_cache,
                logits_processor=LogitsProcessorList([_length_cap_processor(cap, eos)]), **extra,
            )
            gen = out[:, 1:]
            return int(((gen == eos).cumsum(1) == 0).sum())
        wrapped = SuppressEos(model, eos)
        if beam == 1:
            hyps = greedy_search(wrapped, src, bos=bos, eos=eos, max_len_a=d.max_len_a, max_len_b=d.max_len_b,
                                 use_cache=use_cache)
            return sum(len(h.tokens) for h in hyps)
        nbest = beam_search(wrapped, src, bos=bos, eos=eos, beam=beam, nbest=1, lenpen=d.lenpen,
                            max_len_a=d.max_len_a, max_len_b=d.max_len_b, use_cache=use_cache)
        return sum(len(h[0].tokens) for h in nbest)

    model.eval()
    run({"src": batches[-1]["src"][:8], "cap": batches[-1]["cap"][:8]})  # warm-up
    _sync(device)
    start = time.perf_counter()
    generated = sum(run(b) for b in batches)
    _sync(device)
    seconds = time.perf_counter() - start
    sentences = sum(len(b["src"]) for b in batches)
    expected = sum(int(b["cap"].sum()) for b in batches)
    return {"beam": beam, "use_cache": use_cache, "sentences": sentences, "seconds": seconds,
            "sent_per_s": sentences / seconds, "generated_tokens": generated, "expected_tokens": expected,
            "gen_tok_per_s": generated / seconds}


def model_worker(spec: dict, cfg: Any) -> dict[str, Any]:
    import torch
    import transformers  # noqa: F401  (imported by every model worker, so that memory baselines are equal)

    device = torch.device(spec["device"])
    inputs = torch.load(spec["inputs"], weights_only=True)
    ids = inputs["ids"]
    name = spec["model"]
    if spec["task"] == "train":
        batches = []
        for b in inputs["train"]:
            b = {k: v.to(device) if torch.is_tensor(v) else v for k, v in b.items()}
            if name == "marian":
                b["src_mask"] = b["src"] != ids["pad"]
                b["dec_in"] = b["tgt_in"].clone()
                b["dec_in"][:, 0] = ids["pad"]  # Marian's decoder start token
            batches.append(b)
    else:
        batches = [{k: v.to(device) for k, v in b.items()} for b in inputs["decode"]]
    del inputs
    meter = MemoryMeter(device)
    meter.start()
    from utils.training.setup import set_seed

    set_seed(spec["seed"])
    model = build_model(name, cfg, ids["vocab"], ids["pad"], ids["eos"], spec["max_positions"]).to(device)
    n_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if spec["task"] == "train":
        out = time_training(name, model, batches, spec["warmup"], spec["precision"], cfg, device, ids["pad"])
    else:
        beam = cfg.decode.beam if spec["task"] == "beam" else 1
        out = time_decoding(name, model, batches, beam, spec["use_cache"], cfg, device, ids)
    out.update(params=n_params, peak_mib=meter.peak_bytes() / 2**20, memory_method=meter.method,
               file_pages_mib=meter.file_growth / 2**20)
    return out


def synthetic_corpus(cfg: Any, pairs: int, seed: int) -> Any:
    """{"train": ``pairs`` bench training pairs, repeated and shuffled} as a DatasetDict."""
    import datasets
    import numpy as np

    from data.lines import make_split
    from data.sources import load_corpus

    train = load_corpus(cfg.data)["train"]
    src, tgt = train["src"], train["tgt"]
    order = np.random.default_rng(seed).permutation(np.resize(np.arange(len(src)), pairs)).tolist()
    return datasets.DatasetDict({"train": make_split("train", [src[i] for i in order], [tgt[i] for i in order],
                                                     origin="synthetic")})


def data_worker(spec: dict, cfg: Any) -> dict[str, Any]:
    from data.cache import load_or_build
    from tokenizer import load_tokenizer

    tok = load_tokenizer(Path(spec["tokenizer"]))

    def no_corpus() -> Any:
        raise RuntimeError("expected a cache hit, but a split had to be built")

    task = spec["task"]
    if task == "data_warm":
        splits = ["train", TEST_SPLIT]
        loader = no_corpus
    else:
        data = cfg.data.model_copy(update=dict(cache_dir=spec["cache_dir"], num_proc=spec.get("num_proc", 1)))
        cfg = cfg.model_copy(update=dict(data=data))
        splits = ["train"]
        if task == "data_cold":
            corpus = synthetic_corpus(cfg, spec["pairs"], spec["seed"])
            loader = lambda: corpus
        else:
            loader = no_corpus
    def cpu_seconds() -> float:  # this process's threads plus finished worker processes
        own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime

    start, cpu_start = time.perf_counter(), cpu_seconds()
    out = load_or_build(cfg, tok, loader, splits)
    seconds = time.perf_counter() - start
    cores = (cpu_seconds() - cpu_start) / max(seconds, 1e-9)  # average number of busy cores
    return {"seconds": seconds, "cores_busy": cores, "splits": splits, "pairs": sum(len(s) for s in out.values()),
            "tokens": sum(len(s.src_tokens) + len(s.tgt_tokens) for s in out.values()),
            "num_proc": cfg.data.num_proc}


def worker(spec_path: Path) -> int:
    import warnings

    spec = json.loads(spec_path.read_text())
    warnings.filterwarnings("ignore", message=".*enable_nested_tensor.*")
    import torch

    from utils.config import load_config

    if spec["device"] == "cpu":
        torch.set_num_threads(spec["threads"])
    cfg = load_config(spec["config"], spec["overrides"])
    result = data_worker(spec, cfg) if spec["task"].startswith("data") else model_worker(spec, cfg)
    Path(spec["result"]).write_text(json.dumps(result))
    return 0


# ----------------------------------------------------------------------------------------------
# Parent: inputs, workers, report


def default_threads() -> int:
    env = os.environ.get("OMP_NUM_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} logical cores)"
    except OSError:
        pass
    return platform.processor() or platform.machine()


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


def time_real_loop(config: Path, overrides: list[str], steps: int, precision: str, device: str,
                   work: Path) -> dict[str, Any]:
    """``train.py`` itself for ``steps`` optimizer steps (validation only once, at the end, on few sentences).

    Target tokens/s come from train.py's own closing summary (training steps only, batch assembly included);
    CPU user/system seconds, minor page faults and peak RSS from the kernel for the whole process
    (start-up, tokenizer and the final validation included).
    """
    from bench.measure import run_measured

    amp = ["train.amp=none"] if precision == "fp32" else ["train.amp=bf16", "train.amp_cpu=true"]
    sets = [f"train.max_steps={steps}", "train.eval_every=100000000", "train.log_attention_every=0",
            "train.valid_bleu_sentences=20", f"train.device={device}", *overrides, *amp]
    cmd = [sys.executable, "train.py", "--config", str(config), "--runs", str(work / "real")]
    for item in sets:
        cmd += ["--set", item]
    log = work / f"real.{precision}.log"
    print(f"  train.py, {steps} steps, {precision} ...", end="", flush=True)
    m = run_measured(cmd, log)
    runs = work / "real"
    run = max((p for p in runs.iterdir() if p.is_dir() and not p.is_symlink()), key=lambda p: p.stat().st_mtime)
    summary = RunDir(run).summary()
    print(f" {summary['target_tokens_per_s']:.0f} tgt tok/s ({m.wall_s:.0f}s)", flush=True)
    out = {"tok_per_s": summary["target_tokens_per_s"], "steps": summary["steps"],
           "train_seconds": summary["train_seconds"], "wall_s": m.wall_s, "user_s": m.user_s, "sys_s": m.sys_s,
           "minor_faults": m.minor_faults, "peak_mib": m.peak_rss_mib}
    out.update(achieved_flops(run, summary, precision, device))
    return out


def achieved_flops(run: Path, summary: dict[str, Any], precision: str, device: str) -> dict[str, Any]:
    """Model FLOP/s of the run directory ``run`` over its training seconds, and its ratio to the peak of the
    device for the precision used (bench/hardware.py)."""
    import torch

    from bench.hardware import cpu_peak, cuda_peak, run_flops

    counted = run_flops(run, summary["steps"])
    cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    peak = cuda_peak(precision, torch.cuda.get_device_name()) if cuda else cpu_peak(precision)
    achieved = counted["flops"] / summary["train_seconds"]
    return {"model_flops": counted["flops"], "flops_per_s": achieved, "peak_flops": peak.flops,
            "peak_fraction": achieved / peak.flops, "peak_formula": peak.formula, "flops_formula": counted["formula"]}


def _ct2_worker(folder: str, sources: list[str], decoders: dict[str, Any], threads: int) -> dict[str, Any]:
    """In a fresh process: time ``CT2Model.translate`` per decoder; label -> (seconds, texts, output tokens)."""
    from utils.translation.engines import CT2Model

    engine = CT2Model(folder, threads=threads)
    timed = {}
    for label, decode in decoders.items():
        engine.translate(sources[:8], decode)
        start = time.perf_counter()
        hyps = [best[0] for best in engine.translate(sources, decode)]
        timed[label] = (time.perf_counter() - start, [h.text for h in hyps], [len(h.tokens) for h in hyps])
    return timed


def time_ctranslate2(run: Any, sources: list[str], refs: list[str], decoders: dict[str, Any],
                     ours: dict[str, list[str]]) -> dict[str, Any]:
    """The same model exported to CTranslate2 (float32 and int8 weights), greedy and beam with the K-finished
    rule (CTranslate2's own): sent/s including tokenizing and detokenizing, as ours. Empty without ctranslate2.

    Timed in a fresh process, as ``inference.py --model_path EXPORT`` runs it: once PyTorch's CPU thread pool
    has run (our decoding, in this process), CTranslate2's own OpenMP threads compete with it and decode
    2-5x slower."""
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        print("  (ctranslate2 not installed: pip install '.[export]' to time the CTranslate2 export)", flush=True)
        return {}
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    import torch

    from utils.translation.export import export
    from utils.translation.scoring import corpus_scores

    out: dict[str, Any] = {}
    n = len(sources)
    ct2_decoders = {label: d for label, d in decoders.items() if not label.endswith("stop=bound")}
    with tempfile.TemporaryDirectory() as tmp:
        for quantization in (None, "int8"):
            folder = Path(tmp) / str(quantization)
            export(run.run_dir, run.checkpoint, run.model, run.cfg, run.tokenizer, folder, quantization)
            with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
                try:
                    timed = pool.submit(_ct2_worker, str(folder), sources, ct2_decoders,
                                        torch.get_num_threads()).result()
                except BrokenProcessPool:  # the worker died (memory, a crash): no CTranslate2 rows, say why
                    print(f"  (the CTranslate2 {quantization or 'float32'} worker process died: not timed)", flush=True)
                    continue
            for label, (took, texts, lengths) in timed.items():
                name = f"CTranslate2 {quantization or 'float32'}, {label.split(',')[0]}"
                out[name] = {"sent_per_s": n / took, "seconds": took, "out_tokens": sum(lengths) / n,
                             "bleu": corpus_scores(texts, refs, run.cfg.tokenizer.lowercase).bleu,
                             # identical outputs: with our decoder of the same rule, and with our default rule
                             "same_as_ours": sum(a == b for a, b in zip(texts, ours[label], strict=True)),
                             "same_as_default": sum(a == b for a, b in zip(
                                 texts, ours[label.replace("k_finished", "bound")], strict=True))}
                print(f"  trained model, {name}: {n / took:.1f} sent/s", flush=True)
    return out


def time_trained_decoding(model_path: str, sentences: int, beam: int, device: str,
                          profile_to: Path | None = None) -> dict[str, Any]:
    """A trained model (a run directory) on the first ``sentences`` of TEST_SPLIT: greedy, then beam search
    with each stop rule; sentences/s (tokenizing, decoding, detokenizing), mean output tokens, sacreBLEU.

    ``profile_to``: also write torch.profiler's operator table of the beam search (``stop="bound"``).
    """

    from data.sources import load_corpus
    from utils.run.load import load_run
    from utils.translation.scoring import decode_and_score
    from utils.translation.translate import encode_sources, translate_ids

    run = load_run(model_path, device=device)
    split = load_corpus(run.cfg.data)[TEST_SPLIT]
    n = min(sentences, len(split))
    sources, refs = list(split["src"][:n]), list(split["tgt"][:n])
    decoders = {"greedy": run.cfg.decode.model_copy(update=dict(beam=1, nbest=1))}
    for rule in ("bound", "k_finished"):
        decoders[f"beam {beam}, stop={rule}"] = run.cfg.decode.model_copy(
            update=dict(beam=beam, nbest=1, beam_stop=rule))
    out: dict[str, Any] = {"model": str(run.checkpoint), "sentences": n, "lenpen": run.cfg.decode.lenpen,
                           "batch_size": run.cfg.decode.batch_size, "decoders": {}}
    texts: dict[str, list[str]] = {}
    for label, decode in decoders.items():
        decode_and_score(run.model, run.tokenizer, sources[:8], refs[:8], decode)  # warm-up
        scored = decode_and_score(run.model, run.tokenizer, sources, refs, decode, run.cfg.tokenizer.lowercase)
        texts[label] = scored.texts
        out["decoders"][label] = {"sent_per_s": n / scored.seconds, "seconds": scored.seconds,
                                  "out_tokens": sum(len(h.tokens) for h in scored.best) / n,
                                  "bleu": scored.scores.bleu}
        print(f"  trained model, {label}: {n / scored.seconds:.1f} sent/s", flush=True)
    out["decoders"].update(time_ctranslate2(run, sources, refs, decoders, texts))
    if profile_to is not None:
        from torch.profiler import ProfilerActivity, profile

        decode = decoders[f"beam {beam}, stop=bound"]
        ids = encode_sources(run.tokenizer, sources, run.model.max_length, strict=False)
        with profile(activities=[ProfilerActivity.CPU], record_shapes=False) as prof:
            translate_ids(run.model, run.tokenizer, ids, decode)
        profile_to.write_text(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30) + "\n")
        print(f"  beam-search profile written to {profile_to}", flush=True)
    return out


def run_worker(spec: dict, work: Path, label: str) -> dict[str, Any]:
    key = label.replace(" ", "_").replace("/", "_")
    spec = {**spec, "result": str(work / f"{key}.result.json")}
    spec_path = work / f"{key}.spec.json"
    spec_path.write_text(json.dumps(spec))
    print(f"  {label} ...", end="", flush=True)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--_worker", str(spec_path)],
                          cwd=ROOT, capture_output=True, text=True)
    took = time.perf_counter() - start
    if proc.returncode != 0 or not Path(spec["result"]).is_file():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-12:]
        print(f" FAILED (exit {proc.returncode}, {took:.0f}s)\n    " + "\n    ".join(tail), flush=True)
        return {"error": tail[-1] if tail else f"exit {proc.returncode}"}
    result = json.loads(Path(spec["result"]).read_text())
    summary = []
    for k, unit in (("tok_per_s", "tgt tok/s"), ("sent_per_s", "sent/s")):
        if k in result:
            summary.append(f"{result[k]:.1f} {unit}")
    if "peak_mib" in result:
        summary.append(f"peak {result['peak_mib']:.0f} MiB")
    if "seconds" in result and not summary:
        summary.append(f"{result['seconds']:.2f} s, {result['pairs']} pairs")
    print(f" {', '.join(summary)} ({took:.0f}s)", flush=True)
    return result


def _fmt(x: float | None, digits: int = 1) -> str:
    if x is None:
        return "-"
    return f"{x:,.{digits}f}"


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a is not None and b else "-"


def build_report(res: dict[str, dict], meta: dict, args: argparse.Namespace) -> str:
    def get(task: str, field: str) -> float | None:
        return res.get(task, {}).get(field)

    threads = "" if meta["device"] == "cuda" else f", {meta['threads']} threads"
    quick = " [--quick: a smoke test, not a measurement]" if meta["quick"] else ""
    lines = [
        f"Speed{quick}: ours vs Marian vs nn.Transformer, {meta['config']} ({meta['model']}), "
        f"device {meta['device_name']}{threads}; torch {meta['torch']}, transformers {meta['transformers']}",
        "",
        f"Training: {meta['steps']} timed steps after {meta['warmup']} warm-up, batches of <= {meta['max_tokens']} "
        f"tokens from the train split ({meta['timed_tgt_tokens']:,} target tokens timed), AdamW, label smoothing "
        f"{meta['label_smoothing']}. Decoding (fp32): {meta['sentences']} sentences ({meta['decode_src_tokens']:,} "
        f"source tokens, {meta['decode_set']}), "
        f"batches of {meta['decode_batch']}, every hypothesis exactly a*len+b = {meta['max_len_a']:g}*len+"
        f"{meta['max_len_b']} tokens (EOS suppressed until then: untrained models). Memory: peak growth over the "
        f"loaded inputs ({meta['memory_method']}). Higher is better for tok/s and sent/s, lower for MiB.",
        "",
        "| measurement | ours | Marian | nn.Transformer | ours/Marian | ours cached/uncached |",
        "|---|---|---|---|---|---|",
    ]

    def row(label: str, tasks: dict[str, str | None], field: str, digits: int = 1, extra: str = "",
            scale: float = 1.0) -> None:
        vals = {}
        cells = []
        for m in MODELS:
            task = tasks.get(m)
            v = get(task, field) if task else None
            vals[m] = v * scale if v is not None else None
            if task is None:
                cells.append(tasks.get(f"{m}_note", "n/a"))
            elif task in res and "error" in res[task]:
                cells.append("failed")
            else:
                cells.append(_fmt(vals[m], digits))
        lines.append(f"| {label} | {' | '.join(cells)} | {_ratio(vals['ours'], vals['marian'])} | {extra} |")

    train_tasks = {p: {m: f"train.{m}.{p}" for m in MODELS} for p in meta["precisions"]}
    first = train_tasks[meta["precisions"][0]]
    row("parameters (M, trainable)", first, "params", 2, scale=1e-6)
    for p in meta["precisions"]:
        row(f"train step {p}{' autocast' if p == 'bf16' else ''} (target tok/s)", train_tasks[p], "tok_per_s")
    for p in meta["precisions"]:
        row(f"train step {p}, peak memory (MiB)", train_tasks[p], "peak_mib", 0)
    no_cache = {"torch_note": "n/a (no KV cache)"}
    g_cached = {"ours": "greedy.ours.cache", "marian": "greedy.marian.cache", **no_cache}
    g_uncached = {"ours": "greedy.ours.nocache", "marian": "greedy.marian.nocache", "torch": "greedy.torch.nocache"}
    beam = {"ours": "beam.ours.cache", "marian": "beam.marian.cache", "torch_note": "skipped (no KV cache)"}
    cached_vs = _ratio(get("greedy.ours.cache", "sent_per_s"), get("greedy.ours.nocache", "sent_per_s"))
    row("greedy, KV cache (sent/s)", g_cached, "sent_per_s", extra=cached_vs)
    row("greedy, no cache (sent/s)", g_uncached, "sent_per_s")
    row(f"beam {meta['beam']}, KV cache (sent/s)", beam, "sent_per_s")
    row("greedy, KV cache, peak memory (MiB)", g_cached, "peak_mib", 0)
    row("greedy, no cache, peak memory (MiB)", g_uncached, "peak_mib", 0)
    row(f"beam {meta['beam']}, KV cache, peak memory (MiB)", beam, "peak_mib", 0)
    generated = {k: (r["generated_tokens"], r["expected_tokens"]) for k, r in res.items() if "generated_tokens" in r}
    if generated:
        equal = all(g == e for g, e in generated.values())
        lines.insert(4, f"Tokens generated per decoding run: {sorted({g for g, _ in generated.values()})} "
                        f"(equal to the sum of the caps in every run: {'yes' if equal else 'NO'}).")
        lines.insert(5, "")
    if "mfu" in meta:
        cells = [f"{100 * meta['mfu'][m]:.2f}%" if meta["mfu"].get(m) is not None else "-" for m in MODELS]
        lines.append(f"| MFU, bf16 train step (peak {args.peak_tflops:g} TFLOP/s) | {' | '.join(cells)} | "
                     f"{_ratio(meta['mfu'].get('ours'), meta['mfu'].get('marian'))} |  |")

    if not any(k.startswith(("train.", "greedy.", "beam.")) for k in res):
        lines = lines[:1]  # --parts without models: no comparison table
    if any(k.startswith("data.") for k in res):
        np1, np2 = get("data.cold.np1", "seconds"), get("data.cold.np2", "seconds")
        warm = get("data.synth_warm", "seconds")
        target = "-" if warm is None else ("yes" if warm < 3.0 else "NO")
        lines += [
            "",
            f"Data path (data.cache.load_or_build; synthetic corpus of {meta['synth_pairs']:,} pairs: the bench "
            f"training pairs repeated and shuffled, {_fmt(get('data.cold.np1', 'pairs'), 0)} kept by the length "
            "filter)",
            "",
            "| data path | seconds |",
            "|---|---|",
            f"| warm load, cached bench splits (train + {TEST_SPLIT}, {_fmt(get('data.warm', 'pairs'), 0)} pairs) "
            f"| {_fmt(get('data.warm', 'seconds'), 3)} |",
            f"| cold tokenization + cache write, synthetic corpus, num_proc=1 | {_fmt(np1, 3)} "
            f"({_fmt(get('data.cold.np1', 'cores_busy'), 2)} cores busy on average) |",
            f"| cold tokenization + cache write, synthetic corpus, num_proc=2 | {_fmt(np2, 3)} "
            f"({_fmt(get('data.cold.np2', 'cores_busy'), 2)} cores busy; speed-up over num_proc=1: "
            f"{_ratio(np1, np2)}) |",
            f"| warm load, synthetic corpus (target < 3 s: {target}) | {_fmt(warm, 3)} |",
        ]
    lines += real_sections(res, meta)
    return "\n".join(lines)


def real_sections(res: dict[str, dict], meta: dict) -> list[str]:
    """Report lines for the real training loop and the trained model's decoding, where they were measured."""
    lines: list[str] = []
    real = {k.split(".", 1)[1]: v for k, v in res.items() if k.startswith("real.")}
    if real:
        lines += ["", "The real loop: `train.py` itself (batches from its own loader, the full training step; "
                  "CPU seconds, page faults and peak RSS for the whole process)", "",
                  "| train.py | steps | target tok/s | model GFLOP/s | of the peak | user s | system s | "
                  "minor page faults | peak RSS (MiB) |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for p, r in real.items():
            flops = _fmt(r["flops_per_s"] / 1e9, 1) if "flops_per_s" in r else "-"
            frac = f"{100 * r['peak_fraction']:.1f} %" if "peak_fraction" in r else "-"
            lines.append(f"| {p} | {r['steps']} | {_fmt(r['tok_per_s'], 0)} | {flops} | {frac} | "
                         f"{_fmt(r['user_s'], 0)} | {_fmt(r['sys_s'], 1)} | {_fmt(r['minor_faults'], 0)} | "
                         f"{_fmt(r['peak_mib'], 0)} |")
        for note in meta.get("real_skipped", []):
            lines.append(f"| {note}: skipped | | | | | | | | |")
        for p, r in real.items():
            if "peak_formula" in r:
                lines.append(f"\n{p}: model FLOPs {r['flops_formula']}; peak {r['peak_flops'] / 1e9:.1f} GFLOP/s = "
                             f"{r['peak_formula']}.")
    trained = res.get("trained")
    if trained:
        lines += ["", f"Trained model ({trained['model']}): the first {trained['sentences']} sentences of "
                  f"{TEST_SPLIT}, batches of {trained['batch_size']}, lenpen {trained['lenpen']:g}, "
                  "tokenizing and detokenizing included", "",
                  "| decoder | sent/s | mean output tokens | sacreBLEU | outputs identical to ours: same rule / "
                  "our default (bound) |", "|---|---|---|---|---|"]
        for label, r in trained["decoders"].items():
            same = f"{r['same_as_ours']} / {r['same_as_default']}" if "same_as_ours" in r else ""
            lines.append(f"| {label} | {_fmt(r['sent_per_s'])} | {_fmt(r['out_tokens'])} | {_fmt(r['bleu'], 2)} | "
                         f"{same} |")
    return lines


def main() -> int:
    from utils.cli import add_set_arg

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--config", default="configs/bench_small_rope.yaml")
    parser.add_argument("--out", default="runs/bench", help="folder for speed.md and speed.json")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test, not a measurement")
    parser.add_argument("--steps", type=int, help="timed training steps (default 30 on CPU, 200 on CUDA)")
    parser.add_argument("--warmup", type=int, help="untimed training steps first (default 3 on CPU, 20 on CUDA)")
    parser.add_argument("--max-tokens", type=int, help="training batch size in tokens (default: data.max_tokens)")
    parser.add_argument("--sentences", type=int, default=500, help=f"sentences of {TEST_SPLIT} to decode")
    parser.add_argument("--precisions", nargs="+", choices=["fp32", "bf16"], default=["fp32", "bf16"])
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--no-data", action="store_true", help="skip the data-path timings")
    parser.add_argument("--synth-pairs", type=int, default=SYNTH_PAIRS, help="size of the synthetic corpus")
    parser.add_argument("--threads", type=int, help="CPU threads (default: $OMP_NUM_THREADS, else all cores)")
    parser.add_argument("--peak-tflops", type=float, default=989.0,
                        help="accelerator peak for the MFU (default 989: H100 SXM bf16 dense)")
    add_set_arg(parser)
    parser.add_argument("--real-steps", type=int,
                        help="steps of train.py itself per precision (default 60 on CPU, 300 on CUDA; 0 = skip)")
    parser.add_argument("--model_path", help="a trained run directory to time real decoding on "
                                             "(default: runs/<config name>_latest when it exists)")
    parser.add_argument("--profile", action="store_true",
                        help="also write torch.profiler's table of the trained model's beam search to <out>")
    parser.add_argument("--parts", default="models,data,real,trained",
                        help="what to measure, from models (idealised step and forced-length decoding against "
                             "Marian and nn.Transformer), data, real (train.py), trained (a trained model's "
                             "decoding); default all")
    parser.add_argument("--_worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._worker:
        return worker(Path(args._worker))
    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    if not parts or parts - {"models", "data", "real", "trained"}:
        parser.error(f"--parts: choose from models, data, real, trained (got {args.parts!r})")
    if args.model_path and not Path(args.model_path).exists():
        parser.error(f"--model_path {args.model_path}: not found")

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("CUDA is not available: skipping the speed benchmark (run with --device cpu)")
        return 0
    config, out = Path(args.config).resolve(), Path(args.out).resolve()
    os.chdir(ROOT)  # the configs' relative paths (data, cache) are relative to the repository root
    cuda = args.device == "cuda"
    if args.quick:
        steps, warmup, max_tokens = args.steps or 3, args.warmup or 1, args.max_tokens or 1000
        sentences, synth_pairs = min(args.sentences, 20), min(args.synth_pairs, 20_000)
    else:
        steps = args.steps or (200 if cuda else 30)
        warmup = args.warmup if args.warmup is not None else (20 if cuda else 3)
        max_tokens, sentences, synth_pairs = args.max_tokens, args.sentences, args.synth_pairs
    threads = args.threads or default_threads()
    torch.set_num_threads(threads)

    import transformers

    from data.cache import load_or_build
    from data.sources import load_corpus
    from utils.cli import setup_logging
    from utils.config import load_config

    setup_logging()
    cfg = load_config(config, args.overrides)
    max_tokens = max_tokens or cfg.data.max_tokens
    from utils.training.setup import set_seed

    set_seed(cfg.seed)
    corpus_cache: list[Any] = []

    def corpus() -> Any:
        if not corpus_cache:
            corpus_cache.append(load_corpus(cfg.data))
        return corpus_cache[0]

    from utils.io import ensure_dir

    ensure_dir(out, "--out")
    tok, tok_path = get_tokenizer(cfg, out, corpus)
    splits = load_or_build(cfg, tok, corpus, ["train", TEST_SPLIT])
    inputs = make_inputs(cfg, tok, splits, max_tokens, warmup + steps, sentences)
    max_positions = max(cfg.model.max_positions, inputs["longest"])
    meta = {
        "config": str(config.relative_to(ROOT) if config.is_relative_to(ROOT) else config),
        "overrides": args.overrides,
        "model": f"d {cfg.model.d_model}, {cfg.model.n_heads} heads, {cfg.model.encoder_layers}+"
                 f"{cfg.model.decoder_layers} layers, FFN {cfg.model.d_ff}, vocab {tok.vocab_size}, ours "
                 f"{cfg.model.norm}-LN input_pe={cfg.model.input_pe} attention_pe={cfg.model.attention_pe}",
        "device": args.device,
        "device_name": torch.cuda.get_device_name() if cuda else cpu_name(),
        "threads": threads, "torch": torch.__version__, "transformers": transformers.__version__,
        "tokenizer": str(tok_path), "steps": steps, "warmup": warmup, "max_tokens": max_tokens,
        "timed_tgt_tokens": sum(b["n_tgt_tokens"] for b in inputs["train"][warmup:]),
        "label_smoothing": cfg.train.label_smoothing, "precisions": args.precisions,
        "sentences": sum(len(b["src"]) for b in inputs["decode"]),
        "decode_set": f"the first non-empty sources of {TEST_SPLIT}, rows 0-{inputs['decode_rows'][-1]}",
        "decode_src_tokens": sum(int((b["src"] != tok.pad_id).sum()) for b in inputs["decode"]),
        "decode_batch": cfg.decode.batch_size, "beam": cfg.decode.beam, "lenpen": cfg.decode.lenpen,
        "max_len_a": cfg.decode.max_len_a, "max_len_b": cfg.decode.max_len_b, "max_positions": max_positions,
        "synth_pairs": synth_pairs, "quick": args.quick,
        "tokenizers_parallelism": os.environ.get("TOKENIZERS_PARALLELISM"),
    }
    print(f"{meta['model']}; {len(inputs['train'])} training batches, {meta['sentences']} sentences to decode; "
          f"device {args.device}, {threads} threads", flush=True)

    res: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="fr2en-speed-") as tmp:
        work = Path(tmp)
        torch.save({k: inputs[k] for k in ("ids", "train", "decode")}, work / "inputs.pt")
        base = {"config": str(config), "overrides": args.overrides, "device": args.device, "threads": threads,
                "seed": cfg.seed, "inputs": str(work / "inputs.pt"), "tokenizer": str(tok_path),
                "max_positions": max_positions}
        tasks: list[tuple[str, dict]] = []
        for p in args.precisions if "models" in parts else []:
            tasks += [(f"train.{m}.{p}", {"task": "train", "model": m, "precision": p, "warmup": warmup})
                      for m in args.models]
        for key, model, task, cache in (
            ("greedy.ours.cache", "ours", "greedy", True), ("greedy.marian.cache", "marian", "greedy", True),
            ("greedy.ours.nocache", "ours", "greedy", False), ("greedy.marian.nocache", "marian", "greedy", False),
            ("greedy.torch.nocache", "torch", "greedy", False),
            ("beam.ours.cache", "ours", "beam", True), ("beam.marian.cache", "marian", "beam", True),
        ):
            if model in args.models and "models" in parts:
                tasks.append((key, {"task": task, "model": model, "use_cache": cache}))
        if not args.no_data and "data" in parts:
            synth = {"pairs": synth_pairs}
            tasks += [
                ("data.warm", {"task": "data_warm"}),
                ("data.cold.np1", {"task": "data_cold", "num_proc": 1, "cache_dir": str(work / "np1"), **synth}),
                ("data.cold.np2", {"task": "data_cold", "num_proc": 2, "cache_dir": str(work / "np2"), **synth}),
                ("data.synth_warm", {"task": "data_synth_warm", "cache_dir": str(work / "np2")}),
            ]
        for i, (key, spec) in enumerate(tasks, 1):
            res[key] = run_worker({**base, **spec}, work, f"[{i}/{len(tasks)}] {key}")
        real_steps = args.real_steps if args.real_steps is not None else (3 if args.quick else 300 if cuda else 60)
        if real_steps and "real" in parts:
            from utils.host import cpu_has_native_bf16

            print("the real loop (train.py):", flush=True)
            for p in args.precisions:
                if p == "bf16" and not cuda and not cpu_has_native_bf16():
                    meta.setdefault("real_skipped", []).append("bf16 (this CPU has no bf16 instructions)")
                    continue
                res[f"real.{p}"] = time_real_loop(config, args.overrides, real_steps, p, args.device, work)
    model_path = args.model_path or latest_link_path(ROOT / "runs", cfg.name)
    if parts == {"trained"} and not Path(model_path).exists():
        parser.error(f"--parts trained: no trained model at {model_path} (train one, or give --model_path RUN_DIR)")
    if "trained" in parts and Path(model_path).exists():
        print(f"trained-model decoding ({model_path}):", flush=True)
        profile_to = out / "decode_profile.txt" if args.profile else None
        res["trained"] = time_trained_decoding(str(model_path), sentences, cfg.decode.beam, args.device, profile_to)

    memory = [r["memory_method"] for r in res.values() if "memory_method" in r]
    meta["memory_method"] = memory[0] if memory else "-"
    if cuda and "bf16" in args.precisions:
        meta["mfu"] = {}
        for m in args.models:
            r = res.get(f"train.{m}.bf16", {})
            if "tok_per_s" in r:
                meta["mfu"][m] = 6 * r["params"] * r["tok_per_s"] / (args.peak_tflops * 1e12)
    report = build_report(res, meta, args)
    print()
    print(report)
    if "mfu" in meta:
        print("\nMFU (6 * params * target tok/s / peak), bf16 training step: " + ", ".join(
            f"{LABELS[m]} {100 * v:.2f}%" for m, v in meta["mfu"].items()))
    (out / "speed.md").write_text(report + "\n")
    (out / "speed.json").write_text(json.dumps({"meta": meta, "results": res}, indent=2) + "\n")
    print(f"\nwrote {out / 'speed.md'} and {out / 'speed.json'}")
    return 1 if any("error" in r for r in res.values()) else 0


if __name__ == "__main__":
    from utils.cli import run_main

    run_main(main)
