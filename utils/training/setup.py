"""Setting a training run up: seeds and threads, tokenizer, cached data, model, optimizer and schedule."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ignite.distributed as idist
import numpy as np
import torch

from data.batching import BatchIterable, TokenBatchSampler
from data.cache import load_or_build
from data.sources import DataError, load_corpus
from models.transformer import Seq2SeqTransformer
from tokenizer import Tokenizer, build_tokenizer, load_tokenizer
from tokenizer.base import META_FILE as TOKENIZER_META
from utils.config import Config, TrainConfig
from utils.host import cpu_has_native_bf16
from utils.run.layout import RunDir
from utils.run.store import select_device
from utils.translation.translate import encode_sources

log = logging.getLogger("train")


def threads_per_process(num_threads: int | None, local_processes: int, cores: int) -> int | None:
    """CPU threads for one training process: ``train.num_threads`` (None: torch's default) for one process, never
    more than the ``cores`` it may run on (more threads than cores only wait for each other); the processes of one
    machine (torchrun) share ``num_threads`` (or its cores) instead of each taking them all."""
    if local_processes <= 1:
        return min(num_threads, cores) if num_threads else None
    return max(1, min(num_threads or cores, cores) // local_processes)


def set_seed(seed: int) -> None:
    """Seed every generator training uses (Python, NumPy, torch CPU and CUDA)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def inverse_sqrt(warmup: int) -> Callable[[int], float]:
    """Vaswani et al. 2017, eq. 3, relative to the peak: min(step / warmup, sqrt(warmup / step))."""

    def factor(step: int) -> float:
        step = max(step, 1)
        return min(step / max(warmup, 1), math.sqrt(max(warmup, 1) / step))

    return factor


def cooled(factor: Callable[[int], float], total: int, share: float) -> Callable[[int], float]:
    """``factor`` times a linear fall to zero over the last ``share`` of ``total`` optimizer steps (a cool-down,
    Hägele et al. 2024): the step after ``s`` updates uses ``factor(s) * min(1, (total - s) / (share * total))``,
    so the last step's rate is ``1 / (share * total)`` of the plain schedule's."""
    length = max(1, round(share * total))

    def f(step: int) -> float:
        return factor(step) * min(1.0, max(0.0, (total - step) / length))

    return f


def step_budget(t: TrainConfig, batch_tokens: float) -> int | None:
    """Optimizer steps the run may take: ``train.max_steps``, or the steps ``train.max_target_tokens`` allows at
    ``batch_tokens`` per step, whichever is smaller; None without either."""
    budgets = [t.max_steps] if t.max_steps is not None else []
    if t.max_target_tokens is not None:
        budgets.append(max(1, math.ceil(t.max_target_tokens / batch_tokens)))
    return min(budgets) if budgets else None


def tokens_per_step(split: Any, sampler: TokenBatchSampler, accumulate: int, world: int) -> float:
    """Mean target tokens (eos included) per optimizer step over an epoch: all ranks, all accumulated batches."""
    total = float(split.tgt_lengths.sum() + len(split.tgt_lengths))
    return total / max(len(sampler.batches), 1) * accumulate * world


@dataclass(frozen=True)
class Schedule:
    """The learning-rate schedule a run uses, resolved for its batch size."""

    batch_tokens: float
    peak_lr: float
    warmup_steps: int


def schedule_for_batch(t: TrainConfig, batch_tokens: float) -> Schedule:
    """Peak lr and warmup steps for batches of ``batch_tokens`` target tokens (see TrainConfig.warmup_tokens)."""
    lr = t.lr if not t.lr_batch_tokens else t.lr * math.sqrt(batch_tokens / t.lr_batch_tokens)
    warmup = t.warmup_steps if t.warmup_tokens is None else max(1, round(t.warmup_tokens / batch_tokens))
    return Schedule(batch_tokens, lr, warmup)


class WeightAverage:
    """An exponential moving average of the weights (``train.ema_decay``; Polyak & Juditsky 1992), kept by torch's
    ``AveragedModel``: after each optimizer step ``avg = decay * avg + (1 - decay) * weights`` (the first step
    copies). ``module`` is a model holding the averaged weights; the state dict is the count of updates."""

    def __init__(self, model: torch.nn.Module, decay: float) -> None:
        from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

        self.decay = decay
        self.averaged = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay), use_buffers=True)
        self.module: torch.nn.Module = self.averaged.module
        self.module.eval()

    @torch.no_grad()
    def update(self, model: torch.nn.Module, keep: torch.Tensor | None = None) -> None:
        """One optimizer step's update, without waiting for the device: ``keep`` (a 0-d bool tensor), when given,
        decides on the device whether the step counts (False: a skipped step, the average unchanged)."""
        n = self.averaged.n_averaged
        weight = torch.where(n == 0, 1.0, 1.0 - self.decay)  # the first update copies
        if keep is not None:
            weight = weight * keep.to(weight.device)
        averaged = [*self.module.parameters(), *self.module.buffers()]
        current = [*model.parameters(), *model.buffers()]
        floats = [(a, c.detach()) for a, c in zip(averaged, current, strict=True) if torch.is_floating_point(a)]
        if floats:
            avg, cur = (list(x) for x in zip(*floats, strict=True))
            torch._foreach_lerp_(avg, cur, [weight.to(avg[0].dtype)] * len(avg))
        for a, c in zip(averaged, current, strict=True):
            if not torch.is_floating_point(a):
                a.copy_(torch.where(weight > 0, c, a))
        n += 1 if keep is None else keep.to(n.device, n.dtype)

    def state_dict(self) -> dict[str, Any]:
        return {"updates": int(self.averaged.n_averaged)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.averaged.n_averaged.fill_(int(state["updates"]))


@dataclass
class Setup:
    """Everything a training run needs, built from a config and a run directory."""

    cfg: Config
    run_dir: Path
    device: torch.device
    tokenizer: Tokenizer
    model: torch.nn.Module  # the Seq2SeqTransformer, wrapped in DistributedDataParallel when world size > 1
    core: Seq2SeqTransformer  # the unwrapped model (decoding, checkpoints)
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    train_data: BatchIterable
    valid_data: BatchIterable
    valid_texts: list[str]  # the validation sources decoded for BLEU (train.valid_bleu_sentences)
    valid_refs: list[str]
    attention_sentence: str  # the validation sentence whose attention maps are logged
    autocast: Callable[[], contextlib.AbstractContextManager] = field(default=contextlib.nullcontext)
    ema: WeightAverage | None = None  # train.ema_decay

    @property
    def decoded(self) -> torch.nn.Module:
        """The weights validation scores and checkpoints store as ``model``: the average, else the trained ones."""
        return self.ema.module if self.ema is not None else self.core


def prepare(cfg: Config) -> tuple[Any, Tokenizer]:
    """The corpus and the tokenizer trained on it: what a new run needs before its directory exists."""
    corpus = load_corpus(cfg.data)
    tokenizer = build_tokenizer(cfg.tokenizer, lambda: (corpus["train"]["src"], corpus["train"]["tgt"]), seed=cfg.seed)
    return corpus, tokenizer


def start_process(cfg: Config) -> torch.device:
    """Seed this rank, share the CPU threads among the processes of one machine, pick the device."""
    rank, world = idist.get_rank(), idist.get_world_size()
    set_seed(cfg.seed + rank)  # different dropout masks per rank; DDP broadcasts rank 0's initial weights
    local = idist.get_nproc_per_node() if world > 1 else 1
    threads = threads_per_process(cfg.train.num_threads, local, len(os.sched_getaffinity(0)))
    if threads:
        torch.set_num_threads(threads)
        if local > 1:
            log.info("CPU threads: %d per process (%d processes share %s)", threads, local,
                     f"train.num_threads={cfg.train.num_threads}" if cfg.train.num_threads else "this machine's cores")
    return idist.device() if world > 1 else select_device(cfg.train.device)


def run_tokenizer(cfg: Config, run_dir: Path, resume: bool, get_corpus: Callable[[], Any]) -> Tokenizer:
    """The run's tokenizer: trained by rank 0 and saved in the run directory, or reloaded from it."""
    tok_dir = RunDir(run_dir).tokenizer
    tokenizer: Tokenizer | None = None
    if not resume and idist.get_rank() == 0 and not (tok_dir / TOKENIZER_META).is_file():
        tokenizer = build_tokenizer(
            cfg.tokenizer, lambda: (get_corpus()["train"]["src"], get_corpus()["train"]["tgt"]), seed=cfg.seed
        )
        tokenizer.save(tok_dir)
    idist.barrier()
    if tokenizer is None:
        tokenizer = load_tokenizer(tok_dir)
    log.info("tokenizer: %s, vocabulary %d", cfg.tokenizer.type, tokenizer.vocab_size)
    return tokenizer


def batches(cfg: Config, tokenizer: Tokenizer, get_corpus: Callable[[], Any]) -> tuple[BatchIterable, BatchIterable]:
    """Training batches (this rank's shard, shuffled by seed and epoch) and validation batches, from the cache."""
    rank, world = idist.get_rank(), idist.get_world_size()
    with idist.one_rank_first():  # rank 0 builds the cache, the others then find it
        splits = load_or_build(cfg, tokenizer, get_corpus, ["train", "validation"])
    train, valid = splits["train"], splits["validation"]
    log.info("data: %d training pairs, %d validation pairs", len(train), len(valid))
    if len(train) == 0:
        raise DataError("no training pairs left after length filtering (see data.min_len / data.max_len)")
    if len(valid) == 0:
        raise DataError("no validation pairs left after length filtering (see data.min_len / data.max_len)")
    ids = (tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id)
    train_sampler = TokenBatchSampler(
        train.src_lengths, train.tgt_lengths, cfg.data.max_tokens, True, cfg.seed, rank, world,
        static_shapes=cfg.train.static_shapes,
    )
    if cfg.train.static_shapes:
        shapes = train_sampler.shapes()
        log.info("static shapes: %d (rows x length): %s", len(shapes), ", ".join(f"{r}x{n}" for r, n in shapes))
    valid_tokens = cfg.data.valid_max_tokens or cfg.data.max_tokens
    # Every rank evaluates the whole (small) validation set: sharding would drop the uneven tail, or leave a
    # rank with no batch at all; the metric's all-reduce scales loss and token sums alike, so ratios hold.
    valid_sampler = TokenBatchSampler(valid.src_lengths, valid.tgt_lengths, valid_tokens, False, cfg.seed)
    return BatchIterable(train, train_sampler, *ids), BatchIterable(valid, valid_sampler, *ids)


def attention_sentence(tokenizer: Tokenizer, texts: list[str], max_length: int | None) -> str:
    """A readable sentence for attention maps: the first of 6 to 20 tokens (else the first non-empty one)."""
    sources = encode_sources(tokenizer, texts, max_length, strict=False)
    candidates = [i for i, ids in enumerate(sources) if ids] or [0]
    pick = next((i for i in candidates if 6 <= len(sources[i]) <= 20), candidates[0])
    return texts[pick] if texts else ""


def optimization(t: TrainConfig, model: torch.nn.Module, device: torch.device, batch_tokens: float) -> tuple[
        torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler, torch.amp.GradScaler,
        Callable[[], contextlib.AbstractContextManager]]:
    """AdamW (fused: one kernel for all parameters, on CPU too, where it is the fastest of torch's three; and it
    skips a step on the device, ``step_unless``), the learning-rate schedule for batches of ``batch_tokens``, the
    grad scaler and the autocast."""
    sched = schedule_for_batch(t, batch_tokens)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=sched.peak_lr, betas=tuple(t.betas), eps=t.eps, weight_decay=t.weight_decay, fused=True
    )
    factor = inverse_sqrt(sched.warmup_steps) if t.scheduler == "inverse_sqrt" else (lambda step: 1.0)
    total = step_budget(t, batch_tokens)
    cool = ""
    if t.cooldown and total is not None:
        factor = cooled(factor, total, t.cooldown)
        cool = f", cool-down to 0 over the last {max(1, round(t.cooldown * total))} of {total} steps"
    log.info("schedule: %.0f target tokens per optimizer step, peak lr %.3g, warmup %d steps%s",
             sched.batch_tokens, sched.peak_lr, sched.warmup_steps, cool)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    scaler = torch.amp.GradScaler(device.type, enabled=t.amp == "fp16" and device.type == "cuda")
    cpu_bf16 = t.amp == "bf16" and (t.amp_cpu is True or (t.amp_cpu == "auto" and cpu_has_native_bf16()))
    use_amp = t.amp != "none" and (device.type == "cuda" or cpu_bf16)
    if use_amp and device.type == "cpu" and not cpu_has_native_bf16():
        log.warning("train.amp_cpu: this CPU has no bf16 instructions (avx512_bf16/amx_bf16): bf16 autocast "
                    "will be several times slower than fp32 here; set train.amp_cpu=false")
    dtype = torch.bfloat16 if t.amp == "bf16" else torch.float16
    why = f" (train.amp_cpu={t.amp_cpu})" if device.type == "cpu" and t.amp == "bf16" else ""
    log.info("precision: %s%s", f"{t.amp} autocast" if use_amp else "fp32", why)

    def autocast() -> contextlib.AbstractContextManager:
        return torch.autocast(device.type, dtype=dtype) if use_amp else contextlib.nullcontext()

    return optimizer, scheduler, scaler, autocast


