"""bench/study_queue.sh's own logic, run in bash with stand-ins for the study commands: the continuation raises
the budget as long as the rule says so and scores at the budget it fixes, resumes a raise a stopped queue began,
stops on a verdict it does not know or one that training does not move, and steps an earlier queue finished are
not run again (the study's step at 2,250 and the continuation are wrapped so)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

SCRIPT = (ROOT / "bench" / "study_queue.sh").read_text()


def _function(name: str, script: str = SCRIPT) -> str:
    """The text of one of a script's functions (defined inside ``main``, four spaces in)."""
    match = re.search(rf"^    {name}\(\) \{{.*?^    \}}$", script, re.S | re.M)
    assert match, name
    return match.group(0)


def _answering_python(tmp: Path, worktree: Path, tag: str, answers: list[str]) -> None:
    """``worktree``'s .venv/bin/python as a stand-in: it logs ``tag`` and its arguments to ``tmp/log`` and prints the
    next of ``answers`` (one per call, in order; a later call may find its answer written since)."""
    (worktree / ".venv" / "bin").mkdir(parents=True, exist_ok=True)
    for i, answer in enumerate(answers):
        (tmp / f"verdict{i}").write_text(answer)
    python = worktree / ".venv" / "bin" / "python"
    python.write_text(f'#!/usr/bin/env bash\necho "{tag} $*" >> {tmp}/log\nn=$(cat {tmp}/n 2>/dev/null || echo 0)\n'
                      f'echo $((n + 1)) > {tmp}/n\ncat {tmp}/verdict$n\n')
    python.chmod(0o755)


def _queue(tmp: Path, verdicts: list[str], call: str) -> tuple[int, list[str]]:
    """Runs ``call`` with the queue's ``continued`` and ``once``; the rule's worktree python prints the next of
    ``verdicts`` (a table line, then the verdict, as bench/pilot_rule.py); ``step`` and ``replayed`` log their
    arguments. Returns the exit status and the log's lines."""
    rule = tmp / "rule-wt"
    _answering_python(tmp, rule, "rule", [f"| sinusoidal | 49.65 |\n\n{verdict}\n" for verdict in verdicts])
    stubs = (f'step() {{ echo "step $*" >> {tmp}/log; [ ! -f {tmp}/fail ]; }}\n'
             f'replayed() {{ echo "replayed $*" >> {tmp}/log; }}\n')
    script = (f'RUNS={tmp}/runs; RULE_WT={rule}; TRAIN_WT=T; SCORE_WT=S; STUDY="--name x"; BASE="--seeds 3"\n'
              + stubs + _function("continued") + "\n" + _function("once") + "\n" + call + "\n")
    res = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    log = tmp / "log"
    return res.returncode, log.read_text().splitlines() if log.exists() else []


def test_the_continuation_raises_while_the_rule_says_so_then_scores_at_its_budget(tmp_path: Path) -> None:
    rc, log = _queue(tmp_path, ["rule: not decided; raise the study's --steps to 2700",
                                "rule: not decided; raise the study's --steps to 3150",
                                "rule: budget B = 3150 steps (gains over the last 450 steps: sinusoidal +0.41, "
                                "rope +0.98)"], "continued")
    assert rc == 0
    rule = f"rule bench/pilot_rule.py {tmp_path}/runs/study_extrapolation --seed 1,2,3 --start 2250 --cap 4500"
    train = "step T issue 21 continuation: training --name x --seeds 3 --steps {} --train-only"
    assert log == [rule, train.format(2700), f"replayed {tmp_path}/runs/study_extrapolation",
                   rule, train.format(3150), f"replayed {tmp_path}/runs/study_extrapolation",
                   rule, "step S issue 21 continuation: scoring --name x --seeds 3 --steps 3150 --bootstrap 10000 "
                         "--score-only"]


def test_a_raise_a_stopped_queue_began_is_trained_to_its_end(tmp_path: Path) -> None:
    """Restarted mid-raise, the rule says the runs still train toward 2,700: they are trained there, not refused."""
    rc, log = _queue(tmp_path, ["rule: not decided; the runs are still training toward 2700 steps",
                                "rule: budget B = 2700 steps (gains over the last 450 steps: sinusoidal +0.10)"],
                     "continued")
    assert rc == 0
    assert [line.split(" --")[0] for line in log if line.startswith("step")] == [
        "step T issue 21 continuation: training", "step S issue 21 continuation: scoring"]
    assert "--steps 2700 --train-only" in log[1] and "--steps 2700 --bootstrap 10000" in log[-1]


def test_an_unknown_verdict_or_a_failed_training_stops_the_queue(tmp_path: Path) -> None:
    rc, log = _queue(tmp_path, ["something else"], "continued")
    assert rc == 1 and not any(line.startswith("step") for line in log)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "fail").touch()
    rc, log = _queue(tmp_path / "other", ["rule: not decided; raise the study's --steps to 2700",
                                          "rule: budget B = 2700 steps"], "continued")
    assert rc == 1 and [line for line in log if line.startswith("step")] == [
        "step T issue 21 continuation: training --name x --seeds 3 --steps 2700 --train-only"]  # never scored


def test_a_verdict_that_does_not_move_after_training_stops_the_queue(tmp_path: Path) -> None:
    """Trained to 2,700 steps, yet the rule still waits for 2,700 (an evaluation it reads was lost with a killed
    run): one line and exit 1, not a loop that trains nothing forever."""
    waiting = "rule: not decided; the runs are still training toward 2700 steps"
    rc, log = _queue(tmp_path, [waiting, waiting, waiting], "continued")
    assert rc == 1
    assert [line for line in log if line.startswith("step")] == [
        "step T issue 21 continuation: training --name x --seeds 3 --steps 2700 --train-only"]
    assert sum(line.startswith("rule ") for line in log) == 2


