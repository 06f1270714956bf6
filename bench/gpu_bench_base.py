"""The base model's parts of bench/gpu_bench.sh, trained in this process by the real training loop
(``utils.training.loop.Recipe``, what train.py runs): ``base`` (every precision, batch and mode: target tokens/s,
MFU, peak memory, padding) and ``profile`` (the fastest setting's step by phase)."""

from __future__ import annotations

import argparse
import gc
import json
import resource
import shutil
import time
from dataclasses import dataclass
from typing import Any

from bench.gpu_bench_plan import MODES, PRECISIONS, RUN_KEYS, Plan, bf16_peak, machine, one_line, say, steady
from utils.study.gpu import GPU_BASE


def flops_per_token(cfg: Any, tokenizer: Any, train: Any) -> float:
    """Model FLOPs of a training step per real target token, on every training pair's real lengths (bench/hardware.py;
    padding is not model work)."""
    from bench.hardware import matrix_params, train_flops
    from models.transformer import Seq2SeqTransformer

    params = matrix_params(Seq2SeqTransformer(cfg.model, tokenizer.vocab_size, tokenizer.pad_id))
    src, tgt = (train.src_lengths + 1).tolist(), (train.tgt_lengths + 1).tolist()
    m = cfg.model
    return train_flops(params, m.d_model, m.encoder_layers, m.decoder_layers, zip(src, tgt, strict=True)) / sum(tgt)


def batch_size_for(train: Any, target: float, static: bool, seed: int) -> tuple[int, float]:
    """The ``data.max_tokens`` whose batches hold ``target`` real target tokens per step on average (with or without
    static shapes), and that mean."""
    from data.batching import TokenBatchSampler
    from utils.training.setup import tokens_per_step

    def mean(max_tokens: int) -> float:
        sampler = TokenBatchSampler(train.src_lengths, train.tgt_lengths, max_tokens, True, seed,
                                    static_shapes=static)
        return tokens_per_step(train, sampler, 1, 1)

    best: tuple[int, float] | None = None
    size = max(8, round(target * 1.2))
    for _ in range(4):
        got = mean(size)
        if best is None or abs(got - target) < abs(best[1] - target):
            best = (size, got)
        size = max(8, round(size * target / got))
    assert best is not None
    return best


class Windows:
    """Watches a run of the real loop: time, iteration and real target tokens every ``every`` iterations (the loop's
    own ``train.log_every``, where it reads its statistics back from the device anyway), and ends the run, without
    validation or checkpoint, after ``limit`` windows, at ``deadline`` (time.monotonic), or after ``stop_at``
    iterations."""

    def __init__(self, every: int, limit: int, deadline: float, stop_at: int | None = None) -> None:
        self.every, self.limit, self.deadline, self.stop_at = every, limit, deadline, stop_at
        self.points: list[tuple[float, int, int]] = []
        self.tokens = self.positions = self.padding = 0
        self.start = time.monotonic()
        self.cuda = False

    def attach(self, recipe: Any) -> None:
        from ignite.engine import Events

        from utils.training.loop import SIGNAL

        self.cuda = recipe.s.device.type == "cuda"

        def observe(engine: Any) -> None:
            batch = engine.state.batch
            self.tokens += int(batch.n_tgt_tokens)
            self.positions += int(batch.n_positions)
            self.padding += int(batch.n_padding)
            it = engine.state.iteration
            if it % self.every == 0:
                if self.cuda:
                    import torch

                    torch.cuda.synchronize()
                self.points.append((time.monotonic() - self.start, it, self.tokens))
            if len(self.points) >= self.limit or time.monotonic() >= self.deadline or \
                    (self.stop_at is not None and it >= self.stop_at):
                recipe.stop_code = SIGNAL  # as a signal ends a run: no validation; and no checkpoint here
                engine.terminate()

        recipe.trainer.add_event_handler(Events.ITERATION_COMPLETED, observe)