def step_unless(optimizer: torch.optim.Optimizer, skip: torch.Tensor) -> None:
    """``optimizer.step()``, decided on the device: where ``skip`` (a 0-d bool tensor) is True the fused optimizer
    leaves weights, moments and step count as they were (its ``found_inf`` input, which torch's GradScaler feeds
    it the same way), so nothing waits for the device to know. Gradients must be unscaled already."""
    optimizer.found_inf = skip.to(torch.float32)  # type: ignore[attr-defined]
    try:
        optimizer.step()
    finally:
        del optimizer.found_inf  # type: ignore[attr-defined]


class WholeBatchForward(torch.nn.Module):
    """The training forward with its shape-changing tail kept out of a compiled graph: ``forward`` (a compiled
    ``model``) computes the final decoder states of every position of the padded batch, a shape fixed by the
    batch's static shape; the ``keep`` rows (a number that changes every step) are then selected, and the output
    layer applied, in eager mode. The same values as ``model(src, tgt, keep, output)``: the final layer norm acts
    on each position alone."""

    def __init__(self, forward: Callable[..., torch.Tensor], model: torch.nn.Module,
                 output_weight: Callable[[], torch.Tensor], graphs: bool = False) -> None:
        super().__init__()
        self.model = model  # the parameters (clipping, train/eval); ``forward`` runs it
        self.states = forward
        self.output_weight = output_weight
        self.graphs = graphs  # CUDA graphs: each call starts a new step (the last one's buffers are free)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor, keep: torch.Tensor | None = None,
                output: bool = True) -> torch.Tensor:
        if self.graphs:
            torch.compiler.cudagraph_mark_step_begin()
        x = self.states(src, tgt, None, output=False)
        if keep is not None:
            x = x[keep]
        return torch.nn.functional.linear(x, self.output_weight()) if output else x


