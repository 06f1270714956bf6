"""Hostile inputs to a study (bench/study.py, its report and the Studies pages): the same study started twice at once
is refused in one line naming the holder of its lock, which dies with its process; a damaged study.json, score file,
hypotheses file (.hyp or published .json.xz), attention statistics file or results.json is refused in one line
naming it; a file changed since it was written (an edited .hyp: a chrF changed under an unchanged score file) is
refused by its checksum; a --grid whose values are one value once read, and a --set of a key a variant sets, are
refused before anything runs. Cheap: fake run folders, one study.py and one study_report.py process."""

from __future__ import annotations

import importlib.util
import json
import lzma
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, run_script

from utils.cli import run_main
from utils.config import ConfigError
from utils.study import cli, report
from utils.study.files import (
    Ledger,
    StudyFileError,
    hypotheses_checksums,
    read_hypotheses_file,
    read_results,
    read_spec,
    with_sha256,
)
from utils.study.lock import StudyLockedError, lock_study, study_locked_by, unlock_study
from utils.study.plan import Job
from utils.study.report import aggregate, publish_hypotheses, read_hypotheses, reanalyse
from utils.study.runs import eval_current, eval_file, read_attention, read_scores
from utils.study.spec import Variant, check_sets, grid_variants


def _test_py():
    """test.py as a module (its name would be the standard library's ``test`` package)."""
    spec = importlib.util.spec_from_file_location("fr2en_test_script", ROOT / "test.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


test_py = _test_py()
HYPS = ["the cat sleeps", "a dog runs", "good morning"]
REFS = ["the cat is asleep", "a dog is running", "good morning"]


def scored(run: Path, hyps: list[str] = HYPS, checksums: bool = True, seconds: float = 1.0) -> Path:
    """A run's score file and hypotheses as test.py writes them (``checksums=False``: as an older test.py did)."""
    path = eval_file(run, "test", 5, "best", None)
    entry = {"n_sentences": len(hyps), "bleu": 1.0, "bleu_signature": "nrefs:1", "chrf_signature": "nc:6", "step": 8,
             "overrides": [], "seconds": seconds}
    if checksums:
        assert test_py.write_scores(path, entry, hyps)["sha256"] == json.loads(path.read_text())["sha256"]
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(entry))
        path.with_suffix(".hyp").write_text("\n".join(hyps) + "\n")
    return path


def refused(call, *args) -> str:
    """The one line a StudyFileError says."""
    with pytest.raises(StudyFileError) as e:
        call(*args)
    assert "\n" not in str(e.value)
    return str(e.value)


# ---------------------------------------------------------------------------------------------- the lock


