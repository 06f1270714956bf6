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
from conftest import run_script

from data.batching import TokenBatchSampler
from data.cache import load_or_build
from data.sources import load_corpus
from tokenizer import load_tokenizer
from utils.run.checkpoint import CheckpointError, load_checkpoint
from utils.run.layout import RunDir
from utils.run.load import load_run, resolve_checkpoint
from utils.run.store import create_run_dir
from utils.training.loop import train

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
    assert summary["steps"] == 6 and summary["target_tokens"] > 0 and summary["peak_rss_mb"] > 50
    assert summary["train_seconds"] > 0 and summary["eval_seconds"] > 0
    rate = summary["target_tokens"] / summary["train_seconds"]
    assert summary["target_tokens_per_s"] == pytest.approx(rate, rel=0.05)
    assert summary["valid_ppl"] == pytest.approx(metrics["ppl"])
    rd = RunDir(run)  # summary.json holds the same dict; a run without it (written before it) reads the log line
    assert json.loads(rd.summary_json.read_text()) == summary == rd.summary()
    rd.summary_json.unlink()
    rd.log.write_text(f"2026-01-01 00:00:00,000 INFO train: {line}\n")
    assert rd.summary() == summary
    messages = [r.getMessage() for r in caplog.records]
    progress = [m.split(" | ")[0] for m in messages if "| loss" in m and "target tokens/s" in m]
    assert progress == ["epoch 1 step 2", "epoch 1 step 4", "epoch 1 step 6"]
    assert {"loss", "ppl", "accuracy", "bleu", "chrf"} <= set(metrics)
    assert RunDir(tmp_path / "runs" / "tiny_latest").root.resolve() == run.resolve()  # via runs/.latest/<run>
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
    """With a moving average of the weights (train.ema_decay): both the averaged weights (``model``) and the
    training weights (``train_model``) continue exactly."""
    # The interrupted point must fall inside an epoch, so the resumed epoch skips the batches already seen.
    cfg = tiny_config(tmp_path, max_steps=40, eval_every=10, ema_decay=0.9)
    corpus = load_corpus(cfg.data)
    straight = create_run_dir(cfg, tmp_path / "a")
    train(cfg, straight)
    tok = load_tokenizer(straight / "tokenizer")
    split = load_or_build(cfg, tok, lambda: corpus, ["train"])["train"]
    per_epoch = len(TokenBatchSampler(split.src_lengths, split.tgt_lengths, cfg.data.max_tokens, True, cfg.seed))
    assert 10 % per_epoch != 0 and per_epoch < 40, per_epoch  # stop mid-epoch, finish in a later epoch

    first = tiny_config(tmp_path, max_steps=10, eval_every=10, ema_decay=0.9)
    resumed = create_run_dir(first, tmp_path / "b")
    train(first, resumed)
    assert load_checkpoint(resumed / "checkpoints" / "last.pt")["trainer"]["iteration"] == 10
    assert RunDir(resumed).summary()["steps"] == 10
    train(cfg, resumed, resume=True)
    assert RunDir(resumed).summary()["steps"] == 30  # the summary of the latest session, as its log line says
    final = load_checkpoint(resumed / "checkpoints" / "last.pt")
    assert final["trainer"]["iteration"] == 40
    reference = load_checkpoint(straight / "checkpoints" / "last.pt")
    for key in ("model", "train_model"):
        for name, tensor in final[key].items():
            assert torch.equal(tensor, reference[key][name]), (key, name)
    assert final["ema"] == {"updates": 40}
    assert any(not torch.equal(final["model"][n], final["train_model"][n]) for n in final["model"])
    decoded = load_run(str(resumed / "checkpoints" / "last.pt")).model.state_dict()  # decoding loads the average
    assert all(torch.equal(decoded[n], final["model"][n]) for n in final["model"])
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
    deadline = time.time() + 120
    while time.time() < deadline and not list((tmp_path / "runs").glob("tiny_2*/tb")):
        time.sleep(0.5)
    run = next((tmp_path / "runs").glob("tiny_2*"))
    log = run / "train.log"
    while time.time() < deadline and not (log.is_file() and "| loss" in log.read_text()):  # some steps taken
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert "SIGINT received" in out
    state = load_checkpoint(run / "checkpoints" / "last.pt")
    saved = state["trainer"]["iteration"]
    assert saved > 0
    first = json.loads((run / "summary.json").read_text())
    assert (first["steps"], first["run_steps"], first["resumed_from_step"]) == (saved, saved, 0)
    # Resume for two more steps: it starts from the saved iteration, not from zero.
    res = run_script("train.py", "--resume", str(run), "--set", f"train.max_steps={saved + 2}")
    assert res.returncode == 0, res.stderr
    assert f"step {saved}" in res.stderr  # "resumed from ... at epoch E, step N"
    assert load_checkpoint(run / "checkpoints" / "last.pt")["trainer"]["iteration"] == saved + 2
    # summary.json says what this process trained and what the run holds: 2 steps here, saved + 2 in all.
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["steps"], summary["resumed_from_step"], summary["run_steps"]) == (2, saved, saved + 2)
    assert summary["run_target_tokens"] == load_checkpoint(run / "checkpoints" / "last.pt")["tokens_seen"]["tokens"]
    assert 0 < summary["target_tokens"] < summary["run_target_tokens"]
    assert f"trained 2 optimizer steps (resumed at step {saved}: {saved + 2} in the run)" in res.stderr


