"""The compute of a study's runs trained and not kept (utils/study/unkept.py, bench/study_unkept.py): recorded from a
study folder at a stop, counted until an archive keeps the same run directory, reported on the second study's page."""

from __future__ import annotations

import fcntl
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT, kept_run, kept_run_archive, run_script

from utils.host import cpu_description
from utils.study.machines import cpu_label
from utils.study.unkept import archived_runs, read_ledger, record_unkept, unkept_cost

STUDY = "study_x"


def _segment(run: Path, train_s: float, steps: int) -> None:
    """Append a resumed start and its closing summary (train_s seconds on one thread, the run at ``steps``)."""
    summary = json.dumps({"steps": 100, "run_steps": steps, "train_seconds": train_s, "eval_seconds": 0.0,
                          "threads": 1})
    with open(run / "train.log", "a", encoding="utf-8") as f:
        f.write("01:00:00 train: model: 0.10M parameters on cpu (world size 1); positions: rope\n"
                f"01:10:00 train: trained 100 optimizer steps, 1 target tokens in 1 s | stats {summary}\n")


def _study(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A study folder with rope seed 1 kept (its archive in records/), rope seed 2 trained and decoded (3600 s and
    360 s) but not kept, and t5 seed 2 started and stopped before its first segment closed."""
    runs, records = tmp_path / "runs", tmp_path / "records"
    kept_run_archive(runs, records / "short.rope.seed1.tar.xz", STUDY, "rope", 1, 1800.0, 0.0)
    unkept = kept_run(runs / STUDY / "runs" / "rope" / "seed2", 3600.0, 360.0, stamp="20261202_172747")
    started = runs / STUDY / "runs" / "t5" / "seed2" / "bench_short_20261202_172747"
    started.mkdir(parents=True)
    (started / "train.log").write_text("00:00:00 train: model: 0.10M parameters on cpu (world size 1); positions: t5\n")
    return runs / STUDY, records, unkept


def test_the_runs_no_archive_keeps_are_recorded_with_their_cost_step_and_cpu(tmp_path: Path) -> None:
    folder, records, unkept = _study(tmp_path)
    key = f"{STUDY}/runs/rope/seed2/{unkept.name}"
    kept = "runs/rope/seed1/bench_short_20261130_000000"
    size = (folder / kept / "train.log").stat().st_size
    assert archived_runs(sorted(records.glob("*.tar.xz"))) == {f"{STUDY}/{kept}": size}
    other = kept_run(tmp_path / "elsewhere" / "study_y" / "runs" / "rope" / "seed1", 60.0, 0.0)
    (folder / "runs" / "rope" / "seed9").symlink_to(other.parent)  # another study's runs, linked: not this one's
    recorded = record_unkept(folder, records)
    assert list(recorded) == [key]  # not the kept run, nor the one that closed no segment, nor the linked one
    entry = read_ledger(records / "unkept.json")[key]
    assert (entry["train_cpu_s"], entry["decode_cpu_s"], entry["segments"], entry["score_files"], entry["steps"]) == (
        3600.0, 360.0, 1, 1, 900)
    assert entry["cpu"] == cpu_label(*cpu_description()) and entry["recorded"].endswith("Z")
    total = unkept_cost(records)
    assert (total["runs"], total["train_cpu_hours"], total["decode_cpu_hours"], total["steps"]) == (1, 1.0, 0.1, 900)
    assert total["cpus"] == {entry["cpu"]: 1}


def test_a_run_further_on_replaces_its_entry_and_leaves_the_count_once_kept(tmp_path: Path) -> None:
    folder, records, unkept = _study(tmp_path)
    record_unkept(folder, records)
    _segment(unkept, 1800.0, 1000)  # resumed on the same machine, stopped again
    record_unkept(folder, records)
    assert unkept_cost(records)["train_cpu_hours"] == 1.5 and unkept_cost(records)["steps"] == 1000
    ledger = records / "unkept.json"
    newer = ledger.read_text(encoding="utf-8")
    earlier = json.loads(newer)
    earlier[f"{STUDY}/runs/rope/seed2/{unkept.name}"]["segments"] = 5  # an entry counting more than the run now does
    ledger.write_text(json.dumps(earlier), encoding="utf-8")
    assert record_unkept(folder, records) == {}  # kept as it was: a record never counts less than the one before
    assert unkept_cost(records)["runs"] == 1
    # kept at last: its archive holds the same run directory, every segment counted there, so it leaves the count
    res = subprocess.run(["bash", "-c", f'source {ROOT}/bench/worktree.sh\nkeep_runs "$1" "$2" "$3"', "-",
                          str(folder.parent), str(records / "short.rope.seed2.tar.xz"), f"{STUDY}/runs/rope/seed2"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert unkept_cost(records) is None


def test_a_run_lost_with_its_machine_stays_counted_beside_its_second_training(tmp_path: Path) -> None:
    folder, records, unkept = _study(tmp_path)
    record_unkept(folder, records)
    shutil.rmtree(unkept.parent)  # the machine replaced: the seed trains again from step 0, in a new run directory
    kept_run(unkept.parent, 3000.0, 300.0, stamp="20261203_090000")
    res = subprocess.run(["bash", "-c", f'source {ROOT}/bench/worktree.sh\nkeep_runs "$1" "$2" "$3"', "-",
                          str(folder.parent), str(records / "short.rope.seed2.tar.xz"), f"{STUDY}/runs/rope/seed2"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    total = unkept_cost(records)
    assert (total["runs"], total["train_cpu_hours"], total["decode_cpu_hours"]) == (1, 1.0, 0.1)


def test_nothing_is_recorded_while_a_run_still_trains(tmp_path: Path) -> None:
    folder, records, unkept = _study(tmp_path)
    with open(unkept / "train.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # as a training process holds it
        with pytest.raises(ValueError, match=r"still training \(pid -?\d+\): stop the study \(SIGTERM\)"):
            record_unkept(folder, records)
    assert not (records / "unkept.json").exists()


def test_the_command_records_and_says_so_in_a_line_per_run_and_refuses_bad_input(tmp_path: Path) -> None:
    folder, records, unkept = _study(tmp_path)
    res = run_script("bench/study_unkept.py", str(folder), "--records", str(records))
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith(f"{STUDY}/runs/rope/seed2/{unkept.name}: step 900, 1 training segment, 1 score file, "
                               "1.10 CPU core-hours (")
    assert lines[-1] == (f"{records / 'unkept.json'}: 1 run outside the kept archives, 1.10 CPU core-hours "
                         "(1.00 training, 0.10 decoding)")
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)  # the same runs under another folder name: kept ones would count as not kept too
    ledger = (records / "unkept.json").read_text(encoding="utf-8")
    for bad, says in (([str(tmp_path / "nowhere"), "--records", str(records)], "not a study folder"),
                      ([str(folder), "--records", str(tmp_path / "nowhere")], "no such folder of kept archives"),
                      ([str(copy), "--records", str(records)], f"kept under the study folder name {STUDY}, not copy")):
        res = run_script("bench/study_unkept.py", *bad)
        assert res.returncode == 2 and res.stderr.count("\n") == 1 and says in res.stderr, res.stderr
    assert (records / "unkept.json").read_text(encoding="utf-8") == ledger  # nothing recorded
    whole = {"train_cpu_s": 1.0, "train_gpu_s": 0, "decode_cpu_s": 0, "decode_gpu_s": 0, "segments": 1,
             "score_files": 0}
    for text in ("[1, 2]", json.dumps({"a/runs/b/seed1/c": {"train_cpu_s": 1.0}}),  # an entry short of a field
                 json.dumps({"a/runs/b/seed1/c": whole}),  # without threads_unrecorded
                 json.dumps({"a/runs/b/seed1/c": {**whole, "threads_unrecorded": False, "cpu": ["x"]}}),
                 json.dumps({"a/runs/b/seed1/c": {**whole, "threads_unrecorded": False, "steps": "900"}})):
        (records / "unkept.json").write_text(text, encoding="utf-8")
        res = run_script("bench/study_unkept.py", str(folder), "--records", str(records))
        assert res.returncode == 2 and "not a ledger of runs not kept" in res.stderr and res.stderr.count("\n") == 1
        assert (records / "unkept.json").read_text(encoding="utf-8") == text  # left as it was
    (records / "unkept.json").unlink()
    (records / "short.t5.seed9.tar.xz").write_text("version https://git-lfs.github.com/spec/v1\n")  # not an archive
    res = run_script("bench/study_unkept.py", str(folder), "--records", str(records))
    assert res.returncode == 2 and "short.t5.seed9.tar.xz: not a readable archive of kept runs" in res.stderr
    assert res.stderr.count("\n") == 1 and not (records / "unkept.json").exists()


def test_each_arms_folder_is_recorded_in_one_call(tmp_path: Path) -> None:
    folder, records, unkept = _study(tmp_path)
    natural = kept_run(folder.parent / f"{STUDY}-natural" / "runs" / "rope" / "seed1", 7200.0, 0.0,
                       stamp="20261210_090000")
    res = run_script("bench/study_unkept.py", str(folder), str(natural.parents[3]), "--records", str(records))
    assert res.returncode == 0, res.stderr
    assert sorted(read_ledger(records / "unkept.json")) == [f"{STUDY}-natural/runs/rope/seed1/{natural.name}",
                                                             f"{STUDY}/runs/rope/seed2/{unkept.name}"]
    assert res.stdout.splitlines()[-1].endswith(": 2 runs outside the kept archives, 3.10 CPU core-hours "
                                                "(3.00 training, 0.10 decoding)")
    (records / "unkept.json").unlink()
    res = run_script("bench/study_unkept.py", str(folder), str(tmp_path / "nowhere"), "--records", str(records))
    assert res.returncode == 2 and "not a study folder" in res.stderr  # the second refused: the first not written
    assert not (records / "unkept.json").exists()


def test_the_second_studys_page_counts_the_runs_trained_and_not_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under "Runs kept": the ledger's runs no archive keeps, their steps, core-hours and CPUs, and the compute spent
    in all; nothing said without a ledger."""
    from docs import study_pages

    studies = ROOT / "bench" / "studies"
    shutil.copytree(studies / "noise-pilot", tmp_path / "noise-pilot", ignore=shutil.ignore_patterns("records"))
    folder = tmp_path / study_pages.SEQUENTIAL
    records = folder / "records"
    records.mkdir(parents=True)
    shutil.copy(studies / study_pages.SEQUENTIAL / "design.json", folder / "design.json")
    kept_run_archive(tmp_path / "runs", records / "short.rope.seed1.tar.xz", "study_extrapolation-sequential", "rope",
                     1, 3240.0, 360.0)  # 1 core-hour kept
    monkeypatch.setattr(study_pages, "STUDIES", tmp_path)
    assert "Trained and not kept" not in "\n".join(study_pages.sequential_status())
    seed = tmp_path / "runs" / "study_extrapolation-sequential" / "runs" / "t5" / "seed1"
    kept_run(seed, 1800.0, 0.0, stamp="20261202_172747")
    record_unkept(seed.parents[2], records)
    status = "\n".join(study_pages.sequential_status())
    cpu = cpu_label(*cpu_description())
    assert ("Trained and not kept (`records/unkept.json`, recorded at each stop by `bench/study_unkept.py`, last on "
            f"{read_ledger(records / 'unkept.json')[next(iter(read_ledger(records / 'unkept.json')))]['recorded'][:10]}"
            f"): 1 run, 900 training steps, 0.5 CPU core-hours (0.5 training, 0.0 decoding), on {cpu} (1 run): runs "
            "lost with a replaced machine or killed before their first checkpoint (counted for good; a training killed "
            "without its closing line is counted to its last logged line) and runs in flight at the last record "
            "(which leave this count once kept). Spent in all: 1.5 CPU core-hours.") in status


def test_trainings_killed_without_their_closing_line_are_counted_to_their_last_line(tmp_path: Path) -> None:
    """SIGKILL (a session's end) leaves no closing summary: a run resumed since holds the killed start in its
    train.log; one killed before its first checkpoint is removed when its seed trains again, and only its seed
    folder's study.log names it, with the CPU of the seed's cpu.txt once the seed is kept."""
    folder, records, unkept = _study(tmp_path)
    with open(unkept / "train.log", "a", encoding="utf-8") as f:  # resumed at 23:58, killed after step 950
        f.write(f"23:58:00 train: run directory: {unkept}\n"
                "23:58:00 train: model: 0.10M parameters on cpu (world size 1); positions: rope\n"
                "00:08:00 train: epoch 3 step 950 | loss 3.1 | lr 0.0001\n")
    seed = folder / "runs" / "t5" / "seed3"
    kept_run(seed, 1800.0, 0.0, stamp="20261202_220000")  # trained again once the first was removed
    (seed / "study.log").write_text(
        "  train t5 seed 3: train.py --config ...\n"
        f"21:30:48 train: run directory: {seed}/bench_short_20261202_213048\n"
        "21:30:48 train: model: 7.58M parameters on cpu (world size 1); positions: t5\n"
        "21:35:22 train: epoch 1 step 100 | loss 7.250 | lr 0.000467\n"
        f"22:00:00 train: run directory: {seed}/bench_short_20261202_220000\n"
        "22:00:00 train: model: 7.58M parameters on cpu (world size 1); positions: t5\n"
        "22:30:00 train: epoch 1 step 450 | loss 3.6 | lr 0.0007\n",  # still there: counted from its own train.log
        encoding="utf-8")
    # a seed kept, its run directory gone from this machine since, its study.log naming a start with no summary
    archived = kept_run_archive(folder.parent, records / "short.t5.seed4.tar.xz", STUDY, "t5", 4, 1800.0, 0.0)
    gone = folder / "runs" / "t5" / "seed4" / "bench_short_20261130_000000"
    shutil.rmtree(gone)
    (gone.parent / "study.log").write_text(
        f"23:00:00 train: run directory: {gone}\n"
        "23:00:00 train: model: 7.58M parameters on cpu (world size 1); positions: t5\n"
        "23:20:00 train: epoch 1 step 300 | loss 4.5 | lr 0.0008\n", encoding="utf-8")
    (seed / "cpu.txt").write_text("Model name:  Some CPU\nFlags: a b\n", encoding="utf-8")
    recorded = record_unkept(folder, records)
    resumed = recorded[f"{STUDY}/runs/rope/seed2/{unkept.name}"]
    assert (resumed["train_cpu_s"], resumed["segments"], resumed["killed_segments"], resumed["killed_s"],
            resumed["steps"]) == (3600.0 + 600.0, 1, 1, 600.0, 950)  # across midnight
    assert resumed["threads_unrecorded"]  # no config: its killed seconds counted on one thread, and said so
    removed = recorded[f"{STUDY}/runs/t5/seed3/bench_short_20261202_213048"]
    assert (removed["train_cpu_s"], removed["decode_cpu_s"], removed["segments"], removed["killed_segments"],
            removed["steps"], removed["cpu"]) == (274.0, 0.0, 0, 1, 100, cpu_label("Some CPU", "a b"))
    present = recorded[f"{STUDY}/runs/t5/seed3/bench_short_20261202_220000"]  # from its own train.log only
    assert (present["train_cpu_s"], present["segments"], present["killed_segments"]) == (1800.0, 1, 0)
    assert f"{STUDY}/runs/t5/seed4/{gone.name}" in archived_runs([archived])
    assert f"{STUDY}/runs/t5/seed4/{gone.name}" not in recorded  # kept: its archive counts it
    assert unkept_cost(records)["runs"] == 3
    ledger = (records / "unkept.json").read_text(encoding="utf-8")
    assert record_unkept(folder, records) == {}  # the same runs at the next stop: nothing rewritten, nor re-dated
    assert (records / "unkept.json").read_text(encoding="utf-8") == ledger
    (records / "unkept.json").unlink()
    res = run_script("bench/study_unkept.py", str(folder), "--records", str(records))
    assert f"{STUDY}/runs/t5/seed3/bench_short_20261202_213048: step 100, 1 training segment (1 killed), 0 score " \
           "files, 0.08 CPU core-hours (Some CPU, flags " in res.stdout, res.stdout + res.stderr