def test_a_second_start_of_a_running_study_is_refused_in_one_line_and_the_lock_dies_with_its_holder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "study_t"
    folder.mkdir()
    (folder / "study.json").write_text('{"variants": []}')
    holder = subprocess.Popen([sys.executable, "-c", "import sys; from pathlib import Path; "
                               "from utils.study.lock import lock_study; lock_study(Path(sys.argv[1])); "
                               "print('locked', flush=True); sys.stdin.read()", str(folder)],
                              cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "locked\n"
        before = sorted((p.name, p.stat().st_mtime_ns) for p in folder.iterdir())
        monkeypatch.chdir(ROOT)  # bench/study.py as its command line runs it (run_main), in this process
        monkeypatch.setattr(sys, "argv", ["bench/study.py", "--config", "configs/demo.yaml", "--grid",
                                          "model.attention_pe=none,rope", "--seeds", "2", "--steps", "8", "--name",
                                          "t", "--runs", str(tmp_path), "--score-only"])
        with pytest.raises(SystemExit) as exit_code:
            run_main(cli.main)
        line = (f"error: {folder} is in use: another bench/study.py runs this study (pid {holder.pid}, host "
                f"{socket.gethostname()}, started DATE); nothing was trained or written: wait for it to end (or stop "
                "it), then run the command again")
        out, err = capsys.readouterr()
        assert exit_code.value.code == 2 and out == ""
        assert re.sub(r"started [\d-]+ [\d:]+ [+-]\d{4}", "started DATE", err) == line + "\n"
        assert sorted((p.name, p.stat().st_mtime_ns) for p in folder.iterdir()) == before  # nothing written
        with pytest.raises(StudyLockedError, match=f"pid {holder.pid}, host "):
            lock_study(folder)
        with pytest.raises(StudyLockedError, match="is in use: another bench/study.py runs this study"):
            reanalyse(folder)  # the report is not rewritten under a running study either
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert study_locked_by(folder) is None  # the kernel released it with the killed process: a rerun resumes
    lock_study(folder)
    try:
        assert json.loads((folder / "study.lock").read_text())["pid"] == os.getpid()
    finally:
        unlock_study(folder)


# ---------------------------------------------------------------------------------------------- damaged files


def test_a_damaged_study_json_is_refused_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = tmp_path / "study_t" / "study.json"
    spec.parent.mkdir()
    for data, why in ((b'{"variants": [{"label": "a", "over', "truncated (Unterminated string starting at: line 1 "
                                                             "column 30): not a study's definition"),
                      (b"\xff\xfe\x00garbage", "not UTF-8 text (byte 0 is 0xff): not a study's definition"),
                      (b"[1, 2]", "JSON, but not a study's definition"),
                      (b'{"variants": [{"label": 3}]}', "its variants are not a list of label and overrides: not a "
                                                        "study's definition")):
        spec.write_bytes(data)
        assert refused(read_spec, spec) == f"{spec}: {why}"
    spec.write_bytes(b'{"variants": [')  # what the study itself reads when resumed: the same line
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "argv", ["bench/study.py", "--config", "configs/demo.yaml", "--grid",
                                      "model.attention_pe=none,rope", "--steps", "8", "--name", "t", "--runs",
                                      str(tmp_path)])
    assert refused(cli.main).startswith(f"{spec}: truncated (Expecting value: line 1 column 15)")
    assert sorted(p.name for p in spec.parent.iterdir()) == ["study.json"]


def test_an_edited_hyp_is_refused_by_its_checksum_and_a_damaged_score_file_in_one_line(tmp_path: Path) -> None:
    """The hostile case: a reported chrF changed from 2.854 to 13.028 by an edited .hyp under an unchanged score
    file. test.py records the sha256 of its hypotheses and of the score file itself; the study checks both."""
    run = tmp_path / "runs" / "a" / "seed1" / "demo_1"
    path = scored(run)
    hyp = path.with_suffix(".hyp")
    assert read_scores(path, 3)[1] == HYPS and eval_current(path, 3, [], 8)
    hint = f"to score it again, delete {path.name} and {hyp.name} in {path.parent} and run the study again (its " \
           "checkpoint is needed)"
    hyp.write_text("the cat is asleep\na dog runs\ngood morning\n")  # as many lines, a better chrF
    assert refused(read_scores, path, 3) == \
        f"{hyp}: changed since it was scored (its sha256 is not the one {path.name} records); {hint}"
    for data, why in ((b"the cat sleeps\na dog runs\n", "2 lines for the 3 reference sentences scored (test.py writes "
                                                        "one per sentence): truncated or edited"),
                      (b"the cat sleeps\na dog runs\ngood mor", "truncated (its last line has no end): not the "
                                                                "hypotheses test.py wrote"),
                      (b"\x00\x01\xfe\xff\n\n\n", "not UTF-8 text (byte 2 is 0xfe): not the hypotheses test.py wrote")):
        hyp.write_bytes(data)
        assert refused(read_scores, path, 3) == f"{hyp}: {why}; {hint}"
    scored(run)
    entry = json.loads(path.read_text())
    path.write_text(json.dumps({**entry, "bleu": 13.028}))
    line = f"{path}: changed since it was written (its content no longer matches the sha256 it records); {hint}"
    assert refused(read_scores, path, 3) == line
    assert refused(eval_current, path, 3, [], 8) == line  # nor is it taken as scored already
    path.write_text(json.dumps(entry)[:50])
    assert refused(read_scores, path, 3).startswith(f"{path}: truncated (")
    assert refused(eval_current, path, 3, [], 8).endswith(": not test.py's scores")

    # The report's reading (aggregate) refuses before any number is computed.
    jobs = [Job(Variant("a", []), s, tmp_path / "runs" / "a" / f"seed{s}") for s in (1, 2)]
    runs = {job.key: job.root / "demo_1" for job in jobs}
    for job in jobs:
        scored(runs[job.key])
    tampered = eval_file(runs["a seed 2"], "test", 5, "best", None).with_suffix(".hyp")
    tampered.write_text("the cat is asleep\na dog is running\ngood morning\n")
    corpus = {"test": {"src": ["x", "y", "z"], "tgt": REFS}}
    with pytest.raises(StudyFileError, match=f"^{re.escape(str(tampered))}: changed since it was scored"):
        aggregate(jobs, runs, corpus, ["test"], "a", "best", 10, 6, decoders=["beam5"])