@dataclass
class Prepared:
    """What every setting of a part shares: the corpus, the tokenizer, the training split's lengths, the FLOPs per
    real target token and the device's bf16 peak."""

    corpus: Any
    tokenizer: Any
    train: Any
    flops_per_token: float
    peak: Any


def prepare(plan: Plan, sets: list[str], peak_tflops: float | None) -> Prepared:
    """The corpus's tokenizer (trained once per work folder, then reloaded: base and profile share it), the training
    split from the data cache, its FLOPs per target token and the device's peak."""
    from data.cache import load_or_build
    from data.sources import load_corpus
    from tokenizer import load_tokenizer
    from utils.config import load_config
    from utils.training.setup import prepare as prepare_run

    cfg = load_config(GPU_BASE, sets)
    began = time.monotonic()
    saved = plan.work / "tokenizer"
    corpus = None
    if (saved / "meta.json").is_file():
        tokenizer = load_tokenizer(saved)
    else:
        corpus, tokenizer = prepare_run(cfg)
        tokenizer.save(saved)

    def get_corpus() -> Any:
        nonlocal corpus
        if corpus is None:
            corpus = load_corpus(cfg.data)
        return corpus

    train = load_or_build(cfg, tokenizer, get_corpus, ["train"])["train"]
    say(f"tokenizer and cache ready in {time.monotonic() - began:.0f} s ({len(train.src_lengths):,} training pairs)")
    return Prepared(corpus, tokenizer, train, flops_per_token(cfg, tokenizer, train), bf16_peak(plan.device,
                                                                                                  peak_tflops))


def train_here(plan: Plan, prep: Prepared, sets: list[str], watch: Windows) -> dict[str, Any]:
    """One run of configs/gpu_base.yaml with ``sets`` by the real loop in this process, ended by ``watch``: its
    rates, memory, padding and its run directory (for the caller to read, then remove)."""
    import torch

    from utils.config import load_config
    from utils.run.layout import RunDir
    from utils.run.store import create_run_dir
    from utils.training.loop import Recipe

    cfg = load_config(GPU_BASE, sets)  # not train.py's host-memory estimate: the GPU's own peak is measured
    run = create_run_dir(cfg, plan.work / "runs")
    prep.tokenizer.save(RunDir(run).tokenizer)
    if plan.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    recipe = Recipe(cfg, run, False, prep.corpus)
    watch.attach(recipe)
    recipe.run()
    summary = RunDir(run).summary()
    out: dict[str, Any] = {"steps": summary["steps"], "tokens_per_s_run": summary["target_tokens_per_s"],
                           "train_s": summary["train_seconds"], "run_dir": str(run),
                           "padding_share": watch.padding / watch.positions if watch.positions else None,
                           "mean_target_tokens_per_step": watch.tokens / max(summary["steps"], 1),
                           "first_window_s": watch.points[0][0] if watch.points else None,
                           "windows_logged": len(watch.points)}
    rates = steady(watch.points)
    if rates is not None:
        out.update(rates, mfu=prep.flops_per_token * rates["tokens_per_s"] / prep.peak.flops)
    if plan.device == "cuda":
        out.update(peak_memory_mib=torch.cuda.max_memory_allocated() / 2**20, memory="CUDA allocator peak")
    else:
        out.update(peak_memory_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                   memory="peak RSS of the process")
    del recipe
    release(plan.device)
    return out


def release(device: str) -> None:
    """Free what a finished run held: its compiled graphs, CUDA graphs and cached blocks."""
    import torch

    gc.collect()
    try:
        import torch._dynamo
        from torch._inductor import cudagraph_trees

        torch._dynamo.reset()
        cudagraph_trees.reset_cudagraph_trees()  # the CUDA graphs' memory pools
    except Exception:  # noqa: BLE001 - a torch without them: nothing compiled to free
        pass
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def run_sets(plan: Plan, precision: str, mode: str, max_tokens: int) -> list[str]:
    return [*plan.corpus_sets(), *RUN_KEYS, f"train.log_every={plan.log_every}", f"train.device={plan.device}",
            *PRECISIONS[precision], *MODES[mode], f"data.max_tokens={max_tokens}"]


