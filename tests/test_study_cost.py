"""What a study's runs cost (utils/study/cost.py): every training segment of a run, paired with the start it closes,
and the decoding seconds of its score files, as CPU core-hours and GPU minutes; the report's Compute section."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from conftest import ROOT, kept_run, kept_run_archive

from utils.study.cost import cost_lines, kept_cost, killed_segments, run_cost, study_cost, training_segments


def _summary(train: float, valid: float, **extra: object) -> str:
    return json.dumps({"steps": 4, "train_seconds": train, "eval_seconds": valid, **extra})


LOG = "\n".join([
    "10:00:00 train: model: 0.10M parameters on cpu (world size 1); positions: rope",
    f"10:01:00 train: trained 4 optimizer steps, 100 target tokens in 60 s | stats {_summary(50.0, 10.0)}",
    "10:02:00 train: model: 0.10M parameters on cpu (world size 2); positions: rope",  # killed: no summary
    "10:03:00 train: model: 0.10M parameters on cuda:0 (world size 1); positions: rope",
    f"10:04:00 train: trained 4 optimizer steps (resumed at step 4: 8 in the run), 100 target tokens in 30 s | stats "
    f"{_summary(25.0, 5.0)}",
    "10:05:00 train: model: 0.10M parameters on cpu (world size 1); positions: rope",
    f"10:06:00 train: trained 4 optimizer steps, 100 target tokens in 20 s | stats {_summary(18.0, 2.0, threads=3)}",
    "10:07:00 train: trained 4 optimizer steps, 1 target tokens in 1 s | stats {\"steps\": 4, \"train_sec",  # cut
])


def test_each_summary_is_paired_with_the_start_it_closes() -> None:
    segments = training_segments(LOG)
    assert [(s["device"], s["world_size"], s["train_seconds"]) for s in segments] == [
        ("cpu", 1, 50.0), ("cuda:0", 1, 25.0), ("cpu", 1, 18.0)]
    assert segments[2]["threads"] == 3 and "threads" not in segments[0]


def test_a_start_killed_before_its_summary_is_timed_from_its_start_to_its_last_line() -> None:
    log = "\n".join([
        "starting the queue",  # not a training's line
        "23:50:00 train: run directory: /runs/rope/seed1/bench_short_20261202_235000",
        "23:50:01 train: model: 0.10M parameters on cpu (world size 2); positions: rope",
        "23:59:30 train: epoch 1 step 50 | loss 8.5 | lr 0.0002",
        "00:10:01 train: epoch 1 step 100 | loss 7.2 | lr 0.0004",  # past midnight, then killed
        "08:00:00 train: run directory: /runs/rope/seed1/bench_short_20261203_080000",
        "08:00:00 train: model: 0.10M parameters on cuda:0 (world size 1); positions: rope",
        f"08:01:00 train: trained 4 optimizer steps, 100 target tokens in 60 s | stats {_summary(50.0, 10.0)}",
        "08:30:00 test: decoded 100 sentences",  # after a closed segment: not training
        "09:00:00 train: run directory: /runs/rope/seed1/bench_short_20261203_080000",
        "09:00:00 train: model: 0.10M parameters on cuda:0 (world size 1); positions: rope",
        "09:00:05 train: epoch 2 step 150 | loss 6.0 | lr 0.0004",
    ])
    assert killed_segments(log) == [
        {"run": "bench_short_20261202_235000", "device": "cpu", "world_size": 2, "steps": 100, "seconds": 1200.0},
        {"run": "bench_short_20261203_080000", "device": "cuda:0", "world_size": 1, "steps": 150, "seconds": 5.0}]
    assert killed_segments(LOG) == []  # its killed start has no time past it; the others closed


def test_a_killed_start_ends_at_its_own_last_line_and_a_clock_set_back_is_not_a_day() -> None:
    """The next process's data lines before its ``run directory:`` line are not the killed training's; a time of day
    a few seconds earlier than the line before (a clock adjusted, lines of two writers) counts nothing, not a day;
    a summary line cut short closes nothing (``training_segments`` cannot count it either)."""
    log = "\n".join([
        "21:30:55 train: run directory: /runs/t5/seed6/bench_short_20261202_213055",
        "21:30:55 train: model: 7.58M parameters on cpu (world size 1); positions: t5",
        "21:35:45 train: epoch 1 step 100 | loss 7.2 | lr 0.0004",
        "21:35:44 train: epoch 1 step 101 | loss 7.2 | lr 0.0004",  # a second earlier
        "21:35:50 train: epoch 1 step 102 | loss 7.2 | lr 0.0004",
        "09:00:00 data: using the cached copy of the corpus",  # the next session's process, before its start
        "09:00:05 train: run directory: /runs/t5/seed6/bench_short_20261203_090005",
        "09:00:05 train: model: 7.58M parameters on cpu (world size 1); positions: t5",
        "09:10:05 train: epoch 1 step 50 | loss 8.6 | lr 0.0002",
        "09:20:05 train: trained 4 optimizer steps, 1 target tokens in 1 s | stats {\"steps\": 4, \"train_sec",
        "09:30:05 train: epoch 1 step 60 | loss 8.6 | lr 0.0002",
    ])
    assert killed_segments(log) == [
        {"run": "bench_short_20261202_213055", "device": "cpu", "world_size": 1, "steps": 102, "seconds": 295.0},
        {"run": "bench_short_20261203_090005", "device": "cpu", "world_size": 1, "steps": 60, "seconds": 1800.0}]
    assert training_segments(log) == []


def test_a_kept_run_counts_its_killed_starts_too(tmp_path: Path) -> None:
    """A run killed after a checkpoint (SIGKILL, a session's end), resumed and kept: its archive holds the killed
    start, counted to its last line at the config's threads in ``run_cost`` and ``kept_cost``, so that the compute
    the ledger of runs not kept counted before does not vanish once the run is kept."""
    runs, out = tmp_path / "runs", tmp_path / "records"
    run = runs / "study_x" / "runs" / "rope" / "seed1" / "bench_short_20261130_000000"
    run.parent.mkdir(parents=True)
    kept_run(run.parent, 1800.0, 0.0)
    (run / "config.yaml").write_text("base: " + str(Path("configs/demo.yaml").resolve()) + "\n"
                                     "train:\n  num_threads: 2\n")
    log = (run / "train.log").read_text()
    (run / "train.log").write_text("23:00:00 train: model: 0.10M parameters on cpu (world size 1); positions: rope\n"
                                   "23:30:00 train: epoch 1 step 300 | loss 4.5 | lr 0.0008\n" + log)
    cost = run_cost(run, "last", None)
    assert (cost["train_cpu_s"], cost["segments"], cost["killed_segments"], cost["killed_s"]) == (
        1800.0 + 1800 * 2, 1, 1, 1800.0)
    res = subprocess.run(["bash", "-c", f'source {ROOT}/bench/worktree.sh\nkeep_runs "$1" "$2" "$3"', "-", str(runs),
                          str(out / "short.rope.seed1.tar.xz"), "study_x/runs/rope/seed1"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert kept_cost([out / "short.rope.seed1.tar.xz"])["train_cpu_hours"] == 1.5


def test_a_runs_cost_counts_every_segment_and_the_score_files_of_its_scored_step(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "eval").mkdir(parents=True)
    (run / "train.log").write_text(LOG + "\n")
    (run / "config.yaml").write_text("base: " + str(Path("configs/demo.yaml").resolve()) + "\n"
                                     "train:\n  num_threads: 2\n")

    def score(name: str, seconds: float, threads: int | None, step: int = 8) -> None:
        (run / "eval" / name).write_text(json.dumps({"seconds": seconds, "threads": threads, "step": step}))

    score("test.last.beam5.json", 7.0, 2)
    score("test.last.beam1.json", 3.0, 2)
    score("test.x4.last.beam5.json", 4.0, None)  # decoded on a GPU
    score("all.last.beam5.json", 99.0, 2)  # every split again: not counted twice
    score("test.last.beam5.old.json", 50.0, 2, step=4)  # another step's model
    score("test.best.beam5.json", 60.0, 2)  # another checkpoint
    (run / "eval" / "test.last.beam5.hyp").write_text("not a score file\n")
    cost = run_cost(run, "last", 8)
    # CPU segments: (50 + 10) s x 2 threads (the config's), (18 + 2) s x 3 threads (the summary's); the GPU one 30 s
    assert cost == {"train_cpu_s": 60 * 2 + 20 * 3, "train_gpu_s": 30.0, "decode_cpu_s": 7 * 2 + 3 * 2,
                    "decode_gpu_s": 4.0, "segments": 3, "score_files": 3, "threads_unrecorded": False,
                    "killed_segments": 0, "killed_s": 0.0}  # its killed start has no time past it
    # a score file written before test.py recorded threads: CPU time on one thread, said so
    (run / "eval" / "test.x2.last.beam5.json").write_text(json.dumps({"seconds": 5.0, "step": 8}))
    older = run_cost(run, "last", 8)
    assert (older["decode_cpu_s"], older["decode_gpu_s"], older["threads_unrecorded"]) == (25.0, 4.0, True)
    total = study_cost({"a seed 1": cost, "a seed 2": cost})
    assert total == {"runs": 2, "train_cpu_hours": round(2 * 180 / 3600, 3), "decode_cpu_hours": round(40 / 3600, 3),
                     "train_gpu_minutes": 1.0, "decode_gpu_minutes": round(8 / 60, 2), "threads_unrecorded": []}


def test_the_compute_section_gives_the_cost_per_resolved_comparison() -> None:
    total = {"runs": 4, "train_cpu_hours": 30.0, "decode_cpu_hours": 6.0, "train_gpu_minutes": 0.0,
             "decode_gpu_minutes": 0.0, "threads_unrecorded": []}
    results = {"compute": {"total": total, "runs": {}}, "primary": {"resolved": 3, "size": 24, "tests": [{}]}}
    text = "\n".join(cost_lines(results))
    assert text.startswith("## Compute") and "**36.0 CPU core-hours** (30.0 training, 6.0 decoding" in text
    assert "Per resolved comparison of the primary family (3 of 24): 12.0 CPU core-hours and 0.0 GPU minutes" in text
    results["primary"]["resolved"] = 0
    assert "No comparison of the primary family is resolved" in "\n".join(cost_lines(results))
    assert cost_lines({"primary": {}}) == []  # a study published before its compute was recorded: no section


def test_processes_sharing_a_machine_share_its_configured_threads(tmp_path: Path) -> None:
    """torchrun with 2 CPU processes and train.num_threads 4, in a summary that does not record its threads: each
    process had 2 (utils.training.setup.threads_per_process), so 100 s is 400 core-seconds, not 800."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "train.log").write_text("\n".join([
        "10:00:00 train: model: 0.10M parameters on cpu (world size 2); positions: rope",
        f"10:01:40 train: trained 4 optimizer steps, 100 target tokens in 100 s | stats {_summary(90.0, 10.0)}"]))
    (run / "config.yaml").write_text("base: " + str(Path("configs/demo.yaml").resolve()) + "\n"
                                     "train:\n  num_threads: 4\n")
    assert run_cost(run, "last", None)["train_cpu_s"] == 400.0


def test_the_runs_kept_in_archives_cost_what_their_records_say(tmp_path: Path) -> None:
    """``kept_cost`` over bench/worktree.sh's keep_runs archives: the runs of every study folder they hold, counted
    together (the second study's two arms are two folders); no archive, no figure."""
    runs, out = tmp_path / "runs", tmp_path / "records"
    archives = [kept_run_archive(runs, out / "short.rope.seed1.tar.xz", "study_x", "rope", 1, 3240.0, 360.0),
                kept_run_archive(runs, out / "short.alibi.seed1.tar.xz", "study_x", "alibi", 1, 1800.0, 0.0),
                kept_run_archive(runs, out / "natural.rope.seed1.tar.xz", "study_x-natural", "rope", 1, 7200.0, 720.0)]
    assert kept_cost(archives) == {"runs": 3, "train_cpu_hours": 0.9 + 0.5 + 2.0, "decode_cpu_hours": 0.3,
                                   "train_gpu_minutes": 0.0, "decode_gpu_minutes": 0.0, "threads_unrecorded": []}
    assert kept_cost(archives[:1])["train_cpu_hours"] == 0.9 and kept_cost([]) is None
