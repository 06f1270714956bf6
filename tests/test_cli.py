"""inference.py and test.py on a checkpoint trained in the test; one-line errors for bad input."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import ROOT, make_tiny_config, once, run_script

from utils.run.checkpoint import load_checkpoint, save_checkpoint
from utils.run.store import create_run_dir
from utils.training.loop import train


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    def build() -> Path:
        tmp = tmp_path_factory.mktemp("cli")
        cfg = make_tiny_config(tmp, max_steps=150, eval_every=75, lr=0.005)
        run = create_run_dir(cfg, tmp / "runs")
        train(cfg, run)
        return run

    return once("test_cli.run_dir", build)


def cli(script: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """``python script args`` in this process (``conftest.run_script``): the process-level behaviours (closed
    streams, pipes, signals, full disks) are tested below with real subprocesses."""
    return run_script(script, *args, stdin=stdin)


def error_line(res: subprocess.CompletedProcess[str]) -> str:
    """The last stderr line; expected errors are one line with no traceback."""
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert "Traceback" not in res.stderr
    return res.stderr.strip().splitlines()[-1]


def test_inference_prints_greedy_and_nbest_with_scores(run_dir: Path) -> None:
    res = cli("inference.py", "--model_path", str(run_dir), "--src_text", "Bonjour le monde.", "--beam", "3")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == "source: Bonjour le monde."
    assert lines[1].startswith("greedy: ") and "(logprob -" in lines[1]
    assert lines[2] == "beam 3 (lenpen 0.6), 3-best:"
    scores = [float(line.split("score ")[1].split(",")[0]) for line in lines[3:6]]
    assert len(scores) == 3 and scores == sorted(scores, reverse=True)


def test_inference_accepts_both_option_spellings_and_a_checkpoint_file(run_dir: Path) -> None:
    config = run_dir / "config.yaml"
    res = cli("inference.py", "--config", str(config), "--model-path", str(run_dir / "checkpoints" / "last.pt"),
              "--src-text", "Merci beaucoup.", "--beam", "1")
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[1].startswith("greedy: ")
    assert "beam" not in res.stdout  # beam 1: greedy only


def test_inference_translates_a_file_and_stdin_line_by_line(run_dir: Path, tmp_path: Path) -> None:
    src = ["Bonjour.", "", "Le chat dort sur le canapé.", "Merci beaucoup."]
    path = tmp_path / "in.fr"
    path.write_text("\n".join(src) + "\n", encoding="utf-8")
    from_file = cli("inference.py", "--model_path", str(run_dir), "--input", str(path), "--batch_size", "2")
    from_stdin = cli("inference.py", "--model_path", str(run_dir), stdin="\n".join(src) + "\n")
    assert from_file.returncode == 0 and from_stdin.returncode == 0, from_file.stderr
    out = from_file.stdout.split("\n")[:-1]
    assert len(out) == 4 and out[1] == "" and all(out[i] for i in (0, 2, 3))
    assert from_stdin.stdout == from_file.stdout  # batching does not change results
    assert "1 empty input line" in from_file.stderr and "sentences/s" in from_file.stderr


def test_test_py_scores_and_writes_hypotheses_and_json(run_dir: Path) -> None:
    res = cli("test.py", "--config", str(run_dir / "config.yaml"), "--model_path", str(run_dir), "--beam", "2")
    assert res.returncode == 0, res.stderr
    assert "sacreBLEU" in res.stdout and "chrF" in res.stdout and "nltk BLEU-4" in res.stdout
    assert "  sacreBLEU signature: nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:" in res.stdout
    assert "  chrF signature:      nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:" in res.stdout
    scores = json.loads((run_dir / "eval" / "test.best.beam2.json").read_text())
    hyps = (run_dir / "eval" / "test.best.beam2.hyp").read_text(encoding="utf-8").splitlines()
    assert scores["n_sentences"] == len(hyps) == 40
    for key in ("bleu", "chrf", "nltk_bleu4"):
        assert 0.0 <= scores[key] <= 100.0
    assert scores["bleu_signature"].startswith("nrefs:1") and scores["beam"] == 2
    assert sum(row["n"] for row in scores["by_source_length"]) == 40
    assert [row["bucket"] for row in scores["by_source_length"]] == ["0-9", "10-19", "20-29", "30-39", "40-59", "60+"]
    assert "by source length (tokens):  0-9: " in res.stdout
    greedy = cli("test.py", "--model_path", str(run_dir), "--beam", "1", "--split", "validation", "--buckets", "5,8")
    assert greedy.returncode == 0, greedy.stderr
    assert "validation: 40 sentences, greedy" in greedy.stdout
    by_length = json.loads((run_dir / "eval" / "validation.best.beam1.json").read_text())["by_source_length"]
    assert [row["bucket"] for row in by_length] == ["0-4", "5-7", "8+"]


def test_test_py_scores_several_beams_in_one_process_as_one_at_a_time(run_dir: Path, tmp_path: Path) -> None:
    """--beam 2 1 (what a study asks for each run): the files and scores of --beam 2 and --beam 1 run apart."""
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("eval"))
    both = cli("test.py", "--model_path", str(copy), "--beam", "2", "1", "--split", "validation", "--tag", "t")
    assert both.returncode == 0, both.stderr
    assert both.stdout.index("validation: 40 sentences, beam 2") < both.stdout.index("validation: 40 sentences, greedy")
    together = {b: (copy / "eval" / f"validation.best.beam{b}.t.hyp").read_text() for b in (2, 1)}
    scores = {b: json.loads((copy / "eval" / f"validation.best.beam{b}.t.json").read_text()) for b in (2, 1)}
    for beam in (2, 1):
        alone = cli("test.py", "--model_path", str(copy), "--beam", str(beam), "--split", "validation", "--tag", "a")
        assert alone.returncode == 0, alone.stderr
        assert (copy / "eval" / f"validation.best.beam{beam}.a.hyp").read_text() == together[beam]
        one = json.loads((copy / "eval" / f"validation.best.beam{beam}.a.json").read_text())
        assert scores[beam]["beam"] == one["beam"] == beam
        assert {k: scores[beam][k] for k in ("bleu", "chrf", "nltk_bleu4", "lenpen", "by_source_length")} == \
            {k: one[k] for k in ("bleu", "chrf", "nltk_bleu4", "lenpen", "by_source_length")}
    assert "--beam must be >= 1, got 0" in error_line(cli("test.py", "--model_path", str(copy), "--beam", "2", "0"))


def test_an_empty_sentence_is_refused_before_the_model_loads(run_dir: Path, tmp_path: Path) -> None:
    """--src_text " " is the user's mistake, said in one line before the (slow) model load: here the checkpoint is
    damaged too, and the empty sentence is what is named."""
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("eval"))
    best = copy / "checkpoints" / "best.pt"
    best.write_bytes(best.read_bytes()[:1000])
    assert "--src_text is empty" in error_line(cli("inference.py", "--model_path", str(copy), "--src_text", " "))
    assert "--src_text is empty" not in error_line(cli("inference.py", "--model_path", str(copy), "--src_text",
                                                       "Oui."))


def test_user_errors_are_one_line(run_dir: Path, tmp_path: Path) -> None:
    assert "checkpoint not found" in error_line(cli("inference.py", "--model_path", str(tmp_path / "x.pt"),
                                                    "--src_text", "Bonjour."))
    assert "--src_text is empty" in error_line(cli("inference.py", "--model_path", str(run_dir), "--src_text", " "))
    line = error_line(cli("inference.py", "--model_path", str(run_dir), "--src_text", "Oui.",
                          "--set", "decode.beem=2"))
    assert "unknown config key decode.beem; allowed keys in decode: beam," in line
    # A config describing another model than the checkpoint's.
    other = yaml.safe_load((run_dir / "config.yaml").read_text())
    other["model"]["d_model"] = 64
    path = tmp_path / "other.yaml"
    path.write_text(yaml.safe_dump(other))
    line = error_line(cli("inference.py", "--config", str(path), "--model_path", str(run_dir), "--src_text", "Oui."))
    assert "model.d_model=64 but the checkpoint was trained with 32" in line
    line = error_line(cli("test.py", "--model_path", str(run_dir), "--split", "nope"))
    assert "--split nope: no such split; available: train, validation, test" in line


def test_mismatched_checkpoint_weights_are_caught(run_dir: Path, tmp_path: Path) -> None:

    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    state = load_checkpoint(copy / "checkpoints" / "best.pt")
    state["meta"]["model_fingerprint"] = "0" * 16
    save_checkpoint(copy / "checkpoints" / "best.pt", state)
    assert "different model configuration" in error_line(
        cli("inference.py", "--model_path", str(copy), "--src_text", "Oui."))
    state["meta"].pop("model_fingerprint")
    state["model"]["src_embed.weight"] = torch.zeros(3, 3)
    save_checkpoint(copy / "checkpoints" / "best.pt", state)
    line = error_line(cli("inference.py", "--model_path", str(copy), "--src_text", "Oui."))
    assert "does not fit the model" in line and "src_embed.weight has shape [3, 3] in the checkpoint" in line
    (copy / "checkpoints" / "best.pt").write_bytes(b"garbage")
    line = error_line(cli("inference.py", "--model_path", str(copy), "--src_text", "Oui."))
    assert "is not a PyTorch checkpoint" in line


def test_test_py_scores_a_lowercased_model_case_insensitively(run_dir: Path, tmp_path: Path) -> None:
    """A run trained with tokenizer.lowercase outputs lowercase text: it is scored as it was trained."""

    from sacrebleu.metrics import BLEU

    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("eval"))
    cfg = yaml.safe_load((copy / "config.yaml").read_text())
    cfg["tokenizer"]["lowercase"] = True
    (copy / "config.yaml").write_text(yaml.safe_dump(cfg))
    res = cli("test.py", "--model_path", str(copy), "--beam", "1", "--split", "validation")
    assert res.returncode == 0, res.stderr
    assert "|case:lc|" in res.stdout
    entry = json.loads((copy / "eval" / "validation.best.beam1.json").read_text())
    assert "case:lc" in entry["bleu_signature"]
    hyps = (copy / "eval" / "validation.best.beam1.hyp").read_text(encoding="utf-8").splitlines()
    refs = (ROOT / "data" / "demo" / "valid.en").read_text(encoding="utf-8").splitlines()
    assert entry["bleu"] == pytest.approx(BLEU(lowercase=True).corpus_score(hyps, [refs]).score)


def test_inference_reads_crlf_and_stdin_like_files_one_output_line_per_input_line(run_dir: Path,
                                                                                    tmp_path: Path) -> None:
    src = ["Bonjour.", "Le chat dort sur le canapé.", "", "Merci beaucoup."]
    lf = tmp_path / "lf.fr"
    lf.write_text("\n".join(src) + "\n", encoding="utf-8")
    crlf = "\r\n".join(src) + "\r\n"
    from_lf = cli("inference.py", "--model_path", str(run_dir), "--input", str(lf), "--beam", "1")
    from_crlf_stdin = cli("inference.py", "--model_path", str(run_dir), "--beam", "1", stdin=crlf)
    messy_input = "\ufeffBonjour.\r\nLe  chat\tdort sur le\u00a0canapé.\r\n\r\nMerci beaucoup."  # BOM, no final EOL
    messy = cli("inference.py", "--model_path", str(run_dir), "--beam", "1", stdin=messy_input)
    assert from_lf.returncode == from_crlf_stdin.returncode == messy.returncode == 0, from_crlf_stdin.stderr
    assert len(from_lf.stdout.split("\n")) == 5 and from_lf.stdout.endswith("\n")
    assert from_crlf_stdin.stdout == from_lf.stdout == messy.stdout


def test_inference_undecodable_lines_do_not_stop_the_others(run_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "mixed.fr"
    path.write_bytes(b"Bonjour.\ncaf\xe9 latin-1\nMerci beaucoup.\n")
    res = cli("inference.py", "--model_path", str(run_dir), "--input", str(path), "--beam", "1")
    assert res.returncode == 0, res.stderr
    out = res.stdout.split("\n")[:-1]
    assert len(out) == 3 and out[1] == "" and out[0] and out[2]
    assert "line 2: not valid UTF-8 at byte 3; its output line is empty" in res.stderr
    assert "empty input line" not in res.stderr  # the unreadable line is reported once, as unreadable
    good = cli("inference.py", "--model_path", str(run_dir), "--beam", "1", stdin="Bonjour.\nMerci beaucoup.\n")
    assert [out[0], out[2]] == good.stdout.split("\n")[:-1]


def test_inference_bad_input_files_are_one_line(run_dir: Path, tmp_path: Path) -> None:
    binary = tmp_path / "model.bin"
    binary.write_bytes(b"\x00\x01\x02PK\x00\x00" * 100)
    utf16 = tmp_path / "utf16.fr"
    utf16.write_text("Bonjour.\n", encoding="utf-16")
    for path, message in ((tmp_path / "missing.fr", "file not found"), (tmp_path, "is a folder, not a text file"),
                          (binary, "is not a text file"), (utf16, "is not a text file")):
        line = error_line(cli("inference.py", "--model_path", str(run_dir), "--input", str(path)))
        assert message in line and str(path) in line, line


def test_inference_streams_large_input_in_order_with_bounded_memory(run_dir: Path) -> None:
    """The first 2,000-line chunk is written before standard input ends; order and numbering hold across chunks."""
    import select

    lines = [f"Le chat numéro {i} dort." if i % 7 else "Merci." for i in range(2500)]
    proc = subprocess.Popen([sys.executable, "inference.py", "--model_path", str(run_dir), "--beam", "1"], cwd=ROOT,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("\n".join(lines[:2000]) + "\n")
    proc.stdin.flush()
    ready, _, _ = select.select([proc.stdout], [], [], 240)
    assert ready, "nothing written before the input ended"
    first = proc.stdout.readline()
    assert first.strip()  # input still open: the first chunk is already out
    proc.stdin.write("\n".join(lines[2000:]) + "\n")
    proc.stdin.close()
    rest = proc.stdout.read()
    proc.wait(timeout=240)
    out = (first + rest).split("\n")[:-1]
    assert proc.returncode == 0 and len(out) == 2500
    assert len({out[i] for i in range(0, 2500, 7)}) == 1  # every "Merci." line, wherever its chunk, the same


def test_translate_stream_numbers_nbest_rows_across_chunks(run_dir: Path) -> None:
    import io

    from utils.run.load import load_run
    from utils.translation.translate import translate_stream

    run = load_run(run_dir)
    out = io.StringIO()
    decode = run.cfg.decode.model_copy(update=dict(beam=2, nbest=2))
    from utils.translation.translate import translate

    fn = lambda texts, d: translate(run.model, run.tokenizer, texts, d, strict=False)  # noqa: E731
    report = translate_stream(fn, io.BytesIO(b"Bonjour.\nOui.\n\nMerci.\nNon.\n"), out, decode, chunk_lines=2)
    rows = [line.split("\t") for line in out.getvalue().splitlines()]
    assert [int(r[0]) for r in rows] == [0, 0, 1, 1, 2, 3, 3, 4, 4]  # an empty line has one empty hypothesis
    assert report.lines == 5 and report.empty == 1


def test_output_paths_that_cannot_be_used_are_one_line(run_dir: Path, tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    line = error_line(cli("visualize.py", "--model_path", str(run_dir), "--src_text", "Oui.", "--out", str(afile)))
    assert f"--out {afile} exists and is not a folder" in line
    line = error_line(cli("train.py", "--config", "configs/demo.yaml", "--runs", str(afile / "runs")))
    assert "exists and is not a folder" in line

    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("eval"))
    (copy / "eval").write_text("x")
    line = error_line(cli("test.py", "--model_path", str(copy), "--beam", "1", "--split", "validation"))
    assert "eval folder" in line and "exists and is not a folder" in line


def test_checkpoints_that_are_not_checkpoints_inside_a_run_directory_are_one_line(run_dir: Path,
                                                                                  tmp_path: Path) -> None:

    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    best = copy / "checkpoints" / "best.pt"
    best.write_bytes(b"")
    assert "is empty (0 bytes)" in error_line(cli("inference.py", "--model_path", str(copy), "--src_text", "Oui."))
    torch.save({"model": Path("x")}, best)  # a pickled Python object: never unpickled
    line = error_line(cli("test.py", "--model_path", str(best), "--beam", "1"))
    assert "never unpickles" in line and "weights_only" not in line
    (copy / "checkpoints" / "last.pt").write_text("hello")
    line = error_line(cli("train.py", "--resume", str(copy)))
    assert "is not a PyTorch checkpoint" in line


def test_a_closed_pipe_ends_inference_quietly(run_dir: Path) -> None:
    res = subprocess.run(f"printf 'Oui.\\nNon.\\n' | {sys.executable} inference.py --model_path {run_dir} --beam 1 "
                         "| head -c 0", shell=True, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert "Traceback" not in res.stderr and "BrokenPipeError" not in res.stderr


def test_test_py_scores_the_splits_asked_for_each_named_or_says_why_not(run_dir: Path, tmp_path: Path) -> None:
    both = cli("test.py", "--model_path", str(run_dir), "--beam", "1", "--set", "data.test=[test,validation]")
    assert both.returncode == 0, both.stderr  # a split literally named "test" no longer hides the others
    assert [line.split(":")[0] for line in both.stdout.splitlines() if " sentences, greedy" in line] == \
        ["test", "validation"]
    one = cli("test.py", "--model_path", str(run_dir), "--beam", "1", "--split", "test", "--max_sentences", "3")
    assert [line.split(":")[0] for line in one.stdout.splitlines() if " sentences, greedy" in line] == ["test"]
    assert error_line(cli("test.py", "--model_path", str(run_dir), "--set", "data.test=[]")) == \
        "error: data.test is empty: no split to score (name one with --split)"
    line = error_line(cli("test.py", "--model_path", str(run_dir), "--set", "data.test=[nosuch]"))
    assert line == "error: data.test: no split 'nosuch' in the corpus; available: train, validation, test"
    folder = tmp_path / "text"
    folder.mkdir()
    for split, name in (("train", "train"), ("valid", "valid"), ("test", "empty")):
        for lang in ("fr", "en"):
            src = ROOT / "data" / "demo" / f"{split}.{lang}"
            (folder / f"{name}.{lang}").write_text("" if name == "empty" else src.read_text(encoding="utf-8"))
    line = error_line(cli("test.py", "--model_path", str(run_dir), "--set", "data.source=text",
                          "--set", f"data.path={folder}", "--set", "data.test=[empty]"))
    assert line == "error: split empty has no sentence pairs: nothing to score"


def test_threads_sets_the_decoding_threads_shown_and_recorded(run_dir: Path, tmp_path: Path) -> None:
    """--threads N is what decoding uses on CPU (more threads than free cores stall each other: README measures 18x
    slower decoding with two threads beside two training runs), printed with the speed and kept in the score file.
    3: a count no command here takes by default (2 cores; one per test worker)."""
    res = cli("test.py", "--model_path", str(run_dir), "--beam", "1", "--split", "test", "--max_sentences", "3",
              "--threads", "3", "--tag", "t3", "--device", "cpu")
    assert res.returncode == 0, res.stderr
    line = next(x for x in res.stdout.splitlines() if x.startswith("test: "))
    assert re.fullmatch(r"test: 3 sentences, greedy, [0-9.]+ sentences/s, 3 threads", line), line
    assert json.loads((run_dir / "eval" / "test.best.beam1.t3.json").read_text())["threads"] == 3
    src = tmp_path / "src.fr"
    src.write_text("Bonjour le monde.\nMerci.\n", encoding="utf-8")
    res = cli("inference.py", "--model_path", str(run_dir), "--input", str(src), "--threads", "3", "--device", "cpu")
    assert res.returncode == 0 and len(res.stdout.splitlines()) == 2, res.stderr
    assert re.search(r"\(\S+ sentences/s, 3 threads\)$", res.stderr.strip().splitlines()[-1]), res.stderr
    for script in ("test.py", "inference.py"):
        assert error_line(cli(script, "--model_path", str(run_dir), "--threads", "0")).endswith(
            "error: --threads must be >= 1, got 0")


def test_threads_reach_the_processes_a_command_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server decodes in a process of its own (spawned): --threads reaches it as OMP_NUM_THREADS."""
    import argparse

    from utils.cli import add_run_args, apply_threads

    parser = argparse.ArgumentParser()
    add_run_args(parser)
    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    try:  # 3: not what a test worker (one core) or a child on this 2-core machine would take by default
        assert apply_threads(parser, parser.parse_args(["--model_path", "x", "--threads", "3"])) == 3
        assert torch.get_num_threads() == 3 and os.environ["OMP_NUM_THREADS"] == "3"
        child = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('OMP_NUM_THREADS'))"],
                               capture_output=True, text=True, timeout=120)
        assert child.stdout.strip() == "3"  # (torch takes at most the cores it may use from it)
        monkeypatch.delenv("OMP_NUM_THREADS")
        assert apply_threads(parser, parser.parse_args(["--model_path", "x"])) == 3  # no flag: left as it is
        assert "OMP_NUM_THREADS" not in os.environ
    finally:
        torch.set_num_threads(before)