def test_files_written_before_checksums_keep_loading_and_are_checked_from_their_first_read(tmp_path: Path) -> None:
    """A score file an older test.py wrote records no checksum: the study records its and its hypotheses' in
    <study>/checksums.json at its first read; a later edit of the hypotheses is refused, a new scoring is not."""
    folder = tmp_path / "study_t"
    path = scored(folder / "runs" / "a" / "seed1" / "demo_1", checksums=False)
    hyp = path.with_suffix(".hyp")
    ledger = Ledger(folder)
    assert read_scores(path, 3, ledger)[1] == HYPS and ledger.save() == 1
    ledger = Ledger(folder)  # the next run of the study
    assert read_scores(path, 3, ledger)[1] == HYPS and ledger.save() == 0
    hyp.write_text("the cat is asleep\na dog runs\ngood morning\n")
    assert refused(read_scores, path, 3, Ledger(folder)).startswith(
        f"{hyp}: changed since it was scored (its sha256 is not the one {folder / 'checksums.json'} recorded); to "
        "score it again, delete")
    scored(path.parents[1], ["the cat is asleep", "a dog runs", "good morning"], False, 2.0)  # scored again
    ledger = Ledger(folder)
    assert read_scores(path, 3, ledger)[1][0] == "the cat is asleep" and ledger.save() == 1

    attention = folder / "runs" / "a" / "seed1" / "demo_1" / "eval" / "attention_stats.best.n6.json"
    attention.write_text(json.dumps({"step": 8, "stats": {"encoder": {}}}))  # an older study's: no checksum
    ledger = Ledger(folder)
    assert read_attention(attention.parents[1], "best", 6, ledger) == {"step": 8, "stats": {"encoder": {}}}
    ledger.save()
    attention.write_text(json.dumps({"step": 8, "stats": {"encoder": {"x": 1}}}))
    assert refused(read_attention, attention.parents[1], "best", 6, Ledger(folder)) == (
        f"{attention}: changed since the study first read it (its sha256 is not the one {folder / 'checksums.json'} "
        "recorded); delete it and run the study again to compute it again (the run's checkpoint is needed)")


def test_a_damaged_or_changed_attention_statistics_file_is_refused_in_one_line(tmp_path: Path) -> None:
    run = tmp_path / "demo_1"
    out = run / "eval" / "attention_stats.best.n6.json"
    out.parent.mkdir(parents=True)
    stats = with_sha256({"sentences": 6, "step": 8, "stats": {"cross": {"diagonal": [[0.5]]}}})
    out.write_text(json.dumps(stats))
    assert read_attention(run, "best", 6) == {k: v for k, v in stats.items() if k != "sha256"}
    remedy = "delete it and run the study again to compute it again (the run's checkpoint is needed)"
    out.write_text(json.dumps(stats)[:40])
    assert refused(read_attention, run, "best", 6).startswith(f"{out}: truncated (")
    out.write_text(json.dumps({**stats, "stats": {"cross": {"diagonal": [[0.9]]}}}))
    assert refused(read_attention, run, "best", 6) == \
        f"{out}: changed since it was written (its content no longer matches the sha256 it records); {remedy}"
    out.write_text(json.dumps({"step": 8}))
    assert refused(read_attention, run, "best", 6) == \
        f"{out}: no statistics in it: not a run's attention statistics; {remedy}"


