"""A study's decoders: the table said once; the length-controlled secondary decoder (beam5-minlen), its floor chosen
per system from the long validation split alone by the declared rule (no test-set file read), its tests a
family of their own (Holm within it), its report section, its recomputation from the published files; and the
natural-length arm of the extrapolation preset. Cheap: fake runs and a stand-in for test.py, no training."""

from __future__ import annotations

import importlib.util
import json
import statistics
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, make_tiny_config

from utils.config import ConfigError, load_config, save_config
from utils.study import analysis, cli, report
from utils.study.decoders import DECODERS, LENGTH_DECODER
from utils.study.files import StudyFileError, hypotheses_checksums
from utils.study.length_control import (
    LengthRule,
    add_length_results,
    floor_tag,
    length_control_lines,
    reanalyse_length,
    score_length,
)
from utils.study.plan import Job
from utils.study.presets import EXTRAPOLATION_FAMILY, LENGTH_SHIFTED, presets
from utils.study.report import publish_hypotheses, read_hypotheses
from utils.study.runs import eval_file
from utils.study.spec import Variant
from utils.study.stats import holm


def _test_py() -> Any:
    """test.py as a module (its name would be the standard library's ``test`` package)."""
    spec = importlib.util.spec_from_file_location("fr2en_test_script", ROOT / "test.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


test_py = _test_py()


def test_the_decoder_table_is_said_once() -> None:
    assert cli.DECODERS is report.DECODERS is analysis.DECODERS is DECODERS  # one table, imported
    assert DECODERS == {"beam5": 5, "greedy": 1}  # what every published study was scored with
    assert LENGTH_DECODER not in DECODERS  # scored only when --decoders names it


def test_the_rule_takes_the_smallest_floor_of_its_grid_reaching_the_target() -> None:
    rule = LengthRule("validation.x4", ("test",), ("a", "b"))
    assert rule.grid == (0.0, 0.25, 0.5, 0.75, 1.0) and rule.target == 0.95
    assert rule.choice({}) is None
    assert rule.choice({0.0: [0.96, 0.95]}) == 0.0
    assert rule.choice({0.0: [0.9, 0.96]}) is None  # mean 0.93: 0.25 is to be measured next
    assert rule.choice({0.0: [0.9, 0.96], 0.25: [0.94, 0.97]}) == 0.25
    assert rule.choice({a: [0.5] for a in rule.grid}) == 1.0  # none reaches it: the grid's largest


def test_the_rule_is_declared_on_the_long_validation_split_for_the_familys_systems() -> None:
    systems = ["sinusoidal", "learnable", "rope", "rope+ntk", "rope+linear", "alibi"]
    rule = LengthRule.declare(EXTRAPOLATION_FAMILY, LENGTH_SHIFTED, systems, "sinusoidal")
    assert rule.validation == "validation.x4"
    assert rule.splits == ("test.tatoeba", "test.tatoeba.x4", "test.multi30k-2016", "test.multi30k-2016.x4")
    assert rule.systems == ("sinusoidal", "learnable", "rope", "rope+ntk", "alibi")  # those of the family present
    assert LengthRule.from_dict(json.loads(json.dumps(rule.to_dict()))) == rule  # as study.json records it
    assert rule.to_dict()["rule"] == ("the smallest decode.min_len_a of 0, 0.25, 0.5, 0.75, 1 whose length ratio on "
                                      "validation.x4 (beam 5, the mean over seeds) is at least 0.95; 1 where none is")
    plain = LengthRule.declare({}, ["test"], ["none", "rope"], "none")  # no length-shifted split: the validation split
    assert (plain.validation, plain.splits, plain.systems) == ("validation", ("test",), ("none", "rope"))


# ---------------------------------------------------------------------------------------------- scoring


KEEP = {"base": {0.0: 1.0}, "long": {0.0: 0.5, 0.25: 0.7, 0.5: 1.0}}  # share of each reference's words written


def _fake_study(tmp: Path) -> dict[str, Any]:
    """Two systems x two seeds of fake runs, and ``score`` running ``score_length`` with a stand-in for test.py that
    writes what test.py would: ``base`` writes whole references, ``long`` the first half of each, more with a floor,
    and a wrong first word in its first 5 (seed 1) or 9 (seed 2) lines."""
    from data.sources import load_corpus

    cfg = make_tiny_config(tmp)
    data = cfg.data.model_copy(update={"test": ["test", "test.x4", "validation.x4"]})
    corpus = load_corpus(data)
    references = {s: list(corpus[s]["tgt"]) for s in ("test", "test.x4", "validation.x4")}
    jobs, runs = [], {}
    for label in KEEP:
        for seed in (1, 2):
            job = Job(Variant(label, []), seed, tmp / label / f"seed{seed}")
            runs[job.key] = job.root / "run"
            (runs[job.key] / "checkpoints").mkdir(parents=True)
            (runs[job.key] / "checkpoints" / "best.pt").write_bytes(b"")
            save_config(cfg, runs[job.key] / "config.yaml")  # what the report reads: case-sensitive scoring
            jobs.append(job)
    rounds: list[list[list[str]]] = []

    def write(run: Path, split: str, tag: str | None, sets: list[str], a: float) -> None:
        keep = KEEP[run.parents[1].name].get(a, 1.0)
        hyps = [" ".join(r.split()[: max(1, round(len(r.split()) * keep))]) for r in references[split]]
        if run.parents[1].name == "long":
            hyps = [" ".join(["zzz", *h.split()[1:]]) if i < 1 + 4 * int(run.parent.name[-1]) else h
                    for i, h in enumerate(hyps)]
        entry = {"n_sentences": len(hyps), "overrides": sets, "step": 8, "bleu_signature": "nrefs:1",
                 "chrf_signature": "nc:6"}
        test_py.write_scores(eval_file(run, split, 5, "best", tag), entry, hyps)

    def fake_test_py(commands: list[tuple[str, list[str], Path]]) -> None:
        rounds.append([argv for _, argv, _ in commands])
        for _, argv, _ in commands:
            sets = [argv[i + 1] for i, x in enumerate(argv) if x == "--set"]
            a = float(next((x.split("=")[1] for x in sets if x.startswith("decode.min_len_a=")), 0))
            for split in (argv[i + 1] for i, x in enumerate(argv) if x == "--split"):
                write(Path(argv[argv.index("--model_path") + 1]).parents[1], split,
                      argv[argv.index("--tag") + 1] if "--tag" in argv else None, sets, a)

    for run in runs.values():  # beam 5 on the test sets, as the study scores it before
        for split in ("test", "test.x4"):
            write(run, split, None, [], 0.0)

    rule = LengthRule("validation.x4", ("test", "test.x4"), ("base", "long"))
    sizes = {s: len(references[s]) for s in rule.splits}
    steps = {job.key: 8 for job in jobs}

    def score(every_floor: bool = False) -> dict[str, Any]:
        return score_length(rule, jobs, runs, steps, "best", None, sizes, data, fake_test_py, every_floor)

    return {"rule": rule, "jobs": jobs, "runs": runs, "references": references, "rounds": rounds, "score": score,
            "test_py": fake_test_py, "data": data}


@pytest.fixture(scope="module")
def scored(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``_fake_study`` scored once, choosing each floor as the rule goes."""
    study = _fake_study(tmp_path_factory.mktemp("length"))
    return {**study, "choice": study["score"]()}


def test_every_floor_decoded_first_leaves_no_choice_that_needs_the_weights(scored: dict[str, Any],
                                                                           tmp_path: Path) -> None:
    """``every_floor`` (a study's --decode-only): every grid value on validation and the test sets for every run,
    the same choice as deciding one value at a time; after it, a scoring without any checkpoint decodes nothing."""
    study = _fake_study(tmp_path)
    grid = study["rule"].grid
    assert study["score"](every_floor=True) == scored["choice"]
    assert [len(r) for r in study["rounds"]] == [len(grid) * 4, (len(grid) - 1) * 4]  # validation, then test sets
    assert {tuple(argv[argv.index("--split"):argv.index("--tag")]) for argv in study["rounds"][1]} == {
        ("--split", "test", "--split", "test.x4")}
    for run in study["runs"].values():
        (run / "checkpoints" / "best.pt").unlink()
    rounds = len(study["rounds"])
    assert study["score"]() == scored["choice"] and len(study["rounds"]) == rounds


def test_the_choice_reads_no_test_set_file_even_where_every_floor_was_decoded_on_them(scored: dict[str, Any],
                                                                                     tmp_path: Path) -> None:
    """A study's --decode-only decodes the test sets at every floor before any choice: the choice reads none of
    them. Every test-set file rewritten with the references themselves (each floor a perfect length there, so a
    choice that read them would take 0 for every system) leaves the choice as the validation files make it."""
    study = _fake_study(tmp_path)
    assert study["score"](every_floor=True) == scored["choice"]
    rewritten = 0
    for run in study["runs"].values():
        for split in study["rule"].splits:
            for a in study["rule"].grid:
                path = eval_file(run, split, 5, "best", floor_tag(None, a))
                entry = json.loads(path.read_text())
                test_py.write_scores(path, {k: v for k, v in entry.items() if k not in ("sha256", "hyp_sha256")},
                                     study["references"][split])
                rewritten += 1
        (run / "checkpoints" / "best.pt").unlink()  # nothing may be decoded again either
    assert rewritten == 4 * 2 * len(study["rule"].grid)
    assert study["score"]() == scored["choice"] and scored["choice"]["long"]["min_len_a"] == 0.5


def test_the_floor_is_chosen_on_validation_one_grid_value_at_a_time_then_the_test_sets_decoded(
        scored: dict[str, Any]) -> None:
    rounds, choice = scored["rounds"], scored["choice"]
    assert [len(r) for r in rounds] == [4, 2, 2, 2]  # 0 for all; 0.25, 0.5 for long alone; then its test sets
    assert choice["base"]["min_len_a"] == 0.0 and list(choice["base"]["validation_ratio"]) == ["0"]
    assert choice["long"]["min_len_a"] == 0.5
    assert list(choice["long"]["validation_ratio"]) == ["0", "0.25", "0.5"]
    assert [statistics.fmean(r) < 0.95 for r in choice["long"]["validation_ratio"].values()] == [True, True, False]
    first, floored, test = rounds[0][0], rounds[1][0], rounds[3][0]
    assert first[first.index("--split"):] == ["--split", "validation.x4", "--set", "data.test=[validation.x4]"]
    assert floored[floored.index("--split"):] == ["--split", "validation.x4", "--tag", "minlen0.25", "--set",
                                                  "data.test=[validation.x4]", "--set", "decode.min_len_a=0.25"]
    assert test[test.index("--beam"):] == ["--beam", "5", "--split", "test", "--split", "test.x4", "--tag",
                                           "minlen0.5", "--set", "decode.min_len_a=0.5"]
    assert all("/long/" in argv[argv.index("--model_path") + 1] for r in rounds[1:] for argv in r)


def test_scoring_again_decodes_nothing_and_a_gone_checkpoint_is_one_line(scored: dict[str, Any]) -> None:
    before = len(scored["rounds"])
    assert scored["score"]() == scored["choice"]
    assert len(scored["rounds"]) == before  # every file current: nothing decoded again
    run = scored["runs"]["long seed 2"]
    eval_file(run, "test.x4", 5, "best", "minlen0.5").unlink()
    (run / "checkpoints" / "best.pt").unlink()
    with pytest.raises(ConfigError) as e:
        scored["score"]()
    assert str(e.value) == (f"{run}: its best checkpoint is gone and {LENGTH_DECODER} (min_len_a 0.5) is not scored "
                            "on test, test.x4: nothing was scored")
    (run / "checkpoints" / "best.pt").write_bytes(b"")
    assert scored["score"]() == scored["choice"]
    assert [len(r) for r in scored["rounds"][before:]] == [1]  # the missing file alone is decoded again


def test_the_secondary_family_is_its_own_reported_apart_and_recomputed_from_the_published_files(
        scored: dict[str, Any], tmp_path: Path) -> None:
    rule, choice, references = scored["rule"], scored["choice"], scored["references"]
    results: dict[str, Any] = {"baseline": "base", "seeds": [1, 2],
                               "_hypotheses": {s: {split: {} for split in rule.splits} for s in rule.systems}}
    add_length_results(results, rule, choice, scored["jobs"], scored["runs"], "best", None, references, 200, {})
    lc = results["length_control"]
    fam = lc["family"]
    assert fam["family"]["decoder"] == LENGTH_DECODER and fam["family"]["declared"].startswith("declared secondary")
    assert [t["label"] for t in fam["tests"]] == ["chrF test (beam5-minlen)", "chrF test.x4 (beam5-minlen)"]
    assert fam["size"] == 2  # Holm over these alone
    # Under a group-sequential primary design it is still tested once, with Holm at alpha: no boundaries of its own.
    again: dict[str, Any] = {"baseline": "base", "seeds": [1, 2],
                             "_hypotheses": {s: {split: {} for split in rule.splits} for s in rule.systems}}
    add_length_results(again, rule, choice, scored["jobs"], scored["runs"], "best", None, references, 200,
                       {"sequential": {"looks": [2, 4], "spending": "obf"}})
    assert again["length_control"]["family"]["design"]["kind"] == "fixed"
    assert again["length_control"]["family"]["tests"] == fam["tests"]
    assert [t["seed_test"]["p_holm"] for t in fam["tests"]] == holm([t["seed_test"]["p_value"] for t in fam["tests"]])
    assert lc["systems"]["long"]["test"]["length_ratio"] == [pytest.approx(1.0)] * 2  # its floor's output
    assert results["_hypotheses"]["base"]["test"][LENGTH_DECODER][0] == references["test"]  # published with the rest
    lines = length_control_lines(results)
    assert lines[0] == "## Length-controlled decoding, beam5-minlen (declared secondary)"
    ratios = {a: statistics.fmean(r) for a, r in choice["long"]["validation_ratio"].items()}
    assert f"| long | 0.5 | 0: {ratios['0']:.2f}, 0.25: {ratios['0.25']:.2f}, 0.5: 1.00 | " in "\n".join(lines)
    assert "| base | 0 | 0: 1.00 | 100.00 · len 1.00 | 100.00 · len 1.00 |" in lines
    assert fam["tests"][0]["delta"] < 0  # long's wrong words
    assert lines[-2] == f"**{fam['resolved']} of 2 resolved** (secondary; against base)."
    assert length_control_lines({"baseline": "base"}) == []  # a study without it: no section
    assert not any(line.startswith("At look") for line in lines)  # a fixed design: one look
    design = {"kind": "group-sequential", "look": 1, "of": 3}
    interim = length_control_lines(results | {"primary": {"design": design}})
    assert interim == [*lines[:4], interim[4], "", *lines[4:]]
    assert interim[4].startswith("At look 1 of 3 of the primary design: this family is tested once, at the look ")
    # Recomputed from results.json and the published hypotheses alone, as bench/study_report.py does.
    publish_hypotheses(tmp_path / "hypotheses", results.pop("_hypotheses"), [1, 2])
    old = json.loads(json.dumps({**results, "checksums": hypotheses_checksums(tmp_path), "spec": {"family": {}}}))
    again = reanalyse_length(old, tmp_path, references, 200, False, read_hypotheses)
    assert json.dumps(again, sort_keys=True) == json.dumps(old["length_control"], sort_keys=True)
    old["length_control"]["choice"]["long"]["min_len_a"] = 0.25
    with pytest.raises(StudyFileError) as e:
        reanalyse_length(old, tmp_path, references, 200, False, read_hypotheses)
    assert str(e.value) == (f"{tmp_path / 'results.json'}: long's recorded min_len_a 0.25 is not the rule's on its "
                            "recorded validation ratios: changed since the study wrote it")


# ---------------------------------------------------------------------------------------------- the natural arm


def test_the_natural_length_arm_trains_the_same_systems_on_every_length_and_tests_the_same_sets(
        monkeypatch: pytest.MonkeyPatch) -> None:
    short, natural = presets()["train-short-test-long"], presets()["train-natural-test-long"]
    own = {v.label: v.overrides for v in short.variants}
    assert [v.label for v in natural.variants] == list(own)  # today: every system of the short arm, in its order
    assert all(v.overrides == own[v.label] and not v.tests for v in natural.variants)  # no RoPE stretch of 16 tokens
    assert natural.overrides == [*short.overrides, "data.max_train_len=null"]
    assert (natural.config, natural.baseline) == (short.config, short.baseline)
    cfg_short = load_config(short.config, short.overrides)
    cfg = load_config(natural.config, natural.overrides)
    assert (cfg_short.data.max_train_len, cfg.data.max_train_len) == (16, None)
    assert cfg.data.test == LENGTH_SHIFTED  # x1, x2, x4, x8 and TED
    fam = natural.family
    assert {k: fam[k] for k in ("metric", "decoder", "splits", "drops", "smallest_effect", "alpha")} == \
        {k: EXTRAPOLATION_FAMILY[k] for k in ("metric", "decoder", "splits", "drops", "smallest_effect", "alpha")}
    assert fam["systems"] == ["learnable", "rope", "alibi", "t5"]
    # An encoding registered later joins neither arm: the presets name their encodings one by one.
    from models.positional import REGISTRY

    monkeypatch.setitem(REGISTRY["attention"], "later", type("Later", (), {"causal_only": False}))
    assert [v.label for v in presets()["train-short-test-long"].variants] == list(own)
    assert [v.label for v in presets()["train-natural-test-long"].variants] == list(own)


def test_a_few_runs_decoded_at_every_floor_leave_the_others_alone(tmp_path: Path) -> None:
    """``score_length`` on some of a study's runs (``--decode-only --only``): only theirs decoded; a system of the
    rule without runs among them is left out, a trained variant named LABEL+TAG (not a test variant of LABEL)
    included."""
    study = _fake_study(tmp_path)
    base = [j for j in study["jobs"] if j.variant.label == "base"]
    rule = LengthRule("validation.x4", ("test", "test.x4"), ("base", "base+x"))  # base+x: trained, not chosen here
    choice = score_length(rule, base[1:], study["runs"], {j.key: 8 for j in base}, "best", None,
                          {s: len(study["references"][s]) for s in rule.splits}, study["data"], study["test_py"],
                          every_floor=True)
    decoded = [argv for r in study["rounds"] for argv in r]
    assert list(choice) == ["base"] and len(decoded) == len(rule.grid) + len(rule.grid) - 1
    assert {argv[argv.index("--model_path") + 1] for argv in decoded} == {
        str(study["runs"]["base seed 2"] / "checkpoints" / "best.pt")}
