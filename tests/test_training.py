"""Training end to end on the demo corpus: run directory contents, exact resume, Ctrl-C, checkpoints."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from data.batching import TokenBatchSampler
from data.cache import load_or_build
from data.sources import load_corpus
from tokenizer import load_tokenizer
from utils.checkpoint import CheckpointError, load_checkpoint
from utils.runs import create_run_dir, load_run
from utils.trainer import train

ROOT = Path(__file__).resolve().parents[1]


def weights(run: Path, name: str = "last.pt") -> dict[str, torch.Tensor]:
    return load_checkpoint(run / "checkpoints" / name)["model"]


def test_run_directory_holds_everything_to_reload(tmp_path: Path, tiny_config, caplog) -> None:
    cfg = tiny_config(tmp_path, max_steps=6, eval_every=3)
    run = create_run_dir(cfg, tmp_path / "runs")
    with caplog.at_level("INFO", logger="train"):
        metrics = train(cfg, run)
    # The closing summary (what bench/peers.py reads): steps, target tokens, time split, final perplexity.
    line = next(r.getMessage() for r in caplog.records if "| stats {" in r.getMessage())
    summary = json.loads(line.split("| stats ", 1)[1])
    assert summary["steps"] == 6 and summary["target_tokens"] > 0
    assert summary["train_seconds"] > 0 and summary["eval_seconds"] > 0
    rate = summary["target_tokens"] / summary["train_seconds"]
    assert summary["target_tokens_per_s"] == pytest.approx(rate, rel=0.05)
    assert summary["valid_ppl"] == pytest.approx(metrics["ppl"])
    messages = [r.getMessage() for r in caplog.records]
    progress = [m.split(" | ")[0] for m in messages if "| loss" in m and "target tokens/s" in m]
    assert progress == ["epoch 1 step 2", "epoch 1 step 4", "epoch 1 step 6"]
    assert {"loss", "ppl", "accuracy", "bleu", "chrf"} <= set(metrics)
    assert (tmp_path / "runs" / "tiny_latest").resolve() == run.resolve()
    for path in ("config.yaml", "tokenizer/meta.json", "checkpoints/best.pt", "checkpoints/last.pt", "train.log"):
        assert (run / path).is_file() or path == "train.log", path
    assert list((run / "tb").glob("events.out.tfevents.*"))
    last = load_checkpoint(run / "checkpoints" / "last.pt")
    assert {"model", "optimizer", "lr_scheduler", "scaler", "trainer", "rng", "meta", "early_stopping"} <= set(last)
    assert last["trainer"]["iteration"] == 6
    loaded = load_run(run)  # config + tokenizer + best weights, as inference does
    assert loaded.cfg == cfg and loaded.checkpoint.name == "best.pt"
    assert loaded.tokenizer.fingerprint == load_tokenizer(run / "tokenizer").fingerprint
    # TensorBoard holds the training and validation curves.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(run / "tb"))
    ea.Reload()
    tags = set(ea.Tags()["scalars"])
    assert {"train/loss", "train/grad_norm", "train/tokens_per_s", "train/lr/group_0", "valid/loss",
            "valid/accuracy", "valid/bleu"} <= tags
    assert [e.step for e in ea.Scalars("valid/bleu")] == [3, 6]


def test_same_seed_repeats_exactly_on_cpu(tmp_path: Path, tiny_config) -> None:
    runs = []
    for i in range(2):
        cfg = tiny_config(tmp_path, max_steps=4, eval_every=4)
        run = create_run_dir(cfg, tmp_path / f"runs{i}")
        train(cfg, run)
        runs.append(weights(run))
    for name, tensor in runs[0].items():
        assert torch.equal(tensor, runs[1][name]), name


def test_resume_continues_exactly_where_the_checkpoint_left_off(tmp_path: Path, tiny_config) -> None:
    # The interrupted point must fall inside an epoch, so the resumed epoch skips the batches already seen.
    cfg = tiny_config(tmp_path, max_steps=24, eval_every=10)
    corpus = load_corpus(cfg.data)
    straight = create_run_dir(cfg, tmp_path / "a")
    train(cfg, straight)
    tok = load_tokenizer(straight / "tokenizer")
    split = load_or_build(cfg, tok, lambda: corpus, ["train"])["train"]
    per_epoch = len(TokenBatchSampler(split.src_lengths, split.tgt_lengths, cfg.data.max_tokens, True, cfg.seed))
    assert 10 % per_epoch != 0 and per_epoch < 24, per_epoch  # stop mid-epoch, finish in a later epoch

    first = tiny_config(tmp_path, max_steps=10, eval_every=10)
    resumed = create_run_dir(first, tmp_path / "b")
    train(first, resumed)
    assert load_checkpoint(resumed / "checkpoints" / "last.pt")["trainer"]["iteration"] == 10
    train(cfg, resumed, resume=True)
    final = load_checkpoint(resumed / "checkpoints" / "last.pt")
    assert final["trainer"]["iteration"] == 24
    reference = weights(straight)
    for name, tensor in final["model"].items():
        assert torch.equal(tensor, reference[name]), name
    for a, b in zip(final["optimizer"]["state"].values(), load_checkpoint(straight / "checkpoints" / "last.pt")[
            "optimizer"]["state"].values(), strict=True):
        assert torch.equal(a["exp_avg"], b["exp_avg"])


def test_ctrl_c_saves_last_checkpoint_and_resume_continues(tmp_path: Path, tiny_config) -> None:
    cfg = tiny_config(tmp_path, epochs=500, eval_every=1000)
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(cfg.to_dict()))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "train.py", "--config", str(config), "--runs", str(tmp_path / "runs")]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    run = tmp_path / "runs" / "tiny_latest"
    deadline = time.time() + 120
    while time.time() < deadline and not (run / "tb").is_dir():
        time.sleep(0.5)
    time.sleep(4)  # let it take some steps
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert "SIGINT received" in out
    state = load_checkpoint(run / "checkpoints" / "last.pt")
    saved = state["trainer"]["iteration"]
    assert saved > 0
    # Resume for two more steps: it starts from the saved iteration, not from zero.
    res = subprocess.run([sys.executable, "train.py", "--resume", str(run), "--set", f"train.max_steps={saved + 2}"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr
    assert f"step {saved}" in res.stderr  # "resumed from ... at epoch E, step N"
    assert load_checkpoint(run / "checkpoints" / "last.pt")["trainer"]["iteration"] == saved + 2


def test_resume_refuses_a_model_change_and_a_missing_checkpoint(tmp_path: Path, tiny_config) -> None:
    cfg = tiny_config(tmp_path, max_steps=2, eval_every=2)
    run = create_run_dir(cfg, tmp_path / "runs")
    train(cfg, run)
    res = subprocess.run([sys.executable, "train.py", "--resume", str(run), "--set", "model.d_model=64"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines()[-1].startswith("error: --set has model.d_model=64")
    res = subprocess.run([sys.executable, "train.py", "--resume", str(tmp_path)], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 2 and "no checkpoints/last.pt" in res.stderr


def test_corrupt_checkpoint_is_a_clear_error(tmp_path: Path, tiny_config) -> None:
    bad = tmp_path / "checkpoints" / "best.pt"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="cannot read checkpoint"):
        load_checkpoint(bad)


def test_training_with_a_pretrained_marian_tokenizer(tmp_path: Path, tiny_config, shared_data: Path) -> None:
    """Marian has no BOS: its pad id starts the decoder, as in MarianMTModel."""
    cfg = tiny_config(tmp_path, max_steps=2, eval_every=2)
    cfg.tokenizer.type, cfg.tokenizer.path = "marian", str(shared_data / "opus-mt-tc-big-fr-en")
    run = create_run_dir(cfg, tmp_path / "runs")
    metrics = train(cfg, run)
    loaded = load_run(run)
    assert loaded.tokenizer.vocab_size == 53017 and loaded.tokenizer.bos_id == loaded.tokenizer.pad_id
    assert loaded.model.src_embed.weight.shape == (53017, 32)
    assert metrics["loss"] > 0


def test_attention_maps_are_logged_during_training(tmp_path: Path, tiny_config) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = tiny_config(tmp_path, epochs=2, log_attention_every=1, eval_every=0)
    run = create_run_dir(cfg, tmp_path / "runs")
    train(cfg, run)
    ea = EventAccumulator(str(run / "tb"), size_guidance={"images": 0})
    ea.Reload()
    tags = set(ea.Tags()["images"])
    assert {"attention/encoder/layer_0", "attention/decoder/layer_0", "attention/cross/layer_0"} <= tags
    steps = [e.step for e in ea.Images("attention/encoder/layer_0")]
    per_epoch = load_checkpoint(run / "checkpoints" / "last.pt")["trainer"]["iteration"] // 2
    assert steps == [per_epoch, 2 * per_epoch]  # once per epoch, at the epoch's last step
    assert load_checkpoint(run / "checkpoints" / "best.pt")["trainer"]["iteration"] in steps


def test_early_stopping_ends_training_after_patience_evaluations(tmp_path: Path, tiny_config) -> None:
    # With a learning rate of 0 the validation BLEU never improves: patience 1 stops at the 2nd evaluation.
    cfg = tiny_config(tmp_path, epochs=50, eval_every=2, patience=1, lr=0.0)
    run = create_run_dir(cfg, tmp_path / "runs")
    train(cfg, run)
    state = load_checkpoint(run / "checkpoints" / "last.pt")
    assert state["trainer"]["iteration"] == 4
    assert state["early_stopping"]["counter"] == 1


def test_schedule_in_tokens_is_the_same_at_any_batch_size(tmp_path: Path, tiny_config) -> None:
    from utils.trainer import build_setup

    def setup(max_tokens: int, **kw):
        cfg = tiny_config(tmp_path, lr=1e-3, warmup_steps=7, **kw)
        cfg.data.max_tokens = max_tokens
        s = build_setup(cfg, tmp_path / f"run{max_tokens}{len(kw)}")
        batch = tokens_per_batch(s)
        return s.optimizer.param_groups[0]["initial_lr"], s.scheduler.lr_lambdas[0], batch

    # Without the options: the configured peak lr and warmup steps, whatever the batch size.
    lr, factor, _ = setup(300)
    assert lr == pytest.approx(1e-3) and factor(7) == 1.0 and factor(6) < 1.0
    # With them: warmup covers the same number of target tokens, and the peak lr follows sqrt(batch).
    small_lr, small_factor, small = setup(200, warmup_tokens=6000, lr_batch_tokens=1000)
    big_lr, big_factor, big = setup(600, warmup_tokens=6000, lr_batch_tokens=1000)
    assert big > 2 * small
    assert small_lr == pytest.approx(1e-3 * (small / 1000) ** 0.5, rel=1e-6)
    assert big_lr / small_lr == pytest.approx((big / small) ** 0.5, rel=1e-6)
    for batch, factor in ((small, small_factor), (big, big_factor)):
        warmup = round(6000 / batch)
        assert factor(warmup) == 1.0 and factor(warmup - 1) < 1.0


def tokens_per_batch(s) -> float:
    """Mean target tokens (eos included) per training batch, counted by iterating one epoch."""
    batches = list(s.train_data)
    return sum(b.n_tgt_tokens for b in batches) / len(batches)