def test_published_hypotheses_and_results_are_checked_and_refused_in_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "published"
    hyps = {"a": {"test": {"beam5": [HYPS, HYPS[::-1]]}}}
    publish_hypotheses(folder / "hypotheses", hyps, [1, 2])
    checksums = hypotheses_checksums(folder)
    assert set(checksums) == {"hypotheses/a.seed1.json.xz", "hypotheses/a.seed2.json.xz"}
    assert read_hypotheses(folder / "hypotheses", ["a"], [1, 2], checksums) == hyps
    assert read_hypotheses(folder / "hypotheses", ["a"], [1, 2], None) == hyps  # published before checksums
    xz = folder / "hypotheses" / "a.seed2.json.xz"
    good = xz.read_bytes()
    remedy = "restore it as the study published it, or score the study again"
    xz.write_bytes(lzma.compress(json.dumps({"test": {"beam5": REFS}}).encode()))  # an edited output
    assert refused(read_hypotheses_file, xz, checksums) == (
        f"{xz}: changed since it was published (its sha256 is not the one {folder / 'results.json'} records); {remedy}")
    for data, why in ((good[: len(good) // 2], "truncated (Compressed data ended before the end-of-stream marker was "
                                               "reached): not a study's published hypotheses"),
                      (b"garbage", "not xz-compressed (Input format not supported by decoder): not a study's "
                                   "published hypotheses"),
                      (lzma.compress(b'{"test": {"beam5": ["a"'), "truncated (Expecting ',' delimiter: line 1 "
                                                                 "column 24): not a study's published hypotheses"),
                      (lzma.compress(b'{"test": {"beam5": [1, 2, 3]}}'), "not {split: {decoder: [lines]}}: not a "
                                                                         "study's published hypotheses; " + remedy)):
        xz.write_bytes(data)
        assert refused(read_hypotheses_file, xz, None).startswith(f"{xz}: {why}")
    xz.write_bytes(lzma.compress(json.dumps({"test": {"beam5": HYPS[:2]}}).encode()))  # a short seed
    assert refused(read_hypotheses, folder / "hypotheses", ["a"], [1, 2]).startswith(
        f"{xz}: not the lines of every sentence for test/beam5 (as many as a.seed1.json.xz's, at most the references')")

    results = {"spec": {"config": "c.yaml"}, "systems": {}, "seeds": [1, 2], "splits": ["test"], "baseline": "a",
               "checksums": checksums}
    (folder / "results.json").write_text(json.dumps(with_sha256(results), indent=1))
    assert read_results(folder)["checksums"] == checksums
    (folder / "results.json").write_text(json.dumps(with_sha256(results), indent=1).replace('"a"', '"b"'))
    assert refused(read_results, folder) == (
        f"{folder / 'results.json'}: changed since it was written (its content no longer matches the sha256 it "
        "records); restore it as it was published or written (it cannot be recomputed from itself)")
    (folder / "results.json").write_text(json.dumps(results)[:-30])
    monkeypatch.setattr(sys, "argv", ["bench/study_report.py", str(folder)])  # its command line, in this process
    with pytest.raises(SystemExit) as exit_code:
        run_main(report.main)
    err = capsys.readouterr().err
    assert exit_code.value.code == 2 and err.startswith(f"error: {folder / 'results.json'}: truncated (")
    assert len(err.splitlines()) == 1 and err.rstrip().endswith("not a study's results")


def test_a_results_json_of_another_shape_is_one_line_for_every_command_that_reads_it(tmp_path: Path) -> None:
    """A results.json without its checksum (an older version's, or hand-made) whose keys hold something else than a
    study writes: study_stop, noise_ratio, pilot_design and study_report each say so in one line, exit 2, and write
    nothing (they raised KeyError, AttributeError or TypeError). Out-of-range counts are refused the same way, before
    a report is rewritten with them."""
    base = {"spec": {"config": "configs/demo.yaml"}, "systems": {"a": {}}, "seeds": [1, 2, 3, 4, 5, 6],
            "splits": ["test"], "baseline": "a"}
    cases = {"no_primary": (base, "no 'primary': not a study's results"),
             "bad_primary": ({**base, "primary": "oops"}, "'primary' is not an object with a list of tests"),
             "no_power": ({**base, "primary": {"tests": []}}, "no 'primary.power'"),
             "bad_spec": ({**base, "spec": "x", "systems": []}, "'spec' is not an object"),
             "bad_seeds": ({**base, "seeds": ["one"]}, "'seeds' is not a list of seeds")}
    for name, (doc, _) in cases.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps(doc))
    commands = [("bench/study_stop.py", ["no_primary", "bad_primary"]),
                ("bench/noise_ratio.py", ["no_power", "bad_primary"]),
                ("bench/pilot_design.py", ["bad_spec", "no_power"]),
                ("bench/study_report.py", ["bad_spec", "bad_seeds"])]
    for script, names in commands:
        for name in names:
            folder = str(tmp_path / name)
            args = {"bench/noise_ratio.py": [folder, folder], "bench/pilot_design.py": [folder, folder, "--out",
                    str(tmp_path / "design")]}.get(script, [folder])
            res = run_script(script, *args)
            last = res.stderr.strip().splitlines()[-1]
            assert res.returncode == 2 and "Traceback" not in res.stderr, (script, name, res.stderr[-2000:])
            assert cases[name][1] in last and str(tmp_path / name / "results.json") in last, (script, name, last)
    assert not (tmp_path / "design").exists()
    assert {p.name for p in tmp_path.rglob("*") if p.is_file()} == {"results.json"}  # nothing written
    published = ROOT / "bench" / "studies" / "seed-table"
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "results.json").write_bytes((published / "results.json").read_bytes())
    for bad in ("-1", "0"):
        res = run_script("bench/study_report.py", str(copy), "--bootstrap", bad)
        assert res.returncode == 2 and res.stderr.strip().splitlines()[-1].endswith(
            f"error: --bootstrap must be in 1..10000000 (resamples), got {bad}")
    assert [p.name for p in copy.iterdir()] == ["results.json"]
    assert (copy / "results.json").read_bytes() == (published / "results.json").read_bytes()
    res = run_script("bench/sequential_design.py", "--looks", "2,3", "--family", "1" + "0" * 300)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines()[-1].endswith("error: --family must be in 1..1000000 (tests in the family), "
                                                        "got 1" + "0" * 300)


