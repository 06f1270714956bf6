"""bench/peers.py's parts that need no Eole: the protocol overrides, the Eole configs it writes, the report."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import peers  # noqa: E402

from bench.measure import CommandFailed, run_measured  # noqa: E402
from utils.config import load_config  # noqa: E402


def result(steps: int, tok_s: float, bleu: list[float], speed: list[float], words: int = 1000) -> dict:
    return {"steps": steps, "target_tokens_per_s": tok_s, "valid_ppl": 10.0, "peak_rss_mb": 2000.0,
            "tests": {t: {"bleu": b, "chrf": 50.0, "sentences_per_s": s, "words": words, "lines": 100}
                      for t, b, s in zip(peers.TEST_SETS, bleu, speed, strict=True)}}


def test_report_gives_ratios_and_bleu_differences_against_eole() -> None:
    results = {"ours": result(1500, 3000.0, [36.0, 32.0, 5.0], [150.0, 90.0, 60.0]),
               "eole": result(1000, 1500.0, [35.0, 32.5, 4.0], [100.0, 60.0, 40.0])}
    report = peers.table(results, 44)
    lines = report.splitlines()
    assert lines[0] == "| 44 min, then beam 5 | ours | eole | ours/eole |"
    assert "| target tokens/s | 3000 | 1500 | 2.00x |" in lines
    assert "| optimizer steps | 1500 | 1000 | 1.50x |" in lines
    assert "| beam-5 sentences/s test.iwslt-tst2010 | 60.0 | 40.0 | 1.50x |" in lines
    diffs = "- ours: BLEU minus Eole's on test.tatoeba, test.multi30k-2016, test.iwslt-tst2010: +1.00, -0.50, +1.00"
    assert diffs in lines


def test_protocol_overrides_give_the_protocol_model_and_schedule() -> None:
    cfg = load_config(ROOT / peers.CONFIG, peers.PROTOCOL)
    m, t = cfg.model, cfg.train
    assert (m.d_model, m.n_heads, m.encoder_layers, m.decoder_layers, m.d_ff) == (256, 4, 3, 3, 1024)
    assert m.attention_pe == "rope" and m.tie_embeddings and m.dropout == 0.1
    assert (t.lr, t.warmup_steps, t.scheduler, t.betas, t.label_smoothing) == (7e-4, 1000, "inverse_sqrt",
                                                                             [0.9, 0.98], 0.1)
    # The bench config's batch-size-aware schedule is switched off: the protocol counts warmup in steps.
    assert t.warmup_tokens is None and t.lr_batch_tokens is None
    assert cfg.data.max_tokens == 4096 and cfg.tokenizer.vocab_size == 8000 and cfg.decode.beam == 5


def test_eole_configs_follow_the_protocol(tmp_path: Path) -> None:
    vocab_cfg, train_cfg = peers.eole_configs(tmp_path, ROOT.parent / "shared" / "data")
    train = yaml.safe_load(train_cfg.read_text())
    model, tr = train["model"], train["training"]
    assert (model["hidden_size"], model["heads"], model["layers"], model["transformer_ff"]) == (256, 4, 3, 1024)
    assert model["embeddings"]["position_encoding_type"] == "Rotary" and model["share_embeddings"]
    # noam's peak, lr * d^-0.5 * warmup^-0.5 at step = warmup, is the protocol's 7e-4.
    assert tr["learning_rate"] * 256**-0.5 * tr["warmup_steps"] ** -0.5 == pytest.approx(7e-4)
    assert (tr["batch_size"], tr["batch_type"], tr["label_smoothing"]) == (4096, "tokens", 0.1)
    assert (tr["adam_beta1"], tr["adam_beta2"], tr["dropout"]) == (0.9, 0.98, [0.1])
    assert yaml.safe_load(vocab_cfg.read_text())["src_vocab_size"] == 8000


def test_run_measured_reports_failure_in_one_line(tmp_path: Path) -> None:
    ok = run_measured([sys.executable, "-c", "print('hi')"], tmp_path / "ok.log")
    assert (tmp_path / "ok.log").read_text() == "hi\n" and ok.peak_rss_mib > 1 and ok.wall_s > 0
    with pytest.raises(CommandFailed, match=r"failed \(exit 3\).*boom"):
        run_measured([sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"], tmp_path / "bad.log")


def test_variant_names_a_system_with_its_overrides_and_rejects_malformed_ones() -> None:
    assert peers.parse_variant("lr2e-3: train.lr=2.0e-3 data.max_tokens=8192") == (
        "ours-defaults+lr2e-3", ["train.lr=2.0e-3", "data.max_tokens=8192"])
    for bad in ("no-colon train.lr=1", "name:", ": train.lr=1", "name: train.lr"):
        with pytest.raises(ValueError, match="--variant wants"):
            peers.parse_variant(bad)


def test_report_lists_variants_after_the_defaults_and_before_eole() -> None:
    r = result(100, 1000.0, [1.0, 2.0, 3.0], [10.0, 10.0, 10.0])
    report = peers.table({"eole": r, "ours-defaults+b": r, "ours-defaults": r, "ours-defaults+a": r}, 30)
    assert report.splitlines()[0].startswith("| 30 min, then beam 5 | ours-defaults | ours-defaults+a | "
                                             "ours-defaults+b | eole |")


def test_bench_scripts_answer_bad_paths_with_one_line(tmp_path: Path) -> None:
    from conftest import run_script

    afile = tmp_path / "afile"
    afile.write_text("x")
    for cmd, message in (
        (["bench/peers.py", "--systems", "ours", "--work", str(afile)], f"--work {afile} exists and is not a folder"),
        (["bench/speed.py", "--parts", "trained", "--model_path", str(tmp_path / "missing")], "missing: not found"),
        (["bench/study.py", "--preset", "seed-table", "--steps", "10", "--runs", str(afile)],
         "cannot create it (Not a directory)"),
    ):
        res = run_script(*cmd)
        assert res.returncode == 2 and "Traceback" not in res.stderr, (cmd, res.stderr)
        assert message in res.stderr.strip().splitlines()[-1], (cmd, res.stderr)


def test_report_adds_averaged_checkpoint_rows_when_a_run_has_them() -> None:
    ours = result(1500, 3000.0, [36.0, 32.0, 5.0], [150.0, 90.0, 60.0])
    ours["tests_average"] = {t: {"bleu": b, "chrf": 50.0, "sentences_per_s": 1.0}
                             for t, b in zip(peers.TEST_SETS, [37.0, 33.5, 5.5], strict=True)}
    report = peers.table({"ours": ours, "eole": result(1000, 1500.0, [35.0, 32.5, 4.0], [1.0, 1.0, 1.0])}, 44)
    assert "| sacreBLEU test.tatoeba, last 5 checkpoints averaged | 37.00 | - | - |" in report.splitlines()


def test_decoding_speed_is_also_given_per_output_word(tmp_path: Path) -> None:
    """A system whose outputs are half as long looks faster in sentences/s: words/s shows the work done."""
    run_dir = tmp_path / "ours" / "run"
    (run_dir / "eval").mkdir(parents=True)
    (run_dir / "checkpoints").mkdir()
    (run_dir / "checkpoints" / "best.pt").write_bytes(b"")
    (tmp_path / "eole").mkdir()
    for name in peers.TEST_SETS:
        (run_dir / "eval" / f"{name}.best.beam5.hyp").write_text("one two three four\n" * 100)
        (tmp_path / "eole" / f"{name}.hyp").write_text("one two\n" * 100)
    ours = {**result(1500, 3000.0, [36.0, 32.0, 5.0], [30.0, 30.0, 30.0]), "run_dir": str(run_dir)}
    eole = result(1000, 1500.0, [35.0, 32.5, 4.0], [40.0, 40.0, 40.0])
    for system, r in (("ours", ours), ("eole", eole)):
        for t in r["tests"].values():
            del t["words"], t["lines"]
        peers.add_output_lengths(tmp_path, system, r)
    assert ours["tests"]["test.tatoeba"]["words"] == 400 and eole["tests"]["test.tatoeba"]["lines"] == 100
    lines = peers.table({"ours": ours, "eole": eole}, 44).splitlines()
    assert "| beam-5 sentences/s test.iwslt-tst2010 | 30.0 | 40.0 | 0.75x |" in lines
    assert "| beam-5 output words per line test.iwslt-tst2010 | 4.0 | 2.0 | 2.00x |" in lines
    assert "| beam-5 output words/s test.iwslt-tst2010 | 120 | 80 | 1.50x |" in lines


FAKE_EOLE = {
    "eole/__init__.py": "",
    "eole/bin/__init__.py": "",
    # Eole's Trainer at the runner's boundary: train() steps until the runner stops it; validate() reports
    # a perplexity that depends on the criterion's label smoothing, as Eole's does.
    "eole/trainer.py": '''
class Stats:
    def __init__(self, ppl, n_tokens=0):
        self._ppl, self.n_tokens = ppl, n_tokens
    def ppl(self):
        return self._ppl
    def accuracy(self):
        return 50.0


class Criterion:
    label_smoothing = 0.1


class Loss:
    criterion = Criterion()


class Optim:
    training_step = 1


class Saver:
    saved = []
    def save(self, step, moving_average=None):
        Saver.saved.append(step)


class Trainer:
    def __init__(self):
        self.valid_loss, self.optim, self.model_saver, self.moving_average = Loss(), Optim(), Saver(), None
        self.seen = []
    def _train_step(self, batches, normalization, total_stats, report_stats, step=0):
        total_stats.n_tokens += 100
        self.optim.training_step += 1
    def train(self, train_iter, train_steps, save_checkpoint_steps=5000, valid_iter=None, valid_steps=10000):
        total = Stats(0.0)
        for _ in range(train_steps):
            self._train_step([], 1, total, None)
        return total
    def validate(self, valid_iter, moving_average=None):
        smoothing = self.valid_loss.criterion.label_smoothing
        self.seen.append(smoothing)
        return Stats(34.8 if smoothing else 11.0)
''',
    "eole/bin/main.py": '''
import json, sys
from eole.trainer import Trainer

def main():
    trainer = Trainer()
    trainer.train(None, 10, valid_iter="valid")
    json.dump({"smoothing_after": trainer.valid_loss.criterion.label_smoothing, "seen": trainer.seen},
              open(sys.argv[-1], "w"))
''',
}


def test_eole_runner_records_the_plain_perplexity_and_the_label_smoothed_one(tmp_path: Path) -> None:
    """Eole's validate keeps label smoothing (34.8 here); the plain perplexity (11.0) is what every other row
    of the table is, so the runner validates again with smoothing 0, restores it, and records both."""
    import json
    import os
    import subprocess

    for name, text in FAKE_EOLE.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    stats, probe = tmp_path / "stats.json", tmp_path / "probe.json"
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    res = subprocess.run([sys.executable, str(ROOT / "bench" / "eole_runner.py"), "train", str(stats), "0",
                          "-config", "x.yaml", str(probe)], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    record = json.loads(stats.read_text())
    assert record["valid_ppl"] == 11.0 and record["valid_ppl_label_smoothed"] == 34.8
    assert record["valid_label_smoothing"] == 0.1 and record["steps"] == 1
    assert json.loads(probe.read_text()) == {"smoothing_after": 0.1, "seen": [0.1, 0.0]}


def test_an_old_eole_result_never_shows_its_label_smoothed_perplexity_as_the_plain_one() -> None:
    old = {**result(1000, 1500.0, [35.0, 32.5, 4.0], [100.0, 60.0, 40.0]), "valid_ppl": 34.8}
    new = {**old, "valid_ppl": 11.0, "valid_ppl_label_smoothed": 34.8, "valid_label_smoothing": 0.1}
    ours = {**result(1500, 3000.0, [36.0, 32.0, 5.0], [150.0, 90.0, 60.0]), "valid_ppl": 8.45}
    lines = peers.table({"ours": ours, "eole": old}, 44).splitlines()
    assert "| valid perplexity (plain, no label smoothing) | 8.45 | - | - |" in lines
    assert "| valid perplexity with label smoothing (Eole's validate) | - | 34.80 | - |" in lines
    lines = peers.table({"ours": ours, "eole": new}, 44).splitlines()
    assert "| valid perplexity (plain, no label smoothing) | 8.45 | 11.00 | 0.77x |" in lines