def test_resume_refuses_a_model_change_and_a_missing_checkpoint(tmp_path: Path, tiny_config) -> None:
    cfg = tiny_config(tmp_path, max_steps=2, eval_every=2)
    run = create_run_dir(cfg, tmp_path / "runs")
    train(cfg, run)
    res = run_script("train.py", "--resume", str(run), "--set", "model.d_model=64")
    assert res.returncode == 2
    assert res.stderr.strip().splitlines()[-1].startswith("error: --set has model.d_model=64")
    res = run_script("train.py", "--resume", str(tmp_path))
    assert res.returncode == 2 and "no checkpoints/last.pt" in res.stderr
    # A damaged last.pt is one line before anything is written: no lock, no log line, no TensorBoard file.
    (run / "checkpoints" / "last.pt").write_bytes(b"random bytes, not a checkpoint")
    before = {p.relative_to(run): p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file()}
    res = run_script("train.py", "--resume", str(run), "--set", "train.max_steps=3")
    assert res.returncode == 2 and res.stderr.strip().splitlines()[-1] == (
        f"error: {run / 'checkpoints' / 'last.pt'} is not a PyTorch checkpoint (torch.save writes a zip archive)")
    assert {p.relative_to(run): p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file()} == before


def test_corrupt_checkpoint_is_a_clear_error(tmp_path: Path, tiny_config) -> None:
    bad = tmp_path / "checkpoints" / "best.pt"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="is not a PyTorch checkpoint"):
        load_checkpoint(bad)
    bad.write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"is empty \(0 bytes\)"):
        load_checkpoint(bad)
    torch.save({"model": {"w": torch.zeros(2)}, "extra": Unpicklable()}, bad)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(bad)
    assert "never unpickles" in str(err.value) and "weights_only" not in str(err.value)
    assert "\n" not in str(err.value)
    with pytest.raises(CheckpointError, match="is a folder, not a checkpoint file"):
        load_checkpoint(bad.parent)


class Unpicklable:
    """Any Python object: a checkpoint holding one is refused, never unpickled."""


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


def test_early_stopping_ends_training_after_patience_evaluations(tmp_path: Path, tiny_config) -> None:
    # With a learning rate of 0 the validation BLEU never improves: patience 1 stops at the 2nd evaluation.
    cfg = tiny_config(tmp_path, epochs=50, eval_every=2, patience=1, lr=0.0)
    run = create_run_dir(cfg, tmp_path / "runs")
    train(cfg, run)
    state = load_checkpoint(run / "checkpoints" / "last.pt")
    assert state["trainer"]["iteration"] == 4
    assert state["early_stopping"]["counter"] == 1


def test_schedule_in_tokens_is_the_same_at_any_batch_size(tmp_path: Path, tiny_config) -> None:
    from utils.training.setup import build_setup

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