def test_a_study_command_out_of_range_or_a_damaged_definition_is_one_line_and_leaves_nothing(tmp_path: Path) -> None:
    """bench/study.py: seeds beyond any study, a non-ASCII digit in --only, a --merge folder that is no study, a
    family's design of the wrong types and a damaged study.json were tracebacks, or left a study folder and its lock
    behind; --score-only of a study never trained is refused as before, its folder not left behind either."""
    runs = tmp_path / "runs"
    base = ["--config", "configs/demo.yaml", "--grid", "model.attention_pe=none,rope", "--name", "g", "--steps", "10",
            "--runs", str(runs)]
    family = tmp_path / "family.json"
    cases = [(["--seeds", "100000000000", "--score-only"], "--seeds must be at most 10000, got 100000000000"),
             (["--only", "attention_pe=rope:\u00b2", "--train-only"], "the seed must be one of 1..3 (--seeds 3)"),
             (["--merge", str(tmp_path / "nowhere"), "--score-only"],
              f"--merge {tmp_path / 'nowhere'}: not a study folder (it has no runs/)"),
             (["--score-only"], "error: --score-only: 6 of 6 runs are not trained to the budget")]
    designs = (({"looks": [2, 4], "spending": {}}, "family.sequential.spending: {} is not one of: obf, pocock"),
               ({"looks": [2, 4], "beta": "abc"}, "family.sequential.beta: 'abc' is not a number"),
               ({"looks": [2, 4], "futility": "yes"}, "family.sequential.futility: 'yes' is not true or false"))
    for design, why in designs:
        cases.append((["--family", str(family), "--train-only", "--seeds", "4"], why))
        family.write_text(json.dumps({"declared": "before the runs", "sequential": design}))
        res = run_script("bench/study.py", *base, *cases[-1][0])
        assert res.returncode == 2 and "Traceback" not in res.stderr and why in res.stderr.strip().splitlines()[-1], \
            res.stderr[-2000:]
    # A decoding must be a test-time variant of the family of the trained system it names (not a trained system).
    family.write_text(json.dumps({"declared": "before the runs", "systems": ["attention_pe=rope"],
                                  "decodings": {"attention_pe=rope": "attention_pe=none"}}))
    res = run_script("bench/study.py", *base, "--family", str(family), "--train-only")
    assert res.returncode == 2 and res.stderr.strip().splitlines()[-1].endswith(
        "decodings: 'attention_pe=rope' -> 'attention_pe=none': a system of the family, a test-time decoding "
        "('label+tag') of the trained system it names, which is not the baseline"), res.stderr[-2000:]
    for flags, why in cases[:4]:
        res = run_script("bench/study.py", *base, *flags)
        assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
        assert why in res.stderr.strip().splitlines()[-1], (flags, res.stderr[-1000:])
        assert not runs.exists() or not any(runs.iterdir()), list(runs.rglob("*"))  # nothing made
    folder = runs / "study_g"
    folder.mkdir(parents=True)
    variants = [{"label": "attention_pe=none", "overrides": ["model.attention_pe=none"]},
                {"label": "attention_pe=rope", "overrides": [{}]}]
    damaged = (({"variants": variants, "steps": 10}, "its variants are not a list of label and overrides"),
               ({"variants": variants[:1], "steps": "abc"}, "its budget (steps, tokens) or seeds are not counts"))
    for spec, why in damaged:
        (folder / "study.json").write_text(json.dumps(spec))
        res = run_script("bench/study.py", *base, "--score-only")
        assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
        assert res.stderr.strip().splitlines()[-1] == f"error: {folder / 'study.json'}: {why}: not a study's definition"