def test_a_step_an_earlier_queue_finished_is_not_run_again(tmp_path: Path) -> None:
    """``once``: done steps are marked in RUNS/queue-done and skipped (the step at 2,250 steps would refuse the
    runs once the continuation trained them past it); a failed step is not marked."""
    rc, log = _queue(tmp_path, [], 'once scored step S score && once scored step S again && echo ok >> "$RUNS/../log"')
    assert rc == 0 and log == ["step S score", "ok"] and (tmp_path / "runs" / "queue-done" / "scored").is_file()
    (tmp_path / "fail").touch()
    rc, log = _queue(tmp_path, [], "once other step S fails")
    assert rc == 1 and log[-1] == "step S fails" and not (tmp_path / "runs" / "queue-done" / "other").exists()


def test_the_steps_at_2250_and_the_continuation_are_run_once() -> None:
    chain = SCRIPT[SCRIPT.index('worktree "$TRAIN_WT" "$TRAIN_COMMIT" &&'):]
    steps = [line.strip() for line in chain.splitlines() if " step " in f" {line.strip()}" or "continued" in line]
    assert [line.split()[:2] for line in steps] == [["once", "study-trained-2250"], ["once", "continuation-scored"]]


def test_the_noise_pilot_trains_scores_and_keeps_each_arm_one_seed_at_a_time(tmp_path: Path) -> None:
    """bench/pilot_noise.sh: the declared arms (the published training, and a cool-down with an EMA) are trained,
    scored and kept (their runs without weights, to commit) one seed at a time, in turn, so an interrupted pilot
    stays balanced; kept runs are unpacked first and merged into their arm; a failed step stops it."""
    pilot = (ROOT / "bench" / "pilot_noise.sh").read_text()
    assert "PILOT_COMMIT=7186bb6" in pilot and "--set train.cooldown=0.2 --set train.ema_decay=0.99" in pilot

    def arms(fail_at: int | None = None, kept: bool = False) -> tuple[int, list[str]]:
        log = tmp_path / f"log{fail_at}{kept}"
        if kept:
            (tmp_path / "runs" / "kept" / "study_pilot-cool" / "runs").mkdir(parents=True, exist_ok=True)
        stub = (f'n=0; step() {{ n=$((n + 1)); echo "$*" >> {log}; [ "$n" != "{fail_at}" ]; }}\n'
                f'keep_runs() {{ echo "keep $*" >> {log}; }}\nrestore_runs() {{ echo "restore $*" >> {log}; }}\n'
                f'RUNS={tmp_path}/runs; KEEP=K; WT=W; COMMON="--preset p"; PLAIN="--name plain"; '
                'COOL="--name cool --set k=v"\n')
        script = stub + "\n".join(_function(f, pilot) for f in ("merged", "arms")) + "\narms"
        res = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60, cwd=tmp_path)
        return res.returncode, log.read_text().replace(str(tmp_path), "TMP").splitlines()

    def unit(k: int, arm: str, merge: str = "", keep: bool = True) -> list[str]:
        name = {"plain": "plain", "cool": "cool --set k=v"}[arm]
        seeds = (1, 2) if k == 2 else (k,)
        archive = "seeds1-2" if k == 2 else f"seed{k}"
        return [f"W noise pilot: {arm} arm, seeds 1-{k} --preset p --name {name} --seeds {k} --train-only{merge}",
                f"W noise pilot: {arm} arm, scoring seeds 1-{k} --preset p --name {name} --seeds {k} --score-only",
                *([f"keep TMP/runs K/pilot-{arm}.{archive}.tar.xz "
                   + " ".join(f"study_pilot-{arm}/runs/{v}/seed{s}" for v in ("sinusoidal", "rope") for s in seeds)]
                  if keep else [])]

    rc, log = arms()
    expected = [line for k in (2, 3, 4, 5, 6) for arm in ("plain", "cool") for line in unit(k, arm)]
    assert rc == 0 and log == ["restore TMP/runs/kept K/pilot-*.tar.xz", *expected]
    rc, log = arms(fail_at=3)
    assert rc == 1 and log[1:] == expected[:4]  # plain trained, scored and kept; cool's training failed: stop
    rc, log = arms(kept=True)  # a new machine: the cool arm's kept runs are merged into it
    assert rc == 0 and log[4] == unit(2, "cool", " --merge TMP/runs/kept/study_pilot-cool")[0]
    assert log[2] == unit(2, "plain")[1]
    # Units kept already are neither trained nor scored again (an arm's results.json is never taken back to fewer
    # seeds), but the last seed's steps run in any case: they merge every kept seed and score all six; keep_runs
    # makes nothing that exists (itself).
    (tmp_path / "K").mkdir()
    for name in ("plain.seeds1-2", "plain.seed3", "cool.seed3", "plain.seed5", "cool.seed6"):
        (tmp_path / "K" / f"pilot-{name}.tar.xz").touch()
    rc, log = arms(fail_at=99)
    merge = " --merge TMP/runs/kept/study_pilot-cool"
    assert rc == 0 and log[1:] == [*unit(2, "cool", merge), *unit(4, "plain"), *unit(4, "cool", merge),
                                   *unit(5, "cool", merge), *unit(6, "plain"), *unit(6, "cool", merge)]


