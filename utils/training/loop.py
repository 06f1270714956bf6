"""The training recipe: a run set up (``utils.training.setup``), then Ignite's trainer with its handlers, as
named phases of one object (torchtune's recipes are the model): attach statistics, validation, checkpoints,
TensorBoard, attention maps and stop rules; resume; train; summarise.

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

A training step never waits for the device: its loss and gradient norm stay there, a non-finite step is skipped
there (``train.nonfinite``), and they are read back (``Recipe.read``) every ``train.log_every`` iterations, before
validation, checkpoints and stopping.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import resource
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ignite.distributed as idist
import torch
from ignite.engine import Engine, Events
from ignite.handlers import Checkpoint, EarlyStopping, ProgressBar, global_step_from_engine
from ignite.handlers.tensorboard_logger import OptimizerParamsHandler, OutputHandler, TensorboardLogger

from data.batching import Batch, PaddingCount
from models.loss import linear_cross_entropy
from utils.config import Config
from utils.host import keep_freed_memory, limit_kernel_caches
from utils.run.checkpoint import CheckpointError, load_checkpoint, model_fingerprint
from utils.run.environment import describe, record_environment, summary_line
from utils.run.layout import BEST, LAST, PERIODIC_PREFIX, SUMMARY_MARK, RunDir
from utils.run.store import lock_run, make_view, point_latest, unlock_run
from utils.training.evaluation import create_evaluator, token_loss
from utils.training.guards import NonFiniteGuard, StepWindow, StopRequest, finished_reason
from utils.training.profile import StepProfiler
from utils.training.setup import build_setup, step_unless
from utils.training.state import (
    AtomicSaver,
    PendingGradients,
    RNGState,
    RunMeta,
    TokenCount,
    remove_stale_temporaries,
)
from utils.translation.scoring import decode_and_score

log = logging.getLogger("train")

#: Why training stopped before its epochs ran out (``Recipe.stop_code``).
MAX_STEPS, MAX_MINUTES, SIGNAL, MAX_TOKENS = 1, 2, 3, 4

#: Iterations whose losses the device may hold before they are read, whatever ``train.log_every`` says.
MAX_UNREAD = 1000


def train(cfg: Config, run_dir: Path, resume: bool = False, corpus: Any = None,
          before_training: Callable[[], None] | None = None) -> dict[str, float]:
    """Train in ``run_dir`` (resuming from its last.pt if ``resume``); returns the last validation metrics.

    The run directory is locked (``utils.run.store.lock_run``) while this trains. ``before_training`` runs once
    everything is checked (the checkpoint resumed, the run not finished), just before the first step: e.g.
    write a changed config. A run directory that already holds a tokenizer (train.py saves it there first)
    keeps it."""
    if idist.get_rank() == 0:
        lock_run(run_dir)
    try:
        keep_freed_memory()  # no page-fault churn from large per-step allocations (see utils/host.py)
        limit_kernel_caches()  # no cache of oneDNN kernels for every batch shape seen (see utils/host.py)
        return Recipe(cfg, run_dir, resume, corpus).run(before_training)
    finally:
        if idist.get_rank() == 0:
            unlock_run(run_dir)


@dataclass
class Totals:
    """Whole-run counts for the closing summary, and the running window of the logged throughput."""

    tokens: int = 0  # target tokens trained on by this rank
    steps: int = 0  # iterations (optimizer steps x train.accumulate)
    eval_s: float = 0.0  # seconds outside training steps: validation, attention maps
    window_tokens: int = 0  # since the last log line
    window_since: float = 0.0


class Recipe:
    """One training run: ``__init__`` sets it up and builds the engines; ``run`` attaches the handlers in order,
    resumes, trains and writes the summary."""

    def __init__(self, cfg: Config, run_dir: Path, resume: bool, corpus: Any = None) -> None:
        self.cfg, self.t, self.run_dir, self.resume = cfg, cfg.train, Path(run_dir), resume
        self.s = build_setup(cfg, run_dir, resume, corpus)
        self.rd = RunDir(run_dir)
        self.rank, self.world = idist.get_rank(), idist.get_world_size()
        self.guard = NonFiniteGuard(self.t.nonfinite, check_grads=not self.s.scaler.is_enabled())
        self.window = StepWindow()  # losses and gradient norms on the device since the last read
        self.accumulated: list[torch.Tensor] = []  # the losses of the current accumulation window, on the device
        self.unreduced_tokens = 0  # world > 1 without a token budget: this rank's tokens since the last read
        self.trainer = Engine(self.train_step)
        self.evaluator = create_evaluator(self.s.decoded, self.s.tokenizer.pad_id, self.s.device, self.s.autocast)
        self.valid_decode = cfg.decode.model_copy(update=dict(beam=self.t.valid_beam, nbest=1, sample=False, mbr=0))
        self.totals = Totals(window_since=time.perf_counter())
        self.seen = TokenCount(self.world)
        self.padding = PaddingCount()  # padding among the positions trained on (train.static_shapes adds some)
        self.resumed_at = 0  # the iteration a resumed run started this process from
        self.last_eval_iteration = -1
        self.stop_code = 0
        self.tb: TensorboardLogger | None = None
        self.periodic: Checkpoint | None = None
        self.profiler = (StepProfiler(self.rd.profile, self.t.profile_after, self.t.profile_steps,
                                      self.t.accumulate, log) if self.t.profile_steps and self.rank == 0 else None)

    def phase(self, name: str) -> contextlib.AbstractContextManager:
        """The step's phases, marked for the profiler while it records (utils/training/profile.py)."""
        return self.profiler.phase(name) if self.profiler is not None else contextlib.nullcontext()

    # -- one step ------------------------------------------------------------------------------------------

    def train_step(self, engine: Engine, batch: Batch) -> dict[str, Any]:
        """Forward, loss, backward; every ``train.accumulate`` iterations clip and step the optimizer. Nothing here
        waits for the device: the real target positions are found on the host (``batch`` comes from the data on
        the CPU), the loss and gradient norm stay on the device (``self.window``, read by ``read``), a non-finite
        step is skipped there, and the output's ``loss`` and ``grad_norm`` (None without an optimizer step) are
        device tensors."""
        s, t = self.s, self.t
        s.model.train()
        with self.phase("data"):
            rows, cols = (batch.tgt_out != s.tokenizer.pad_id).nonzero(as_tuple=True)
            target = batch.tgt_out[rows, cols]
            src, tgt_in, rows, cols, target = (x.to(s.device, non_blocking=True)
                                               for x in (batch.src, batch.tgt_in, rows, cols, target))
        with self.phase("forward"), s.autocast():  # [N, D] or [N, V]: no output layer or loss over padding
            out = s.model(src, tgt_in, (rows, cols), output=not t.fused_loss)
        with self.phase("loss"), s.autocast():
            loss = (linear_cross_entropy(out, s.core.output_weight, target, t.label_smoothing) if t.fused_loss
                    else token_loss(out, target, s.tokenizer.pad_id, t.label_smoothing)) / batch.n_tgt_tokens
        with self.phase("backward"):
            s.scaler.scale(loss / t.accumulate).backward()
        loss = loss.detach()
        self.window.add_loss(engine.state.iteration, loss)
        self.accumulated.append(loss)
        grad_norm = None
        if engine.state.iteration % t.accumulate == 0:
            with self.phase("optimizer"):
                grad_norm = self.optimizer_step(engine.state.iteration)
        return {"loss": loss, "tokens": batch.n_tgt_tokens, "grad_norm": grad_norm}

    def optimizer_step(self, iteration: int) -> torch.Tensor:
        """Unscale (fp16), clip, and step the optimizer, the schedule and the weight average, unless the step is
        non-finite (decided on the device); the gradient norm, a device tensor."""
        s, t = self.s, self.t
        s.scaler.unscale_(s.optimizer)
        if t.clip_norm > 0:
            grad_norm = torch.nn.utils.clip_grad_norm_(s.model.parameters(), t.clip_norm, foreach=True)
        else:
            grad_norm = torch.nn.utils.get_total_norm(
                [p.grad for p in s.model.parameters() if p.grad is not None], foreach=True)
        skip, bad = self.guard.flags(self.accumulated, grad_norm)
        self.accumulated = []
        step_unless(s.optimizer, skip)
        s.scaler.update()  # fp16: the scale falls after an overflow, as the scaler found it when unscaling
        s.scheduler.step()  # on the host, so it counts skipped steps too
        if s.ema is not None:
            s.ema.update(s.core, keep=~skip)
        s.optimizer.zero_grad(set_to_none=True)
        self.window.add_step(iteration, grad_norm, bad)
        return grad_norm

    def read(self, engine: Engine) -> None:
        """Bring the losses and gradient norms kept on the device since the last read to the host (training waits
        for the device here, and only here): every ``train.log_every`` iterations, before validation, checkpoints
        and stopping. Updates the running loss (exponential average) and gradient norm, and gives each optimizer
        step to the non-finite guard, which may end training (StopError)."""
        m, t = engine.state.metrics, self.t
        for iteration, loss, step in self.window.read():
            self.guard.saw_loss(loss)
            if math.isfinite(loss):  # a skipped non-finite step does not poison the running average
                m["loss"] = loss if "loss" not in m else 0.98 * m["loss"] + 0.02 * loss
            if step is not None:
                grad_norm, bad = step
                if math.isfinite(grad_norm):
                    m["grad_norm"] = grad_norm
                self.guard.judge(iteration // t.accumulate, bad, grad_norm)
        if self.world > 1 and t.max_target_tokens is None:
            self.seen.tokens += int(idist.all_reduce(self.unreduced_tokens))
            self.unreduced_tokens = 0

    # -- phases --------------------------------------------------------------------------------------------

    def attach_profiler(self) -> None:
        """``train.profile_steps``: torch.profiler over a window of steps, the batch fetch marked as "data"."""
        p = self.profiler
        if p is None:
            return
        self.trainer.add_event_handler(Events.STARTED, lambda _: p.start())
        self.trainer.add_event_handler(Events.GET_BATCH_STARTED, lambda _: p.data_started())
        self.trainer.add_event_handler(Events.GET_BATCH_COMPLETED, lambda _: p.data_done())
        self.trainer.add_event_handler(Events.ITERATION_COMPLETED, lambda _: p.step())

    def attach_data_order(self) -> None:
        """Each epoch's batch order from the seed and epoch; a resumed epoch skips the batches it trained."""

        @self.trainer.on(Events.EPOCH_STARTED)
        def _set_epoch(engine: Engine) -> None:
            length = len(self.s.train_data)
            self.s.train_data.set_epoch(engine.state.epoch, skip=engine.state.iteration % length)

    def attach_padding(self) -> None:
        """The share of padding among the source and target positions trained on, as the metric ``padding`` every
        ``train.log_every`` iterations (the window since the last) and in the summary (the whole run)."""
        padding = self.padding

        @self.trainer.on(Events.ITERATION_COMPLETED)
        def _count_padding(engine: Engine) -> None:
            padding.add(engine.state.batch)
            if engine.state.iteration % self.t.log_every == 0:
                engine.state.metrics["padding"] = padding.take_window()

    def attach_statistics(self) -> None:
        """Target tokens (counted on the host, each batch's), and every ``train.log_every`` iterations a read of the
        device (``read``): the running loss, grad norm and target tokens/s, logged."""
        t, totals = self.t, self.totals

        @self.trainer.on(Events.ITERATION_COMPLETED)
        def _running_stats(engine: Engine) -> None:
            m, tokens = engine.state.metrics, engine.state.output["tokens"]
            totals.window_tokens += tokens
            totals.tokens += tokens
            if self.world == 1:
                self.seen.tokens += tokens
            elif t.max_target_tokens is not None:  # the budget is checked every step, on every rank's tokens
                self.seen.tokens += int(idist.all_reduce(tokens))
            else:
                self.unreduced_tokens += tokens
            totals.steps += 1
            if engine.state.iteration % t.log_every == 0:
                self.read(engine)
                now = time.perf_counter()
                tokens = idist.all_reduce(totals.window_tokens) if self.world > 1 else totals.window_tokens
                m["tokens_per_s"] = tokens / max(now - totals.window_since, 1e-9)
                totals.window_tokens, totals.window_since = 0, now
                log.info("epoch %d step %d | loss %.3f | lr %.3g | %.0f target tokens/s | padding %.1f %%",
                         engine.state.epoch, engine.state.iteration, m["loss"], self.s.optimizer.param_groups[0]["lr"],
                         m["tokens_per_s"], 100 * m.get("padding", 0.0))
            elif len(self.window) >= MAX_UNREAD:
                self.read(engine)

    def attach_validation_scores(self) -> None:
        """BLEU and chrF of the validation sentences, decoded after each teacher-forced validation pass (every
        rank decodes its share; all get the same scores)."""

        @self.evaluator.on(Events.COMPLETED)
        def _bleu(engine: Engine) -> None:
            scored = decode_and_score(self.s.decoded, self.s.tokenizer, self.s.valid_texts, self.s.valid_refs,
                                      self.valid_decode, self.cfg.tokenizer.lowercase, shard=True, bleu4=False)
            engine.state.metrics["bleu"] = scored.scores.bleu
            engine.state.metrics["chrf"] = scored.scores.chrf
            engine.state.metrics["example"] = scored.texts[0] if scored.texts else ""

    def attach_checkpoints(self) -> None:
        """``best.pt`` (validation BLEU), early stopping, the periodic ``step_<n>.pt`` files kept for averaging,
        and ``last.pt``, which holds everything a resumed run needs."""
        s, t, trainer = self.s, self.t, self.trainer
        meta = RunMeta(model_fingerprint(self.cfg.model, s.tokenizer.vocab_size), s.tokenizer.fingerprint,
                       s.tokenizer.vocab_size)
        remove_stale_temporaries(self.rd.checkpoints)
        saver = AtomicSaver(self.rd.checkpoints,
                            on_first_save=None if self.resume else lambda: point_latest(self.run_dir))
        step = global_step_from_engine(trainer, Events.ITERATION_COMPLETED)
        self.best = Checkpoint({"model": s.decoded, "meta": meta, "trainer": trainer},  # the trainer state: the step
                               saver, filename_pattern=f"{BEST}.{{ext}}", n_saved=1,
                               score_function=lambda e: e.state.metrics["bleu"], score_name="bleu",
                               global_step_transform=step)
        self.stopper = EarlyStopping(t.patience, lambda e: e.state.metrics["bleu"], trainer)
        self.to_save = {
            "model": s.decoded, "optimizer": s.optimizer, "lr_scheduler": s.scheduler, "scaler": s.scaler,
            "trainer": trainer, "rng": RNGState(), "meta": meta, "early_stopping": self.stopper,
            "best_checkpoint": self.best, "grads": PendingGradients(s.core), "tokens_seen": self.seen,
        }
        if s.ema is not None:  # "model": the average (what decoding loads); the training weights to resume
            self.to_save.update(train_model=s.core, ema=s.ema)
        if t.keep_checkpoints > 0:  # weights every checkpoint_every steps (or validation), the last K kept
            self.periodic = Checkpoint({"model": s.decoded, "meta": meta, "trainer": trainer}, saver,
                                       filename_pattern=f"{PERIODIC_PREFIX}{{global_step}}.{{ext}}",
                                       n_saved=t.keep_checkpoints, global_step_transform=step)
            self.to_save["periodic_checkpoints"] = self.periodic
        self.last = Checkpoint(self.to_save, saver, filename_pattern=f"{LAST}.{{ext}}", n_saved=1)

    def attach_tensorboard(self) -> None:
        """TensorBoard (rank 0 only): training loss, grad norm, tokens/s and lr; validation metrics; and a
        progress bar on a terminal. Then the best checkpoint and early stopping, after the validation scores."""
        if self.rank == 0:
            self.tb = tb = TensorboardLogger(log_dir=str(self.rd.tb))
            every = Events.ITERATION_COMPLETED(every=self.t.log_every)
            train_metrics = ["loss", "grad_norm", "tokens_per_s", "padding"]
            tb.attach(self.trainer, OutputHandler("train", metric_names=train_metrics), every)
            tb.attach(self.trainer, OptimizerParamsHandler(self.s.optimizer, "lr", "train"), every)
            tb.attach(self.evaluator, OutputHandler(
                "valid", metric_names=["loss", "ppl", "accuracy", "bleu", "chrf"],
                global_step_transform=global_step_from_engine(self.trainer, Events.ITERATION_COMPLETED)),
                Events.COMPLETED)
            if sys.stderr.isatty():  # without a terminal (nohup, a cluster job) the log_every lines are the progress
                ProgressBar(persist=False).attach(self.trainer, metric_names=["loss"], event_name=every)
        self.evaluator.add_event_handler(Events.COMPLETED, self.best)
        self.evaluator.add_event_handler(Events.COMPLETED, self.stopper)

    def attach_attention_maps(self) -> None:
        """Attention maps of one validation sentence in TensorBoard every ``train.log_attention_every`` epochs."""
        if not (self.t.log_attention_every > 0 and self.s.attention_sentence and self.tb is not None):
            return
        tb = self.tb

        @self.trainer.on(Events.EPOCH_COMPLETED(every=self.t.log_attention_every))
        def _log_attention(engine: Engine) -> None:
            from utils.figures.maps import attention_figures, write_figures

            began = time.perf_counter()
            figures = attention_figures(self.s.decoded, self.s.tokenizer, self.s.attention_sentence)
            write_figures(figures, None, tb.writer, engine.state.iteration, dpi=100)
            self.totals.eval_s += time.perf_counter() - began

    def validate(self, engine: Engine) -> None:
        """Validation (once per iteration at most), the periodic checkpoint when it follows validation, a log
        line, and ``last.pt``."""
        self.read(engine)
        if self.last_eval_iteration == engine.state.iteration:
            return
        self.last_eval_iteration = engine.state.iteration
        began = time.perf_counter()
        self.evaluator.run(self.s.valid_data)
        self.totals.eval_s += time.perf_counter() - began
        if self.periodic is not None and not self.t.checkpoint_every:
            self.periodic(engine)
        m = self.evaluator.state.metrics
        log.info("epoch %d step %d | valid loss %.3f ppl %.2f acc %.3f BLEU %.2f chrF %.2f | %r", engine.state.epoch,
                 engine.state.iteration, m["loss"], m["ppl"], m["accuracy"], m["bleu"], m["chrf"], m["example"][:80])
        self.last(engine)

    def attach_validation(self) -> None:
        """Validation every ``train.eval_every`` iterations (else every epoch); periodic checkpoints every
        ``train.checkpoint_every`` iterations, with ``last.pt`` so a killed run loses fewer than N steps."""
        t = self.t
        if self.periodic is not None and t.checkpoint_every:
            periodic = self.periodic

            def save_periodic(engine: Engine) -> None:
                self.read(engine)
                periodic(engine)
                if not (t.eval_every > 0 and engine.state.iteration % t.eval_every == 0):  # validation writes it
                    self.last(engine)

            self.trainer.add_event_handler(Events.ITERATION_COMPLETED(every=t.checkpoint_every), save_periodic)
        event = Events.ITERATION_COMPLETED(every=t.eval_every) if t.eval_every > 0 else Events.EPOCH_COMPLETED
        self.trainer.add_event_handler(event, self.validate)

    def stop(self, engine: Engine) -> None:
        """End training now for ``stop_code``: validate (not after a signal), save ``last.pt``, terminate."""
        reasons = {MAX_STEPS: f"train.max_steps={self.t.max_steps} reached",
                   MAX_MINUTES: f"train.max_minutes={self.t.max_minutes} reached",
                   SIGNAL: "stop requested by a signal",
                   MAX_TOKENS: f"train.max_target_tokens={self.t.max_target_tokens} reached"}
        self.read(engine)
        log.info("stopping at step %d: %s", engine.state.iteration, reasons[self.stop_code])
        if self.stop_code != SIGNAL:
            self.validate(engine)
        self.last(engine)
        engine.terminate()

    def attach_stop_rules(self, request: StopRequest) -> None:
        """Stop at ``train.max_steps``, ``max_minutes``, ``max_target_tokens`` or a signal: validate (not after a
        signal), save ``last.pt``, end. Every rank stops at the same step."""
        t, world, start = self.t, self.world, time.monotonic()

        @self.trainer.on(Events.ITERATION_COMPLETED)
        def _maybe_stop(engine: Engine) -> None:
            code = 0
            tokens = self.seen.tokens  # every rank's, the same on each
            if request.reason is not None:
                code = SIGNAL
            elif t.max_steps is not None and engine.state.iteration >= t.max_steps * t.accumulate:
                code = MAX_STEPS
            elif t.max_minutes is not None and time.monotonic() - start >= 60 * t.max_minutes:
                code = MAX_MINUTES
            elif t.max_target_tokens is not None and engine.state.iteration % t.accumulate == 0 \
                    and tokens >= t.max_target_tokens:
                code = MAX_TOKENS
            if world > 1:
                code = int(idist.all_reduce(code, op="MAX"))
            if code == 0:
                return
            self.stop_code = code
            # On an epoch's last step, its end-of-epoch work (validation when eval_every is 0, the best
            # checkpoint, early stopping, attention maps) runs first: a resumed run counts that epoch as done.
            if engine.state.iteration % engine.state.epoch_length != 0:
                self.stop(engine)

        @self.trainer.on(Events.EPOCH_COMPLETED)  # registered after every other end-of-epoch handler
        def _stop_after_epoch_end(engine: Engine) -> None:
            if self.stop_code and not engine.should_terminate:
                self.stop(engine)

    def resume_from_last(self) -> None:
        """Load ``last.pt`` into every stateful object; StopError, one line, if the run's budget is spent."""
        state = load_checkpoint(self.rd.last)
        # A checkpoint's optimizer groups carry the implementation that saved them (a run of an older version: the
        # for-loop AdamW); this run steps with the one it built (fused, which takes the skip flag on the device).
        built = [{k: g[k] for k in ("fused", "foreach") if k in g} for g in self.s.optimizer.param_groups]
        try:
            optional = ("grads", "tokens_seen", "periodic_checkpoints")  # absent from checkpoints of older runs
            Checkpoint.load_objects(to_load={k: v for k, v in self.to_save.items() if k in state or k not in optional},
                                    checkpoint=state)
        except (KeyError, ValueError, RuntimeError, TypeError) as e:
            raise CheckpointError(f"{self.rd.last} cannot resume this run: "
                                  f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
        for group, flags in zip(self.s.optimizer.param_groups, built, strict=True):
            group.update(flags)
        trainer, t = self.trainer, self.t
        self.resumed_at = trainer.state.iteration
        log.info("resumed from %s at epoch %d, step %d", self.rd.last, trainer.state.epoch, trainer.state.iteration)
        why = finished_reason(t, trainer.state.iteration, len(self.s.train_data), self.seen.tokens,
                              self.stopper.counter)
        if why is not None:
            from utils.cli import StopError

            raise StopError(f"{self.run_dir} has finished: {why} at step {trainer.state.iteration // t.accumulate}; "
                            "nothing to train (raise that budget with --set to continue)")

    def summary(self, wall: float) -> dict[str, Any]:
        """The closing summary (every rank's tokens), logged and written to ``summary.json`` by rank 0: ``steps``,
        ``target_tokens`` and the speeds are this process's; ``run_steps`` and ``run_target_tokens`` the run's since
        its start (more after a resume, from ``resumed_from_step``)."""
        totals = self.totals
        train_s = max(wall - totals.eval_s, 1e-9)
        tokens = int(idist.all_reduce(totals.tokens)) if self.world > 1 else totals.tokens
        positions, padding = self.padding.positions, self.padding.padding
        if self.world > 1:
            positions, padding = int(idist.all_reduce(positions)), int(idist.all_reduce(padding))
        metrics = self.evaluator.state.metrics if self.evaluator.state else {}
        summary = {
            "steps": totals.steps // self.t.accumulate,
            "target_tokens": tokens,
            "run_steps": self.trainer.state.iteration // self.t.accumulate,
            "run_target_tokens": self.seen.tokens,
            "resumed_from_step": self.resumed_at // self.t.accumulate,
            "train_seconds": round(train_s, 3),
            "eval_seconds": round(totals.eval_s, 3),
            "target_tokens_per_s": round(tokens / train_s, 1),
            "padding": round(padding / positions, 4) if positions else 0.0,  # of the positions trained on
            "valid_ppl": metrics.get("ppl"),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),  # this process
            "encodings": self.cfg.model.encodings(),  # where each positional encoding acts
            "augment": self.cfg.model.augment.describe() or None,  # training-time positions (model.augment)
            # where it ran: what a study's compute counts (utils/study/cost.py)
            "device": self.s.device.type, "world_size": self.world,
            "threads": torch.get_num_threads() if self.s.device.type == "cpu" else None,
        }
        resumed = (f" (resumed at step {summary['resumed_from_step']}: {summary['run_steps']} in the run)"
                   if self.resumed_at else "")
        log.info("trained %d optimizer steps%s, %d target tokens in %.0f s (%.0f target tokens/s; %.1f %% padding; "
                 "%.0f s validating; peak memory %.0f MB)" + SUMMARY_MARK + "%s", summary["steps"], resumed,
                 summary["target_tokens"], train_s, summary["target_tokens_per_s"], 100 * summary["padding"],
                 totals.eval_s, summary["peak_rss_mb"], json.dumps(summary))
        if self.rank == 0:  # the same summary for the benchmarks, without parsing the log
            self.rd.write_summary(summary)
            make_view(self.run_dir, create=False)  # <name>_latest shows summary.json (and profile/) too
        return summary

    def record_environment(self) -> None:
        """Rank 0 appends what trains this call (Python, packages, CPU, GPUs) to the run's ``environment.json``."""
        if self.rank != 0:
            return
        device = self.s.device
        cuda = device.type == "cuda"
        gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else []
        entry = describe(str(device), gpus, self.resumed_at // self.t.accumulate if self.resume else None)
        record_environment(self.run_dir, entry)
        log.info("environment: %s", summary_line(entry))

    def run(self, before_training: Callable[[], None] | None = None) -> dict[str, float]:
        """Attach, resume, train, summarise; returns the last validation metrics."""
        self.attach_profiler()
        self.attach_data_order()
        self.attach_padding()
        self.attach_statistics()
        self.attach_validation_scores()
        self.attach_checkpoints()
        self.attach_tensorboard()
        self.attach_attention_maps()
        self.attach_validation()
        wall_start = time.perf_counter()
        with StopRequest() as request:
            self.attach_stop_rules(request)
            if self.resume:
                self.resume_from_last()
            if before_training is not None:
                before_training()
            self.record_environment()
            try:
                self.trainer.run(self.s.train_data, max_epochs=self.t.epochs)
            finally:
                if self.profiler is not None:
                    self.profiler.stop()
            self.read(self.trainer)
            if self.trainer.state.iteration > self.last_eval_iteration and self.stop_code != SIGNAL:
                self.validate(self.trainer)  # the epochs ran out between evaluations
        self.summary(time.perf_counter() - wall_start)
        if self.tb is not None:
            self.tb.close()
        metrics = self.evaluator.state.metrics if self.evaluator.state else {}
        return {k: v for k, v in metrics.items() if isinstance(v, float)}