def test_scores_under_other_settings_never_overwrite_each_other(run_dir: Path) -> None:
    plain = cli("test.py", "--model_path", str(run_dir), "--beam", "1", "--max_sentences", "5", "--tag", "mine")
    assert plain.returncode == 0, plain.stderr
    first = (run_dir / "eval" / "test.best.beam1.mine.json").read_text()
    scaled = cli("test.py", "--model_path", str(run_dir), "--beam", "1", "--max_sentences", "5",
                 "--set", "model.rope.scaling=linear", "--set", "model.rope.factor=2")
    assert scaled.returncode == 0, scaled.stderr
    name = "test.best.beam1.n5+model.rope.scaling-linear+model.rope.factor-2.0.json"
    assert json.loads((run_dir / "eval" / name).read_text())["overrides"] == \
        ["model.rope.scaling=linear", "model.rope.factor=2"]
    lenpen = cli("test.py", "--model_path", str(run_dir), "--beam", "2", "--max_sentences", "5", "--lenpen", "1.5")
    assert lenpen.returncode == 0, lenpen.stderr
    assert json.loads((run_dir / "eval" / "test.best.beam2.n5+decode.lenpen-1.5.json").read_text())["lenpen"] == 1.5
    assert (run_dir / "eval" / "test.best.beam1.mine.json").read_text() == first  # an explicit --tag is kept


