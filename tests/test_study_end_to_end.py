"""bench/study.py end to end: a whole small study on the demo corpus (train, score, compare, report), run twice to
show it is idempotent, once more after a killed run to show it resumes, with linked runs and study_replay.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, run_script, run_study

from utils.config import ConfigError  # noqa: E402
from utils.run.checkpoint import load_checkpoint  # noqa: E402
from utils.study.files import slug
from utils.study.runs import scored_step


def test_a_small_study_end_to_end_idempotent_and_resumable(tmp_path: Path, study_in_process: None) -> None:
    root = tmp_path / "study_t"
    # A run stopped after its first checkpoint, 4 of the 8 steps done: what a study killed mid-run leaves
    # (train.py writes last.pt when a signal stops it; tests/test_training.py checks that).
    killed = root / "runs" / slug("attention_pe=rope") / "seed2"
    pre = run_script("train.py", "--config", "configs/demo.yaml", "--runs", str(killed), "--set",
                     "model.attention_pe=rope", "--set", "model.input_pe=none", "--set", "seed=2", "--set",
                     f"data.cache_dir={tmp_path / 'c'}", "--set", "model.d_model=32", "--set", "model.d_ff=64", "--set",
                     "model.encoder_layers=1", "--set", "model.decoder_layers=1", "--set",
                     "train.valid_bleu_sentences=6", "--set", "train.max_steps=4", "--set", "train.eval_every=4")
    assert pre.returncode == 0, pre.stderr
    # --score-only scores what a pinned worktree trained: with runs short of the budget it trains nothing.
    refused = run_study(tmp_path, *LINEAR, "--score-only")
    assert refused.returncode == 2 and [x for x in refused.stderr.splitlines() if "Traceback" in x or "error" in x] == [
        "error: --score-only: 4 of 4 runs are not trained to the budget (attention_pe=none seed 1, attention_pe=none "
        "seed 2, attention_pe=rope seed 1, attention_pe=rope seed 2); nothing was trained or scored: train them "
        "first (--train-only)"]
    assert not (root / "study.json").exists() and len(list(root.glob("runs/*/seed*/demo_2*"))) == 1
    # A run another process still trains is refused at once, not waited for (it could take hours).
    from utils.run.store import lock_run, unlock_run

    training = next(killed.glob("demo_2*"))
    lock_run(training)
    try:
        busy = run_study(tmp_path, *LINEAR, "--score-only", process=True)
    finally:
        unlock_run(training)
    assert busy.returncode == 2 and f"attention_pe=rope seed 2 (pid {os.getpid()} trains it)" in busy.stderr
    assert "waiting for pid" not in busy.stdout
    res = run_study(tmp_path, *LINEAR)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "4 runs, 0 trained, 4 to train" in res.stdout and f"study t: report in {root / 'report.md'}" in res.stdout
    runs = sorted(p for p in root.glob("runs/*/seed*/demo_2*"))
    assert len(runs) == 4  # the killed run was resumed in place, not started again
    for run in runs:
        assert load_checkpoint(run / "checkpoints" / "last.pt")["trainer"]["iteration"] == 8
        assert all((run / "eval" / f"test.best.beam{b}.n12.json").is_file() for b in (5, 1))

    results = json.loads((root / "results.json").read_text())
    assert results["baseline"] == "attention_pe=none" and results["seeds"] == [1, 2]
    # What the runs cost: both segments of the resumed run, and each run's score files of its scored step.
    from utils.study.cost import training_segments

    compute = results["compute"]
    assert set(compute["runs"]) == {f"attention_pe={pe} seed {k}" for pe in ("none", "rope") for k in (1, 2)}
    resumed = compute["runs"]["attention_pe=rope seed 2"]
    segments = training_segments(next(killed.glob("demo_2*")).joinpath("train.log").read_text())
    assert resumed["segments"] == len(segments) == 2 and all(s["device"] == "cpu" and s["threads"] for s in segments)
    assert resumed["train_cpu_s"] == pytest.approx(
        sum((s["train_seconds"] + s["eval_seconds"]) * s["threads"] for s in segments), abs=0.01)
    for cost in compute["runs"].values():  # beam 5 and greedy, of the run and of its test variant (+linear)
        assert cost["score_files"] == 4 and cost["decode_cpu_s"] > 0 and cost["train_gpu_s"] == 0
    assert compute["total"]["train_cpu_hours"] == pytest.approx(
        sum(r["train_cpu_s"] for r in compute["runs"].values()) / 3600, abs=0.001)
    assert "## Compute" in (root / "report.md").read_text()
    rope = results["systems"]["attention_pe=rope"]["splits"]["test"]["beam5"]
    assert len(rope["bleu"]) == 2 and rope["bleu_mean_std"][0] == pytest.approx(sum(rope["bleu"]) / 2)
    one = json.loads(next(p for p in runs if "rope" in str(p) and "seed1" in str(p)).joinpath(
        "eval", "test.best.beam5.n12.json").read_text())
    assert rope["bleu"][0] == pytest.approx(one["bleu"])  # the report's numbers are test.py's
    scored = next(p for p in runs if "rope" in str(p) and "seed1" in str(p))
    assert one["step"] == load_checkpoint(scored / "checkpoints" / "best.pt")["trainer"]["iteration"]
    # --checkpoint last scores exactly the budget's model: a run past it (or short of it) is refused.
    assert scored_step(scored, "last", 8) == 8 and scored_step(scored, "best", 4) == one["step"]
    with pytest.raises(ConfigError, match=r"last.pt is at step 8, not the study's budget of 4: not the model"):
        scored_step(scored, "last", 4)
    # The primary family (the default: every system against the baseline, chrF, beam 5), seeds as blocks.
    primary = results["primary"]
    tests = {t["system"]: t for t in primary["tests"]}
    assert set(tests) == {"attention_pe=rope", "attention_pe=rope+linear", "attention_pe=none+linear"}
    assert primary["size"] == 3 and primary["bootstrap_available"]
    rope_test = tests["attention_pe=rope"]
    base_chrf = results["systems"]["attention_pe=none"]["splits"]["test"]["beam5"]["chrf"]
    assert rope_test["per_seed_delta"] == pytest.approx([r - b for r, b in zip(rope["chrf"], base_chrf, strict=True)])
    assert rope_test["seed_test"]["test"] == "blocked ANOVA contrast" and rope_test["seed_test"]["df"] == 3
    assert rope_test["bootstrap"]["delta"] == pytest.approx(rope_test["delta"])  # one quantity for both tests
    assert rope_test["bootstrap"]["samples"] == 100 and 0 < rope_test["bootstrap"]["p_value"] <= 1
    att = results["systems"]["attention_pe=rope"]["attention"][0]
    assert att["sentences"] == 6 and len(att["stats"]["cross"]["diagonal"]) == 1  # 1 decoder layer
    buckets = rope["by_source_length"]
    assert sum(b["n"] for b in buckets) == 12 and all(len(b["bleu"]) == 2 for b in buckets if b["n"])
    assert results["length_unit"] == "bpe tokens of attention_pe=none's tokenizer"

    # The test-time variant: every variant's models scored again with linear RoPE scaling, compared with the
    # baseline and, paired over seeds, with themselves; the baseline's own (same models) only with itself.
    linear = results["systems"]["attention_pe=rope+linear"]
    assert linear["variant"] == "attention_pe=rope" and linear["test_variant"] == "linear"
    for run in (p for p in runs if "rope" in str(p)):
        scored = json.loads((run / "eval" / "test.best.beam5.n12.linear.json").read_text())
        assert scored["max_sentences"] == 12 and scored["n_sentences"] == 12
        assert scored["overrides"] == LINEAR[1].split(":")[1].split(",")
    assert linear["splits"]["test"]["beam5"]["bleu"][0] == pytest.approx(json.loads(next(
        p for p in runs if "rope" in str(p) and "seed1" in str(p)).joinpath(
        "eval", "test.best.beam5.n12.linear.json").read_text())["bleu"])
    keys = {(t["system"], t["against"], t["label"]) for t in primary["tests"]}  # each contrast tested once
    assert keys and not keys & {(t["system"], t["against"], t["label"]) for t in results["exploratory"]}
    own = [t for t in results["exploratory"] if t["system"] == "attention_pe=rope+linear"
           and t["against"] == "attention_pe=rope"]
    assert len(own) == 1 and own[0]["seed_test"]["df"] == 1  # the same models: the paired t-test
    assert own[0]["delta"] == pytest.approx(
        sum(linear["splits"]["test"]["beam5"]["chrf"]) / 2 - sum(rope["chrf"]) / 2)

    # Every number can be recomputed from the published hypotheses: the p-value of the first primary test
    # from sacreBLEU's chrF of each seed's published output, and the whole report by study_report.py.
    from sacrebleu.metrics import BLEU, CHRF

    from utils.study.report import read_hypotheses
    from utils.study.stats import blocked_anova

    names = list(results["systems"])
    hyps = read_hypotheses(root / "hypotheses", names, [1, 2])
    refs = (ROOT / "data" / "demo" / "test.en").read_text(encoding="utf-8").splitlines()[:12]
    chrf = {n: [CHRF().corpus_score(h, [refs]).score for h in hyps[n]["test"]["beam5"]] for n in names}
    assert chrf["attention_pe=rope"] == pytest.approx(rope["chrf"])
    bleu = BLEU().corpus_score(hyps["attention_pe=rope"]["test"]["beam5"][0], [refs])
    assert rope["length_ratio"][0] == pytest.approx(bleu.sys_len / bleu.ref_len)  # output length: visible
    contrasts, _ = blocked_anova(chrf, "attention_pe=none")
    assert contrasts["attention_pe=rope"].p_value == pytest.approx(rope_test["seed_test"]["p_value"])
    again_report = run_script("bench/study_report.py", str(root))
    assert again_report.returncode == 0, again_report.stderr
    recomputed = {t["system"]: t for t in json.loads((root / "results.json").read_text())["primary"]["tests"]}
    assert recomputed["attention_pe=rope"]["bootstrap"]["p_value"] == rope_test["bootstrap"]["p_value"]
    assert recomputed["attention_pe=rope"]["seed_test"] == rope_test["seed_test"]

    report = (root / "report.md").read_text()
    assert "## Primary analysis" in report and "**0 of 3 resolved.**" in report or "of 3 resolved.**" in report
    assert "| system | quantity | Δ per seed | Δ mean | seed test p | p Holm | paired t p (Holm) | bootstrap 95 % CI " \
        "| bootstrap p | p Holm | len | resolved |" in report
    rope_row = next(line for line in report.splitlines() if line.startswith("| attention_pe=rope | chrF test (beam"))
    paired = rope_test["paired_t"]["p_value"]
    lens = [sum(results["systems"][n]["splits"]["test"]["beam5"]["length_ratio"]) / 2
            for n in ("attention_pe=rope", "attention_pe=none")]
    holm = recomputed["attention_pe=rope"]["paired_t"]["p_holm"]
    assert f"| {paired:.4f} ({holm:.4f}) |" in rope_row and rope_row.endswith(f"| {lens[0]:.2f} / {lens[1]:.2f} | no |")
    for heading in ("## chrF by source length, beam 5 (exploratory", "## BLEU by source length, beam 5 (exploratory",
                    "## BLEU, beam 5 (secondary, exploratory; each seed)"):
        assert heading in report, heading
    from utils.study.sections import primary_lines

    newcomers = {**results, "primary": {**primary, "family": {**primary["family"], "declared": "exploratory: x"}}}
    assert primary_lines(newcomers)[0] == "## Main analysis (exploratory)"
    assert primary_lines(results)[0] == "## Primary analysis"
    assert "| attention_pe=rope | chrF test (beam 5) |" in report and "Power (noncentral t" in report
    att_row = next(line for line in report.splitlines() if line.startswith("| attention_pe=rope | ") and "(p " in line)
    assert att_row.count("(p ") == 7 and "p: paired t-test over seeds against attention_pe=none" in report
    assert "## Exploratory tests" in report and "| attention_pe=rope+linear | attention_pe=rope |" in report
    assert "chrF `nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|" in report and " · len " in report
    for fig in ("primary_contrasts.png", "valid_bleu.png", "attention_encoder.png", "attention_cross.png"):
        assert (root / "figures" / fig).stat().st_size > 1000, fig
    tb = {p.parent.name: p.parent for p in (root / "tb").glob("*/events.out.tfevents.*")}
    assert len(tb) == 8  # HParams, one per run and test variant
    hparams = _hparams(tb["attention_pe=rope_seed1"])
    assert hparams["variant"] == "attention_pe=rope" and hparams["seed"] == 1.0
    assert hparams["test/test/bleu_beam5"] == pytest.approx(rope["bleu"][0])
    assert hparams["test/test/chrf_beam5"] == pytest.approx(rope["chrf"][0])

    # A study run is a normal run directory: visualize.py draws its attention as for any other.
    vis = run_script("visualize.py", "--model_path", str(runs[0]), "--src_text", "Le chat dort.", "--out",
                     str(tmp_path / "vis"))
    assert vis.returncode == 0, vis.stderr
    assert (tmp_path / "vis" / "attention_cross_layer_0.png").stat().st_size > 1000

    again = run_study(tmp_path, *LINEAR, "--score-only")
    assert again.returncode == 0 and "4 runs, 4 trained, 0 to train" in again.stdout
    assert "  test " not in again.stdout  # every evaluation was already there
    assert sorted(p for p in root.glob("runs/*/seed*/demo_2*")) == runs

    # Scored from its score files alone: a copy of study t without checkpoints or attention statistics (deleted
    # to save disk, or runs fetched from another machine without their weights) is reported again, beam 5 only
    # (--decoders) on the splits asked (--splits); nothing is deleted, nothing decoded, and the report says what
    # it lacks. A decoder whose scores are missing there is refused in one line.
    bare = tmp_path / "bare"
    shutil.copytree(root, bare / "study_t", symlinks=True, ignore=shutil.ignore_patterns("*.pt", "attention_stats.*"))
    partial = run_study(bare, *LINEAR, "--score-only", "--decoders", "beam5", "--splits", "test", cache=tmp_path / "c")
    assert partial.returncode == 0, partial.stdout + partial.stderr
    assert "  test " not in partial.stdout and "no checkpoint, so no attention statistics" in partial.stdout
    assert len(list(bare.glob("study_t/runs/*/seed*/demo_2*/eval/test.best.beam5.n12.json"))) == 4  # all kept
    part = json.loads((bare / "study_t" / "results.json").read_text())
    assert part["decoders"] == ["beam5"] and part["spec"]["decoders"] == ["beam5"] and part["splits"] == ["test"]
    assert set(part["systems"]["attention_pe=rope"]["splits"]["test"]) == {"beam5"}
    assert not any("attention" in e for e in part["systems"].values()) and part["attention_tests"] == {}
    assert part["systems"]["attention_pe=rope"]["splits"]["test"]["beam5"]["chrf"] == rope["chrf"]
    assert [t["seed_test"] for t in part["primary"]["tests"]] == [t["seed_test"] for t in primary["tests"]]
    text = (bare / "study_t" / "report.md").read_text()
    assert "Scored on part of the study's sets or decoders: test; beam5." in text and "greedy" not in text
    assert "Attention statistics: not computed for attention_pe=none, attention_pe=rope" in text
    assert not list((bare / "study_t" / "figures").glob("attention_*.png"))
    # A family declared in a file (--family, as a pre-registration commits it) replaces the default one: here a
    # group-sequential design, reported at the look 2 seeds make with the alpha spent so far.
    declared = tmp_path / "family.json"
    family = {"splits": ["test"], "systems": ["attention_pe=rope"], "smallest_effect": 2.0,
              "declared": "declared in this test before scoring",
              "sequential": {"looks": [2, 4], "spending": "obf", "futility": True, "residual_sd": 1.0}}
    declared.write_text(json.dumps(family))
    looked = run_study(bare, *LINEAR, "--score-only", "--decoders", "beam5", "--splits", "test", "--family",
                       str(declared), cache=tmp_path / "c")
    assert looked.returncode == 0, looked.stdout + looked.stderr
    seq = json.loads((bare / "study_t" / "results.json").read_text())["primary"]
    assert seq["family"]["declared"] == "declared in this test before scoring" and seq["size"] == 1
    assert seq["family"]["sequential"]["looks"] == [2, 4] and seq["family"]["smallest_effect"] == 2.0
    assert (seq["design"]["kind"], seq["design"]["look"], seq["design"]["of"]) == ("group-sequential", 1, 2)
    assert 0 < seq["design"]["alpha_spent"] < 0.05 / 4  # O'Brien-Fleming spends little at half the information
    (test,) = seq["tests"]
    assert test["system"] == "attention_pe=rope" and test["sequential"]["step"] == 1
    assert test["sequential"]["crossed"] == (test["seed_test"]["p_value"] <= test["sequential"]["boundary_p"])
    assert "**This is look 1 of 2**, at 2 seeds per system" in (bare / "study_t" / "report.md").read_text()
    for wrong, said in ((family | {"systems": ["attention_pe=alibi"]}, "system 'attention_pe=alibi' is not a variant"),
                        (family | {"systems": ["attention_pe=none"]}, "system 'attention_pe=none' is the baseline"),
                        ({k: v for k, v in family.items() if k != "declared"}, "'declared' is required"),
                        (family | {"power": 0.8}, "unknown key 'power'"), (family | {"splits": ["dev"]},
                                                                         "the primary family needs dev too")):
        declared.write_text(json.dumps(wrong))
        refused = run_study(bare, *LINEAR, "--score-only", "--decoders", "beam5", "--splits", "test", "--family",
                            str(declared), cache=tmp_path / "c")
        assert refused.returncode == 2 and said in refused.stderr.strip().splitlines()[-1], refused.stderr
        assert "Traceback" not in refused.stderr
    assert json.loads((bare / "study_t" / "results.json").read_text())["primary"] == seq  # nothing rewritten
    for greedy in bare.glob("study_t/runs/attention_pe_none/seed1/demo_2*/eval/test.best.beam1.n12.json"):
        greedy.unlink()
    lacking = run_study(bare, *LINEAR, "--score-only", cache=tmp_path / "c")
    assert lacking.returncode == 2 and "  test " not in lacking.stdout
    assert lacking.stderr.strip().splitlines()[-1].endswith(
        "its best checkpoint is gone and beam 1 is not scored on every one of test: nothing was scored")
    no_beam = run_study(bare, *LINEAR, "--score-only", "--decoders", "greedy", cache=tmp_path / "c")
    assert no_beam.returncode == 2 and "beam5 is needed" in no_beam.stderr
    raised = run_study(bare, *LINEAR, "--steps", "12", "--train-only", cache=tmp_path / "c")  # weights gone
    assert raised.returncode == 2 and "  train " not in raised.stdout
    assert raised.stderr.strip().splitlines()[-1].endswith(
        "its checkpoints are gone and it is short of the budget: it cannot be trained on; nothing was trained or "
        "scored")

    # Another study in the same runs folder, sweeping tokenization: its bpe variant has exactly the config of
    # study t's attention_pe=none, so those runs are linked, not trained; char is trained.
    other = run_study(tmp_path, "--set", "model.attention_pe=none", grid="tokenizer.type=bpe,char", name="u")
    assert other.returncode == 0, other.stdout + other.stderr
    assert "4 runs, 2 trained, 2 to train" in other.stdout and "train type=bpe" not in other.stdout
    for seed in (1, 2):
        linked = tmp_path / "study_u" / "runs" / slug("type=bpe") / f"seed{seed}"
        assert linked.is_symlink()
        assert linked.resolve() == (root / "runs" / slug("attention_pe=none") / f"seed{seed}").resolve()
    results = json.loads((tmp_path / "study_u" / "results.json").read_text())
    assert results["baseline"] == "type=bpe" and results["length_unit"] == "bpe tokens of type=bpe's tokenizer"
    # BLEU by length buckets the same sentences for every system, whatever its own tokenizer counts.
    counts = {name: [b["n"] for b in entry["splits"]["test"]["beam5"]["by_source_length"]]
              for name, entry in results["systems"].items()}
    assert counts["type=char"] == counts["type=bpe"], counts
    char_run = next((tmp_path / "study_u" / "runs" / "type_char" / "seed1").glob("demo_2*"))
    own_counts = [b["n"] for b in json.loads((char_run / "eval" / "test.best.beam5.n12.json").read_text())[
        "by_source_length"]]
    assert own_counts != counts["type=bpe"]  # test.py alone counts characters there
    assert sorted(p for p in root.glob("runs/*/seed*/demo_2*")) == runs  # nothing of study t was redone

    # --no-link: the same config trained again in this study (e.g. a baseline for runs of a newer commit).
    fresh = run_study(tmp_path, "--set", "model.attention_pe=none", "--no-link", "--train-only", "--seeds", "1",
                      grid="tokenizer.type=bpe", name="v")
    assert fresh.returncode == 0, fresh.stdout + fresh.stderr
    assert "1 runs, 0 trained, 1 to train" in fresh.stdout and "linked" not in fresh.stdout
    own = tmp_path / "study_v" / "runs" / slug("type=bpe") / "seed1"
    assert not own.is_symlink() and len(list(own.glob("demo_2*/checkpoints/last.pt"))) == 1

    # A run trained past the budget is not the model the study declares: refused before anything is written.
    past = run_script("train.py", "--resume", str(runs[0]), "--set", "train.max_steps=10")
    assert past.returncode == 0, past.stderr
    spec = (root / "study.json").read_text()
    refused = run_study(tmp_path, *LINEAR, "--score-only", "--checkpoint", "last")
    assert refused.returncode == 2 and "test " not in refused.stdout
    assert refused.stderr.strip().splitlines()[-1] == (
        f"error: {runs[0] / 'checkpoints' / 'last.pt'} is at step 10, not the study's budget of 8: not the model "
        "this study scores")
    assert (root / "study.json").read_text() == spec

    # bench/study_replay.py: do retrained runs repeat a published study? Study t against its own published folder
    # is identical; a changed published value is a difference (exit 1). (The real check: the extrapolation
    # study's runs trained again on a new machine; a seed repeating a CPU run: tests/test_training.py.)
    published = tmp_path / "published"
    shutil.copytree(root, published, ignore=shutil.ignore_patterns("runs", "tb", "figures"))
    itself = replay(published, root)
    assert itself.returncode == 0, itself.stdout + itself.stderr
    assert itself.stdout.splitlines()[-1] == f"replay of {published}: every compared value identical"
    assert sorted(itself.stdout.splitlines()[:-1]) == [
        f"attention_pe={pe} seed {s}: validation BLEU 2 of 2 evaluations identical; hypotheses 2 of 2 split/decoder "
        "outputs identical" for pe in ("none", "rope") for s in (1, 2)]
    changed = {k: v for k, v in json.loads((published / "results.json").read_text()).items()
               if k not in ("checksums", "sha256")}  # as published before checksums: its edits below are not refused
    curve = changed["systems"]["attention_pe=rope"]["valid_bleu"][1]  # seed 2
    curve[-1][1] += 1e-9  # one evaluation off by one part in a billion
    other = changed["systems"]["attention_pe=none"]["valid_bleu"][1]
    other.insert(1, [6, other[0][1]])  # a published evaluation the retrained run lacks (e.g. its event lost)
    (published / "results.json").write_text(json.dumps(changed))
    import lzma

    hyp = published / "hypotheses" / "attention_pe=none.seed1.json.xz"
    doc = json.loads(lzma.decompress(hyp.read_bytes()))
    doc["test"]["greedy"][0] += " x"
    hyp.write_bytes(lzma.compress(json.dumps(doc).encode()))
    differs = replay(published, root)
    assert differs.returncode == 1 and differs.stdout.splitlines()[-1] == f"replay of {published}: DIFFERS"
    assert f"attention_pe=rope seed 2: validation BLEU 1 of 2 evaluations identical (differs at steps {curve[-1][0]})" \
        in differs.stdout
    assert "attention_pe=none seed 1: validation BLEU 2 of 2 evaluations identical; hypotheses 1 of 2 split/decoder " \
        "outputs identical (differ: test/greedy)" in differs.stdout.splitlines()
    assert "attention_pe=none seed 2: validation BLEU 2 of 3 evaluations identical (no value at steps 6); " \
        "hypotheses 2 of 2 split/decoder outputs identical" in differs.stdout.splitlines()
    changed["spec"]["steps"] = 4  # published at another budget: hypotheses scored at 8 steps are not compared
    (published / "results.json").write_text(json.dumps(changed))
    assert "attention_pe=none seed 1: validation BLEU 2 of 2 evaluations identical; hypotheses not compared " \
        "(scored at step 8, published at 4)" in replay(published, root).stdout.splitlines()


def replay(published: Path, *studies: Path) -> subprocess.CompletedProcess[str]:
    return run_script("bench/study_replay.py", str(published), *map(str, studies))


LINEAR = ("--test-variant", "linear:model.rope.scaling=linear,model.rope.factor=2,model.rope.original_max_len=8")


def _hparams(logdir: Path) -> dict[str, Any]:
    """The hyperparameters and metrics one HParams summary in ``logdir`` records."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    ea = EventAccumulator(str(logdir))
    ea.Reload()
    content = ea.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    out: dict[str, Any] = {}
    for key, value in start.session_start_info.hparams.items():
        kind = value.WhichOneof("kind")
        out[key] = getattr(value, kind)
    for tag in ea.Tags()["scalars"]:
        out[tag] = ea.Scalars(tag)[-1].value
    return out
