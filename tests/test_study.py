"""bench/study.py: grids and presets, and a whole small study on the demo corpus (train, score, compare,
report), run twice to show it is idempotent and once more after a killed run to show it resumes."""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))

import study  # noqa: E402

from utils.checkpoint import load_checkpoint  # noqa: E402
from utils.config import ConfigError, load_config  # noqa: E402


def test_grid_is_the_cross_product_of_its_axes() -> None:
    variants = study.grid_variants(["model.attention_pe=none,rope", "model.input_pe=sinusoidal,none"])
    assert [v.label for v in variants] == ["attention_pe=none,input_pe=sinusoidal", "attention_pe=none,input_pe=none",
                                           "attention_pe=rope,input_pe=sinusoidal", "attention_pe=rope,input_pe=none"]
    assert variants[2].overrides == ["model.attention_pe=rope", "model.input_pe=sinusoidal"]
    with pytest.raises(ConfigError, match="expected KEY=V1,V2"):
        study.grid_variants(["model.attention_pe"])


def test_every_preset_variant_is_a_valid_config() -> None:
    presets = study.presets()
    assert set(presets) == {"seed-table", "all-encodings", "train-short-test-long", "tokenization"}
    assert [v.label for v in presets["seed-table"].variants] == ["sinusoidal", "learnable", "rope"]
    assert len(presets["all-encodings"].variants) == 11  # none + 6 input-level + 4 attention-level
    for name, preset in presets.items():
        labels = [v.label for v in preset.variants]
        assert preset.baseline in labels, name
        for v in preset.variants:
            cfg = load_config(ROOT / preset.config, v.overrides)
            for tag, extra in v.tests.items():
                study.inference_only(cfg, load_config(ROOT / preset.config, [*v.overrides, *extra]), tag)
            if name == "train-short-test-long":
                assert cfg.data.max_train_len == 16
    # Tokenizations: the same sentences per step, peak lr and warmup steps, each in its own tokens.
    tok = {v.label: load_config(ROOT / presets["tokenization"].config, v.overrides) for v in
           presets["tokenization"].variants}
    assert tok["char"].data.max_tokens == 4 * tok["bpe"].data.max_tokens == 16384
    for cfg in tok.values():
        assert cfg.train.lr_batch_tokens / cfg.data.max_tokens == pytest.approx(3500 / 4096, rel=1e-3)
        assert cfg.train.warmup_tokens / cfg.data.max_tokens == pytest.approx(750_000 / 4096, rel=1e-3)
    rope = next(v for v in presets["train-short-test-long"].variants if v.label == "rope")
    assert set(rope.tests) == {"linear", "ntk", "yarn"}


def test_budget_never_uses_wall_time_or_early_stopping() -> None:
    sets = dict(s.split("=", 1) for s in study.budget_overrides(1500, None, 300))
    assert sets["train.max_minutes"] == "null" and sets["train.max_steps"] == "1500"
    assert sets["train.max_target_tokens"] == "null" and int(sets["train.patience"]) >= 10**6
    assert dict(s.split("=", 1) for s in study.budget_overrides(None, 10**6, 300))["train.max_target_tokens"] == \
        "1000000"


def run_study(tmp: Path, *extra: str, grid: str = "model.attention_pe=none,rope",
              name: str = "t") -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "bench/study.py", "--config", "configs/demo.yaml", "--grid",
           grid, "--set", "model.input_pe=none", "--set", "data.cache_dir=" + str(tmp / "c"),
           "--set", "model.d_model=32", "--set", "model.d_ff=64", "--set", "model.encoder_layers=1",
           "--set", "model.decoder_layers=1", "--seeds", "2", "--steps", "8", "--eval-every", "4", "--name", name,
           "--runs", str(tmp), "--max-sentences", "12", "--attention-sentences", "6", "--bootstrap", "100", *extra]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)