def test_closed_standard_streams_and_endless_input_are_one_line(run_dir: Path) -> None:
    def sh(script: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300,
                              env={**__import__("os").environ, "PY": sys.executable, "RUN": str(run_dir)})

    line = error_line(sh('"$PY" inference.py --model_path "$RUN" --beam 1 <&-'))
    assert line == "error: standard input is closed: pipe sentences in, or give --input FILE"
    res = sh('echo Bonjour. | "$PY" inference.py --model_path "$RUN" --beam 1 >&-')
    assert error_line(res) == \
        "error: standard output is closed, and the translations would be lost; redirect it (> FILE)"
    quiet = sh('printf "Bonjour.\\nMerci.\\n" | "$PY" inference.py --model_path "$RUN" --beam 1 2>&-')
    assert quiet.returncode == 0 and len(quiet.stdout.splitlines()) == 2  # no message in the translations
    endless = sh('ulimit -v 4000000; "$PY" inference.py --model_path "$RUN" --beam 1 --input /dev/zero')
    assert error_line(endless) == "error: /dev/zero is not a text file (NUL bytes in its first line; UTF-16 or binary?)"
    long = sh('(head -c 200000 /dev/zero | tr "\\0" a; printf "\\nMerci.\\n") | '
              '"$PY" inference.py --model_path "$RUN" --beam 1')
    assert long.returncode == 0 and len(long.stdout.splitlines()) == 2 and long.stdout.splitlines()[0] == ""
    assert "warning: standard input line 1: longer than 65,536 bytes; its output line is empty" in long.stderr