def test_a_cool_down_ends_the_learning_rate_near_zero_at_the_budget(tmp_path: Path, tiny_config) -> None:
    """train.cooldown=0.25 over train.max_steps=40: the schedule as before for 30 steps, then a straight line
    down to 1/10 of it at the last step (40 - 39 = 1 of 10); the step budget may also come from target tokens."""
    from utils.config import ConfigError
    from utils.training.setup import build_setup

    plain = build_setup(tiny_config(tmp_path, max_steps=40), tmp_path / "plain").scheduler.lr_lambdas[0]
    cooled = build_setup(tiny_config(tmp_path, max_steps=40, cooldown=0.25), tmp_path / "cooled")
    factor = cooled.scheduler.lr_lambdas[0]
    assert [factor(s) for s in range(31)] == [plain(s) for s in range(31)]
    assert [factor(s) / plain(s) for s in range(30, 41)] == pytest.approx([1 - i / 10 for i in range(11)])
    s = build_setup(tiny_config(tmp_path, max_target_tokens=9000, cooldown=0.5), tmp_path / "tokens")
    total = -(-9000 // tokens_per_batch(s))  # ceil: the steps 9,000 target tokens allow
    assert s.scheduler.lr_lambdas[0](total) == 0.0 and s.scheduler.lr_lambdas[0](total - 1) > 0.0
    with pytest.raises(ConfigError, match=r"^train.cooldown: needs a step budget to end at: set train.max_steps "):
        tiny_config(tmp_path, cooldown=0.5)


def tokens_per_batch(s) -> float:
    """Mean target tokens (eos included) per training batch, counted by iterating one epoch."""
    batches = list(s.train_data)
    return sum(b.n_tgt_tokens for b in batches) / len(batches)


class StopSignalAt:
    """Stands in for StopRequest: a SIGTERM "arrives" during iteration ``at`` (counted in reads of ``reason``,
    which the trainer reads once per iteration)."""

    def __init__(self, at: int) -> None:
        self.at, self.reads = at, 0

    def __call__(self) -> StopSignalAt:
        return self

    def __enter__(self) -> StopSignalAt:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    @property
    def reason(self) -> str | None:
        self.reads += 1
        return "SIGTERM" if self.reads >= self.at else None


def epoch_length(cfg, tmp_path: Path) -> int:
    from utils.training.setup import build_setup

    return len(build_setup(cfg, tmp_path / "probe").train_data)


def test_a_signal_on_an_epochs_last_step_keeps_that_epochs_validation(tmp_path: Path, tiny_config,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """With eval_every 0 the validation (best.pt, early stopping) happens at the epoch's end; a stop request
    on that epoch's last step must not skip it, or it is lost for good (the resumed run counts the epoch
    as done). The attention maps training logs (``train.log_attention_every``) are checked here too."""
    cfg = tiny_config(tmp_path, epochs=2, eval_every=0, log_attention_every=1)
    per_epoch = epoch_length(cfg, tmp_path)
    monkeypatch.setattr("utils.training.loop.StopRequest", StopSignalAt(per_epoch))
    run = create_run_dir(cfg, tmp_path / "runs")
    train(cfg, run)
    last = load_checkpoint(run / "checkpoints" / "last.pt")
    assert last["trainer"]["iteration"] == per_epoch
    best = load_checkpoint(run / "checkpoints" / "best.pt")  # the epoch's validation happened
    assert best["trainer"]["iteration"] == per_epoch
    assert last["early_stopping"]["best_score"] is not None
    monkeypatch.undo()
    train(cfg, run, resume=True)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(run / "tb"), size_guidance={"images": 0})
    ea.Reload()
    assert [e.step for e in ea.Scalars("valid/bleu")] == [per_epoch, 2 * per_epoch]
    # Attention maps are logged once per epoch, at its last step, for every kind of attention, across the resume.
    assert {"attention/encoder/layer_0", "attention/decoder/layer_0", "attention/cross/layer_0"} <= set(
        ea.Tags()["images"])
    assert [e.step for e in ea.Images("attention/encoder/layer_0")] == [per_epoch, 2 * per_epoch]


def test_a_checkpoint_inside_an_accumulation_window_resumes_exactly(tmp_path: Path, tiny_config,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tiny_config(tmp_path, max_steps=4, eval_every=1000, accumulate=2)  # 4 optimizer steps = 8 batches
    straight = create_run_dir(cfg, tmp_path / "a")
    train(cfg, straight)
    assert load_checkpoint(straight / "checkpoints" / "last.pt")["trainer"]["iteration"] == 8
    monkeypatch.setattr("utils.training.loop.StopRequest", StopSignalAt(5))  # stops after batch 5: mid-window
    resumed = create_run_dir(cfg, tmp_path / "b")
    train(cfg, resumed)
    state = load_checkpoint(resumed / "checkpoints" / "last.pt")
    assert state["trainer"]["iteration"] == 5 and state["grads"]  # the pending gradients were saved
    monkeypatch.undo()
    train(cfg, resumed, resume=True)
    final = weights(resumed)
    for name, tensor in weights(straight).items():
        assert torch.equal(final[name], tensor), name


def test_a_failed_start_leaves_no_run_directory_and_keeps_latest(tmp_path: Path, tiny_config) -> None:
    cfg = tiny_config(tmp_path, max_steps=2, eval_every=2)
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(cfg.to_dict()))
    runs = tmp_path / "runs"
    ok = run_script("train.py", "--config", str(config), "--runs", str(runs))
    assert ok.returncode == 0, ok.stderr
    good = RunDir(runs / "tiny_latest").root.resolve()
    assert (good / "checkpoints" / "last.pt").is_file()
    log = (good / "train.log").read_text()
    assert "tokenizer: bpe" in log and "run directory:" in log  # lines logged before the directory existed
    assert "\r" not in log and "\r" not in ok.stderr  # no progress-bar frames without a terminal
    assert "epoch 1 step 2 | loss" in log
    blocker = tmp_path / "cache_is_a_file"
    blocker.write_text("x")
    for sets in (["data.source=text", f"data.path={tmp_path / 'nope'}"],  # bad data path: before creation
                 ["train.lr=-1e-3"],  # a value the optimizer would reject
                 [f"data.cache_dir={blocker}"]):  # fails after the run directory was made: it is removed
        res = run_script("train.py", "--config", str(config), "--runs", str(runs),
                         *[x for s in sets for x in ("--set", s)])
        assert res.returncode == 2, (sets, res.stderr)
        assert "Traceback" not in res.stderr and res.stderr.strip().splitlines()[-1].startswith("error: "), sets
        if "cache" in sets[0]:
            assert "data.cache_dir" in res.stderr and "training stopped before its first checkpoint" in res.stderr
        assert sorted(p.name for p in runs.iterdir()) == sorted([good.name, "tiny_latest", ".latest"]), sets
        assert RunDir(runs / "tiny_latest").root.resolve() == good


KILL_CHILD = """
import sys, time
from pathlib import Path
import utils.run.checkpoint as ck
from utils.config import load_config
from utils.training.loop import train

run, marker, pause_at = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
saves = {"n": 0}
real_save = ck.torch.save

def slow_save(obj, f, *a, **k):  # half a checkpoint on disk, then a pause in which the parent kills us
    saves["n"] += 1
    real_save(obj, f, *a, **k)
    if saves["n"] == pause_at:
        data = Path(f).read_bytes()
        Path(f).write_bytes(data[: len(data) // 2])
        marker.write_text("writing")
        time.sleep(600)

ck.torch.save = slow_save
cfg = load_config(run / "config.yaml")
train(cfg, run)
"""


PAUSE_CHILD = """
import sys, time
from pathlib import Path
import utils.run.checkpoint as ck
from utils.config import load_config
from utils.training.loop import train

run, marker, pause_after = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
saves = {"n": 0}
real_save = ck.torch.save

def save_then_pause(obj, f, *a, **k):  # complete checkpoints, then a pause in which the parent kills us
    real_save(obj, f, *a, **k)
    saves["n"] += 1
    if saves["n"] == pause_after:
        marker.write_text("saved")
        time.sleep(600)

ck.torch.save = save_then_pause
train(load_config(run / "config.yaml"), run)
"""


def test_a_run_killed_between_validations_resumes_from_its_last_periodic_checkpoint(
        tmp_path: Path, tiny_config) -> None:
    # Validation (which used to be the only writer of last.pt besides a clean stop) never comes: every
    # periodic checkpoint must refresh the resume point, or kill -9 leaves weights that cannot resume.
    cfg = tiny_config(tmp_path, max_steps=12, eval_every=1000, epochs=100, keep_checkpoints=2, checkpoint_every=3)
    run = create_run_dir(cfg, tmp_path / "runs")
    marker = tmp_path / "marker"
    proc = subprocess.Popen([sys.executable, "-c", PAUSE_CHILD, str(run), str(marker), "5"], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not marker.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert marker.exists(), "the child never reached its fifth checkpoint write"  # step_9.pt, after last.pt at 6
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    ckpt = run / "checkpoints"
    assert {"last.pt", "step_6.pt"} <= {p.name for p in ckpt.glob("*.pt")}
    assert load_checkpoint(ckpt / "last.pt")["trainer"]["iteration"] == 6
    assert resolve_checkpoint(run)[1] == ckpt / "last.pt"  # the run loads for inference too
    train(cfg, run, resume=True)
    assert load_checkpoint(ckpt / "last.pt")["trainer"]["iteration"] == 12
    assert sorted(p.name for p in ckpt.glob("step_*.pt")) == ["step_12.pt", "step_9.pt"]


def test_a_run_stopped_in_its_cool_down_resumes_to_the_weights_of_one_never_stopped(tmp_path: Path,
                                                                                     tiny_config) -> None:
    """The noise pilot's cool arm (a cool-down over the last quarter here, an EMA of the weights), stopped between
    sessions inside the cool-down and resumed: the same averaged and training weights, optimizer state and schedule
    as the run that never stopped."""
    keys = dict(max_steps=40, eval_every=1000, epochs=100, cooldown=0.25, ema_decay=0.9, checkpoint_every=5,
                keep_checkpoints=10)
    straight = create_run_dir(tiny_config(tmp_path, **keys), tmp_path / "a")
    train(tiny_config(tmp_path, **keys), straight)
    cfg = tiny_config(tmp_path, **keys)
    run = create_run_dir(cfg, tmp_path / "b")
    marker = tmp_path / "marker"
    proc = subprocess.Popen([sys.executable, "-c", PAUSE_CHILD, str(run), str(marker), "16"], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not marker.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert marker.exists(), "the child never reached its 16th checkpoint write"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    stopped = load_checkpoint(run / "checkpoints" / "last.pt")["trainer"]["iteration"]
    assert 30 < stopped < 40, stopped  # inside the cool-down (steps 30 to 40)
    train(cfg, run, resume=True)
    final, reference = (load_checkpoint(r / "checkpoints" / "last.pt") for r in (run, straight))
    assert final["trainer"]["iteration"] == 40 and final["ema"] == reference["ema"]
    for key in ("model", "train_model"):
        for name, tensor in final[key].items():
            assert torch.equal(tensor, reference[key][name]), (key, name)
    for a, b in zip(final["optimizer"]["state"].values(), reference["optimizer"]["state"].values(), strict=True):
        assert torch.equal(a["exp_avg"], b["exp_avg"]) and torch.equal(a["exp_avg_sq"], b["exp_avg_sq"])
    assert final["lr_scheduler"] == reference["lr_scheduler"]


@pytest.mark.parametrize("pause_at", [1, 4])  # the very first checkpoint, and one replacing an existing one
def test_kill_9_while_writing_a_checkpoint_leaves_loadable_ones_and_resume_continues(
        tmp_path: Path, tiny_config, pause_at: int) -> None:
    cfg = tiny_config(tmp_path, max_steps=12, eval_every=2)
    run = create_run_dir(cfg, tmp_path / "runs")
    marker = tmp_path / "marker"
    proc = subprocess.Popen([sys.executable, "-c", KILL_CHILD, str(run), str(marker), str(pause_at)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not marker.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert marker.exists(), "the child never reached the checkpoint write"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    ckpt = run / "checkpoints"
    assert list(ckpt.glob(".*.tmp"))  # the half-written temporary file is all the kill damaged
    if pause_at == 1:
        assert not list(ckpt.glob("*.pt"))
        return
    for name in ("last.pt", "best.pt"):
        assert load_checkpoint(ckpt / name)["trainer"]["iteration"] > 0
    train(cfg, run, resume=True)
    assert load_checkpoint(ckpt / "last.pt")["trainer"]["iteration"] == 12
    assert not list(ckpt.glob(".*.tmp"))  # no temporary files pile up
