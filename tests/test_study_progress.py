"""bench/study.py's progress on the terminal: a line per run started, per validation (step, valid BLEU) and per
run finished or scored, on standard output; an overall bar on standard error only when it is a terminal."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import threading
from pathlib import Path

import pytest
from conftest import ROOT

from utils.study.runs import Progress, duration

VALID = "2026-01-01 00:00:00,000 INFO train: epoch 1 step {step} | valid loss 5.1 ppl 160.2 acc 0.120 BLEU {bleu} " \
        "chrF 20.1 | 'Le chat.'\n"


def test_durations_read_as_a_person_says_them() -> None:
    assert [duration(s) for s in (4.4, 59.6, 252, 3725)] == ["4s", "1m00s", "4m12s", "1h02m"]


def test_lines_from_a_growing_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "study.log"
    log.write_text(VALID.format(step=3, bleu=99.0))  # an earlier command's output in the same log: not this run's
    labels = ["train rope seed 1", "train rope seed 2", "test rope seed 2 beam 5 1 linear"]
    progress = Progress(labels, steps=300, accumulate={"rope seed 2": 2}, bar=False)
    progress.started("train rope seed 2", log)
    with log.open("a") as f:
        f.write(VALID.format(step=300, bleu=12.34))  # iteration 300 = step 150 at 2 iterations per step
        f.write(VALID.format(step=600, bleu=15.0)[:40])  # a line still being written: not read yet
    progress.poll()
    with log.open("a") as f:
        f.write(VALID.format(step=600, bleu=15.0)[40:])
    progress.ended("train rope seed 2")
    progress.started("test rope seed 2 beam 5 1 linear", log)
    progress.ended("test rope seed 2 beam 5 1 linear")
    progress.started("train rope seed 1", log, resumed=True)
    progress.ended("train rope seed 1", ok=False)
    progress.close()
    out, err = capsys.readouterr()
    assert err == ""  # no bar without a terminal
    lines = out.splitlines()
    assert lines[:3] == ["[2/3] rope seed 2: started", "[2/3] rope seed 2: step 150/300 valid BLEU 12.3",
                         "[2/3] rope seed 2: step 300/300 valid BLEU 15.0"]
    assert re.fullmatch(r"\[2/3\] rope seed 2: finished in \d+s", lines[3])
    assert lines[4] == "[3/3] rope seed 2: scoring (beam 5 1 linear) started"
    assert re.fullmatch(r"\[3/3\] rope seed 2: scored \(beam 5 1 linear\) in \d+s", lines[5])
    assert lines[6] == "[1/3] rope seed 1: started (resuming its last checkpoint)"
    assert re.fullmatch(r"\[1/3\] rope seed 1: failed after \d+s", lines[7]) and len(lines) == 8


def test_a_tiny_study_says_what_each_run_does(tmp_path: Path) -> None:
    """Two runs of 8 steps validated every 4, standard error a terminal (a pty): the lines on standard output, the
    bar on the terminal."""
    cmd = [sys.executable, "bench/study.py", "--config", "configs/demo.yaml", "--grid", "model.attention_pe=none,rope",
           "--set", "model.input_pe=none", "--set", f"data.cache_dir={tmp_path / 'c'}", "--set", "model.d_model=32",
           "--set", "model.d_ff=64", "--set", "model.encoder_layers=1", "--set", "model.decoder_layers=1",
           "--set", "train.valid_bleu_sentences=4", "--seeds", "1", "--steps", "8", "--eval-every", "4",
           "--train-only", "--name", "p", "--runs", str(tmp_path)]
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # 24 x 100, as a terminal has
    terminal: list[bytes] = []

    def drain() -> None:  # read the terminal as it fills, or the study would block writing its bar
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:
                return
            if not data:
                return
            terminal.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        res = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=slave, text=True, timeout=900)
    finally:
        os.close(slave)
        reader.join(timeout=10)
        os.close(master)
    assert res.returncode == 0, res.stdout[-3000:]
    lines = [line for line in res.stdout.splitlines() if line.startswith("[")]
    for i, variant in enumerate(("attention_pe=none", "attention_pe=rope"), 1):
        mine = [line.removeprefix(f"[{i}/2] {variant} seed 1: ") for line in lines
                if line.startswith(f"[{i}/2] {variant} seed 1: ")]
        assert mine[0] == "started" and re.fullmatch(r"finished in \d+s", mine[-1]), mine
        steps = [re.fullmatch(r"step (\d+)/8 valid BLEU \d+\.\d", line) for line in mine[1:-1]]
        assert all(steps) and [int(m.group(1)) for m in steps] == [4, 8], mine
    assert len(lines) == 8, lines
    bar = b"".join(terminal).decode("utf-8", "replace")
    assert "training 2 runs:" in bar and "%|" in bar and "100%|" in bar, bar[-2000:]
    assert "[1/2]" not in bar  # the lines go to standard output, not to the terminal of the bar