# ---------------------------------------------------------------------------------------------- base

#: Seconds an eager setting trains at most (its windows come sooner at small batches), and the fewest worth starting.
EAGER_S, EAGER_LEAST = 15.0, 8.0
#: The fewest seconds worth starting a compiled setting with, and the share of the time left (after the eager
#: settings' time) that the goal's compiled settings take: compiling comes first, then the windows.
COMPILED_LEAST, GOAL_SHARE = 45.0, 0.6


def time_share(settings: list[tuple[str, int, str]], index: int, left: float) -> float:
    """Seconds for setting ``index`` of ``settings`` (in ``order``), ``left`` seconds being left: an eager one
    ``EAGER_S``; a compiled one of the goal (bf16 at the largest batch) ``GOAL_SHARE`` of what the eager ones after
    it leave, shared with the goal's other compiled modes; any other compiled one an equal share of what is left."""
    precision, target, mode = settings[index]
    rest = settings[index + 1:]
    if mode == "eager":
        return EAGER_S
    largest = max(s[1] for s in settings)
    if precision == "bf16" and target == largest:
        goal_after = sum(1 for s in rest if s[2] != "eager" and s[0] == "bf16" and s[1] == largest)
        eager_after = sum(1 for s in rest if s[2] == "eager")
        return max(COMPILED_LEAST, (left - EAGER_S * eager_after) * GOAL_SHARE / (1 + goal_after))
    return max(COMPILED_LEAST, left / (1 + sum(1 for s in rest if s[2] != "eager")))


def order(precisions: list[str], batches: list[int], modes: list[str]) -> list[tuple[str, int, str]]:
    """The settings in the order they run: bf16 at the largest batch in every mode (the goal's), then every eager
    setting, then the other compiled ones (bf16 first, larger batches first)."""
    largest = max(batches)
    first = [(p, largest, m) for p in precisions if p == "bf16" for m in modes]
    rest = [(p, b, m) for m in modes for p in sorted(precisions, key=lambda p: p != "bf16")
            for b in sorted(batches, reverse=True) if (p, b, m) not in first]
    return first + sorted(rest, key=lambda s: s[2] != "eager")


def base_part(plan: Plan, args: argparse.Namespace) -> dict[str, Any]:
    from utils.cli import setup_logging
    from utils.host import keep_freed_memory, limit_kernel_caches

    setup_logging()
    keep_freed_memory()
    limit_kernel_caches()
    batches = args.batches or ([64, 128, 256] if plan.dry else [4096, 16384, 32768])
    modes = args.modes or ["eager", "reduce-overhead"]
    precisions = args.precisions or list(PRECISIONS)
    doc: dict[str, Any] = {"machine": machine(plan.device), "config": "configs/gpu_base.yaml", "dry_run": plan.dry,
                           "sets": plan.corpus_sets(), "rows": []}
    prep = prepare(plan, plan.corpus_sets(), args.peak_tflops)
    doc.update(flops_per_target_token=prep.flops_per_token, peak_flops=prep.peak.flops, peak=prep.peak.formula)
    sizes: dict[tuple[int, bool], tuple[int, float]] = {}
    settings = order(precisions, batches, modes)
    for index, (precision, target, mode) in enumerate(settings):
        static = mode != "eager"
        if (target, static) not in sizes:
            sizes[target, static] = batch_size_for(prep.train, target, static, 1234)
        max_tokens, mean = sizes[target, static]
        row: dict[str, Any] = {"precision": precision, "target_tokens_per_step": target, "mode": mode,
                               "max_tokens": max_tokens, "corpus_mean_target_tokens_per_step": mean}
        doc["rows"].append(row)
        if plan.dry and mode != "eager":
            row.update(status="skipped", reason="--dry-run: no compiling on the CPU (inductor takes minutes there)")
            plan.write("base", doc)
            continue
        share = min(plan.left(), time_share(settings, index, plan.left()))
        least = EAGER_LEAST if mode == "eager" else COMPILED_LEAST
        if not plan.dry and plan.left() < least:
            row.update(status="not run", reason=f"the part's time cap ({plan.budget:.0f} s) was spent")
            plan.write("base", doc)
            continue
        say(f"base: {precision}, {target} target tokens per step (data.max_tokens={max_tokens}), {mode}: up to "
            f"{share:.0f} s")
        watch = Windows(plan.log_every, 5 if plan.dry else args.windows, time.monotonic() + share - 3)
        began = time.monotonic()
        try:
            row.update(train_here(plan, prep, run_sets(plan, precision, mode, max_tokens), watch), status="ok")
            shutil.rmtree(row.pop("run_dir"), ignore_errors=True)
        except Exception as e:  # noqa: BLE001 - a setting that fails (memory, compile) is a row saying why
            import traceback

            traceback.print_exc()
            row.update(status="failed", reason=one_line(e))
        if row["status"] == "failed":
            release(plan.device)  # out of the except block: its traceback no longer holds the run
        row["seconds"] = time.monotonic() - began
        if row["status"] == "ok" and "tokens_per_s" not in row:
            row.update(status="too short", reason=f"{row['windows_logged']} windows of {plan.log_every} steps "
                       "logged: too few for a steady rate (compiling took the setting's time)")
        say(f"base: {precision}, {target}, {mode}: {row['status']}"
            + (f", {row['tokens_per_s']:,.0f} target tokens/s" if "tokens_per_s" in row else ""))
        plan.write("base", doc)
    return doc