def test_kept_runs_leave_their_weights_behind_and_come_back_whole(tmp_path: Path) -> None:
    """bench/worktree.sh's keep_runs packs seed folders without *.pt files (with the CPU that trained them), once,
    refusing a missing folder; restore_runs unpacks every archive whole (a file an interrupted unpacking left is
    written again; what the archives do not hold is left)."""
    runs = tmp_path / "runs"
    run = runs / "study_x" / "runs" / "rope" / "seed1" / "bench_short_1"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "last.pt").write_bytes(b"w" * 1000)
    (run / "eval").mkdir()
    (run / "eval" / "test.last.beam5.json").write_text('{"chrf": 40}')
    (run / "train.log").write_text("trained")
    (run / "tb").mkdir()
    (run / "tb" / "events.out.tfevents.1").write_bytes(b"e" * 1000)
    (run.parent / "cpu.txt").write_text("")  # left empty by an lscpu that failed: written again

    def bash(call: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-c", f"source {ROOT}/bench/worktree.sh\n{call}"], capture_output=True,
                              text=True, timeout=60)

    out = tmp_path / "kept" / "x.seeds1.tar.xz"
    res = bash(f"keep_runs {runs} {out} study_x/runs/rope/seed1 study_x/runs/rope/seed2")
    assert res.returncode == 1 and "seed2: no such seed folder; nothing kept" in res.stdout and not out.exists()
    assert bash(f"keep_runs {runs} {out} study_x/runs/rope/seed1").returncode == 0
    (run / "train.log").write_text("changed")
    assert bash(f"keep_runs {runs} {out} study_x/runs/rope/seed1").returncode == 0  # made once
    into = tmp_path / "new-machine"
    (into / "study_x" / "runs" / "rope" / "seed1").mkdir(parents=True)
    (into / "study_x" / "runs" / "rope" / "seed1" / "study.log").write_text("mine")
    (into / "study_x" / "runs" / "rope" / "seed1" / "bench_short_1").mkdir()
    (into / "study_x" / "runs" / "rope" / "seed1" / "bench_short_1" / "train.log").write_text("half")
    res = bash(f"restore_runs {into} {out} {tmp_path}/kept/none*.tar.xz")
    assert res.returncode == 0, res.stderr
    back = into / "study_x" / "runs" / "rope" / "seed1"
    assert (back / "bench_short_1" / "train.log").read_text() == "trained"
    assert (back / "bench_short_1" / "eval" / "test.last.beam5.json").read_text() == '{"chrf": 40}'
    assert not (back / "bench_short_1" / "checkpoints" / "last.pt").exists()
    assert not (back / "bench_short_1" / "tb").exists()
    assert (back / "cpu.txt").read_text().startswith("Model name:") and (back / "study.log").read_text() == "mine"
    assert [line.split(":")[0] for line in (back / "cpu.txt").read_text().splitlines()] == [
        "Model name", "Flags", "Host", "Kept"]  # which CPU, which machine, when


def test_kept_runs_record_the_packages_of_the_python_that_trained_them(tmp_path: Path) -> None:
    """With KEEP_PYTHON set (bench/study_sequential.sh: the pinned checkout's Python), keep_runs writes that Python's
    ``pip freeze`` to each seed folder's packages.txt before packing it; a Python that cannot list them keeps
    nothing. Without KEEP_PYTHON, no packages.txt (the noise pilot's archives)."""
    from importlib.metadata import version

    runs = tmp_path / "runs"
    for seed in (1, 2):
        (runs / "study_x" / "runs" / "rope" / f"seed{seed}" / "bench_short_1").mkdir(parents=True)

    def keep(python: str, out: Path, folder: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-c", f"source {ROOT}/bench/worktree.sh\nKEEP_PYTHON={python}\n"
                               f"keep_runs {runs} {out} {folder}"], capture_output=True, text=True, timeout=120)

    res = keep(str(tmp_path / "no-python"), tmp_path / "a.tar.xz", "study_x/runs/rope/seed1")
    assert res.returncode == 1 and "-m pip freeze did not list its packages; nothing kept" in res.stdout
    assert not (tmp_path / "a.tar.xz").exists() and not (runs / "study_x/runs/rope/seed1/packages.txt").exists()
    assert keep(sys.executable, tmp_path / "a.tar.xz", "study_x/runs/rope/seed1").returncode == 0
    assert keep('""', tmp_path / "b.tar.xz", "study_x/runs/rope/seed2").returncode == 0
    listed = subprocess.run(["tar", "-tJf", str(tmp_path / "a.tar.xz")], capture_output=True, text=True).stdout
    assert "study_x/runs/rope/seed1/packages.txt" in listed.splitlines()
    assert "packages.txt" not in subprocess.run(["tar", "-tJf", str(tmp_path / "b.tar.xz")], capture_output=True,
                                                text=True).stdout
    frozen = (runs / "study_x/runs/rope/seed1/packages.txt").read_text().splitlines()
    assert any(line.lower() == f"sacrebleu=={version('sacrebleu')}" for line in frozen)