def compile_mode(t: TrainConfig, device: torch.device) -> tuple[str | None, bool]:
    """``torch.compile``'s (mode, dynamic) for ``train.compile`` and ``train.static_shapes`` on ``device``:
    dynamic shapes without static shapes (token-bucketed batches change both sizes every step), else one graph
    per static shape; ``reduce-overhead`` (CUDA graphs) on CUDA only: a CPU compiles as ``true``."""
    mode = "reduce-overhead" if t.compile == "reduce-overhead" and device.type == "cuda" else None
    return mode, not t.static_shapes


def compiled(model: torch.nn.Module, t: TrainConfig, device: torch.device, core: Seq2SeqTransformer,
             shapes: int = 0) -> torch.nn.Module:
    """``torch.compile`` for the training forward (``compile_mode``), with the random numbers eager draws
    (dropout), so a seed trains the same model either way. With static shapes, the compiled part is the whole
    padded batch (``WholeBatchForward``) and each of the run's ``shapes`` static shapes compiles once."""
    import torch._dynamo.config as dynamo
    import torch._inductor.config as inductor

    inductor.fallback_random = True
    mode, dynamic = compile_mode(t, device)
    if t.compile == "reduce-overhead" and mode is None:
        log.warning("train.compile=reduce-overhead: CUDA graphs need a CUDA device; on %s it compiles as "
                    "train.compile=true", device.type)
    if dynamic:
        log.info("train.compile: the training forward compiles on its first steps (inductor, dynamic shapes)")
        return torch.compile(model, dynamic=True, mode=mode)
    dynamo.recompile_limit = max(dynamo.recompile_limit, 2 * shapes + 8)  # one graph per shape, never eager again
    log.info("train.compile: the training forward compiles once per static shape (inductor%s, %d shapes)",
             ", CUDA graphs" if mode else "", shapes)
    return WholeBatchForward(torch.compile(model, dynamic=False, mode=mode), model, lambda: core.output_weight,
                             graphs=mode is not None)


