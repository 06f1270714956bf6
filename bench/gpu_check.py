"""Every registered encoding trained a few hundred steps on one device, then cached decoding checked against full.

    python bench/gpu_check.py [--device cuda] [--steps 200] [--amp bf16] [--out runs/gpu_check]

Variants: each input-level encoding alone (``model.attention_pe=none``); each attention-level encoding on
self-attention alone (``model.input_pe=none``; the causal-only ones on the decoder's), Shaw also with its value
term a^V (``model.shaw.values=true``); each attention-level encoding as ``model.cross_attention_pe`` (sinusoidal
input); what validation refuses is a row that says so.
Each is ``configs/bench_small.yaml`` trained by the project's own loop (``utils.training.loop.train``, one
process, the tokenizer and cache built once) for ``--steps`` steps in ``--amp`` autocast; then its last
checkpoint, loaded as ``inference.py`` loads it, greedy-decodes ``--sentences`` validation sentences with the
key/value cache and without it (the whole prefix every step), fp32.

One row per variant: finite losses (every logged value), the validation loss and BLEU at the end, sentences whose
cached and full hypotheses are the same tokens, the largest difference of their log-probabilities, seconds.
Writes ``<out>/gpu_check.md`` and ``<out>/gpu_check.json``; exits 1 if any variant fails (an error, a
non-finite loss, or a cached hypothesis that differs from the full one).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as bench/gpu_check.py: the repository root first

from bench.common import ROOT  # noqa: E402


def variants() -> list[tuple[str, list[str]]]:
    """(name, --set overrides) for every encoding the registry holds, as the module docstring lists them."""
    from models.positional import REGISTRY, names

    out = [(f"input {n}", [f"model.input_pe={n}", "model.attention_pe=none"]) for n in names("input")]
    for n in names("attention"):
        if n != "none":
            out.append((f"self {n}", ["model.input_pe=none", f"model.attention_pe={n}"]))
    for n in names("attention"):  # the causal-only ones (CoPE, xPos), refused above, on the decoder's own
        if n != "none" and REGISTRY["attention"][n].causal_only:
            out.append((f"decoder {n}", ["model.input_pe=none", "model.attention_pe=none",
                                         f"model.decoder_pe.attention={n}"]))
    out.append(("self shaw + a^V", ["model.input_pe=none", "model.attention_pe=shaw", "model.shaw.values=true"]))
    for n in names("attention"):
        if n != "none":
            out.append((f"cross {n}", ["model.input_pe=sinusoidal", "model.attention_pe=none",
                                       f"model.cross_attention_pe={n}"]))
    return out


def check_decoding(run_dir: Path, device: str, src_texts: list[str]) -> dict:
    """Greedy decoding of ``src_texts`` with and without the cache, fp32."""
    import torch

    from models.decoding import greedy_search
    from utils.run.load import load_run
    from utils.translation.translate import encode_sources

    loaded = load_run(run_dir, device=device)
    tok, model = loaded.tokenizer, loaded.model
    ids = encode_sources(tok, src_texts, model.max_length, strict=False)
    ids = [s for s in ids if s]
    width = max(map(len, ids))
    src = torch.tensor([s + [tok.pad_id] * (width - len(s)) for s in ids], device=model.device)
    with torch.no_grad():
        cached = greedy_search(model, src, bos=tok.bos_id, eos=tok.eos_id)
        full = greedy_search(model, src, bos=tok.bos_id, eos=tok.eos_id, use_cache=False)
    same = sum(a.tokens == b.tokens for a, b in zip(cached, full, strict=True))
    diff = max((abs(a.logprob - b.logprob) for a, b in zip(cached, full, strict=True) if a.tokens == b.tokens),
               default=0.0)
    return {"sentences": len(ids), "same_tokens": same, "max_logprob_diff": diff}


def logged_losses(run_dir: Path) -> list[float]:
    """Every training loss the run's log holds (``loss <x>`` of the periodic lines)."""
    import re

    from utils.run.layout import RunDir

    text = RunDir(run_dir).log.read_text()
    return [float(x) for x in re.findall(r"\bloss (\S+?)[,\s]", text)]