def test_a_queue_goes_on_in_a_session_of_its_own_at_its_niceness_appending_to_its_log(tmp_path: Path) -> None:
    """bench/worktree.sh's in_background, as the study queue and the noise pilot start: the call returns at once
    with one line, and the script runs again as the leader of a new session (no terminal's hangup stops it)."""
    import os
    import time

    script = tmp_path / "queue.sh"
    script.write_text(f'source {ROOT}/bench/worktree.sh\nin_background "$0" "$1" q.log "the queue" 7\n'
                      'echo "sid=$(ps -o sid= -p $$ | tr -d " ") pid=$$ nice=$(ps -o ni= -p $$ | tr -d " ") runs=$1"\n')
    runs = tmp_path / "runs"
    res = subprocess.run(["bash", str(script), str(runs)], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0 and re.fullmatch(rf"the queue started in the background \(pid \d+\); log: "
                                                rf"{re.escape(str(runs))}/q.log\n", res.stdout), res
    deadline = time.monotonic() + 20
    while not ((runs / "q.log").is_file() and "runs=" in (runs / "q.log").read_text()):
        assert time.monotonic() < deadline, "the background run wrote nothing"
        time.sleep(0.05)
    fields = dict(f.split("=", 1) for f in (runs / "q.log").read_text().split())
    assert fields["sid"] == fields["pid"] and fields["runs"] == str(runs)
    assert int(fields["nice"]) == min(19, os.nice(0) + 7)  # 7 above the caller's


def test_a_queue_started_in_a_session_of_its_own_makes_its_runs_folder_on_a_new_machine(tmp_path: Path) -> None:
    """Started by hand under setsid (already a session's leader) with a runs folder that does not exist yet, as on a
    replaced machine: the queue makes the folder, takes its lock and runs, rather than saying it runs already."""
    script = tmp_path / "queue.sh"
    script.write_text(f'source {ROOT}/bench/worktree.sh\nin_background "$0" "$1" q.log "the queue"\n'
                      'echo "ran in $1"\n')
    runs = tmp_path / "new" / "runs"
    res = subprocess.run(["setsid", "--wait", "bash", str(script), str(runs)], capture_output=True, text=True,
                         timeout=30)
    assert res.returncode == 0 and res.stdout == f"ran in {runs}\n", res
    assert (runs / "q.lock").is_file()


SEQUENTIAL = (ROOT / "bench" / "study_sequential.sh").read_text()


SYSTEMS = ("sinusoidal", "learnable", "alibi", "t5", "rope")


def _looks(tmp: Path, looks: str, verdicts: list[str], fail: str = "") -> tuple[int, list[str]]:
    """bench/study_sequential.sh's ``looks`` with ``step``, ``kept``, ``keep_runs``, ``restore_runs`` and
    ``same_training`` logging their arguments (``kept`` makes the look's results.json, ``keep_runs`` its archive)
    and the scoring worktree's python printing the next of ``verdicts`` (bench/study_stop.py's first line); a step
    whose description holds ``fail`` fails."""
    score = tmp / "score-wt"
    _answering_python(tmp, score, "stop-rule", [f"{verdict}\nresolved (0): -\n" for verdict in verdicts])
    stubs = (f'step() {{ echo "step $1 $2 | ${{*:3}}" >> {tmp}/log; [ -z "{fail}" ] || [[ "$2" != *"{fail}"* ]]; }}\n'
             f'kept() {{ echo "kept $1 $2" >> {tmp}/log; mkdir -p "$2" && touch "$2/results.json"; }}\n'
             f'keep_runs() {{ echo "keep_runs $*" >> {tmp}/log; mkdir -p "$(dirname "$2")" && touch "$2"; }}\n'
             f'restore_runs() {{ echo "restore_runs $*" >> {tmp}/log; }}\nrecorded() {{ :; }}\n'
             f'same_training() {{ echo "same_training" >> {tmp}/log; }}\nbeside() {{ echo "beside" >> {tmp}/log; }}\n')
    functions = "\n".join(_function(f, SEQUENTIAL) for f in ("folder", "arm", "decoding", "merged", "record",
                                                              "pending", "runs", "pilot_also", "look", "looks"))
    script = (f'RUNS={tmp}/runs; SCORE_WT={score}; STUDY_DIR=D; KEEP={tmp}/records; PILOT_KEEP={tmp}/pilot; '
              f'LOOKS_DIR={tmp}/looks; LOOKS="{looks}"; SYSTEMS="{" ".join(SYSTEMS)}"\n'
              'SHORT="--name s"; NATURAL="--name n"; SCORING="--score-only"\n' + stubs + functions + "\nlooks\n")
    res = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    log = tmp / "log"
    return res.returncode, log.read_text().replace(str(tmp), "TMP").splitlines() if log.is_file() else []


SHORT_DECODING = "--family TMP/score-wt/D/family.json --decoders beam5,greedy,beam5-minlen"


def _queue_of(arm: str, seeds: int, first: int = 1, merge: str = "", kept: tuple = ()) -> list[str]:
    """The queue's lines for the arm's runs of seeds ``first``..``seeds`` but those ``kept`` ((system, seed)): two
    at a time in seed then system order, each pair trained, then decoded, then each run kept in an archive of its
    own."""
    name, study = (("s", "extrapolation-sequential") if arm == "short" else ("n", "extrapolation-sequential-natural"))
    decoding = SHORT_DECODING if arm == "short" else "--decoders beam5,greedy"
    items = [(system, seed) for seed in range(first, seeds + 1) for system in SYSTEMS if (system, seed) not in kept]
    lines = []
    for i in range(0, len(items), 2):
        pair = ",".join(f"{system}:{seed}" for system, seed in items[i:i + 2])
        lines += [f"step TMP/score-wt {arm} arm, {pair}: training | --name {name} --seeds {seeds} --train-only "
                  f"--only {pair}{merge}",
                  f"step TMP/score-wt {arm} arm, {pair}: decoding | --name {name} {decoding} --seeds {seeds} "
                  f"--decode-only --only {pair}{merge}"]
        lines += [f"keep_runs TMP/runs TMP/records/{arm}.{system}.seed{seed}.tar.xz "
                  f"study_{study}/runs/{system}/seed{seed}" for system, seed in items[i:i + 2]]
    return lines


def test_the_sequential_study_takes_its_looks_in_turn_until_the_stopping_rule_says_stop(tmp_path: Path) -> None:
    """Each look trains, decodes and keeps its runs two at a time (seed 1's five systems, then seed 2's: a pair may
    span two seeds; each run kept without its weights, to commit), then scores every seed so far with the family
    file and the three decoders and keeps the look's files; the natural-length arm follows the first look; the
    stopping rule reads every look taken so far, with the pilot's arms whose kept runs were unpacked in its all-in
    cost, and its answer is kept in the look's folder (stop.txt); a stop ends the study before its last planned
    look."""
    def look(k: int, n: int, first: int = 1) -> list[str]:
        return [*_queue_of("short", n, first),
                f"step TMP/score-wt look-{k}: scoring at {n} seeds per system | --name s {SHORT_DECODING} --seeds {n} "
                "--score-only", f"kept TMP/runs/study_extrapolation-sequential TMP/looks/look-{k}"]

    natural = [*_queue_of("natural", 3),
               "step TMP/score-wt natural: scoring at 3 seeds per system | --name n --decoders beam5,greedy --seeds 3 "
               "--score-only", "kept TMP/runs/study_extrapolation-sequential-natural TMP/looks/natural", "beside"]
    assert natural[0].startswith("step TMP/score-wt natural arm, sinusoidal:1,learnable:1: training") and \
        natural[2 * 4].startswith("step TMP/score-wt natural arm, rope:1,sinusoidal:2: training")  # across seeds

    def rule(k: int) -> str:
        return ("stop-rule bench/study_stop.py " + " ".join(f"TMP/looks/look-{i}" for i in range(1, k + 1))
                + " --also TMP/runs/pilot-kept/study_pilot-plain")

    restore = ["restore_runs TMP/runs/kept TMP/records/*.tar.xz", "restore_runs TMP/runs/pilot-kept TMP/pilot/*.tar.xz"]
    (tmp_path / "runs" / "pilot-kept" / "study_pilot-plain").mkdir(parents=True)  # only this arm's were unpacked
    rc, log = _looks(tmp_path, "3 6 8", ["continue: 20 of 24 tests are open at look 1 of 3",
                                         "stop: every test is resolved or futile"])
    assert rc == 0 and log == ["same_training", *restore, *look(1, 3), *natural, rule(1), *look(2, 6, first=4),
                               rule(2)]
    assert (tmp_path / "looks" / "look-2" / "stop.txt").read_text() == (
        "stop: every test is resolved or futile\nresolved (0): -\n")
    # Started again (a new machine, a killed queue): the looks and runs already kept are not run again, and the
    # kept runs unpacked are merged into each step of their arm.
    (tmp_path / "log").unlink()
    (tmp_path / "n").unlink()
    (tmp_path / "verdict1").write_text("continue: 2 of 24 tests are open at look 2 of 3\n")
    (tmp_path / "verdict2").write_text("stop: the last planned look (8 seeds per system)\n")
    (tmp_path / "runs" / "kept" / "study_extrapolation-sequential" / "runs").mkdir(parents=True)
    (tmp_path / "records" / "short.sinusoidal.seed7.tar.xz").touch()  # kept before the machine was lost
    rc, log = _looks(tmp_path, "3 6 8", [])
    merge = " --merge TMP/runs/kept/study_extrapolation-sequential"
    kept = " ".join(sorted([*(f"TMP/records/{arm}.{system}.seed{k}.tar.xz" for arm, n in (("natural", 3), ("short", 6))
                              for k in range(1, n + 1) for system in SYSTEMS),
                            "TMP/records/short.sinusoidal.seed7.tar.xz"]))
    queue = _queue_of("short", 8, 7, merge, kept=(("sinusoidal", 7),))
    assert queue[0] == (f"step TMP/score-wt short arm, learnable:7,alibi:7: training | --name s --seeds 8 "
                        f"--train-only --only learnable:7,alibi:7{merge}")
    assert rc == 0 and log == ["same_training", f"restore_runs TMP/runs/kept {kept}", restore[1], "beside", rule(1),
                               rule(2), *queue,
                               f"step TMP/score-wt look-3: scoring at 8 seeds per system | --name s {SHORT_DECODING} "
                               f"--seeds 8 --score-only{merge}",
                               "kept TMP/runs/study_extrapolation-sequential TMP/looks/look-3", rule(3)]


def test_the_natural_arm_is_put_beside_the_short_one_once(tmp_path: Path) -> None:
    """After the natural arm's look, bench/arms_table.py of look 1 and the natural look is kept as
    looks/natural/arms.md, written whole; a later start leaves it as it is."""
    score = tmp_path / "score-wt"
    _answering_python(tmp_path, score, "arms", ["| system | x1 |\n", "| changed |\n"])
    (tmp_path / "looks" / "natural").mkdir(parents=True)
    call = f"LOOKS_DIR={tmp_path}/looks; SCORE_WT={score}\n" + _function("beside", SEQUENTIAL) + "\nbeside\n"
    for _ in range(2):
        assert subprocess.run(["bash", "-c", call], capture_output=True, text=True, timeout=30).returncode == 0
    assert (tmp_path / "looks" / "natural" / "arms.md").read_text() == "| system | x1 |\n"
    assert (tmp_path / "log").read_text() == (f"arms bench/arms_table.py {tmp_path}/looks/look-1 "
                                              f"{tmp_path}/looks/natural\n")
    assert not (tmp_path / "looks" / "natural" / "arms.md.partial").exists()


def test_a_failed_step_stops_the_sequential_study_before_the_stopping_rule(tmp_path: Path) -> None:
    rc, log = _looks(tmp_path, "3 6 8", ["continue: x"], fail="natural arm, t5:2,rope:2: decoding")
    assert rc == 1 and log[-1].startswith("step TMP/score-wt natural arm, t5:2,rope:2: decoding")
    assert "TMP/records/natural.t5.seed2.tar.xz" not in "\n".join(log)
    assert "TMP/records/natural.alibi.seed2.tar.xz" in "\n".join(log)  # the pairs before it are kept
    assert not any(line.startswith("stop-rule") for line in log)


def test_a_look_is_kept_whole_or_not_at_all(tmp_path: Path) -> None:
    study = tmp_path / "study"
    for part in ("figures", "hypotheses", "tb"):
        (study / part).mkdir(parents=True)
        (study / part / "x").write_text(part)
    (study / "results.json").write_text("{}")
    call = _function("kept", SEQUENTIAL) + f'\nkept {study} {tmp_path}/look-1'
    missing = subprocess.run(["bash", "-c", call], capture_output=True, text=True, timeout=30)
    assert missing.returncode != 0 and not (tmp_path / "look-1").exists()  # report.md missing: nothing kept
    (tmp_path / "look-1" / "figures").mkdir(parents=True)  # a look's folder left without results.json: replaced
    (study / "report.md").write_text("# report")
    res = subprocess.run(["bash", "-c", call], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0 and sorted(p.name for p in (tmp_path / "look-1").iterdir()) == [
        "figures", "hypotheses", "report.md", "results.json", "tb"]
    assert [p.name for p in (tmp_path / "look-1" / "figures").iterdir()] == ["x"]  # not the copy inside the old one
    assert (tmp_path / "look-1" / "tb" / "x").read_text() == "tb" and not (tmp_path / "look-1.partial").exists()


def test_the_sequential_study_refuses_to_start_before_its_design_is_committed(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "bench").mkdir(parents=True)
    (repo / "bench" / "study_sequential.sh").write_text(SEQUENTIAL)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    res = subprocess.run(["bash", str(repo / "bench" / "study_sequential.sh"), str(tmp_path / "runs")],
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 1 and res.stdout.startswith(
        "bench/studies/extrapolation-sequential/design.json is not committed: score the noise pilot")
    assert not (tmp_path / "runs").exists() and not (tmp_path / "pilot-wt").exists()


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                   capture_output=True)


def test_a_look_waits_until_every_record_of_its_seeds_is_committed_unchanged(tmp_path: Path) -> None:
    """A look is scored from committed records only (a later look on a new machine merges those same runs): until
    every run's archive of its seeds is tracked and unchanged, the study says once that it waits, and waits."""
    records = tmp_path / "records"
    records.mkdir()
    _git(tmp_path, "init", "-q")
    for seed in (1, 2):
        for system in ("sinusoidal", "rope"):
            (records / f"short.{system}.seed{seed}.tar.xz").write_bytes(b"%s %d" % (system.encode(), seed))
    call = (f'ROOT={tmp_path}; KEEP={records}; RECORD_POLL=0.05; SYSTEMS="sinusoidal rope"\n'
            + _function("record", SEQUENTIAL) + "\n" + _function("recorded", SEQUENTIAL) + "\nrecorded short 2\n")

    def recorded() -> subprocess.CompletedProcess:
        return subprocess.run(["timeout", "1", "bash", "-c", call], capture_output=True, text=True)

    for name in ("short.sinusoidal.seed1.tar.xz", "short.rope.seed1.tar.xz", "short.sinusoidal.seed2.tar.xz"):
        _git(tmp_path, "add", f"records/{name}")
    _git(tmp_path, "commit", "-qm", "three runs")
    res = recorded()  # seed 2's rope run is not committed
    assert res.returncode == 124 and res.stdout.count("\n") == 1 and res.stdout.strip().endswith(
        f"waiting for {records}/short.rope.seed2.tar.xz to be committed (a look is scored from committed records)")
    _git(tmp_path, "add", "records")
    _git(tmp_path, "commit", "-qm", "the fourth")
    assert recorded().returncode == 0
    (records / "short.rope.seed1.tar.xz").write_bytes(b"trained again")  # changed since its commit
    assert recorded().returncode == 124


def test_the_sequential_study_refuses_a_design_changed_after_the_commit_that_fixed_it(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    study = repo / "bench" / "studies" / "extrapolation-sequential"
    study.mkdir(parents=True)
    (repo / "bench" / "study_sequential.sh").write_text(SEQUENTIAL)
    (study / "design.json").write_text('{"seeds": 12}')
    (study / "family.json").write_text("{}")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "the design")
    (study / "design.json").write_text('{"seeds": 8}')
    _git(repo, "commit", "-qam", "a later edit")
    first = subprocess.run(["git", "-C", str(repo), "rev-list", "--max-parents=0", "--abbrev-commit", "HEAD"],
                           capture_output=True, text=True, check=True).stdout.strip()
    res = subprocess.run(["bash", str(repo / "bench" / "study_sequential.sh"), str(tmp_path / "runs")],
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 1 and res.stdout == (
        "bench/studies/extrapolation-sequential/design.json or family.json differs from the commit that fixed the "
        f"design ({first}): the design is fixed once; restore them as that commit has them\n")
    assert not (tmp_path / "runs").exists()


def _design_repo(tmp_path: Path) -> tuple[Path, Path]:
    """A repository holding the sequential study's driver, a worktree.sh whose in_background says "started", and a
    design: (the repository, the study's folder), nothing committed yet."""
    repo = tmp_path / "repo"
    study = repo / "bench" / "studies" / "extrapolation-sequential"
    study.mkdir(parents=True)
    (repo / "bench" / "study_sequential.sh").write_text(SEQUENTIAL)
    (repo / "bench" / "worktree.sh").write_text("in_background() { echo started; exit 0; }\n")
    (study / "design.json").write_text('{"seeds": 12}')
    (study / "family.json").write_text("{}")
    return repo, study


def test_the_sequential_study_refuses_a_shallow_clone_whose_history_cannot_name_the_design_commit(
        tmp_path: Path) -> None:
    """In a clone of depth 1 the design's commit is beyond the history, and the oldest commit there seems to add
    design.json: the study says how to fetch the rest, and does not start (a full clone of the same repository
    names the design's commit and goes on)."""
    repo, study = _design_repo(tmp_path)
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "the design")
    (repo / "README.md").write_text("later\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "a later commit")
    for depth, name in ((["--depth", "1"], "shallow"), ([], "full")):
        subprocess.run(["git", "clone", "-q", *depth, f"file://{repo}", str(tmp_path / name)], check=True)
    shallow = subprocess.run(["bash", str(tmp_path / "shallow" / "bench" / "study_sequential.sh"),
                              str(tmp_path / "runs")], capture_output=True, text=True, timeout=30)
    assert shallow.returncode == 1 and shallow.stdout == (
        "this clone is shallow, so the commit that fixed the design cannot be found: run "
        f"git -C {tmp_path / 'shallow'} fetch --unshallow, then start this again\n")
    assert not (tmp_path / "runs").exists()
    full = subprocess.run(["bash", str(tmp_path / "full" / "bench" / "study_sequential.sh"), str(tmp_path / "runs")],
                          capture_output=True, text=True, timeout=30)
    assert full.stdout == "started\n"


def test_the_sequential_study_runs_its_procedure_as_the_design_commit_has_it_or_as_an_amendment_declares(
        tmp_path: Path) -> None:
    """bench/study_sequential.sh and bench/worktree.sh are the study's procedure: changed after the commit that fixed
    the design, the study starts only with AMENDED_DRIVER naming the date of the latest amendment committed, one the
    design's commit did not hold (then it goes on to its next check: here, that it may start in the background);
    an older amendment, one dated after the design but committed with it, or one not committed does not start it."""
    repo, study = _design_repo(tmp_path)
    (study / "amendments.md").write_text("### 2026-11-29 — Amendment: before the design\n\n"
                                         "### 2026-12-02 — Amendment: with the design, in its commit\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "the design"],
                   check=True, env={**os.environ, "GIT_COMMITTER_DATE": "2026-12-02T12:00:00Z"})
    (repo / "bench" / "worktree.sh").write_text("in_background() { echo started again; exit 0; }\n")
    for date, what in (("2026-12-03", "the driver"), ("2026-12-04", "a later correction")):
        with (study / "amendments.md").open("a") as f:
            f.write(f"\n### {date} — Amendment: {what}\n")
        _git(repo, "commit", "-qam", what)
    with (study / "amendments.md").open("a") as f:
        f.write("\n### 2026-12-05 — Amendment: not committed\n")

    def start(**env: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(repo / "bench" / "study_sequential.sh"), str(tmp_path / "runs")],
                              capture_output=True, text=True, timeout=30, env={**os.environ, **env})

    refused = start()
    assert refused.returncode == 1 and refused.stdout.startswith(
        "bench/study_sequential.sh or bench/worktree.sh differs from the commit that fixed the design (") and \
        ", 2026-12-02): declare the change in a dated amendment committed after it, and run with " \
        "AMENDED_DRIVER=<the latest amendment's date>, or restore them as that commit has them\n" in refused.stdout
    for date in ("2026-11-29",  # older than the design
                 "2026-12-02",  # dated the design's day, but the design's commit held it
                 "2026-12-03",  # committed after the design, but not the latest
                 "2026-12-05",  # not committed
                 "2026-12-06"):  # no amendment of that date
        assert start(AMENDED_DRIVER=date).stdout == refused.stdout, date
    assert start(AMENDED_DRIVER="2026-12-04").stdout == "started again\n"


def test_a_queue_runs_once_at_a_time(tmp_path: Path) -> None:
    """in_background's lock (RUNS/<log>.lock, held by the run and its children): started again while it runs, a
    queue says so in one line and starts nothing; once it has ended, it starts."""
    import time

    script = tmp_path / "queue.sh"
    script.write_text(f'source {ROOT}/bench/worktree.sh\nin_background "$0" "$1" q.log "the queue"\n'
                      'echo started >> "$1/runs.txt"; sleep 2\n')
    runs = tmp_path / "runs"

    def start() -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(script), str(runs)], capture_output=True, text=True, timeout=30)

    assert start().returncode == 0
    deadline = time.monotonic() + 20
    while not (runs / "runs.txt").is_file():
        assert time.monotonic() < deadline, "the background run did not start"
        time.sleep(0.05)
    again = start()
    assert again.returncode == 1 and again.stdout == (
        f"the queue is running already ({runs}/q.lock is held): not started twice; log: {runs}/q.log\n")
    while subprocess.run(["flock", "-n", str(runs / "q.lock"), "true"]).returncode != 0:
        assert time.monotonic() < deadline, "the background run did not end"
        time.sleep(0.1)
    assert start().returncode == 0
    while (runs / "runs.txt").read_text().count("started") < 2:
        assert time.monotonic() < deadline, "the queue did not start again"
        time.sleep(0.05)


