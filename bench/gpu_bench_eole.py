"""The Eole part of bench/gpu_bench.sh: Eole 0.6.4 at the base model's sizes, batch and precision on the same GPU
(bench/eole_runner.py runs ``eole train`` for a wall-clock budget), installed from wheels carried to the machine."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from bench.common import ROOT
from bench.gpu_bench_plan import Plan, nvidia_smi, one_line, say, shared_data

EOLE_VERSION = "0.6.4"


def eole_part(plan: Plan, args: argparse.Namespace) -> dict[str, Any]:
    wheels = Path(os.environ.get("EOLE_WHEELS", ROOT / ".whl" / "eole"))
    doc: dict[str, Any] = {"machine": None, "dry_run": plan.dry, "version": EOLE_VERSION}
    if not sorted(wheels.glob(f"eole-{EOLE_VERSION}-*.whl")):
        doc.update(status="skipped", reason=f"no eole-{EOLE_VERSION} wheel in {wheels} (put it there with the "
                   "wheels of its dependencies, for this machine's Python)")
    elif plan.dry:
        doc.update(status="skipped", reason="--dry-run: Eole is not run")
    if "status" in doc:
        say(f"eole: {doc['reason']}: not measured")
        plan.write("eole", doc)
        return doc
    try:
        doc.update(run_eole(plan, wheels), status="ok")
    except Exception as e:  # noqa: BLE001 - Eole failing is a finding, said in one line
        doc.update(status="failed", reason=one_line(e))
    say(f"eole: {doc['status']}" + (f": {doc['reason']}" if "reason" in doc else
                                   f", {doc['target_tokens_per_s']:,.0f} target tokens/s"))
    plan.write("eole", doc)
    return doc


def step(what: str, cmd: list[str], env: dict[str, str], timeout: float) -> None:
    """Run one of Eole's steps; RuntimeError naming it and its last line of error output if it fails (its whole
    output goes to the log)."""
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{what}: still running after {timeout:.0f} s") from None
    if done.returncode != 0:
        say((done.stdout + done.stderr)[-4000:])
        last = [ln.strip() for ln in done.stderr.splitlines() if ln.strip()][-1:]
        raise RuntimeError(f"{what} ended with status {done.returncode}" + (f": {last[0][:240]}" if last else ""))


def run_eole(plan: Plan, wheels: Path) -> dict[str, Any]:
    """Eole 0.6.4 installed from ``wheels`` into the work folder, its SentencePiece model and vocabulary made on the
    bench corpus, then ``eole train`` (bench/eole_runner.py) at the base model's sizes, the largest batch of the
    base part, bf16, on the GPU, for what is left of the budget."""
    import yaml

    from bench.peers import eole_configs
    from utils.config import load_config
    from utils.study.gpu import GPU_BASE
    from utils.training.setup import schedule_for_batch

    site = plan.work / "eole-site"
    step("installing its wheels", [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                                   "--no-compile", "--target", str(site), *map(str, sorted(wheels.glob("*.whl")))],
         dict(os.environ), 300)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    work = plan.work / "eole"
    work.mkdir(parents=True, exist_ok=True)
    bench = shared_data() / "bench" / "fr-en"
    import sentencepiece as spm

    spm.SentencePieceTrainer.train(
        sentence_iterator=(line.rstrip("\n") for name in ("train.fr", "train.en")
                           for line in open(bench / name, encoding="utf-8")),
        model_prefix=str(work / "spm8k"), vocab_size=8000, model_type="bpe", character_coverage=1.0,
        input_sentence_size=200_000, shuffle_input_sentence=True, unk_id=0, bos_id=1, eos_id=2, pad_id=3,
        minloglevel=2)
    vocab_cfg, train_cfg = eole_configs(work, shared_data())
    base = plan.out / "parts" / "base.json"
    rows = json.loads(base.read_text())["rows"] if base.is_file() else []
    largest = max((r for r in rows if r["precision"] == "bf16" and r["mode"] == "eager"),
                  key=lambda r: r["target_tokens_per_step"], default=None)
    max_tokens = largest["max_tokens"] if largest else 45056
    target = largest["target_tokens_per_step"] if largest else 32768
    cfg = yaml.safe_load(train_cfg.read_text())
    d = 512
    cfg["model"].update(hidden_size=d, heads=8, transformer_ff=2048, layers=6,
                        embeddings={"word_vec_size": d, "position_encoding_type": "SinusoidalInterleaved"})
    cfg["model"].pop("rope_config", None)
    cfg["transforms_configs"]["filtertoolong"] = {"src_seq_length": 128, "tgt_seq_length": 128}
    sched = schedule_for_batch(load_config(GPU_BASE).train, target)  # our schedule at this batch, in noam's terms
    cfg["training"].update(batch_size=max_tokens, valid_batch_size=max_tokens, compute_dtype="bf16", gpu_ranks=[0],
                           world_size=1, warmup_steps=sched.warmup_steps,
                           learning_rate=sched.peak_lr * d**0.5 * sched.warmup_steps**0.5)
    train_cfg.write_text(yaml.safe_dump(cfg))
    main = "import sys; from eole.bin.main import main; sys.argv = ['eole', *sys.argv[1:]]; main()"
    step("eole build_vocab", [sys.executable, "-c", main, "build_vocab", "-config", str(vocab_cfg), "-n_sample",
                              "50000"], env, max(30, plan.left()))
    budget = max(10.0, plan.left() - 35)
    stats = work / "train_stats.json"
    memory: list[float] = []
    stop = threading.Event()

    def sample() -> None:  # GPU memory in use while Eole trains (nvidia-smi; Eole records host memory only)
        while not stop.wait(2.0):
            used = nvidia_smi("memory.used")
            if used:
                memory.append(float(used))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        step("eole train", [sys.executable, str(ROOT / "bench" / "eole_runner.py"), "train", str(stats), str(budget),
                            "-config", str(train_cfg)], env, budget + max(30, plan.left() - budget))
    finally:
        stop.set()
    got = json.loads(stats.read_text())
    return {"target_tokens_per_s": got["target_tokens_per_s"], "steps": got["steps"],
            "train_seconds": got["train_seconds"], "max_tokens": max_tokens, "target_tokens_per_step": target,
            "gpu_memory_used_mib": max(memory) if memory else None,
            "sizes": "d 512, 8 heads, 6+6 layers, FFN 2048, SentencePiece BPE 8000, bf16"}