def test_a_small_study_end_to_end_idempotent_and_resumable(tmp_path: Path) -> None:
    root = tmp_path / "study_t"
    # A run stopped after its first checkpoint, 4 of the 8 steps done: what a study killed mid-run leaves
    # (train.py writes last.pt when a signal stops it; tests/test_training.py checks that).
    killed = root / "runs" / study.slug("attention_pe=rope") / "seed2"
    pre = subprocess.run([sys.executable, "train.py", "--config", "configs/demo.yaml", "--runs", str(killed),
                          "--set", "model.attention_pe=rope", "--set", "model.input_pe=none", "--set", "seed=2",
                          "--set", f"data.cache_dir={tmp_path / 'c'}", "--set", "model.d_model=32",
                          "--set", "model.d_ff=64", "--set", "model.encoder_layers=1",
                          "--set", "model.decoder_layers=1", "--set", "train.max_steps=4",
                          "--set", "train.eval_every=4"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert pre.returncode == 0, pre.stderr
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
    rope = results["systems"]["attention_pe=rope"]["splits"]["test"]["beam5"]
    assert len(rope["bleu"]) == 2 and rope["bleu_mean_std"][0] == pytest.approx(sum(rope["bleu"]) / 2)
    one = json.loads(next(p for p in runs if "rope" in str(p) and "seed1" in str(p)).joinpath(
        "eval", "test.best.beam5.n12.json").read_text())
    assert rope["bleu"][0] == pytest.approx(one["bleu"])  # the report's numbers are test.py's
    comp = results["comparisons"]["attention_pe=rope"]["test"]["beam5"]["BLEU"]
    assert 0.0 <= comp["p_value"] <= 1.0 and comp["system"]["ci"] >= 0.0 and "bs:100" in comp["signature"]
    seeds = results["comparisons"]["attention_pe=rope"]["test"]["beam5"]["across_seeds"]
    base_bleu = results["systems"]["attention_pe=none"]["splits"]["test"]["beam5"]["bleu"]
    assert seeds["delta"] == pytest.approx(sum(rope["bleu"]) / 2 - sum(base_bleu) / 2)
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
    own = results["test_variant_comparisons"]["attention_pe=rope+linear"]["test"]["beam5"]["across_seeds"]
    assert own["test"] == "paired t" and own["delta"] == pytest.approx(
        sum(linear["splits"]["test"]["beam5"]["bleu"]) / 2 - sum(rope["bleu"]) / 2)
    assert set(results["comparisons"]) == {"attention_pe=rope", "attention_pe=rope+linear"}
    assert set(results["test_variant_comparisons"]) == {"attention_pe=none+linear", "attention_pe=rope+linear"}
    assert results["comparisons_per_decoder"] == 2 and results["test_variant_comparisons_per_decoder"] == 2

    report = (root / "report.md").read_text()
    assert "## BLEU, beam 5" in report and "## What the intervals resolve, beam 5" in report
    assert "| system | split | Δ mean | Welch p (seeds) |" in report
    att_row = next(line for line in report.splitlines() if line.startswith("| attention_pe=rope | ") and "(p " in line)
    assert att_row.count("(p ") == 7 and "p: Welch's t-test over seeds against attention_pe=none" in report
    assert "attention_pe=rope vs attention_pe=none on test:" in report
    assert "## Test-time variants against their own trained models" in report
    assert "| attention_pe=rope+linear | attention_pe=rope | test |" in report
    assert "chrF `nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|" in report
    for fig in ("bleu_by_length_test.png", "valid_bleu.png", "attention_encoder.png", "attention_cross.png"):
        assert (root / "figures" / fig).stat().st_size > 1000, fig
    tb = {p.parent.name: p.parent for p in (root / "tb").glob("*/events.out.tfevents.*")}
    assert len(tb) == 8  # HParams, one per run and test variant
    hparams = _hparams(tb["attention_pe=rope_seed1"])
    assert hparams["variant"] == "attention_pe=rope" and hparams["seed"] == 1.0
    assert hparams["test/test/bleu_beam5"] == pytest.approx(rope["bleu"][0])

    # A study run is a normal run directory: visualize.py draws its attention as for any other.
    vis = subprocess.run([sys.executable, "visualize.py", "--model_path", str(runs[0]), "--src_text",
                          "Le chat dort.", "--out", str(tmp_path / "vis")], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert vis.returncode == 0, vis.stderr
    assert (tmp_path / "vis" / "attention_cross_layer_0.png").stat().st_size > 1000

    again = run_study(tmp_path, *LINEAR)
    assert again.returncode == 0 and "4 runs, 4 trained, 0 to train" in again.stdout
    assert "  test " not in again.stdout  # every evaluation was already there
    assert sorted(p for p in root.glob("runs/*/seed*/demo_2*")) == runs

    # Another study in the same runs folder, sweeping tokenization: its bpe variant has exactly the config of
    # study t's attention_pe=none, so those runs are linked, not trained; char is trained.
    other = run_study(tmp_path, "--set", "model.attention_pe=none", grid="tokenizer.type=bpe,char", name="u")
    assert other.returncode == 0, other.stdout + other.stderr
    assert "4 runs, 2 trained, 2 to train" in other.stdout and "train type=bpe" not in other.stdout
    for seed in (1, 2):
        linked = tmp_path / "study_u" / "runs" / study.slug("type=bpe") / f"seed{seed}"
        assert linked.is_symlink()
        assert linked.resolve() == (root / "runs" / study.slug("attention_pe=none") / f"seed{seed}").resolve()
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


def _systems() -> tuple[list[str], list[str], list[str]]:
    refs = (ROOT / "data" / "demo" / "test.en").read_text(encoding="utf-8").splitlines()
    base = [" ".join(r.split()[:-1]) if i % 2 else r for i, r in enumerate(refs)]  # last word dropped, every other
    system = [" ".join(r.split()[1:]) if i % 3 == 0 else r for i, r in enumerate(refs)]
    return refs, base, system


def test_paired_bootstrap_is_sacrebleus_for_one_seed_and_seed_copies_add_no_evidence() -> None:
    from sacrebleu.metrics import BLEU, CHRF
    from sacrebleu.significance import PairedTest

    refs, base, system = _systems()
    one = study.paired_bootstrap([base], [system], refs, 200)
    _, theirs = PairedTest([("baseline", base), ("system", system)], {"BLEU": BLEU(), "chrF": CHRF()}, [refs],
                           test_type="bs", n_samples=200)()
    for metric, key in (("BLEU", "BLEU"), ("chrF", "chrF2")):
        b, s = theirs[key]
        assert one[metric]["p_value"] == pytest.approx(s.p_value)
        assert one[metric]["system"]["ci"] == pytest.approx(s.ci, abs=1e-4)
        assert one[metric]["baseline"]["ci"] == pytest.approx(b.ci, abs=1e-4)
        assert one[metric]["delta"] == pytest.approx(s.score - b.score)
    # Three seeds that happen to translate alike are one test set, not three: the interval must not shrink
    # (pooling the copies as separate segments, as sacreBLEU would see them, narrows it by about sqrt(3)).
    three = study.paired_bootstrap([base] * 3, [system] * 3, refs, 200)
    assert three["BLEU"]["system"]["ci"] == pytest.approx(one["BLEU"]["system"]["ci"], rel=1e-3)
    assert three["BLEU"]["p_value"] == pytest.approx(one["BLEU"]["p_value"])
    _, pooled = PairedTest([("baseline", base * 3), ("system", system * 3)], {"BLEU": BLEU()}, [refs * 3],
                           test_type="bs", n_samples=200)()
    assert pooled["BLEU"][1].ci < 0.75 * one["BLEU"]["system"]["ci"]
    assert "unit:sentence,3-seed-pooled" in three["BLEU"]["signature"] and "bs:200" in three["BLEU"]["signature"]
    lower = study.paired_bootstrap([[h.upper() for h in base]], [system], refs, 50, lowercase=True)
    assert lower["BLEU"]["baseline"]["score"] == pytest.approx(one["BLEU"]["baseline"]["score"])


def test_seed_test_is_welchs_t_test_and_says_how_many_seeds_would_do() -> None:
    out = study.seed_test([1.0, 2.0, 3.0], [4.0, 5.0, 6.0], 0.05)
    assert out["delta"] == pytest.approx(3.0) and out["p_value"] == pytest.approx(0.02131, abs=1e-4)  # t=3.67, df=4
    assert out["seeds_needed"] == 2
    # Unequal variances: Welch's df (2.01, by hand: p = 1 - t / sqrt(t^2 + 2) with t = 0.736) decide, not the
    # pooled t-test's 4 (p 0.502).
    assert study.seed_test([10.0, 10.2, 9.9], [12.0, 8.0, 14.0], 0.05)["p_value"] == pytest.approx(0.538, abs=1e-3)
    # n = 2 (z_0.975 + z_0.8)^2 s^2 / delta^2 with s^2 = 1, delta = 0.5: 62.8 -> 63 seeds a variant.
    assert study.seed_test([-1.0, 0.0, 1.0], [-0.5, 0.5, 1.5], 0.05)["seeds_needed"] == 63
    assert study.seed_test([1.0], [2.0], 0.05)["p_value"] is None
    assert study.seed_test([2.0, 2.0], [2.0, 2.0], 0.05) == {"test": "Welch", "delta": 0.0, "p_value": 1.0,
                                                             "seeds_needed": None}
    # The same models scored two ways: the paired t-test on the per-seed differences (0.5, 0.4, 0.7: t = 6.05,
    # df 2, p = 1 - t / sqrt(t^2 + 2) = 0.026), which Welch's test, blind to the pairing, misses (p 0.61).
    base, system = [1.0, 2.0, 3.0], [1.5, 2.4, 3.7]
    paired = study.seed_test(base, system, 0.05, paired=True)
    t = (1.6 / 3) / (statistics.stdev([0.5, 0.4, 0.7]) / 3**0.5)
    assert paired["test"] == "paired t" and paired["p_value"] == pytest.approx(1 - t / (t * t + 2) ** 0.5)
    assert study.seed_test(base, system, 0.05)["p_value"] > 0.5
    # n = (z_0.975 + z_0.8)^2 s_d^2 / delta^2 = 7.849 * 0.02333 / 0.2844 = 0.64 -> the floor of 2 seeds.
    assert paired["seeds_needed"] == 2
    from study_report import half_width

    assert half_width(1.0, 3) == pytest.approx(4.3027 / 3**0.5, abs=1e-4) and half_width(1.0, 1) == 0.0  # t_{.975,2}


def test_a_difference_is_resolved_only_when_the_test_set_and_the_seeds_both_resolve_it() -> None:
    from study_report import resolved, significance_lines

    def comp(bs_p: float, seed_p: float | None) -> dict:
        return {"t": {"beam5": {"BLEU": {"p_value": bs_p, "delta": 0.6},
                                "across_seeds": {"delta": 0.5, "p_value": seed_p, "seeds_needed": 40}}}}

    cases = {"a": comp(0.001, 0.6), "b": comp(0.001, 0.001), "c": comp(0.03, 0.001), "d": comp(0.001, None)}
    results = {"baseline": "base", "seeds": [1, 2, 3], "bootstrap_samples": 1000, "comparisons": cases,
               "comparisons_per_decoder": 4}
    lines = significance_lines(results)
    assert len(lines) == 4
    # The test-set bootstrap alone would call a significant; the seeds vary too much for that.
    assert "a vs base on t: +0.50 BLEU in the mean over seeds (Welch p = 0.600), +0.60 pooled" in lines[0]
    assert "not resolved" in lines[0] and "the seeds do not" in lines[0] and "about 40 seeds" in lines[0]
    assert "resolved: significant on the test-set bootstrap and across seeds" in lines[1]
    assert "not resolved: the test-set bootstrap gives p < 0.05 alone, not after Bonferroni over 4" in lines[2]
    assert "with one seed a side the variation between training runs is not measured" in lines[3]
    assert [resolved(c["t"]["beam5"], 4)[0] for c in cases.values()] == [False, True, False, False]
    results["bootstrap_samples"] = 50
    assert "no p-value can go below 0.0196" in significance_lines(results)[0]  # 1/51 > 0.05/4


def test_study_keys_cannot_be_set_and_the_variant_overrides_the_study_set(tmp_path: Path) -> None:
    job = study.Job(study.Variant("rope", ["model.attention_pe=rope"]), 2, tmp_path / "rope" / "seed2")
    cmd = study.train_command(job, "configs/demo.yaml", ["model.attention_pe=none", "model.d_model=32"],
                              ["train.max_steps=8"])
    sets = [cmd[i + 1] for i, x in enumerate(cmd) if x == "--set"]
    assert sets == ["model.attention_pe=none", "model.d_model=32", "model.attention_pe=rope", "seed=2",
                    "train.max_steps=8"]  # later --set wins: the variant, then the study's seed and budget
    res = subprocess.run([sys.executable, "bench/study.py", "--preset", "seed-table", "--steps", "8", "--set",
                          "seed=7", "--runs", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "--set seed is decided by the study (--seeds)" in res.stderr
    assert "Traceback" not in res.stderr and not (tmp_path / "study_seed-table").exists()
    res = subprocess.run([sys.executable, "bench/study.py", "--config", "configs/demo.yaml", "--grid",
                          "model.attention_pe=none,rope", "--grid", "seed=1,2", "--steps", "8", "--name", "x", "--runs",
                          str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "--grid seed is decided by the study (--seeds)" in res.stderr
    res = subprocess.run([sys.executable, "bench/study.py", "--preset", "tokenization", "--tokens", "1000000",
                          "--runs", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "--tokens counts each tokenizer's own tokens" in res.stderr
    res = subprocess.run([sys.executable, "bench/study.py", "--preset", "seed-table", "--steps", "0"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "--steps must be >= 1, got 0" in res.stderr and "Traceback" not in res.stderr


def test_a_run_without_a_resume_point_is_started_again(tmp_path: Path) -> None:
    root = tmp_path / "seed1"
    weights_only = root / "demo_20260101_000000"
    (weights_only / "checkpoints").mkdir(parents=True)
    (weights_only / "checkpoints" / "step_100.pt").write_bytes(b"weights")  # killed before last.pt was written
    resumable = root / "demo_20260101_000001"
    (resumable / "checkpoints").mkdir(parents=True)
    (resumable / "checkpoints" / "last.pt").write_bytes(b"state")
    assert study.find_run(root) == resumable
    assert not weights_only.exists()
    (resumable / "checkpoints" / "last.pt").unlink()
    (resumable / "checkpoints" / "step_1.pt").write_bytes(b"weights")
    assert study.find_run(root) is None and not resumable.exists()


def test_test_variants_name_a_variant_or_all_of_them() -> None:
    variants = study.grid_variants(["model.attention_pe=none,rope"])
    study.add_test_variants(variants, ["attention_pe=rope+linear:model.rope.scaling=linear, model.rope.factor=8",
                                       "b2:decode.lenpen=0.6"])
    assert variants[0].tests == {"b2": ["decode.lenpen=0.6"]}
    assert variants[1].tests == {"linear": ["model.rope.scaling=linear", "model.rope.factor=8"], "b2": [
        "decode.lenpen=0.6"]}
    for bad, message in (("rope+linear:model.rope.scaling=linear", "no variant 'rope'"),
                         ("linear", "expected [LABEL+]TAG:KEY=VALUE"), ("a b:x=1", "expected [LABEL+]TAG"),
                         ("b2:decode.lenpen=1.0", "already has a test variant 'b2'")):
        with pytest.raises(ConfigError, match=re.escape(message)):
            study.add_test_variants(variants, [bad])
    with pytest.raises(ConfigError, match=re.escape("two systems would share a name: a+b")):
        study.add_test_variants([study.Variant("a", []), study.Variant("a+b", [])], ["a+b:decode.lenpen=0.6"])
    demo = load_config(ROOT / "configs/demo.yaml")
    study.inference_only(demo, load_config(ROOT / "configs/demo.yaml", ["model.rope.scaling=linear"]), "x")
    with pytest.raises(ConfigError, match="model.d_model=64 but the checkpoint was trained with 128"):
        study.inference_only(demo, load_config(ROOT / "configs/demo.yaml", ["model.d_model=64"]), "x")
    with pytest.raises(ConfigError, match="--test-variant x changes data settings"):
        study.inference_only(demo, load_config(ROOT / "configs/demo.yaml", ["data.test=[validation]"]), "x")


def test_cached_scores_and_attention_are_reused_only_for_the_same_sentences_and_settings(tmp_path: Path) -> None:
    scores = tmp_path / "test.best.beam5.json"
    assert not study.eval_current(scores, 1670, [])
    scores.write_text(json.dumps({"bleu": 1.0, "n_sentences": 1670}))  # written before test.py recorded --set
    assert study.eval_current(scores, 1670, []) and not study.eval_current(scores, 12, [])
    assert not study.eval_current(scores, 1670, ["model.rope.scaling=linear"])
    scores.write_text(json.dumps({"bleu": 1.0, "n_sentences": 12, "overrides": ["model.rope.factor=2"]}))
    assert study.eval_current(scores, 12, ["model.rope.factor=2"])
    assert not study.eval_current(scores, 12, ["model.rope.factor=8"])  # the test variant changed: score again
    # A study scoring the first N sentences keeps its files apart (also in runs it shares with another study).
    assert study.file_tag(None, None) is None and study.file_tag("linear", None) == "linear"
    assert study.file_tag(None, 12) == "n12" and study.file_tag("linear", 12) == "n12.linear"
    cached = study.attention_file(tmp_path, "best", 200)
    cached.parent.mkdir(parents=True, exist_ok=True)
    cached.write_text(json.dumps({"sentences": 200, "stats": {}}))
    assert study.read_attention(tmp_path, "best", 200) is not None
    assert study.read_attention(tmp_path, "best", 50) is None


def test_buckets_keep_every_seed_and_score_the_given_lengths() -> None:
    from sacrebleu.metrics import BLEU
    from study_report import _buckets

    refs, base, system = _systems()
    lengths = [len(r.split()) for r in refs]
    rows = _buckets([base, system], refs, lengths, [8], lowercase=False)
    short = [i for i, n in enumerate(lengths) if n < 8]
    assert [r["bucket"] for r in rows] == ["0-7", "8+"] and rows[0]["n"] == len(short)
    expected = [BLEU().corpus_score([h[i] for i in short], [[refs[i] for i in short]]).score for h in (base, system)]
    assert rows[0]["bleu"] == pytest.approx(expected)
    assert rows[0]["bleu_mean_std"][0] == pytest.approx(sum(expected) / 2) and len(rows[1]["chrf"]) == 2


def test_each_gpu_takes_the_next_run_as_soon_as_its_own_ends(tmp_path: Path) -> None:
    job = ("import os, sys, time; print(os.environ['CUDA_VISIBLE_DEVICES'], time.time(), flush=True); "
           "time.sleep(float(sys.argv[1])); print(time.time())")
    logs = [tmp_path / f"{i}.log" for i in range(3)]
    study.run_commands([(f"job {i}", [sys.executable, "-c", job, str(t)], log)
                        for i, (t, log) in enumerate(zip((3.0, 0.2, 0.2), logs, strict=True))], devices=2, poll=0.05)
    dev0, _, end0 = logs[0].read_text().split()
    dev2, start2, _ = logs[2].read_text().split()
    assert (dev0, logs[1].read_text().split()[0], dev2) == ("0", "1", "1")
    assert float(start2) < float(end0)  # job 2 ran on GPU 1 while GPU 0 was still busy with job 0
    with pytest.raises(SystemExit, match="job 1 failed"):
        study.run_commands([("job 0", [sys.executable, "-c", job, "30"], logs[0]),
                            ("job 1", [sys.executable, "-c", "raise SystemExit(3)"], logs[1])], devices=2, poll=0.05)


def test_readme_tables_are_the_published_reports() -> None:
    """The README's study tables are copied from the reports in bench/studies/, digit for digit."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for heading, study_name, n in (("### The seed table with error bars", "seed-table", 3),
                                   ("### All eleven encodings with error bars", "all-encodings", 11)):
        section = readme.split(heading, 1)[1].split("\n### ", 1)[0]
        rows = [line for line in section.splitlines() if line.startswith("| ") and "±" in line]
        report = (ROOT / "bench" / "studies" / study_name / "report.md").read_text(encoding="utf-8").splitlines()
        assert len(rows) == n and [r for r in rows if r not in report] == [], study_name