def run_variant(name: str, overrides: list[str], args: argparse.Namespace, runs: Path) -> dict:
    from utils.cli import LOG_FORMAT
    from utils.config import ConfigError, load_config
    from utils.run.layout import RunDir
    from utils.run.store import create_run_dir
    from utils.training.loop import train
    from utils.training.setup import prepare

    t0 = time.perf_counter()
    sets = [*overrides, f"train.max_steps={args.steps}", f"train.eval_every={args.steps}",
            f"train.checkpoint_every={args.steps}", "train.keep_checkpoints=1", "train.max_minutes=null",
            f"train.valid_bleu_sentences={args.sentences}", f"train.device={args.device}", f"train.amp={args.amp}",
            "train.patience=1000", "train.epochs=1000", f"train.log_every={max(1, args.steps // 10)}",
            *args.set]
    try:
        cfg = load_config(ROOT / args.config, sets)
    except ConfigError as e:  # e.g. an encoding cross-attention does not take: said, not failed
        return {"variant": name, "overrides": overrides, "skipped": str(e), "ok": True}
    corpus, tokenizer = prepare(cfg)
    run_dir = create_run_dir(cfg, runs)
    tokenizer.save(RunDir(run_dir).tokenizer)
    log_file = logging.FileHandler(RunDir(run_dir).log, encoding="utf-8")  # train.py's log: losses read back
    log_file.setFormatter(LOG_FORMAT)
    logging.getLogger().addHandler(log_file)
    try:
        metrics = train(cfg, run_dir, corpus=corpus)
    finally:
        logging.getLogger().removeHandler(log_file)
        log_file.close()
    losses = logged_losses(run_dir)
    row = {"variant": name, "overrides": overrides, "run_dir": str(run_dir),
           "finite_loss": bool(losses) and all(math.isfinite(x) for x in losses),
           "valid_loss": metrics.get("loss"), "bleu": metrics.get("bleu"),
           **check_decoding(run_dir, args.device, list(corpus["validation"]["src"][:args.sentences]))}
    row["seconds"] = time.perf_counter() - t0
    row["ok"] = row["finite_loss"] and row["same_tokens"] == row["sentences"]
    return row


def table(rows: list[dict], meta: dict) -> str:
    lines = [f"# Every encoding trained {meta['steps']} steps on {meta['device_name']} ({meta['amp']} autocast)",
             "", f"torch {meta['torch']}; config {meta['config']}; `{meta['command']}`", "",
             "| variant | loss finite | valid loss | valid BLEU | cached = full (sentences) | max Δ logprob | s | ok |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['variant']} | not accepted: {r['skipped']} | | | | | | - |")
            continue
        if "error" in r:
            lines.append(f"| {r['variant']} | error: {r['error']} | | | | | | no |")
            continue
        lines.append(f"| {r['variant']} | {r['finite_loss']} | {r['valid_loss']:.3f} | {r['bleu']:.2f} | "
                     f"{r['same_tokens']}/{r['sentences']} | {r['max_logprob_diff']:.1e} | {r['seconds']:.0f} | "
                     f"{'yes' if r['ok'] else 'NO'} |")
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    """The command line of bench/gpu_check.py."""
    from utils.cli import add_set_arg

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda",
                        help="where to train and decode (default cuda)")
    parser.add_argument("--config", default="configs/bench_small.yaml",
                        help="config every variant starts from (default configs/bench_small.yaml)")
    parser.add_argument("--steps", type=int, default=200, help="training steps per variant (default 200)")
    parser.add_argument("--amp", choices=["none", "bf16", "fp16"], default="bf16",
                        help="autocast precision of training (default bf16)")
    parser.add_argument("--sentences", type=int, default=100, help="validation sentences for BLEU and decoding")
    parser.add_argument("--only", help="comma-separated substrings: run only the variants whose name holds one")
    parser.add_argument("--out", default="runs/gpu_check",
                        help="folder for gpu_check.md and gpu_check.json (default runs/gpu_check)")
    add_set_arg(parser)
    return parser


def main() -> int:
    parser = build_parser()
    args = parser.parse_args()
    args.set = args.overrides or []

    import torch

    from utils.cli import setup_logging

    if args.device == "cuda" and not torch.cuda.is_available():
        print("CUDA is not available: nothing to check (run with --device cpu)")
        return 0
    setup_logging()
    out = Path(args.out).resolve()
    runs = out / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    todo = variants()
    if args.only:
        keys = [k.strip() for k in args.only.split(",")]
        todo = [v for v in todo if any(k in v[0] for k in keys)]
    rows = []
    for name, overrides in todo:
        try:
            rows.append(run_variant(name, overrides, args, runs))
        except Exception as e:  # a variant's failure is a row of the table, not the end of the check
            traceback.print_exc()
            rows.append({"variant": name, "overrides": overrides, "error": f"{type(e).__name__}: {e}"[:200],
                         "ok": False})
        print(json.dumps(rows[-1]), flush=True)
    meta = {"steps": args.steps, "amp": args.amp, "config": args.config, "torch": torch.__version__,
            "device_name": torch.cuda.get_device_name() if args.device == "cuda" else "CPU",
            "command": " ".join(["python", *sys.argv])}
    (out / "gpu_check.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    md = table(rows, meta)
    (out / "gpu_check.md").write_text(md)
    print(md)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
