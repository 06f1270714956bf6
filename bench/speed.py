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
tensors; every measurement then runs in a fresh process (``bench/workers.py``) that loads those
same tensors, so that peak memory is measured per model and per measurement.

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
import json
import os
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as bench/speed.py: the repository root first

from bench.common import ROOT, cpu_model, fmt, ratio, usable_cores  # noqa: E402
from bench.compare_models import LABELS, MODELS  # noqa: E402
from bench.speed_inputs import TEST_SPLIT, get_tokenizer, make_inputs  # noqa: E402
from bench.speed_runs import time_real_loop, time_trained_decoding  # noqa: E402
from bench.workers import run_worker, worker  # noqa: E402
from utils.run.layout import latest_link_path  # noqa: E402

SYNTH_PAIRS = 232_000


def default_threads() -> int:
    """``--threads`` by default: $OMP_NUM_THREADS if set, else every core this process may use."""
    env = os.environ.get("OMP_NUM_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    return usable_cores()


def cpu_name() -> str:
    """The processor's model name and logical core count, for the report's header."""
    name = cpu_model()
    if name is not None:
        return f"{name} ({os.cpu_count()} logical cores)"
    return platform.processor() or platform.machine()


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
                cells.append(fmt(vals[m], digits))
        lines.append(f"| {label} | {' | '.join(cells)} | {ratio(vals['ours'], vals['marian'])} | {extra} |")

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
    cached_vs = ratio(get("greedy.ours.cache", "sent_per_s"), get("greedy.ours.nocache", "sent_per_s"))
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
                     f"{ratio(meta['mfu'].get('ours'), meta['mfu'].get('marian'))} |  |")

    if not any(k.startswith(("train.", "greedy.", "beam.")) for k in res):
        lines = lines[:1]  # --parts without models: no comparison table
    if any(k.startswith("data.") for k in res):
        np1, np2 = get("data.cold.np1", "seconds"), get("data.cold.np2", "seconds")
        warm = get("data.synth_warm", "seconds")
        target = "-" if warm is None else ("yes" if warm < 3.0 else "NO")
        lines += [
            "",
            f"Data path (data.cache.load_or_build; synthetic corpus of {meta['synth_pairs']:,} pairs: the bench "
            f"training pairs repeated and shuffled, {fmt(get('data.cold.np1', 'pairs'), 0)} kept by the length "
            "filter)",
            "",
            "| data path | seconds |",
            "|---|---|",
            f"| warm load, cached bench splits (train + {TEST_SPLIT}, {fmt(get('data.warm', 'pairs'), 0)} pairs) "
            f"| {fmt(get('data.warm', 'seconds'), 3)} |",
            f"| cold tokenization + cache write, synthetic corpus, num_proc=1 | {fmt(np1, 3)} "
            f"({fmt(get('data.cold.np1', 'cores_busy'), 2)} cores busy on average) |",
            f"| cold tokenization + cache write, synthetic corpus, num_proc=2 | {fmt(np2, 3)} "
            f"({fmt(get('data.cold.np2', 'cores_busy'), 2)} cores busy; speed-up over num_proc=1: "
            f"{ratio(np1, np2)}) |",
            f"| warm load, synthetic corpus (target < 3 s: {target}) | {fmt(warm, 3)} |",
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
                  "| train.py | steps | target tok/s | last third, tok/s | model GFLOP/s | of the peak | user s | "
                  "system s | minor page faults | peak RSS (MiB) |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for p, r in real.items():
            flops = fmt(r["flops_per_s"] / 1e9, 1) if "flops_per_s" in r else "-"
            frac = f"{100 * r['peak_fraction']:.1f} %" if "peak_fraction" in r else "-"
            lines.append(f"| {p} | {r['steps']} | {fmt(r['tok_per_s'], 0)} | {fmt(r.get('tok_per_s_last'), 0)} | "
                         f"{flops} | {frac} | "
                         f"{fmt(r['user_s'], 0)} | {fmt(r['sys_s'], 1)} | {fmt(r['minor_faults'], 0)} | "
                         f"{fmt(r['peak_mib'], 0)} |")
        for note in meta.get("real_skipped", []):
            lines.append(f"| {note}: skipped | | | | | | | | | |")
        for p, r in real.items():
            if "peak_formula" in r:
                lines.append(f"\n{p}: model FLOPs {r['flops_formula']}; peak {r['peak_flops'] / 1e9:.1f} GFLOP/s = "
                             f"{r['peak_formula']}.")
        profiled = {p: r["phases"] for p, r in real.items() if "phases" in r}
        if profiled:
            from utils.training.profile import PHASES

            totals = {p: sum(ms.values()) for p, ms in profiled.items()}
            lines += ["", "Where a step's time goes: torch.profiler over a separate, shorter `train.py` "
                      "(`train.profile_steps`; the timed run is not profiled), ms per optimizer step and share", "",
                      "| phase | " + " | ".join(profiled) + " |", "|---|" + "---|" * len(profiled)]
            for phase in PHASES:
                lines.append(f"| {phase} | " + " | ".join(
                    f"{ms[phase]:.1f} ({100 * ms[phase] / totals[p]:.0f} %)" for p, ms in profiled.items()) + " |")
            lines.append("| step | " + " | ".join(f"{t:.1f}" for t in totals.values()) + " |")
    trained = res.get("trained")
    if trained:
        lines += ["", f"Trained model ({trained['model']}): the first {trained['sentences']} sentences of "
                  f"{TEST_SPLIT}, batches of {trained['batch_size']}, lenpen {trained['lenpen']:g}, "
                  "tokenizing and detokenizing included", "",
                  "| decoder | sent/s | mean output tokens | sacreBLEU | outputs identical to ours: same rule / "
                  "our default (bound) |", "|---|---|---|---|---|"]
        for label, r in trained["decoders"].items():
            same = f"{r['same_as_ours']} / {r['same_as_default']}" if "same_as_ours" in r else ""
            if "same_as_eager" in r:
                same = f"eager greedy: {r['same_as_eager']} (first, compiling call: {r['warmup_s']:.0f} s)"
            lines.append(f"| {label} | {fmt(r['sent_per_s'])} | {fmt(r['out_tokens'])} | {fmt(r['bleu'], 2)} | "
                         f"{same} |")
    return lines


def build_parser() -> argparse.ArgumentParser:
    """The command line of bench/speed.py."""
    from utils.cli import add_set_arg

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where to measure (default cpu)")
    parser.add_argument("--config", default="configs/bench_small_rope.yaml",
                        help="config whose model: section sizes the models (default configs/bench_small_rope.yaml)")
    parser.add_argument("--out", default="runs/bench", help="folder for speed.md and speed.json")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test, not a measurement")
    parser.add_argument("--steps", type=int, help="timed training steps (default 30 on CPU, 200 on CUDA)")
    parser.add_argument("--warmup", type=int, help="untimed training steps first (default 3 on CPU, 20 on CUDA)")
    parser.add_argument("--max-tokens", type=int, help="training batch size in tokens (default: data.max_tokens)")
    parser.add_argument("--sentences", type=int, default=500, help=f"sentences of {TEST_SPLIT} to decode")
    parser.add_argument("--precisions", nargs="+", choices=["fp32", "bf16"], default=["fp32", "bf16"],
                        help="precisions of the training steps (default fp32 bf16)")
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS),
                        help="models measured: ours, Marian, nn.Transformer (default all)")
    parser.add_argument("--no-data", action="store_true", help="skip the data-path timings")
    parser.add_argument("--synth-pairs", type=int, default=SYNTH_PAIRS, help="size of the synthetic corpus")
    parser.add_argument("--threads", type=int, help="CPU threads (default: $OMP_NUM_THREADS, else all cores)")
    parser.add_argument("--peak-tflops", type=float, default=989.0,
                        help="accelerator peak for the MFU (default 989: H100 SXM bf16 dense)")
    add_set_arg(parser)
    parser.add_argument("--real-steps", type=int,
                        help="steps of train.py itself per precision (default 60 on CPU, 300 on CUDA; 0 = skip)")
    parser.add_argument("--profile-steps", type=int, default=None,
                        help="--parts real: steps of a second, profiled train.py for the phase table "
                             "(default 10; 2 with --quick; 0 = none)")
    parser.add_argument("--compile", action="store_true",
                        help="--parts real: also time train.py with train.compile=true, per precision; "
                             "--parts trained: also greedy decoding with the decoder step compiled")
    parser.add_argument("--model_path", help="a trained run directory to time real decoding on "
                                             "(default: runs/<config name>_latest when it exists)")
    parser.add_argument("--profile", action="store_true",
                        help="also write torch.profiler's table of the trained model's beam search to <out>")
    parser.add_argument("--parts", default="models,data,real,trained",
                        help="what to measure, from models (idealised step and forced-length decoding against "
                             "Marian and nn.Transformer), data, real (train.py), trained (a trained model's "
                             "decoding); default all")
    parser.add_argument("--_worker", help=argparse.SUPPRESS)
    return parser


def main() -> int:
    parser = build_parser()
    args = parser.parse_args()
    if args.profile_steps is None:
        args.profile_steps = 2 if args.quick else 10
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
                for compiled in (False, True) if args.compile else (False,):
                    res[f"real.{p}{' compiled' if compiled else ''}"] = time_real_loop(
                        config, args.overrides, real_steps, p, args.device, work, profile_steps=args.profile_steps,
                        profile_after=1 if args.quick else 5, compile=compiled)
    model_path = args.model_path or latest_link_path(ROOT / "runs", cfg.name)
    if parts == {"trained"} and not Path(model_path).exists():
        parser.error(f"--parts trained: no trained model at {model_path} (train one, or give --model_path RUN_DIR)")
    if "trained" in parts and Path(model_path).exists():
        print(f"trained-model decoding ({model_path}):", flush=True)
        profile_to = out / "decode_profile.txt" if args.profile else None
        res["trained"] = time_trained_decoding(str(model_path), sentences, cfg.decode.beam, args.device, profile_to,
                                               compile=args.compile)

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
