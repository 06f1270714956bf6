"""The training recipe: data -> tokenizer -> cache -> model -> Ignite trainer with handlers.

Handlers (all from ``ignite.handlers``): progress bar (on a terminal; plain log lines every
``train.log_every`` steps otherwise), TensorBoard logging (train loss, learning rate,
gradient norm, target tokens/s; validation loss, perplexity, token accuracy, BLEU, chrF), early stopping
on validation BLEU, ``checkpoints/best.pt`` (best BLEU) and ``checkpoints/last.pt`` (everything needed
to resume: model, optimizer, LR scheduler, grad scaler, trainer iteration/epoch, RNG state, early
stopping and best-checkpoint bookkeeping, gradients pending inside an accumulation window). Ctrl-C or
SIGTERM finishes the current step (and, on an epoch's last step, that epoch's validation), saves
``last.pt`` and exits; ``--resume RUN_DIR`` continues from it and, on CPU, repeats exactly the run that
would have happened without the interruption. Checkpoints are written atomically (temporary file,
fsync, rename), so a process killed at any moment leaves loadable ones; the temporary files of a
killed write are removed at the next start.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import random
import resource
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ignite.distributed as idist
import numpy as np
import torch
from ignite.engine import Engine, Events
from ignite.handlers import (
    Checkpoint,
    EarlyStopping,
    ProgressBar,
    global_step_from_engine,
)
from ignite.handlers.checkpoint import BaseSaveHandler
from ignite.handlers.tensorboard_logger import OptimizerParamsHandler, OutputHandler, TensorboardLogger

from data.batching import Batch, BatchIterable, TokenBatchSampler
from data.cache import load_or_build
from data.sources import DataError, load_corpus
from models.transformer import Seq2SeqTransformer
from tokenizer import Tokenizer, build_tokenizer, load_tokenizer
from tokenizer.base import META_FILE as TOKENIZER_META
from utils.checkpoint import CheckpointError, load_checkpoint, model_fingerprint, save_checkpoint
from utils.config import Config, TrainConfig
from utils.evaluation import create_evaluator, token_loss
from utils.host import cpu_has_native_bf16, keep_freed_memory
from utils.metrics import corpus_scores
from utils.rundir import BEST, LAST, PERIODIC_PREFIX, SUMMARY_MARK, RunDir
from utils.rundir import read_summary as read_summary  # re-exported: callers that import it from here
from utils.runs import lock_run, point_latest, select_device, unlock_run
from utils.translate import encode_sources, translate_ids

log = logging.getLogger("train")


def threads_per_process(num_threads: int | None, local_processes: int, cores: int) -> int | None:
    """CPU threads for one training process: ``train.num_threads`` (None: torch's default) for one process; the
    processes of one machine (torchrun) share ``num_threads`` (or its cores) instead of each taking them all."""
    if local_processes <= 1:
        return num_threads
    return max(1, (num_threads or cores) // local_processes)


def set_seed(seed: int) -> None:
    """Seed every generator training uses (Python, NumPy, torch CPU and CUDA)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class RNGState:
    """torch CPU (and CUDA) generator state, checkpointed so a resumed run draws the same dropout masks."""

    def state_dict(self) -> dict[str, Any]:
        state = {"torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            state["cuda"] = torch.stack(torch.cuda.get_rng_state_all())
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        torch.set_rng_state(state["torch"])
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(list(state["cuda"]))


class TokenCount:
    """Target tokens trained on so far by this rank (checkpointed: ``train.max_target_tokens`` holds across resumes)."""

    def __init__(self) -> None:
        self.tokens = 0

    def state_dict(self) -> dict[str, Any]:
        return {"tokens": self.tokens}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.tokens = int(state["tokens"])


class PendingGradients:
    """Gradients accumulated since the last optimizer step (``train.accumulate`` > 1), checkpointed so that
    a run stopped inside an accumulation window resumes exactly. Empty at a window's end."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def state_dict(self) -> dict[str, Any]:
        return {n: p.grad.detach().clone() for n, p in self.model.named_parameters() if p.grad is not None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for n, p in self.model.named_parameters():
            p.grad = state[n].to(p.device, p.dtype) if n in state else None


@dataclass
class RunMeta:
    """Fingerprints stored in every checkpoint, checked when it is loaded."""

    model_fingerprint: str
    tokenizer_fingerprint: str
    vocab_size: int

    def state_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("model_fingerprint") != self.model_fingerprint:
            raise ValueError("checkpoint was saved for a different model configuration")
        if state.get("tokenizer_fingerprint") != self.tokenizer_fingerprint:
            raise ValueError("checkpoint was trained with a different tokenizer")


class AtomicSaver(BaseSaveHandler):
    """Ignite save handler writing ``dirname/filename`` atomically (temp file + rename).

    Ignite removes a checkpoint before writing one of the same name; with fixed names (best.pt,
    last.pt) that would leave a moment with no file, so removal of a name about to be rewritten is
    skipped: the rename replaces it.
    """

    def __init__(self, dirname: Path, on_first_save: Callable[[], None] | None = None) -> None:
        self.dirname = Path(dirname)
        self.fixed_names = {RunDir(self.dirname.parent).best.name, RunDir(self.dirname.parent).last.name}
        self.on_first_save = on_first_save  # e.g. point <name>_latest at the run once it has a checkpoint

    def __call__(self, checkpoint: dict[str, Any], filename: str, metadata: dict | None = None) -> None:
        if idist.get_rank() == 0:  # in data-parallel training only rank 0 writes
            save_checkpoint(self.dirname / filename, checkpoint)
            if self.on_first_save is not None and filename in self.fixed_names:  # a run one can load or resume
                self.on_first_save()
                self.on_first_save = None

    def remove(self, filename: str) -> None:
        if filename not in self.fixed_names and idist.get_rank() == 0:
            (self.dirname / filename).unlink(missing_ok=True)


def remove_stale_temporaries(ckpt_dir: Path) -> None:
    """Delete temporary checkpoint files a killed process left (``.last.pt.<random>.pt.tmp``): the real
    ``best.pt``/``last.pt`` are only ever replaced by a completed rename, so these are never needed."""
    if idist.get_rank() == 0:
        for tmp in Path(ckpt_dir).glob(".*.tmp"):
            tmp.unlink(missing_ok=True)


def inverse_sqrt(warmup: int) -> Callable[[int], float]:
    """Vaswani et al. 2017, eq. 3, relative to the peak: min(step / warmup, sqrt(warmup / step))."""

    def factor(step: int) -> float:
        step = max(step, 1)
        return min(step / max(warmup, 1), math.sqrt(max(warmup, 1) / step))

    return factor


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
    valid_sources: list[list[int]]
    valid_refs: list[str]
    attention_sentence: str  # the validation sentence whose attention maps are logged
    autocast: Callable[[], contextlib.AbstractContextManager] = field(default=contextlib.nullcontext)


def prepare(cfg: Config) -> tuple[Any, Tokenizer]:
    """The corpus and the tokenizer trained on it: what a new run needs before its directory exists."""
    corpus = load_corpus(cfg.data)
    tokenizer = build_tokenizer(cfg.tokenizer, lambda: (corpus["train"]["src"], corpus["train"]["tgt"]), seed=cfg.seed)
    return corpus, tokenizer


def build_setup(cfg: Config, run_dir: Path, resume: bool = False, corpus: Any = None) -> Setup:
    """Tokenizer (trained, or reloaded when the run directory has one), cached data, model, optimizer and
    schedule. ``corpus``: the corpus if the caller has loaded it already.

    Data-parallel (``idist`` world size > 1): rank 0 trains the tokenizer and builds the cache first;
    every rank gets a disjoint shard of the batches; the model is wrapped in DistributedDataParallel.
    """
    rank, world = idist.get_rank(), idist.get_world_size()
    set_seed(cfg.seed + rank)  # different dropout masks per rank; DDP broadcasts rank 0's initial weights
    local = idist.get_nproc_per_node() if world > 1 else 1
    threads = threads_per_process(cfg.train.num_threads, local, len(os.sched_getaffinity(0)))
    if threads:
        torch.set_num_threads(threads)
        if local > 1:
            log.info("CPU threads: %d per process (%d processes share %s)", threads, local,
                     f"train.num_threads={cfg.train.num_threads}" if cfg.train.num_threads else "this machine's cores")
    device = idist.device() if world > 1 else select_device(cfg.train.device)

    def get_corpus():
        nonlocal corpus
        if corpus is None:
            corpus = load_corpus(cfg.data)
        return corpus

    tok_dir = RunDir(run_dir).tokenizer
    tokenizer: Tokenizer | None = None
    if not resume and rank == 0 and not (tok_dir / TOKENIZER_META).is_file():
        tokenizer = build_tokenizer(
            cfg.tokenizer, lambda: (get_corpus()["train"]["src"], get_corpus()["train"]["tgt"]), seed=cfg.seed
        )
        tokenizer.save(tok_dir)
    idist.barrier()
    if tokenizer is None:
        tokenizer = load_tokenizer(tok_dir)
    log.info("tokenizer: %s, vocabulary %d", cfg.tokenizer.type, tokenizer.vocab_size)

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
        train.src_lengths, train.tgt_lengths, cfg.data.max_tokens, True, cfg.seed, rank, world
    )
    valid_tokens = cfg.data.valid_max_tokens or cfg.data.max_tokens
    # Every rank evaluates the whole (small) validation set: sharding would drop the uneven tail, or leave a
    # rank with no batch at all; the metric's all-reduce scales loss and token sums alike, so ratios hold.
    valid_sampler = TokenBatchSampler(valid.src_lengths, valid.tgt_lengths, valid_tokens, False, cfg.seed)
    train_data = BatchIterable(train, train_sampler, *ids)
    valid_data = BatchIterable(valid, valid_sampler, *ids)

    raw_valid = get_corpus()["validation"]
    n_bleu = cfg.train.valid_bleu_sentences or len(raw_valid)
    src_texts = list(raw_valid["src"][:n_bleu])
    refs = list(raw_valid["tgt"][:n_bleu])

    core = Seq2SeqTransformer(cfg.model, tokenizer.vocab_size, tokenizer.pad_id).to(device)
    model = idist.auto_model(core) if world > 1 else core
    valid_sources = encode_sources(tokenizer, src_texts, core.max_length, strict=False)
    # A readable sentence for attention maps: the first of 6 to 20 tokens (else the first non-empty one).
    candidates = [i for i, ids in enumerate(valid_sources) if ids] or [0]
    pick = next((i for i in candidates if 6 <= len(valid_sources[i]) <= 20), candidates[0])
    attention_sentence = src_texts[pick] if src_texts else ""
    log.info("model: %.2fM parameters on %s (world size %d)", core.num_parameters() / 1e6, device, world)
    t = cfg.train
    sched = schedule_for_batch(t, tokens_per_step(train, train_sampler, t.accumulate, world))
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=sched.peak_lr, betas=tuple(t.betas), eps=t.eps, weight_decay=t.weight_decay
    )
    factor = inverse_sqrt(sched.warmup_steps) if t.scheduler == "inverse_sqrt" else (lambda step: 1.0)
    log.info("schedule: %.0f target tokens per optimizer step, peak lr %.3g, warmup %d steps",
             sched.batch_tokens, sched.peak_lr, sched.warmup_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    scaler = torch.amp.GradScaler(device.type, enabled=t.amp == "fp16" and device.type == "cuda")
    use_amp = t.amp != "none" and (device.type == "cuda" or (t.amp_cpu and t.amp == "bf16"))
    if use_amp and device.type == "cpu" and not cpu_has_native_bf16():
        log.warning("train.amp_cpu: this CPU has no bf16 instructions (avx512_bf16/amx_bf16): bf16 autocast "
                    "will be several times slower than fp32 here; set train.amp_cpu=false")
    dtype = torch.bfloat16 if t.amp == "bf16" else torch.float16

    def autocast() -> contextlib.AbstractContextManager:
        return torch.autocast(device.type, dtype=dtype) if use_amp else contextlib.nullcontext()

    return Setup(
        cfg,
        run_dir,
        device,
        tokenizer,
        model,
        core,
        optimizer,
        scheduler,
        scaler,
        train_data,
        valid_data,
        valid_sources,
        refs,
        attention_sentence,
        autocast,
    )


class NonFiniteGuard:
    """Watches each optimizer step's loss and gradient norm (``train.nonfinite``): a NaN or inf either stops
    training with one line naming the step (``stop``) or skips the update (``skip``; 20 skipped in a row stop
    training). Every rank decides alike (the flag is all-reduced). Healthy steps are untouched."""

    MAX_SKIPPED = 20

    def __init__(self, mode: str, check_grads: bool = True) -> None:
        self.mode, self.check_grads = mode, check_grads  # fp16: the grad scaler skips overflowing steps itself
        self.bad_loss: float | None = None  # the first non-finite loss of the current accumulation window
        self.skipped = 0

    def saw_loss(self, loss: float) -> None:
        if not math.isfinite(loss) and self.bad_loss is None:
            self.bad_loss = loss

    def step_is_finite(self, grad_norm: float, step: int) -> bool:
        """Whether the optimizer may step; raises StopError when training must stop."""
        from utils.cli import StopError

        what = f"loss {self.bad_loss}" if self.bad_loss is not None else \
            f"gradient norm {grad_norm}" if self.check_grads and not math.isfinite(grad_norm) else None
        self.bad_loss = None
        bad = what is not None
        if idist.get_world_size() > 1:
            bad = bool(idist.all_reduce(int(bad), op="MAX"))
            what = what or "loss or gradient on another rank"
        if not bad:
            self.skipped = 0
            return True
        if self.mode == "skip" and self.skipped < self.MAX_SKIPPED - 1:
            self.skipped += 1
            log.warning("step %d: non-finite %s, update skipped (train.nonfinite=skip)", step, what)
            return False
        again = f" ({self.MAX_SKIPPED} steps in a row)" if self.mode == "skip" else ""
        raise StopError(f"training diverged at step {step}: non-finite {what}{again}; nothing of this step was "
                        "saved (lower train.lr, or set train.nonfinite=skip to skip such steps)")


class StopRequest:
    """Turns the first SIGINT/SIGTERM into a request honoured at the next iteration boundary."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopRequest:
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not in the main thread
                pass
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.reason is not None:  # second signal: stop now
            raise KeyboardInterrupt
        self.reason = signal.Signals(signum).name
        log.warning("%s received: finishing this step, saving checkpoints/last.pt (again to abort)", self.reason)


def train(cfg: Config, run_dir: Path, resume: bool = False, corpus: Any = None,
          before_training: Callable[[], None] | None = None) -> dict[str, float]:
    """Train in ``run_dir`` (resuming from its last.pt if ``resume``); returns the last validation metrics.

    The run directory is locked (``utils.runs.lock_run``) while this trains. ``before_training`` runs once
    everything is checked (the checkpoint resumed, the run not finished), just before the first step: e.g.
    write a changed config. A run directory that already holds a tokenizer (train.py saves it there first)
    keeps it."""
    if idist.get_rank() == 0:
        lock_run(run_dir)
    try:
        return _train(cfg, run_dir, resume, corpus, before_training)
    finally:
        if idist.get_rank() == 0:
            unlock_run(run_dir)


def finished_reason(t: TrainConfig, iteration: int, epoch_length: int, tokens: int,
                    early_stopping_counter: int) -> str | None:
    """Why a resumed run has nothing left to train (its budget is spent), or None."""
    if iteration >= t.epochs * epoch_length:
        return f"all train.epochs={t.epochs} are done"
    if t.max_steps is not None and iteration >= t.max_steps * t.accumulate:
        return f"train.max_steps={t.max_steps} is reached"
    if t.max_target_tokens is not None and tokens >= t.max_target_tokens:
        return f"train.max_target_tokens={t.max_target_tokens} is reached"
    if early_stopping_counter >= t.patience:
        return f"early stopping ended it (no better validation BLEU in train.patience={t.patience} evaluations)"
    return None


def _train(cfg: Config, run_dir: Path, resume: bool, corpus: Any,
           before_training: Callable[[], None] | None) -> dict[str, float]:
    keep_freed_memory()  # no page-fault churn from large per-step allocations (see utils/host.py)
    s = build_setup(cfg, run_dir, resume, corpus)
    t = cfg.train
    model, optimizer, scheduler, scaler = s.model, s.optimizer, s.scheduler, s.scaler
    pad_id = s.tokenizer.pad_id
    rd = RunDir(run_dir)
    ckpt_dir = rd.checkpoints

    guard = NonFiniteGuard(t.nonfinite, check_grads=not scaler.is_enabled())

    def train_step(engine: Engine, batch: Batch) -> dict[str, float]:
        model.train()
        batch = batch.to(s.device)
        real = batch.tgt_out != pad_id
        with s.autocast():
            logits = model(batch.src, batch.tgt_in, real)  # [N, V]: no output layer or loss over padding
        loss = token_loss(logits, batch.tgt_out[real], pad_id, t.label_smoothing) / batch.n_tgt_tokens
        scaler.scale(loss / t.accumulate).backward()
        loss_value = float(loss.detach())
        guard.saw_loss(loss_value)
        grad_norm = float("nan")
        if engine.state.iteration % t.accumulate == 0:
            scaler.unscale_(optimizer)
            max_norm = t.clip_norm if t.clip_norm > 0 else float("inf")
            grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))
            if guard.step_is_finite(grad_norm, engine.state.iteration // t.accumulate):
                scaler.step(optimizer)
                scaler.update()
                scheduler.step()
            optimizer.zero_grad(set_to_none=True)
        return {"loss": loss_value, "tokens": int(batch.n_tgt_tokens), "grad_norm": grad_norm}

    trainer = Engine(train_step)
    core = s.core
    rank, world = idist.get_rank(), idist.get_world_size()
    evaluator = create_evaluator(core, pad_id, s.device, s.autocast)
    decode_cfg = cfg.decode.model_copy(update=dict(beam=t.valid_beam, nbest=1))

    @trainer.on(Events.EPOCH_STARTED)
    def _set_epoch(engine: Engine) -> None:
        length = len(s.train_data)
        s.train_data.set_epoch(engine.state.epoch, skip=engine.state.iteration % length)

    # Running training statistics: loss (exponential average), grad norm, target tokens per second.
    stats = {"tokens": 0, "since": time.perf_counter()}
    # Whole-run totals for the closing summary: target tokens and seconds spent outside training steps.
    totals = {"tokens": 0, "steps": 0, "eval_s": 0.0}

    @trainer.on(Events.ITERATION_COMPLETED)
    def _running_stats(engine: Engine) -> None:
        out = engine.state.output
        m = engine.state.metrics
        if math.isfinite(out["loss"]):  # a skipped non-finite step does not poison the running average
            m["loss"] = out["loss"] if "loss" not in m else 0.98 * m["loss"] + 0.02 * out["loss"]
        if math.isfinite(out["grad_norm"]):
            m["grad_norm"] = out["grad_norm"]
        stats["tokens"] += out["tokens"]
        totals["tokens"] += out["tokens"]
        seen.tokens += out["tokens"]
        totals["steps"] += 1
        if engine.state.iteration % t.log_every == 0:
            now = time.perf_counter()
            tokens = idist.all_reduce(stats["tokens"]) if world > 1 else stats["tokens"]  # all ranks together
            m["tokens_per_s"] = tokens / max(now - stats["since"], 1e-9)
            stats["tokens"], stats["since"] = 0, now
            log.info(
                "epoch %d step %d | loss %.3f | lr %.3g | %.0f target tokens/s",
                engine.state.epoch,
                engine.state.iteration,
                m["loss"],
                optimizer.param_groups[0]["lr"],
                m["tokens_per_s"],
            )

    @evaluator.on(Events.COMPLETED)
    def _bleu(engine: Engine) -> None:
        # Each rank decodes every world-th sentence; the gathered hypotheses give every rank the same BLEU.
        mine = translate_ids(core, s.tokenizer, s.valid_sources[rank::world], decode_cfg)
        hyps = [nbest[0].text for nbest in mine]
        if world > 1:
            shards = [json.loads(x) for x in idist.all_gather(json.dumps(hyps))]
            hyps = [shards[i % world][i // world] for i in range(len(s.valid_sources))]
        scores = corpus_scores(hyps, s.valid_refs, lowercase=cfg.tokenizer.lowercase)
        engine.state.metrics["bleu"] = scores.bleu
        engine.state.metrics["chrf"] = scores.chrf
        engine.state.metrics["example"] = hyps[0] if hyps else ""

    meta = RunMeta(
        model_fingerprint(cfg.model, s.tokenizer.vocab_size), s.tokenizer.fingerprint, s.tokenizer.vocab_size
    )
    remove_stale_temporaries(ckpt_dir)
    saver = AtomicSaver(ckpt_dir, on_first_save=None if resume else lambda: point_latest(run_dir))
    best = Checkpoint(
        {"model": core, "meta": meta, "trainer": trainer},  # the trainer state records the step
        saver,
        filename_pattern=f"{BEST}.{{ext}}",
        n_saved=1,
        score_function=lambda e: e.state.metrics["bleu"],
        score_name="bleu",
        global_step_transform=global_step_from_engine(trainer, Events.ITERATION_COMPLETED),
    )
    stopper = EarlyStopping(t.patience, lambda e: e.state.metrics["bleu"], trainer)
    rng = RNGState()
    grads = PendingGradients(core)
    seen = TokenCount()
    to_save = {
        "model": core,
        "optimizer": optimizer,
        "lr_scheduler": scheduler,
        "scaler": scaler,
        "trainer": trainer,
        "rng": rng,
        "meta": meta,
        "early_stopping": stopper,
        "best_checkpoint": best,
        "grads": grads,
        "tokens_seen": seen,
    }
    periodic = None
    if t.keep_checkpoints > 0:  # weights every checkpoint_every steps (or validation), the last K kept, to average
        periodic = Checkpoint({"model": core, "meta": meta, "trainer": trainer}, saver,
                              filename_pattern=f"{PERIODIC_PREFIX}{{global_step}}.{{ext}}", n_saved=t.keep_checkpoints,
                              global_step_transform=global_step_from_engine(trainer, Events.ITERATION_COMPLETED))
        to_save["periodic_checkpoints"] = periodic
    last = Checkpoint(to_save, saver, filename_pattern=f"{LAST}.{{ext}}", n_saved=1)

    tb = TensorboardLogger(log_dir=str(rd.tb)) if rank == 0 else None  # only rank 0 logs
    if tb is not None:
        every = Events.ITERATION_COMPLETED(every=t.log_every)
        tb.attach(trainer, OutputHandler("train", metric_names=["loss", "grad_norm", "tokens_per_s"]), every)
        tb.attach(trainer, OptimizerParamsHandler(optimizer, "lr", "train"), every)
        tb.attach(
            evaluator,
            OutputHandler(
                "valid",
                metric_names=["loss", "ppl", "accuracy", "bleu", "chrf"],
                global_step_transform=global_step_from_engine(trainer, Events.ITERATION_COMPLETED),
            ),
            Events.COMPLETED,
        )
        if sys.stderr.isatty():  # without a terminal (nohup, a cluster job) the log_every lines are the progress
            ProgressBar(persist=False).attach(trainer, metric_names=["loss"])
    evaluator.add_event_handler(Events.COMPLETED, best)
    evaluator.add_event_handler(Events.COMPLETED, stopper)

    if t.log_attention_every > 0 and s.attention_sentence and tb is not None:

        @trainer.on(Events.EPOCH_COMPLETED(every=t.log_attention_every))
        def _log_attention(engine: Engine) -> None:
            from utils.visualization import attention_figures, write_figures

            began = time.perf_counter()
            figures = attention_figures(core, s.tokenizer, s.attention_sentence)
            write_figures(figures, None, tb.writer, engine.state.iteration)
            totals["eval_s"] += time.perf_counter() - began

    last_eval = {"iteration": -1}

    def run_validation(engine: Engine) -> None:
        if last_eval["iteration"] == engine.state.iteration:
            return
        last_eval["iteration"] = engine.state.iteration
        began = time.perf_counter()
        evaluator.run(s.valid_data)
        totals["eval_s"] += time.perf_counter() - began
        if periodic is not None and not t.checkpoint_every:
            periodic(engine)
        m = evaluator.state.metrics
        log.info(
            "epoch %d step %d | valid loss %.3f ppl %.2f acc %.3f BLEU %.2f chrF %.2f | %r",
            engine.state.epoch,
            engine.state.iteration,
            m["loss"],
            m["ppl"],
            m["accuracy"],
            m["bleu"],
            m["chrf"],
            m["example"][:80],
        )
        last(engine)

    if periodic is not None and t.checkpoint_every:

        def save_periodic(engine: Engine) -> None:  # and the resume point, so a killed run loses < N steps
            periodic(engine)
            if not (t.eval_every > 0 and engine.state.iteration % t.eval_every == 0):  # validation writes it next
                last(engine)

        trainer.add_event_handler(Events.ITERATION_COMPLETED(every=t.checkpoint_every), save_periodic)
    eval_event = Events.ITERATION_COMPLETED(every=t.eval_every) if t.eval_every > 0 else Events.EPOCH_COMPLETED
    trainer.add_event_handler(eval_event, run_validation)

    start = time.monotonic()
    wall_start = time.perf_counter()
    reasons = {
        1: f"train.max_steps={t.max_steps} reached",
        2: f"train.max_minutes={t.max_minutes} reached",
        3: "stop requested by a signal",
        4: f"train.max_target_tokens={t.max_target_tokens} reached",
    }
    stopped = {"code": 0}
    with StopRequest() as stop:

        def _stop(engine: Engine) -> None:
            code = stopped["code"]
            log.info("stopping at step %d: %s", engine.state.iteration, reasons[code])
            if code != 3:
                run_validation(engine)
            last(engine)
            engine.terminate()

        @trainer.on(Events.ITERATION_COMPLETED)
        def _maybe_stop(engine: Engine) -> None:
            code = 0
            tokens = seen.tokens
            if t.max_target_tokens is not None and world > 1:  # every rank joins this all-reduce, every step
                tokens = idist.all_reduce(tokens)
            if stop.reason is not None:
                code = 3
            elif t.max_steps is not None and engine.state.iteration >= t.max_steps * t.accumulate:
                code = 1
            elif t.max_minutes is not None and time.monotonic() - start >= 60 * t.max_minutes:
                code = 2
            elif t.max_target_tokens is not None and engine.state.iteration % t.accumulate == 0 \
                    and tokens >= t.max_target_tokens:
                code = 4
            if world > 1:  # every rank stops at the same step
                code = int(idist.all_reduce(code, op="MAX"))
            if code == 0:
                return
            stopped["code"] = code
            # On an epoch's last step, its end-of-epoch work (validation when eval_every is 0, the best
            # checkpoint, early stopping, attention maps) runs first: a resumed run counts that epoch as done.
            if engine.state.iteration % engine.state.epoch_length != 0:
                _stop(engine)

        @trainer.on(Events.EPOCH_COMPLETED)  # registered after every other end-of-epoch handler
        def _stop_after_epoch_end(engine: Engine) -> None:
            if stopped["code"] and not engine.should_terminate:
                _stop(engine)

        if resume:
            state = load_checkpoint(rd.last)
            try:
                # Checkpoints written before these keys existed resume without them.
                optional = ("grads", "tokens_seen", "periodic_checkpoints")
                Checkpoint.load_objects(to_load={k: v for k, v in to_save.items() if k in state or k not in optional},
                                        checkpoint=state)
            except (KeyError, ValueError, RuntimeError, TypeError) as e:
                raise CheckpointError(f"{rd.last} cannot resume this run: "
                                      f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
            log.info(
                "resumed from %s at epoch %d, step %d",
                rd.last,
                trainer.state.epoch,
                trainer.state.iteration,
            )
            tokens = idist.all_reduce(seen.tokens) if t.max_target_tokens is not None and world > 1 else seen.tokens
            why = finished_reason(t, trainer.state.iteration, len(s.train_data), tokens, stopper.counter)
            if why is not None:
                from utils.cli import StopError

                raise StopError(f"{run_dir} has finished: {why} at step {trainer.state.iteration // t.accumulate}; "
                                "nothing to train (raise that budget with --set to continue)")
        if before_training is not None:
            before_training()
        trainer.run(s.train_data, max_epochs=t.epochs)
        if trainer.state.iteration > last_eval["iteration"] and stopped["code"] != 3:
            run_validation(trainer)  # the epochs ran out between evaluations
    wall = time.perf_counter() - wall_start
    train_s = max(wall - totals["eval_s"], 1e-9)
    if world > 1:  # the run's throughput is every rank's tokens, not rank 0's share
        totals["tokens"] = int(idist.all_reduce(totals["tokens"]))
    summary = {
        "steps": totals["steps"] // t.accumulate,
        "target_tokens": totals["tokens"],
        "train_seconds": round(train_s, 3),
        "eval_seconds": round(totals["eval_s"], 3),
        "target_tokens_per_s": round(totals["tokens"] / train_s, 1),
        "valid_ppl": evaluator.state.metrics.get("ppl") if evaluator.state else None,
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),  # this process
    }
    log.info(
        "trained %d optimizer steps, %d target tokens in %.0f s (%.0f target tokens/s; %.0f s validating; "
        "peak memory %.0f MB)"
        + SUMMARY_MARK + "%s",
        summary["steps"],
        summary["target_tokens"],
        train_s,
        summary["target_tokens_per_s"],
        totals["eval_s"],
        summary["peak_rss_mb"],
        json.dumps(summary),
    )
    if rank == 0:  # the same summary for the benchmarks, without parsing the log
        rd.write_summary(summary)
    if tb is not None:
        tb.close()
    return {k: v for k, v in evaluator.state.metrics.items() if isinstance(v, float)} if evaluator.state else {}