# ---------------------------------------------------------------------------------------------- profile


def profile_part(plan: Plan, args: argparse.Namespace) -> dict[str, Any]:
    from utils.cli import setup_logging
    from utils.host import keep_freed_memory, limit_kernel_caches
    from utils.run.layout import RunDir

    base_file = plan.out / "parts" / "base.json"
    rows = json.loads(base_file.read_text())["rows"] if base_file.is_file() else []
    done = [r for r in rows if r.get("status") == "ok" and "tokens_per_s" in r]
    doc: dict[str, Any] = {"machine": None, "dry_run": plan.dry}
    if not done:
        doc.update(status="not run", reason="no setting of the base model finished")
        plan.write("profile", doc)
        return doc
    after, steps = (2, 2) if plan.dry else (30, 10)
    ranked = sorted(done, key=lambda r: -r["tokens_per_s"])

    def fits(r: dict[str, Any]) -> bool:  # its warm-up (compiling) as the base part measured it, then the steps
        return plan.dry or (r.get("first_window_s") or 0) + (after + steps) / r["steps_per_s"] + 10 < plan.left()

    best = next((r for r in ranked if fits(r)), ranked[-1])
    why = "the fastest setting" if best is ranked[0] else \
        f"the fastest whose warm-up fits the part's {plan.budget:.0f} s; the fastest, {ranked[0]['mode']}, does not"
    setup_logging()
    keep_freed_memory()
    limit_kernel_caches()
    doc["machine"] = machine(plan.device)
    doc.update(setting={k: best[k] for k in ("precision", "target_tokens_per_step", "mode", "max_tokens")},
               why=why, profile_after=after, profile_steps=steps)
    prep = prepare(plan, plan.corpus_sets(), args.peak_tflops)
    sets = [*run_sets(plan, best["precision"], best["mode"], best["max_tokens"]), f"train.profile_steps={steps}",
            f"train.profile_after={after}"]
    say(f"profile: {best['precision']}, {best['target_tokens_per_step']}, {best['mode']} ({why})")
    try:
        got = train_here(plan, prep, sets, Windows(plan.log_every, 10**9, time.monotonic() + plan.left() - 3,
                                                   stop_at=after + steps + 1))
        phases = RunDir(got["run_dir"]).phases()
        shutil.rmtree(got["run_dir"], ignore_errors=True)
        doc.update(status="ok", ms_per_step=phases["ms_per_step"], phases=phases["phases"])
    except Exception as e:  # noqa: BLE001 - no phases (the window did not close in time), or a failure
        doc.update(status="failed", reason=one_line(e))
    plan.write("profile", doc)
    return doc