def test_a_full_disk_while_writing_a_checkpoint_is_one_line_and_keeps_the_run_loadable(run_dir: Path,
                                                                                       tmp_path: Path) -> None:

    run = tmp_path / run_dir.name
    shutil.copytree(run_dir, run)
    before = (run / "checkpoints" / "last.pt").read_bytes()
    step = load_checkpoint(run / "checkpoints" / "last.pt")["trainer"]["iteration"]
    limit = len(before) // 2  # the file size limit hits torch.save as a full disk would (EFBIG instead of ENOSPC)

    def small_files() -> None:
        import resource
        import signal

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    res = subprocess.run([sys.executable, "train.py", "--resume", str(run), "--set", f"train.max_steps={step + 2}",
                          "--set", "train.epochs=100"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300, preexec_fn=small_files)
    line = error_line(res)
    assert line.startswith(f"error: cannot write checkpoint {run / 'checkpoints' / 'last.pt'} (")
    assert line.endswith("the checkpoints already there are intact")
    assert (run / "checkpoints" / "last.pt").read_bytes() == before
    assert not list((run / "checkpoints").glob(".*.tmp"))
    assert load_checkpoint(run / "checkpoints" / "last.pt")["trainer"]["iteration"] == step


def test_decode_flags_become_the_same_overrides_in_every_script() -> None:
    import argparse

    from utils.cli import decode_overrides

    args = argparse.Namespace(overrides=["model.rope.factor=2"], beam=4, lenpen=None, batch_size=16, nbest=2)
    assert decode_overrides(args) == ["model.rope.factor=2", "decode.beam=4", "decode.batch_size=16", "decode.nbest=2"]
    assert decode_overrides(argparse.Namespace(overrides=[], beam=1)) == ["decode.beam=1"]  # flags a script lacks


def test_the_length_floor_flags_of_test_py_and_inference_py(capsys: pytest.CaptureFixture[str]) -> None:
    """--min_len_a/--min-len-a and --min_len_b (utils.cli.add_run_args) become decode.min_len_a/b overrides in both
    scripts; test.py files a floored scoring apart (its settings tag); a negative or non-finite A: one line, exit 2."""
    import importlib.util

    from utils.cli import decode_overrides

    scripts = {}
    for name in ("test", "inference"):
        spec = importlib.util.spec_from_file_location(f"fr2en_{name}_script", ROOT / f"{name}.py")
        scripts[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(scripts[name])
    for module in scripts.values():
        parser = module.build_parser()
        args = parser.parse_args(["--model_path", "run", "--min-len-a", "0.5", "--min_len_b", "2"])
        assert [o for o in decode_overrides(args) if "min_len" in o] == ["decode.min_len_a=0.5", "decode.min_len_b=2"]
        assert not [o for o in decode_overrides(parser.parse_args(["--model_path", "run"])) if "min_len" in o]
        for bad in ("-1", "nan", "inf"):
            with pytest.raises(SystemExit) as e:
                parser.parse_args(["--model_path", "run", "--min_len_a", bad])
            assert e.value.code == 2
            err = capsys.readouterr().err.strip().splitlines()[-1]
            assert err.endswith(f"argument --min_len_a/--min-len-a: must be a finite number in 0..1000, got {bad}")
    cfg = make_tiny_config(Path("/nonexistent")).to_dict()
    floored = json.loads(json.dumps(cfg))
    floored["decode"]["min_len_a"] = 1.0
    assert scripts["test"].settings_tag(cfg, floored, None) == "decode.min_len_a-1.0"


def test_inference_starts_each_line_with_the_prefix_and_writes_each_lines_constraints(run_dir: Path,
                                                                                       tmp_path: Path) -> None:
    """--prefix for every line and --constraints per line (tab-separated, an empty line for none), standard input
    counted against the file before anything is translated."""
    terms = tmp_path / "terms.tsv"
    terms.write_text("sofa\n\nred cat\tbed\n", encoding="utf-8")
    res = cli("inference.py", "--model_path", str(run_dir), "--input", "-", "--threads", "1", "--beam", "3",
              "--prefix", "The  dog", "--constraints", str(terms), stdin="Le chat dort.\nBonjour.\nLe chien mange.\n")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert len(lines) == 3 and all(line.startswith("The dog") for line in lines), lines
    assert "sofa" in lines[0] and "red cat" in lines[2] and "bed" in lines[2]
    assert "constraints" not in res.stderr  # every line met its phrases: no warning


def test_logs_go_to_the_current_stderr_not_one_closed_since(monkeypatch: pytest.MonkeyPatch) -> None:
    """A script's logging set up under one standard error (a caller's capture), closed and replaced since: later
    records reach the new one, with no "Logging error" from writing to the closed stream."""
    import io
    import logging

    from utils.cli import setup_logging

    first, second = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    setup_logging()
    first.close()
    monkeypatch.setattr(sys, "stderr", second)
    logging.getLogger("config").warning("--set %s has no effect", "model.rope.factor=2")
    assert second.getvalue().splitlines()[-1].endswith("config: --set model.rope.factor=2 has no effect")
    assert "Logging error" not in second.getvalue()


def test_a_command_that_needs_no_torch_starts_without_it_and_its_errors_stay_one_line() -> None:
    """bench/sequential_design.py (boundaries and power: scipy, no model) runs without importing torch, the
    several seconds a process takes to import it; run_main still turns a user's bad input into one line, and a
    ConfigError raised by a command that imported only the config schema too."""
    watch = "import atexit, sys; atexit.register(lambda: print('torch' in sys.modules, file=sys.stderr)); "
    design = subprocess.run([sys.executable, "-c", watch + "import runpy; sys.argv = ['bench/sequential_design.py', "
                             "'--looks', '6,12', '--family', '2', '--residual-sd', '1.3', '--effect', '1.0']; "
                             "runpy.run_path('bench/sequential_design.py', run_name='__main__')"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert design.returncode == 0 and "| 12 |" in design.stdout, design.stderr
    assert design.stderr.splitlines()[-1] == "False"
    bad = subprocess.run([sys.executable, "-c", watch + "import runpy; sys.argv = ['bench/sequential_design.py', "
                          "'--looks', '12,6']; runpy.run_path('bench/sequential_design.py', run_name='__main__')"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.splitlines()[-1] == "False", bad.stderr
    assert "error: argument --looks" in bad.stderr.splitlines()[-2]
    schema = subprocess.run([sys.executable, "-c", watch + "from utils.cli import run_main; "
                             "from utils.schema import ConfigError; "
                             "run_main(lambda: (_ for _ in ()).throw(ConfigError('model.d_model: must be > 0')))"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert schema.returncode == 2 and schema.stderr.splitlines() == ["error: model.d_model: must be > 0", "False"]