def build_setup(cfg: Config, run_dir: Path, resume: bool = False, corpus: Any = None) -> Setup:
    """Tokenizer (trained, or reloaded when the run directory has one), cached data, model, optimizer and
    schedule, in that order (each draws on the seeded generators). ``corpus``: the corpus if the caller has
    loaded it already.

    Data-parallel (``idist`` world size > 1): rank 0 trains the tokenizer and builds the cache first;
    every rank gets a disjoint shard of the batches; the model is wrapped in DistributedDataParallel.
    """
    world = idist.get_world_size()
    device = start_process(cfg)

    def get_corpus() -> Any:
        nonlocal corpus
        if corpus is None:
            corpus = load_corpus(cfg.data)
        return corpus

    tokenizer = run_tokenizer(cfg, run_dir, resume, get_corpus)
    train_data, valid_data = batches(cfg, tokenizer, get_corpus)
    raw_valid = get_corpus()["validation"]
    n_bleu = cfg.train.valid_bleu_sentences or len(raw_valid)
    src_texts, refs = list(raw_valid["src"][:n_bleu]), list(raw_valid["tgt"][:n_bleu])
    core = Seq2SeqTransformer(cfg.model, tokenizer.vocab_size, tokenizer.pad_id).to(device)
    model = idist.auto_model(core) if world > 1 else core
    augment = cfg.model.augment.describe()
    log.info("model: %.2fM parameters on %s (world size %d); positions: %s%s", core.num_parameters() / 1e6, device,
             world, cfg.model.describe_encodings(), f"; in training {augment}" if augment else "")
    t = cfg.train
    batch_tokens = tokens_per_step(train_data.split, train_data.sampler, t.accumulate, world)
    optimizer, scheduler, scaler, autocast = optimization(t, model, device, batch_tokens)
    ema = WeightAverage(core, t.ema_decay) if t.ema_decay is not None else None
    if ema is not None:
        log.info("weights: validation and checkpoints use their moving average (train.ema_decay=%g)", t.ema_decay)
    if t.compile:
        model = compiled(model, t, device, core, len(train_data.sampler.shapes()))
    return Setup(cfg, run_dir, device, tokenizer, model, core, optimizer, scheduler, scaler, train_data, valid_data,
                 src_texts, refs, attention_sentence(tokenizer, src_texts, core.max_length), autocast, ema)
