"""bench/study.py --launcher: a study's commands as submitit jobs (SLURM on a cluster; submitit's local executor
here), waited for, reported, failing in one line and cancelling the rest."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest
from conftest import run_script, run_study

from utils.study.launch import INSTALL, JobFailed, Launcher, LaunchError, Resources

# A command that writes its pid, then, on SIGTERM, "stopped" (what train.py does: save, then exit) and ends.
STOPPABLE = ("import os, signal, sys, time\n"
             "def stop(signum, frame):\n    print('stopped', signal.Signals(signum).name, flush=True); sys.exit(0)\n"
             "signal.signal(signal.SIGTERM, stop)\nprint(os.getpid(), flush=True)\ntime.sleep(60)")


class Recorder:
    """A study's progress as the launcher reports it; ``interrupt``: Ctrl-C once that label's log says a pid."""

    def __init__(self, interrupt: tuple[str, Path] | None = None) -> None:
        self.events: list[tuple] = []
        self.interrupt = interrupt

    def say(self, line: str) -> None:
        self.events.append(("say", line))

    def started(self, label: str, log: Path, resumed: bool = False) -> None:
        self.events.append(("started", label))

    def poll(self) -> None:
        if self.interrupt and self.interrupt[1].is_file() and self.interrupt[1].read_text().strip():
            raise KeyboardInterrupt

    def ended(self, label: str, ok: bool = True) -> None:
        self.events.append(("ended", label, ok))

    def of(self, kind: str) -> list[tuple]:
        return [e[1:] for e in self.events if e[0] == kind]


def _wait_for(path: Path) -> str:
    """A command that waits (30 s at most) until ``path`` exists."""
    return f"import os, time\nfor _ in range(600):\n    if os.path.exists({str(path)!r}): break\n    time.sleep(0.05)\n"


def _gone(pid: int) -> bool:
    return not Path(f"/proc/{pid}").exists()


def test_jobs_run_in_the_root_appending_to_their_logs_in_their_slots_and_end_in_any_order(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")  # the study's GPUs: submitit would hide them from a local job
    root, logs = tmp_path / "root", {name: tmp_path / "runs" / name / "study.log" for name in ("slow", "fast", "next")}
    root.mkdir()
    logs["slow"].parent.mkdir(parents=True)
    logs["slow"].write_text("an earlier command's output\n")
    show = "print(os.getcwd(), os.environ['SLOT'], os.environ.get('CUDA_VISIBLE_DEVICES'), flush=True)"
    commands = [("slow", [sys.executable, "-c", _wait_for(logs["next"]) + "time.sleep(0.3)\n" + show], logs["slow"]),
                ("fast", [sys.executable, "-c", f"import os\n{show}"], logs["fast"]),
                ("next", [sys.executable, "-c", f"import os\n{show}"], logs["next"])]
    recorder = Recorder()
    launcher = Launcher("submitit-local", tmp_path / "study_x" / "submitit")
    assert launcher.name == "study_x"
    launcher.run(commands, root, recorder, slots=[{"SLOT": "0"}, {"SLOT": "1"}], poll=0.05)

    # two slots: "next" waited for the first free one (fast's), and ran while "slow" still did
    assert logs["slow"].read_text() == f"an earlier command's output\n{root} 0 7\n"
    assert logs["fast"].read_text() == f"{root} 1 7\n" and logs["next"].read_text() == f"{root} 1 7\n"
    assert recorder.of("started") == [("slow",), ("fast",), ("next",)]
    assert recorder.of("ended") == [("fast", True), ("next", True), ("slow", True)]
    said = [line for (line,) in recorder.of("say")]
    assert [re.fullmatch(r"  (\w+): local job \d+: -c .*", line, re.S).group(1) for line in said] == \
        ["slow", "fast", "next"]
    assert len(list((tmp_path / "study_x" / "submitit").glob("*_result.pkl"))) == 3  # submitit's own files there


@pytest.mark.parametrize("stop", ["failure", "ctrl-c"])
def test_a_failure_or_ctrl_c_cancels_the_jobs_running_and_queued(tmp_path: Path, stop: str) -> None:
    logs = {name: tmp_path / f"{name}.log" for name in ("long", "fail", "queued")}
    fail = _wait_for(logs["long"]) + "time.sleep(0.5)\nraise SystemExit(3)"
    commands = [("long", [sys.executable, "-c", STOPPABLE], logs["long"]),
                ("fail" if stop == "failure" else "wait", [sys.executable, "-c",
                                                           fail if stop == "failure" else STOPPABLE], logs["fail"]),
                ("queued", [sys.executable, "-c", "print('ran')"], logs["queued"])]
    recorder = Recorder(interrupt=("long", logs["long"]) if stop == "ctrl-c" else None)
    launcher = Launcher("submitit-local", tmp_path / "study_x" / "submitit")
    with pytest.raises(JobFailed if stop == "failure" else KeyboardInterrupt) as raised:
        launcher.run(commands, tmp_path, recorder, slots=[{}, {}], poll=0.05)
    if stop == "failure":
        assert re.fullmatch(rf"fail failed \(exit 3, local job \d+\); see {re.escape(str(logs['fail']))}",
                            str(raised.value))
        assert recorder.of("ended") == [("fail", False)]
    else:
        assert recorder.of("ended") == []
    pid = int(logs["long"].read_text().split()[0])
    assert logs["long"].read_text().split()[1:] == ["stopped", "SIGTERM"] and _gone(pid)  # asked once, ended
    assert not logs["queued"].exists() and ("queued",) not in recorder.of("started")


def test_a_job_that_ends_without_its_commands_status_names_the_job_and_both_logs(tmp_path: Path) -> None:
    log = tmp_path / "study.log"
    launcher = Launcher("submitit-local", tmp_path / "submitit")
    with pytest.raises(JobFailed) as raised:
        launcher.run([("train x seed 1", [str(tmp_path / "no-such-program")], log)], tmp_path, Recorder(), poll=0.05)
    match = re.fullmatch(r"train x seed 1 failed: local job (\d+) ended without finishing its command "
                         r"\(FileNotFoundError: \[Errno 2\] No such file or directory: '.*no-such-program'\); "
                         rf"see {re.escape(str(log))} and (.*)", str(raised.value))
    assert match is not None and Path(match.group(2)) == tmp_path / "submitit" / f"{match.group(1)}_0_log.err"


def test_slurm_resources_and_refusals_are_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert Resources("gpu", 90, 1, 8, 32.0, 4).parameters("study_pe") == {
        "name": "study_pe", "timeout_min": 90, "gpus_per_node": 1, "nodes": 1, "tasks_per_node": 1,
        "cpus_per_task": 8, "mem_gb": 32.0, "slurm_partition": "gpu", "slurm_array_parallelism": 4}
    assert Resources().parameters("s") == {"name": "s", "timeout_min": 1440, "gpus_per_node": 1, "nodes": 1,
                                           "tasks_per_node": 1}
    if shutil.which("srun") is None:
        with pytest.raises(LaunchError, match=r'^--launcher slurm: Could not detect "srun", are you indeed on a '
                                              r"slurm cluster\?; start the study where SLURM is"):
            Launcher("slurm", tmp_path / "submitit")
    monkeypatch.setitem(sys.modules, "submitit", None)  # not installed
    for kind in ("slurm", "submitit-local"):
        with pytest.raises(LaunchError) as raised:
            Launcher(kind, tmp_path / "submitit")
        assert str(raised.value) == f"--launcher {kind} needs submitit, which is not installed: {INSTALL}"
    assert not (tmp_path / "submitit").exists()


@pytest.mark.skipif(shutil.which("srun") is not None, reason="a SLURM cluster is here")
def test_study_with_slurm_and_no_cluster_stops_in_one_line_writing_nothing(tmp_path: Path) -> None:
    res = run_script("bench/study.py", "--config", "configs/demo.yaml", "--grid", "model.attention_pe=none,rope",
                     "--steps", "8", "--name", "t", "--runs", str(tmp_path), "--launcher", "slurm",
                     "--slurm-time", "30")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines()[-1] == (
        'study.py: error: --launcher slurm: Could not detect "srun", are you indeed on a slurm cluster?; start the '
        "study where SLURM is (srun and sbatch on PATH), or try its jobs here with --launcher submitit-local")
    assert list(tmp_path.iterdir()) == []


def test_a_study_trained_through_submitit_is_trained_for_the_local_launcher(tmp_path: Path) -> None:
    res = run_study(tmp_path, "--launcher", "submitit-local", "--train-only", "--seeds", "1", "--jobs", "2")
    assert res.returncode == 0, res.stderr[-2000:]
    assert "study t: 2 runs, 0 trained, 2 to train" in res.stdout
    assert len(re.findall(r"  train attention_pe=(none|rope) seed 1: local job \d+: train\.py ", res.stdout)) == 2
    study = tmp_path / "study_t"
    for variant in ("none", "rope"):
        seed = study / "runs" / f"attention_pe_{variant}" / "seed1"
        assert any(seed.glob("*/checkpoints/last.pt"))
        assert "step 8 | valid loss" in (seed / "study.log").read_text()  # train.py's output, in the run's log
    assert len(list((study / "submitit").glob("*_result.pkl"))) == 2
    res = run_study(tmp_path, "--launcher", "local", "--train-only", "--seeds", "1")
    assert res.returncode == 0 and "study t: 2 runs, 2 trained, 0 to train" in res.stdout, res.stderr[-2000:]