def test_the_site_generator_says_one_line_for_a_damaged_results_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    from docs import generate, study_pages

    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "results.json").write_text('{"spec": {')
    monkeypatch.setattr(study_pages, "STUDIES", tmp_path)
    monkeypatch.setattr(generate, "GENERATORS", ("study_pages",))
    monkeypatch.setattr(sys, "argv", ["docs/generate.py", "--check"])
    assert generate.main() == 2
    assert capsys.readouterr().err == (f"error: {tmp_path / 'x' / 'results.json'}: truncated (Expecting property "
                                       "name enclosed in double quotes: line 1 column 11): not a study's results\n")


# ---------------------------------------------------------------------------------------------- grids and sets


def _main(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> str:
    """bench/study.py's refusal (ConfigError, one line) for ``args``, run in this process; nothing written."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "argv", ["bench/study.py", "--steps", "8", "--runs", str(tmp_path / "runs"),
                                      "--score-only", *args])
    with pytest.raises(ConfigError) as e:
        cli.main()
    assert not (tmp_path / "runs").exists()  # refused before anything ran
    return str(e.value)


def test_duplicate_variants_and_a_set_a_variant_overrides_are_refused_before_anything_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    grid = ("--config", "configs/demo.yaml", "--name", "g", "--set", "model.attention_pe=rope")
    assert _main(tmp_path, monkeypatch, *grid, "--grid", "model.rope.theta=1e4,1E4") == (
        "--grid: theta=1e4 and theta=1E4 are the same config once their values are read (as 1e4 and 1E4 are one "
        "number): the study would run it twice; give each value once")
    assert _main(tmp_path, monkeypatch, *grid, "--grid", "model.rope.theta=5e4,5e4") == \
        "--grid model.rope.theta=5e4,5e4: 5e4 given twice; each value once"
    assert _main(tmp_path, monkeypatch, *grid, "--grid", "model.attention_pe=none,alibi") == (
        "--set model.attention_pe=rope: --grid model.attention_pe sets it too, and would silently win in its runs; "
        "set each key in one place")
    with pytest.raises(ConfigError, match=r"^--set model.rope=\{theta: 5\}: --grid model.rope.theta sets it too"):
        check_sets(["model.rope={theta: 5}"], grid_variants(["model.rope.theta=1e4,5e4"]), grid=True)
    assert _main(tmp_path, monkeypatch, "--preset", "tokenization", "--set", "data.max_tokens=8000") == (
        "--set data.max_tokens=8000: the preset's variant unigram (data.max_tokens) sets it too, and would silently "
        "win in its runs; set each key in one place")
    assert _main(tmp_path, monkeypatch, *grid, "--grid", "model.rope.theta=1e4,5e4", "--test-variant",
                 "same:model.rope.scaling=none") == (
        "--test-variant: theta=1e4 and theta=1e4+same are the same config once their values are read (as 1e4 and 1E4 "
        "are one number): the study would run it twice; give each value once")