def test_a_pinned_worktree_deleted_by_hand_is_made_again(tmp_path: Path) -> None:
    """bench/worktree.sh's worktree: the checkout at its commit with a virtual environment (here the stand-in
    interpreter of this checkout's, copied); deleted by hand (git still lists it), it is made again."""
    repo = tmp_path / "repo"
    (repo / ".venv" / "bin").mkdir(parents=True)
    (repo / ".venv" / "bin" / "python").write_text("#!/usr/bin/env bash\nexit 0\n")  # "imports torch, ignite..."
    (repo / ".venv" / "bin" / "python").chmod(0o755)
    (repo / "README.md").write_text("x")
    _git(repo, "init", "-q")
    _git(repo, "add", "README.md")
    _git(repo, "commit", "-qm", "x")
    call = f"source {ROOT}/bench/worktree.sh\nROOT={repo}\nworktree {tmp_path}/wt HEAD\n"
    for _ in range(2):
        res = subprocess.run(["bash", "-c", call], capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stdout + res.stderr
        assert (tmp_path / "wt" / "README.md").read_text() == "x" and (tmp_path / "wt" / ".venv" / "bin").is_dir()
        subprocess.run(["rm", "-rf", str(tmp_path / "wt")], check=True)


def test_a_pinned_worktree_gets_the_dependencies_its_own_commit_declares(tmp_path: Path) -> None:
    """An environment copied from this checkout lacks what only an older commit declares (datasets, before
    2026-12-01): bench/worktree.sh's worktree installs the pinned commit's own dependencies, with its dev and export
    extras, under its own constraints, each time (pip installs nothing when all are there)."""
    repo = tmp_path / "repo"
    (repo / ".venv" / "bin").mkdir(parents=True)
    python = repo / ".venv" / "bin" / "python"  # runs the requirements script for real, logs every other call
    python.write_text(f'#!/usr/bin/env bash\n[ "$1" = - ] && exec {sys.executable} "$@"\n'
                      f'echo "$PWD $*" >> {tmp_path}/log\n')
    python.chmod(0o755)
    (repo / "pyproject.toml").write_text('[project]\nname = "x"\ndependencies = ["torch==2.13.0", "datasets>=4.0"]\n'
                                         '[project.optional-dependencies]\ndev = ["pytest>=8"]\n'
                                         'export = ["ctranslate2>=4.8.3"]\nserve = ["fastapi>=0.110"]\n')
    (repo / "constraints.txt").write_text("")
    _git(repo, "init", "-q")
    _git(repo, "add", "pyproject.toml", "constraints.txt")
    _git(repo, "commit", "-qm", "x")
    call = f"source {ROOT}/bench/worktree.sh\nROOT={repo}\nworktree {tmp_path}/wt HEAD\n"
    for _ in range(2):
        res = subprocess.run(["bash", "-c", call], capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stdout + res.stderr
    wt = tmp_path / "wt"
    assert (wt / ".venv" / "pinned-requirements.txt").read_text().split() == [
        "torch==2.13.0", "datasets>=4.0", "pytest>=8", "ctranslate2>=4.8.3"]
    pip = f"{wt} -m pip install -q -c constraints.txt -r .venv/pinned-requirements.txt"
    assert [line for line in (tmp_path / "log").read_text().splitlines() if "-m pip" in line] == [pip, pip]


def test_the_study_starts_only_once_its_commit_is_checked_to_train_as_the_pilots(tmp_path: Path) -> None:
    """``same_training``: bench/same_training.py (the pilot's checkout against the study's, the design's keys, a
    short warmup) is run once and its JSON kept in records/ to be committed; "different" (exit 3) and a failed
    check (any other) are said apart, and the study does not start; a kept check is read again, and one of other
    commits or with a system not identical is refused."""
    score = tmp_path / "score-wt"
    (score / ".venv" / "bin").mkdir(parents=True)
    python = score / ".venv" / "bin" / "python"
    doc = json.dumps({"commits": ["7186bb6", "abc1234"], "steps": 30, "eval_every": 10,
                      "sets": ["train.cooldown=0.2", "train.warmup_tokens=35000", "train.valid_bleu_sentences=16"],
                      "rows": [{"system": s, "identical": True} for s in ("sinusoidal", "rope")]})
    python.write_text(f'#!/usr/bin/env bash\n[ "$1" = - ] && exec {sys.executable} "$@"\n'
                      f'echo "$*" >> {tmp_path}/log\n[ -f {tmp_path}/rc ] && exit "$(cat {tmp_path}/rc)"\n'
                      f"out=${{@: -1}}\necho '{doc}' > \"$out\"\n")
    python.chmod(0o755)
    call = (f'KEEP={tmp_path}/records; SCORE_WT={score}; PILOT_WT=P; SCORE_COMMIT=abc1; PILOT_COMMIT=7186bb6; '
            f'SYSTEMS="sinusoidal rope"; SETS="--set train.cooldown=0.2"\n'
            + _function("same_training", SEQUENTIAL) + "\nsame_training\n")

    def check() -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-c", call], capture_output=True, text=True, timeout=30)

    (tmp_path / "records").mkdir()
    kept = tmp_path / "records" / "same_training.json"
    for rc, said in (("3", "abc1 does not train as 7186bb6 does"), ("1", "the check that abc1 trains as 7186bb6 "
                                                                        "does failed (exit 1)")):
        (tmp_path / "rc").write_text(rc)
        res = check()
        assert res.returncode == 1 and said in res.stdout.strip().splitlines()[-1], res.stdout + res.stderr
        assert res.stdout.strip().endswith("the study does not start") and not kept.exists()
    assert (tmp_path / "log").read_text().split("\n")[0] == (
        "bench/same_training.py P . --preset train-short-test-long --variants sinusoidal,rope --steps 30 "
        "--eval-every 10 --set train.cooldown=0.2 --set train.warmup_tokens=35000 --set "
        f"train.valid_bleu_sentences=16 --out {kept}.partial")
    (tmp_path / "rc").unlink()
    res = check()
    assert res.returncode == 0 and res.stdout.strip().endswith(f"{kept} (commit it)") and kept.is_file()
    (tmp_path / "log").unlink()
    assert check().returncode == 0 and not (tmp_path / "log").exists()  # checked once, read again
    good = kept.read_text()
    for bad in (good.replace('"rope", "identical": true', '"rope", "identical": false'),
                good.replace('"steps": 30', '"steps": 12'),  # a shorter check: the cool-down never ran
                good.replace('"train.cooldown=0.2", ', "")):  # another arm's keys
        assert bad != good
        kept.write_text(bad)
        res = check()
        assert res.returncode == 1 and res.stdout.strip().endswith(
            f"{kept} is not this study's check (30 steps, its arm's keys and the shortened warmup) of abc1 against "
            "7186bb6 with every system identical: the study does not start")
    assert not (tmp_path / "log").exists()
