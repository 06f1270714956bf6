"""bench/study.py: grids and presets, and a whole small study on the demo corpus (train, score, compare,
report), run twice to show it is idempotent and once more after a killed run to show it resumes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, run_script, run_study

from utils.config import ConfigError, load_config
from utils.study.files import slug
from utils.study.linking import linked_elsewhere
from utils.study.plan import Job, budget_overrides, run_commands, train_command
from utils.study.presets import presets
from utils.study.runs import (
    attention_file,
    checkpoint_step,
    eval_current,
    file_tag,
    find_run,
    read_attention,
    recorded_step,
)
from utils.study.spec import (
    Variant,
    add_test_variants,
    grid_labels,
    grid_variants,
    inference_only,
    merge_spec,
    recorded_labels,
    select_variants,
)


def test_grid_is_the_cross_product_of_its_axes() -> None:
    variants = grid_variants(["model.attention_pe=none,rope", "model.input_pe=sinusoidal,none"])
    assert [v.label for v in variants] == ["attention_pe=none,input_pe=sinusoidal", "attention_pe=none,input_pe=none",
                                           "attention_pe=rope,input_pe=sinusoidal", "attention_pe=rope,input_pe=none"]
    assert variants[2].overrides == ["model.attention_pe=rope", "model.input_pe=sinusoidal"]
    with pytest.raises(ConfigError, match="expected KEY=V1,V2"):
        grid_variants(["model.attention_pe"])


def test_grid_labels_of_per_stack_keys_name_the_stack() -> None:
    variants = grid_variants(["model.encoder_pe.attention=rope,alibi", "model.decoder_pe.attention=none"])
    assert [v.label for v in variants] == ["encoder_pe.attention=rope,decoder_pe.attention=none",
                                           "encoder_pe.attention=alibi,decoder_pe.attention=none"]
    assert [v.label for v in grid_variants(["model.decoder_pe.input=sinusoidal"])] == \
        ["decoder_pe.input=sinusoidal"]  # alone too: "input=sinusoidal" would not say which stack
    assert grid_labels(["model.rope.factor", "model.fire.factor", "seed"]) == {
        "model.rope.factor": "rope.factor", "model.fire.factor": "fire.factor", "seed": "seed"}
    for bad in (["model.attention_pe=,"], ["model.attention_pe=rope", "model.attention_pe=alibi"]):
        with pytest.raises(ConfigError, match=r"expected KEY=V1,V2|is given twice: put all its values in one"):
            grid_variants(bad)


def test_a_grid_study_recorded_with_older_labels_resumes_under_them(tmp_path: Path) -> None:
    """A study.json an earlier version wrote labelled per-stack axes by the last key part (its run folders are named
    so): the same grid resumes under those labels instead of being refused as another study."""
    grid = "model.encoder_pe.attention=none,rope"
    sets = ["model.input_pe=none", f"data.cache_dir={tmp_path / 'c'}", "model.d_model=32", "model.d_ff=64",
            "model.encoder_layers=1", "model.decoder_layers=1", "train.valid_bleu_sentences=6"]
    old = {"config": "configs/demo.yaml", "tokens": None, "overrides": sets, "steps": 8,
           "variants": [{"label": f"attention={v}", "overrides": [f"model.encoder_pe.attention={v}"], "tests": {}}
                        for v in ("none", "rope")]}
    (tmp_path / "study_old").mkdir()
    (tmp_path / "study_old" / "study.json").write_text(json.dumps(old))
    res = run_study(tmp_path, "--score-only", grid=grid, name="old")
    assert res.returncode == 2 and "holds a study with other variants" not in res.stderr
    assert "(attention=none seed 1, attention=none seed 2, attention=rope seed 1, attention=rope seed 2)" in res.stderr
    assert [v.label for v in recorded_labels(grid_variants([grid]), {})] == [
        "encoder_pe.attention=none", "encoder_pe.attention=rope"]  # a new study: the new labels


def test_every_preset_variant_is_a_valid_config() -> None:
    shipped = presets()
    assert set(shipped) == {"seed-table", "all-encodings", "train-short-test-long", "train-natural-test-long",
                            "tokenization"}
    assert [v.label for v in shipped["seed-table"].variants] == ["sinusoidal", "learnable", "rope"]
    # named one by one in bench/study.py, not read from the registry: an encoding registered later joins no preset
    assert [v.label for v in shipped["all-encodings"].variants] == [
        "none", "sinusoidal", "learnable", "learnable_ln", "onehot", "gaussian", "binary", "rope", "alibi", "t5",
        "shaw", "kerple_log", "kerple_power", "sandwich", "fire", "dpb", "decoder-nope", "decoder-cope",
        "decoder-xpos", "sinusoidal+shape"]
    assert [v.label for v in shipped["train-short-test-long"].variants] == [
        "sinusoidal", "learnable", "alibi", "t5", "rope", "kerple_log", "kerple_power", "sandwich", "fire", "dpb",
        "decoder-nope", "decoder-cope", "decoder-xpos", "sinusoidal+shape"]  # the pre-registered five first
    for name, preset in shipped.items():
        labels = [v.label for v in preset.variants]
        assert preset.baseline in labels, name
        for v in preset.variants:
            cfg = load_config(ROOT / preset.config, v.overrides)
            for tag, extra in v.tests.items():
                inference_only(cfg, load_config(ROOT / preset.config, [*v.overrides, *extra]), tag)
            if name == "train-short-test-long":
                assert cfg.data.max_train_len == 16
    # Tokenizations: the same sentences per step, peak lr and warmup steps, each in its own tokens.
    tok = {v.label: load_config(ROOT / shipped["tokenization"].config, v.overrides) for v in
           shipped["tokenization"].variants}
    assert tok["char"].data.max_tokens == 4 * tok["bpe"].data.max_tokens == 16384
    for cfg in tok.values():
        assert cfg.train.lr_batch_tokens / cfg.data.max_tokens == pytest.approx(3500 / 4096, rel=1e-3)
        assert cfg.train.warmup_tokens / cfg.data.max_tokens == pytest.approx(750_000 / 4096, rel=1e-3)
    rope = next(v for v in shipped["train-short-test-long"].variants if v.label == "rope")
    assert set(rope.tests) == {"linear", "ntk", "yarn"}


def test_budget_never_uses_wall_time_or_early_stopping() -> None:
    sets = dict(s.split("=", 1) for s in budget_overrides(1500, None, 300))
    assert sets["train.max_minutes"] == "null" and sets["train.max_steps"] == "1500"
    assert sets["train.max_target_tokens"] == "null" and int(sets["train.patience"]) >= 10**6
    assert dict(s.split("=", 1) for s in budget_overrides(None, 10**6, 300))["train.max_target_tokens"] == \
        "1000000"


def _systems() -> tuple[list[str], list[str], list[str]]:
    refs = (ROOT / "data" / "demo" / "test.en").read_text(encoding="utf-8").splitlines()
    base = [" ".join(r.split()[:-1]) if i % 2 else r for i, r in enumerate(refs)]  # last word dropped, every other
    system = [" ".join(r.split()[1:]) if i % 3 == 0 else r for i, r in enumerate(refs)]
    return refs, base, system


def test_half_width_is_the_t_interval_of_the_mean_over_seeds() -> None:
    from utils.study.figures import half_width

    assert half_width(1.0, 3) == pytest.approx(4.3027 / 3**0.5, abs=1e-4) and half_width(1.0, 1) == 0.0  # t_{.975,2}


def test_a_difference_is_resolved_only_when_both_tests_pass_holm_and_agree() -> None:
    """The primary family on per-seed scores: a consistent +3 under a seed effect resolves; a +3 carried by
    one seed does not; without hypotheses (no test-set bootstrap) nothing is called resolved."""
    from utils.study.analysis import Analysis, Family, primary

    scores = {"base": [20.0, 30.0, 25.0], "steady": [23.1, 32.9, 28.0], "lucky": [21.0, 29.5, 27.5],
              "same": [20.0, 30.0, 25.0]}
    table = {n: {"t": {"beam5": {"chrF": v, "BLEU": v}}} for n, v in scores.items()}
    out = primary(Analysis(table, None, "base", 100), Family(), list(scores), ["t"])
    tests = {t["system"]: t for t in out["tests"]}
    assert out["size"] == 3 and not out["bootstrap_available"] and out["resolved"] == 0
    assert tests["steady"]["seed_test"]["p_holm"] < 0.05 < tests["lucky"]["seed_test"]["p_holm"]
    assert tests["same"]["delta"] == 0 and tests["same"]["seed_test"]["p_value"] > 0.99
    assert out["anova"][0]["df"] == 6 and out["power"]["seeds"] == 3
    # Holm: the smallest p times 3, then the running maximum.
    raw = sorted(t["seed_test"]["p_value"] for t in out["tests"])
    assert min(t["seed_test"]["p_holm"] for t in out["tests"]) == pytest.approx(3 * raw[0])


def test_a_declared_contrast_is_tested_once_not_again_among_the_exploratory() -> None:
    """One test per quantity: chrF beam 5 of each system is the family's; the exploratory tests keep the rest
    (BLEU, greedy), each contrast once."""
    from utils.study.analysis import Analysis, Family, exploratory, primary

    scores = {"base": [20.0, 30.0, 25.0], "a": [23.1, 32.9, 28.0], "b": [21.0, 29.5, 27.5]}
    table = {n: {"t": {d: {"chrF": v, "BLEU": v} for d in ("beam5", "greedy")}} for n, v in scores.items()}
    analysis = Analysis(table, None, "base", 100)
    declared = primary(analysis, Family(), list(scores), ["t"])["tests"]
    rows = exploratory(analysis, list(scores), ["t"], Family(), None, None, declared)
    assert {(t["system"], t["label"]) for t in declared} == {("a", "chrF t (beam 5)"), ("b", "chrF t (beam 5)")}
    rest = (("BLEU", "beam 5"), ("chrF", "greedy"), ("BLEU", "greedy"))
    assert sorted((t["system"], t["label"]) for t in rows) == sorted(
        (s, f"{m} t ({d})") for s in ("a", "b") for m, d in rest)


def test_study_keys_cannot_be_set_and_the_variant_overrides_the_study_set(tmp_path: Path) -> None:
    job = Job(Variant("rope", ["model.attention_pe=rope"]), 2, tmp_path / "rope" / "seed2")
    cmd = train_command(job, "configs/demo.yaml", ["model.attention_pe=none", "model.d_model=32"],
                              ["train.max_steps=8"])
    sets = [cmd[i + 1] for i, x in enumerate(cmd) if x == "--set"]
    assert sets == ["model.attention_pe=none", "model.d_model=32", "model.attention_pe=rope", "seed=2",
                    "train.max_steps=8"]  # later --set wins: the variant, then the study's seed and budget
    res = run_script("bench/study.py", "--preset", "seed-table", "--steps", "8", "--set", "seed=7", "--runs",
                     str(tmp_path))
    assert res.returncode == 2 and "--set seed is decided by the study (--seeds)" in res.stderr
    assert "Traceback" not in res.stderr and not (tmp_path / "study_seed-table").exists()
    res = run_script("bench/study.py", "--config", "configs/demo.yaml", "--grid", "model.attention_pe=none,rope",
                     "--grid", "seed=1,2", "--steps", "8", "--name", "x", "--runs", str(tmp_path))
    assert res.returncode == 2 and "--grid seed is decided by the study (--seeds)" in res.stderr
    res = run_script("bench/study.py", "--preset", "tokenization", "--tokens", "1000000", "--runs", str(tmp_path))
    assert res.returncode == 2 and "--tokens counts each tokenizer's own tokens" in res.stderr
    res = run_script("bench/study.py", "--preset", "seed-table", "--steps", "0")
    assert res.returncode == 2 and "--steps must be >= 1, got 0" in res.stderr and "Traceback" not in res.stderr
    res = run_script("bench/study.py", "--preset", "seed-table", "--steps", "8", "--seeds", "1", "--runs",
                     str(tmp_path))
    assert res.returncode == 2 and "Traceback" not in res.stderr and not (tmp_path / "study_seed-table").exists()
    assert res.stderr.strip().splitlines()[-1].endswith(
        "error: scoring and the report need --seeds 2 or more (seeds are the blocks of every test); train a pilot "
        "with --train-only, or decode runs with --decode-only")


def test_python_m_utils_study_is_the_same_command_line_as_bench_study_py(tmp_path: Path) -> None:
    args = ["--preset", "seed-table", "--steps", "8", "--seeds", "1", "--runs", str(tmp_path)]
    module = subprocess.run([sys.executable, "-m", "utils.study", *args], cwd=ROOT, capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    script = run_script("bench/study.py", *args)
    assert module.returncode == script.returncode == 2 and "Traceback" not in module.stderr
    said = module.stderr.strip().splitlines()[-1]
    assert said.startswith("python -m utils.study: error: ") and said.endswith(
        script.stderr.strip().splitlines()[-1].removeprefix("study.py"))
    assert not (tmp_path / "study_seed-table").exists()
    helped = subprocess.run([sys.executable, "-m", "utils.study", "--help"], cwd=ROOT, capture_output=True,
                            text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert helped.returncode == 0 and "--preset" in helped.stdout and "--launcher" in helped.stdout


def test_a_run_without_a_resume_point_is_started_again(tmp_path: Path) -> None:
    root = tmp_path / "seed1"
    weights_only = root / "demo_20260101_000000"
    (weights_only / "checkpoints").mkdir(parents=True)
    (weights_only / "checkpoints" / "step_100.pt").write_bytes(b"weights")  # killed before last.pt was written
    resumable = root / "demo_20260101_000001"
    (resumable / "checkpoints").mkdir(parents=True)
    (resumable / "checkpoints" / "last.pt").write_bytes(b"state")
    assert find_run(root) == resumable
    assert not weights_only.exists()
    (resumable / "checkpoints" / "last.pt").unlink()
    (resumable / "checkpoints" / "step_1.pt").write_bytes(b"weights")
    assert find_run(root) is None and not resumable.exists()


def test_a_scored_run_without_checkpoints_is_kept_at_the_step_its_scores_record(tmp_path: Path) -> None:
    """A run whose checkpoints are gone (deleted after scoring, or fetched without its weights) is found, not
    removed, when it holds score files or its closing summary; its step is what every split's score file records
    (test.py's ``all.*`` summary of several splits, which records none at its top, is not one of them)."""
    scored = tmp_path / "seed1" / "demo_20260101_000000"
    (scored / "checkpoints").mkdir(parents=True)
    (scored / "eval").mkdir()
    for split in ("test", "test.x2"):
        (scored / "eval" / f"{split}.last.beam5.json").write_text(json.dumps({"step": 9, "bleu": 1.0}))
    (scored / "eval" / "all.last.beam5.json").write_text(json.dumps({"test": {"step": 9}, "test.x2": {"step": 9}}))
    assert find_run(tmp_path / "seed1") == scored and scored.is_dir()
    assert recorded_step(scored, "last") == 9 and checkpoint_step(scored, "last") == 9
    assert recorded_step(scored, "best") is None  # no score file of that checkpoint
    with pytest.raises(ConfigError, match="no such checkpoint, and no score file of it records its step"):
        checkpoint_step(scored, "best")
    (scored / "eval" / "test.x2.last.beam5.json").write_text(json.dumps({"step": 7}))
    assert recorded_step(scored, "last") is None  # files that disagree say no step
    summarised = tmp_path / "seed2" / "demo_20260101_000000"
    (summarised / "checkpoints").mkdir(parents=True)
    (summarised / "summary.json").write_text(json.dumps({"run_steps": 8}))
    assert find_run(tmp_path / "seed2") == summarised


def test_test_variants_name_a_variant_or_all_of_them() -> None:
    variants = grid_variants(["model.attention_pe=none,rope"])
    add_test_variants(variants, ["attention_pe=rope+linear:model.rope.scaling=linear, model.rope.factor=8",
                                       "b2:decode.lenpen=0.6"])
    assert variants[0].tests == {"b2": ["decode.lenpen=0.6"]}
    assert variants[1].tests == {"linear": ["model.rope.scaling=linear", "model.rope.factor=8"], "b2": [
        "decode.lenpen=0.6"]}
    for bad, message in (("rope+linear:model.rope.scaling=linear", "no variant 'rope'"),
                         ("linear", "expected [LABEL+]TAG:KEY=VALUE"), ("a b:x=1", "expected [LABEL+]TAG"),
                         ("b2:decode.lenpen=1.0", "already has a test variant 'b2'")):
        with pytest.raises(ConfigError, match=re.escape(message)):
            add_test_variants(variants, [bad])
    with pytest.raises(ConfigError, match=re.escape("two systems would share a name: a+b")):
        add_test_variants([Variant("a", []), Variant("a+b", [])], ["a+b:decode.lenpen=0.6"])
    demo = load_config(ROOT / "configs/demo.yaml")
    inference_only(demo, load_config(ROOT / "configs/demo.yaml", ["model.rope.scaling=linear"]), "x")
    with pytest.raises(ConfigError, match="model.d_model=64 but the checkpoint was trained with 128"):
        inference_only(demo, load_config(ROOT / "configs/demo.yaml", ["model.d_model=64"]), "x")
    with pytest.raises(ConfigError, match="--test-variant x changes data settings"):
        inference_only(demo, load_config(ROOT / "configs/demo.yaml", ["data.test=[validation]"]), "x")


def test_cached_scores_and_attention_are_reused_only_for_the_same_sentences_and_settings(tmp_path: Path) -> None:
    scores = tmp_path / "test.best.beam5.json"
    assert not eval_current(scores, 1670, [], 8)
    scores.write_text(json.dumps({"bleu": 1.0, "n_sentences": 1670, "step": 8}))  # no "overrides": none were set
    assert eval_current(scores, 1670, [], 8) and not eval_current(scores, 12, [], 8)
    assert not eval_current(scores, 1670, ["model.rope.scaling=linear"], 8)
    scores.write_text(json.dumps({"bleu": 1.0, "n_sentences": 12, "overrides": ["model.rope.factor=2"], "step": 8}))
    assert eval_current(scores, 12, ["model.rope.factor=2"], 8)
    assert not eval_current(scores, 12, ["model.rope.factor=8"], 8)  # the test variant changed: score again
    # Scores of another checkpoint (the run trained on after it was scored), or that do not say which: again.
    assert not eval_current(scores, 12, ["model.rope.factor=2"], 16)
    scores.write_text(json.dumps({"bleu": 1.0, "n_sentences": 12, "overrides": ["model.rope.factor=2"]}))
    assert not eval_current(scores, 12, ["model.rope.factor=2"], 8)
    # A study scoring the first N sentences keeps its files apart (also in runs it shares with another study).
    assert file_tag(None, None) is None and file_tag("linear", None) == "linear"
    assert file_tag(None, 12) == "n12" and file_tag("linear", 12) == "n12.linear"
    cached = attention_file(tmp_path, "best", 200)
    cached.parent.mkdir(parents=True, exist_ok=True)
    cached.write_text(json.dumps({"sentences": 200, "stats": {}}))
    assert read_attention(tmp_path, "best", 200) is not None
    assert read_attention(tmp_path, "best", 50) is None


def test_each_gpu_takes_the_next_run_as_soon_as_its_own_ends(tmp_path: Path) -> None:
    """Two runs at a time on two GPUs, one each: a GPU whose run ends takes the next at once."""
    job = ("import os, sys, time; print(os.environ['CUDA_VISIBLE_DEVICES'], time.time(), flush=True); "
           "time.sleep(float(sys.argv[1])); print(time.time())")
    logs = [tmp_path / f"{i}.log" for i in range(3)]
    run_commands([(f"job {i}", [sys.executable, "-c", job, str(t)], log)
                        for i, (t, log) in enumerate(zip((3.0, 0.2, 0.2), logs, strict=True))], devices=2, poll=0.05,
                 jobs=2)
    dev0, _, end0 = logs[0].read_text().split()
    dev2, start2, _ = logs[2].read_text().split()
    assert (dev0, logs[1].read_text().split()[0], dev2) == ("0", "1", "1")
    assert float(start2) < float(end0)  # job 2 ran on GPU 1 while GPU 0 was still busy with job 0
    with pytest.raises(SystemExit, match="job 1 failed"):
        run_commands([("job 0", [sys.executable, "-c", job, "30"], logs[0]),
                            ("job 1", [sys.executable, "-c", "raise SystemExit(3)"], logs[1])], devices=2, poll=0.05,
                     jobs=2)


def test_length_buckets_from_sentence_statistics_are_test_pys_scores_by_length() -> None:
    """The report's buckets sum each seed's sentence statistics; test.py's table scores the bucket's sentences
    with sacreBLEU: the same numbers, an empty bucket included."""
    from utils.study.analysis import metric_for
    from utils.study.report import bucket_index, length_buckets
    from utils.study.stats import sentence_stats
    from utils.translation.scoring import scores_by_length

    refs = ["the cat is on the mat", "a dog barks at noon", "it rains", "we walked home late last night", "yes"]
    hyps = [["the cat sat on the mat", "a dog barks", "it is raining", "we went home late", "yes"],
            ["cat on mat", "the dog barks at noon", "", "we walked home late last night", "no"]]
    lengths, edges = [7, 6, 3, 9, 1], [4, 8, 20]
    metrics = {"chrF": metric_for("chrF", False), "BLEU": metric_for("BLEU", False)}
    per = {m: [sentence_stats(metric, h, refs) for h in hyps] for m, metric in metrics.items()}
    rows = length_buckets(per, bucket_index(lengths, edges), metrics)
    expected = [scores_by_length(h, refs, lengths, edges) for h in hyps]
    assert [r["n"] for r in rows] == [2, 2, 1, 0] and rows[-1]["chrf_mean_std"] is None
    for i, row in enumerate(rows):
        assert row["bucket"] == expected[0][i]["bucket"] and row["n"] == expected[0][i]["n"]
        for metric in ("bleu", "chrf", "length_ratio"):
            assert row[metric] == [e[i][metric] for e in expected if e[i]["n"]]
    assert rows[0]["bleu_mean_std"][0] == pytest.approx(sum(rows[0]["bleu"]) / 2) and len(rows[2]["chrf"]) == 2


def test_a_study_budget_can_be_raised_never_lowered_and_the_raise_is_recorded(tmp_path: Path) -> None:
    base = {"variants": [{"label": "a", "overrides": ["x=1"]}], "config": "c.yaml", "tokens": None,
            "overrides": [], "steps": 900}
    raised = merge_spec(base, {**base, "steps": 1350}, tmp_path)
    assert raised["steps"] == 1350 and raised["budget_history"] == [900, 1350]
    again = merge_spec(raised, {**base, "steps": 1800}, tmp_path)
    assert again["budget_history"] == [900, 1350, 1800]
    assert merge_spec(again, {**base, "steps": 1800}, tmp_path)["budget_history"] == [900, 1350, 1800]
    with pytest.raises(ConfigError, match="can only be raised"):
        merge_spec(again, {**base, "steps": 900}, tmp_path)
    with pytest.raises(ConfigError, match="another overrides"):
        merge_spec(base, {**base, "overrides": ["y=2"]}, tmp_path)


def test_the_extrapolation_preset_is_the_pre_registered_design() -> None:
    """The pre-registration page and the preset say the same: systems, family, test sets, precision."""
    preset = presets()["train-short-test-long"]
    cfg = load_config(preset.config, preset.overrides)
    assert cfg.data.max_train_len == 16 and cfg.train.amp == "none" and not cfg.train.amp_cpu
    assert cfg.train.num_threads == 1
    assert {"test.tatoeba.x4", "test.multi30k-2016.x4", "test.tatoeba", "test.iwslt-tst2010"} <= set(cfg.data.test)
    family = preset.family
    rope = next(v for v in preset.variants if v.label == "rope")
    systems = [v.label for v in preset.variants] + [f"rope+{t}" for t in rope.tests]
    assert set(family["systems"]) <= set(systems) and "rope+linear" not in family["systems"]
    # the variants that joined after the pre-registration are outside its family
    assert not {"decoder-nope"} & set(family["systems"])
    assert len(family["systems"]) * (len(family["splits"]) + len(family["drops"])) == 24
    frozen = (ROOT / "docs" / "pages" / "studies" / "preregistration-extrapolation.md").read_text(encoding="utf-8")
    assert "24 tests, Holm at α = 0.05" in frozen and "Smallest effect of interest: 1.0 chrF" in frozen


def test_variants_select_part_of_a_preset_and_its_family() -> None:
    """--variants: the pre-registered report keeps its five trained systems when newer variants joined the preset."""
    preset = presets()["train-short-test-long"]
    variants, family = select_variants(preset, "learnable, rope,alibi")
    assert [v.label for v in variants] == ["sinusoidal", "learnable", "alibi", "rope"]  # the baseline always kept
    assert family["systems"] == ["learnable", "rope", "rope+ntk", "rope+yarn", "alibi"]
    assert family["metric"] == preset.family["metric"] and len(preset.family["systems"]) == 6  # preset untouched
    newcomers = select_variants(preset, "sinusoidal+shape,kerple_log,fire,decoder-nope")[1]
    assert newcomers["systems"] == [] and newcomers["declared"].startswith("exploratory: none of the preset's")
    assert family["declared"] == preset.family["declared"]  # the pre-registered selection keeps its declaration
    with pytest.raises(ConfigError, match=r"^--variants rpoe: not a variant; variants: sinusoidal, learnable, "):
        select_variants(preset, "rope,rpoe")
    res = run_script("bench/study.py", "--preset", "seed-table", "--steps", "10", "--variants", "nope")
    assert res.returncode == 2 and res.stderr.strip().splitlines()[-1].endswith(
        "--variants nope: not a variant; variants: sinusoidal, learnable, rope (preset seed-table)")


def test_the_pilot_rule_stops_at_the_first_budget_where_no_variant_still_gains() -> None:
    from bench.pilot_rule import verdict

    flat_late = {s: min(s / 60, 30.0) for s in range(150, 2251, 150)}  # +1 per 60 steps up to 1800, then flat
    flat_early = {s: min(s / 60, 20.0) for s in range(150, 2251, 150)}  # flat from 1200: gains 7.5, 5, 0
    assert verdict({"a": flat_early}, 900, 450, 1.0, 2250) == ("stop", 1800)
    assert verdict({"a": flat_early, "b": flat_late}, 900, 450, 1.0, 2250) == ("stop", 2250)  # 1800 still gained
    short = {"a": {s: v for s, v in flat_early.items() if s <= 900}, "b": flat_late}
    assert verdict(short, 900, 450, 1.0, 2250) == ("wait", 1350)  # a must train on to 1350
    assert verdict({"a": {150: 1.0}}, 900, 450, 1.0, 2250) == ("wait", 900)
    capped = {"a": {s: s / 10 for s in range(150, 2251, 150)}}
    assert verdict(capped, 900, 450, 1.0, 2250) == ("stop", 2250)  # never flat: the cap decides


def test_the_continuation_rule_reads_the_mean_of_the_seeds_at_the_steps_all_reached() -> None:
    """The continuation's rule: +450 from 2,250 while any encoding's seed-mean validation BLEU gains >= 1.0, cap 4,500;
    one seed's jump does not move the mean past the threshold, and a seed still training holds the decision."""
    from bench.pilot_rule import seed_mean, verdict

    flat = {s: 50.0 for s in range(1800, 4501, 150)}
    jumpy = {**flat, 2700: 52.5}  # one seed +2.5 at 2,700: the mean +0.83
    rising = {s: 40 + s / 300 for s in range(1800, 4501, 150)}  # +1.5 per 450 steps
    assert seed_mean([flat, jumpy, flat])[2700] == pytest.approx(50 + 2.5 / 3)
    assert verdict({"a": seed_mean([flat, jumpy, flat])}, 2700, 450, 1.0, 4500) == ("stop", 2700)
    assert verdict({"a": seed_mean([jumpy] * 3)}, 2700, 450, 1.0, 4500) == ("stop", 3150)  # all three: +2.5, raised
    assert verdict({"a": seed_mean([rising] * 3), "b": seed_mean([flat] * 3)}, 2250, 450, 1.0, 4500) == ("stop", 4500)
    training = {s: v for s, v in rising.items() if s <= 2700}
    assert sorted(seed_mean([rising, training, rising]))[-1] == 2700  # the mean only where every seed has a value
    assert verdict({"a": seed_mean([rising, training, rising])}, 2250, 450, 1.0, 4500) == ("wait", 3150)
    assert seed_mean([]) == {}


def test_cpu_jobs_run_side_by_side_each_with_its_share_of_the_cores(tmp_path: Path) -> None:
    job = ("import os, sys, time; print(os.environ.get('OMP_NUM_THREADS'), time.time(), flush=True); "
           "time.sleep(float(sys.argv[1])); print(time.time())")
    logs = [tmp_path / f"{i}.log" for i in range(3)]
    run_commands([(f"job {i}", [sys.executable, "-c", job, str(t)], log)
                        for i, (t, log) in enumerate(zip((3.0, 0.2, 0.2), logs, strict=True))], devices=0, poll=0.05,
                       jobs=2)
    threads0, _, end0 = logs[0].read_text().split()
    _, start2, _ = logs[2].read_text().split()
    import os

    assert threads0 == str(max(1, (os.cpu_count() or 1) // 2))
    assert float(start2) < float(end0)  # job 2 started while job 0 still ran


def test_the_contrasts_recorded_as_tested_elsewhere_cannot_change_on_resume(tmp_path: Path) -> None:
    """study.json says rope was tested in another study's family; nothing is linked now: refused in one line."""
    sets = ["model.input_pe=none", f"data.cache_dir={tmp_path / 'c'}", "model.d_model=32", "model.d_ff=64",
            "model.encoder_layers=1", "model.decoder_layers=1", "train.valid_bleu_sentences=6"]
    old = {"config": "configs/demo.yaml", "tokens": None, "overrides": sets, "steps": 8,
           "family": {"elsewhere": {"attention_pe=rope": "other"}},
           "variants": [{"label": f"attention_pe={v}", "overrides": [f"model.attention_pe={v}"], "tests": {}}
                        for v in ("none", "rope")]}
    (tmp_path / "study_t").mkdir()
    (tmp_path / "study_t" / "study.json").write_text(json.dumps(old))
    res = run_study(tmp_path, "--score-only")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines()[-1].endswith(
        "the contrasts tested in another study's family were {'attention_pe=rope': 'other'} and would now be none "
        "(a linked study was scored, removed or changed since): the family of these runs cannot change; use another "
        "--name")


def test_linked_runs_keep_the_family_of_the_study_they_come_from(tmp_path: Path) -> None:
    """all-encodings after seed-table: learnable's and the baseline's runs are linked (relative links, as
    shared_run makes them) from seed-table, whose scored family tests learnable and learnable+ntk against
    sinusoidal; alibi is trained here. Only learnable (and its identical test variant) is tested elsewhere, and only
    while the baseline comes from the same study, whose results exist, with the same endpoint and scoring."""
    ntk = ["model.rope.scaling=ntk"]
    seed_table = tmp_path / "study_seed-table"
    seed_table.mkdir()
    labels = ["sinusoidal", "learnable", "rope"]
    spec = {"baseline": "sinusoidal", "family": {}, "checkpoint": "best", "max_sentences": None,
            "variants": [{"label": x, "overrides": [], "tests": {"ntk": ntk} if x == "learnable" else {}}
                         for x in labels]}
    (seed_table / "study.json").write_text(json.dumps(spec))
    tests = [{"system": x, "against": "sinusoidal"} for x in ("learnable", "learnable+ntk", "rope")]
    (seed_table / "results.json").write_text(json.dumps({"primary": {"tests": tests}}))
    for label in labels:
        for seed in (1, 2):
            (seed_table / "runs" / slug(label) / f"seed{seed}").mkdir(parents=True)
    here = tmp_path / "study_all"
    variants = {"sinusoidal": Variant("sinusoidal", []),
                "learnable": Variant("learnable", [], {"ntk": ntk}), "alibi": Variant("alibi", [])}
    jobs = [Job(v, seed, here / "runs" / slug(label) / f"seed{seed}")
            for label, v in variants.items() for seed in (1, 2)]
    for job in jobs:
        job.root.parent.mkdir(parents=True, exist_ok=True)
        if job.variant.label == "alibi":
            job.root.mkdir()
        else:
            target = seed_table / "runs" / slug(job.variant.label) / f"seed{job.seed}"
            job.root.symlink_to(os.path.relpath(target, job.root.parent), target_is_directory=True)
    scoring = {"checkpoint": "best", "max_sentences": None}
    assert linked_elsewhere(jobs, "sinusoidal", {}, scoring) == {
        "learnable": "seed-table", "learnable+ntk": "seed-table"}
    assert linked_elsewhere(jobs, "sinusoidal", {"metric": "BLEU"}, scoring) == {}  # another endpoint
    assert linked_elsewhere(jobs, "sinusoidal", {}, {**scoring, "checkpoint": "last"}) == {}  # another model
    variants["learnable"].tests["ntk"] = ["model.rope.scaling=yarn"]  # other settings under the same tag
    assert linked_elsewhere(jobs, "sinusoidal", {}, scoring) == {"learnable": "seed-table"}
    own_base = [Job(j.variant, j.seed, tmp_path / "x" / str(i)) if j.variant.label == "sinusoidal" else j
                for i, j in enumerate(jobs)]
    assert linked_elsewhere(own_base, "sinusoidal", {}, scoring) == {}  # the baseline trained here
    (seed_table / "results.json").write_text(json.dumps({"primary": {"tests": tests[2:]}}))
    assert linked_elsewhere(jobs, "sinusoidal", {}, scoring) == {}  # seed-table did not test learnable
    for broken in ("[]", "{", json.dumps({"variants": "x"})):
        (seed_table / "study.json").write_text(broken)
        assert linked_elsewhere(jobs, "sinusoidal", {}, scoring) == {}
    (seed_table / "study.json").write_text(json.dumps(spec))
    (seed_table / "results.json").unlink()  # trained, never scored: nothing was tested there
    assert linked_elsewhere(jobs, "sinusoidal", {}, scoring) == {}


@pytest.mark.filterwarnings("ignore:No artists with labels found")  # no validation curves or attention here
def test_figures_give_every_system_its_own_colour_and_marker_and_drop_small_buckets(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """13 systems: 13 distinct (colour, marker) pairs; a bucket under MIN_BUCKET sentences is left out; the caption
    says the error-bar convention."""
    import utils.study.figures as report

    figures = {}
    monkeypatch.setattr(report, "save_figure", lambda fig, path: figures.setdefault(path.name, fig) and path)
    names = [f"system{i}" for i in range(13)]
    buckets = [("0-10", 50), ("10-20", report.MIN_BUCKET - 1), ("20+", report.MIN_BUCKET)]
    results = {"seeds": [1, 2], "splits": ["test"], "systems": {name: {"splits": {"test": {"beam5": {
        "chrf": [40.0 + i, 41.0 + i],
        "by_source_length": [{"bucket": b, "n": n, "chrf": [30.0 + i, 31.0 + i]} for b, n in buckets]}}}}
        for i, name in enumerate(names)}}
    report.write_figures(results, tmp_path)
    ax = figures["chrf_by_length_test.png"].axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0-10\nn=50", f"20+\nn={report.MIN_BUCKET}"]
    lines = [c.lines[0] for c in ax.containers if c.get_label() in names]  # each errorbar's data line
    assert len(lines) == 13 and len({(str(line.get_color()), line.get_marker()) for line in lines}) == 13
    assert "bars: 95 % t-interval" in ax.get_title() and all(len(line.get_xdata()) == 2 for line in lines)
    styles = {(report.system_style(i)["color"], report.system_style(i)["marker"]) for i in range(30)}
    assert len(styles) == 30  # no two alike well past 11 systems


def test_the_primary_contrasts_figure_draws_each_tests_seeds_mean_and_interval(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The forest plot of the family: a panel per quantity, a row per contrast in the family's order; each seed's
    difference, their mean with the 95 % t-interval over seeds, the marker filled only where resolved, the band of
    the smallest effect around 0."""
    import matplotlib.colors

    import utils.study.figures as report

    figures = {}
    monkeypatch.setattr(report, "save_figure", lambda fig, path: figures.setdefault(path.name, fig) and path)
    deltas = {("b", "q1"): [1.0, 2.0, 4.0], ("a", "q1"): [-1.0, 0.5, 0.0], ("b", "q2"): [3.0, 3.5, 2.5],
              ("a", "q2"): [0.2, 0.1, 0.3]}
    tests = [{"system": s, "label": q, "per_seed_delta": d, "resolved": (s, q) == ("b", "q2")}
             for (s, q), d in deltas.items()]
    results = {"seeds": [1, 2, 3], "splits": [], "baseline": "base", "systems": {n: {} for n in ("base", "a", "b")},
               "primary": {"tests": tests, "power": {"smallest_effect": 1.5}}}
    report.contrasts_figure(results, list(results["systems"]), "mean over 3 seeds, bars: 95 % t-interval",
                             tmp_path / "primary_contrasts.png")
    fig = figures["primary_contrasts.png"]
    axes = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title() for ax in axes] == ["q1", "q2"]
    assert [t.get_text() for t in axes[0].get_yticklabels()] == ["b", "a"]  # the family's order, top down
    for ax, q in zip(axes, ("q1", "q2"), strict=True):
        band = ax.patches[0]
        assert (band.get_x(), band.get_x() + band.get_width()) == (-1.5, 1.5)
        for row, system in enumerate(("b", "a")):
            d = deltas[(system, q)]
            mean, half = sum(d) / 3, report.half_width(float(np.std(d, ddof=1)), 3)
            bar = next(c for c in ax.containers if c.lines[0].get_ydata()[0] == row)
            assert bar.lines[0].get_xdata()[0] == pytest.approx(mean)
            (segment,) = bar.lines[2][0].get_segments()
            assert [x for x, _ in segment] == pytest.approx([mean - half, mean + half])
            face = matplotlib.colors.to_hex(bar.lines[0].get_markerfacecolor())
            assert (face != "#ffffff") == ((system, q) == ("b", "q2"))
            dots = next(line for line in ax.lines if list(line.get_xdata()) == d)
            assert list(dots.get_ydata()) == [row + 0.22] * 3
    assert "bars: 95 % t-interval" in fig.texts[0].get_text() and "filled: resolved" in fig.texts[0].get_text()


def test_a_key_that_needs_the_budget_is_validated_with_the_studys_budget(tmp_path: Path) -> None:
    """train.cooldown needs a step budget, which the study sets (--steps): its configs load with it, so the study
    gets as far as its runs (here: none trained, --score-only refuses), not a refusal of the key."""
    res = run_study(tmp_path, "--set", "train.cooldown=0.5", "--set", "train.ema_decay=0.9", "--score-only")
    assert res.returncode == 2 and "train.cooldown" not in res.stderr, res.stderr
    assert "--score-only: 4 of 4 runs are not trained to the budget" in res.stderr
