"""README's demo-sized command blocks, read from README itself and run in a fresh copy of the project (no runs/,
no cache), in README's order: README and code cannot drift apart. A block runs when an HTML comment
``<!-- readme-test ... -->`` precedes it. Every command runs as written, except that ``--config configs/demo.yaml``
gets ``--set`` overrides shrinking the demo model to the tests' tiny one, validated twice (its steps, epochs,
checkpoints and schedule unchanged): the demo's own model takes a minute on 2 free cores, far longer on a busy
CI machine."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

TINY = ("model.d_model=32", "model.d_ff=64", "model.n_heads=2", "model.encoder_layers=1", "model.decoder_layers=1",
        "tokenizer.vocab_size=400", "train.valid_bleu_sentences=4", "train.log_attention_every=0",
        "train.eval_every=210")
MARK = re.compile(r"<!-- readme-test[^>]*-->\s*\n```bash\n(.*?)```", re.S)


def readme_blocks(text: str) -> list[str]:
    """The command blocks marked for this test, in README's order."""
    return [m.group(1) for m in MARK.finditer(text)]


def shrink(block: str) -> str:
    """``block`` with the tiny model's overrides after each ``--config configs/demo.yaml`` (training, and the
    commands that must describe the same model)."""
    return block.replace("--config configs/demo.yaml", "--config configs/demo.yaml " +
                         " ".join(f"--set {s}" for s in TINY))


def fresh_copy(dest: Path) -> Path:
    """The tracked files of the project, as a fresh clone has them."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for name in filter(None, files.split("\0")):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def test_readme_demo_commands_run_as_written(tmp_path: Path) -> None:
    blocks = readme_blocks((ROOT / "README.md").read_text(encoding="utf-8"))
    assert len(blocks) == 4 and "train.py --config configs/demo.yaml" in blocks[0]
    project = fresh_copy(tmp_path / "project")
    bin_dir = Path(sys.executable).parent  # `python` is this environment's, as in an activated virtual environment
    assert (bin_dir / "python").exists()
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    for block in blocks:
        res = subprocess.run(["bash", "-euo", "pipefail", "-c", shrink(block)], cwd=project, env=env,
                             capture_output=True, text=True, timeout=1200)
        assert res.returncode == 0, f"{block}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
        assert "Traceback" not in res.stderr, block
    runs = project / "runs"
    assert len((project / "hyp.en").read_text(encoding="utf-8").splitlines()) == 40  # one line per input line
    latest = (runs / "demo_latest").resolve()
    assert len(list(runs.glob("demo_2*"))) == 2 and latest == max(runs.glob("demo_2*"))
    (averaged,) = (latest / "checkpoints").glob("average5_step_*.pt")  # the last 5 of the run's periodic ones
    assert (latest / "eval" / f"test.{averaged.stem}.beam5.json").is_file()


def _shell_commands(text: str) -> list[str]:
    """The commands of the ```bash blocks in ``text``, continuation lines joined."""
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    return [line.strip() for block in blocks for line in block.replace("\\\n", " ").splitlines() if line.strip()]


def _flags(words: list[str]) -> dict[str, str | None]:
    """``--flag value`` and bare ``--flag`` words as a flag -> value map (a flag given twice is an error)."""
    out: dict[str, str | None] = {}
    for i, word in enumerate(words):
        if word.startswith("--"):
            assert word not in out, word
            nxt = words[i + 1] if i + 1 < len(words) else None
            out[word] = nxt if nxt is not None and not nxt.startswith("--") else None
    return out


def test_the_study_queue_runs_readmes_study_commands_at_their_pinned_commits() -> None:
    """bench/study_queue.sh chains the study commands README gives, in README's order (the study trained to 2,250
    steps, its continuation trained to the budget the rule sets and scored there; the candidates, which ran on a
    lent GPU, are no longer queued): each from its worktree, with the same flags and values and the same pinned
    commits, the rule with README's own command, so the script and the pre-registration cannot drift apart. A
    budget the rule decides (``--steps "$budget"``) matches README's ``--steps B``."""
    script = (ROOT / "bench" / "study_queue.sh").read_text()
    var = {k: v.strip('"') for k, v in re.findall(r'^\s*([A-Z_]+)=("[^"]*"|\S+)', script, re.M)}
    readme = (ROOT / "README.md").read_text()
    for name, folder in (("TRAIN_COMMIT", "study-wt"), ("SCORE_COMMIT", "score-wt"), ("RULE_COMMIT", "rule-wt")):
        assert f"git worktree add --detach ../{folder} {var[name]}" in readme, name
    documented = []
    for command in _shell_commands(readme):
        if "bench/study.py" in command and "--preset train-short-test-long" in command:
            where, flags = command.split("bench/study.py", 1)
            documented.append((where.split("&&")[0].strip(), _flags(shlex.split(flags))))
    step = re.compile(r'step "\$(\w+)" "[^"]*" (.*?)(?: &&| \|\| return 1)?$', re.M)
    chain = script[script.index('worktree "$TRAIN_WT" "$TRAIN_COMMIT" &&'):]  # what runs, in order
    continuation = script[script.index("continued() {"):script.index("once() {")]
    assert re.search(r"--train-only &&\n\s*replayed \S+ &&\n\s*once \S+ continued &&", chain)  # after the study's
    steps = step.findall(chain) + step.findall(continuation)
    assert len(steps) == 3, steps
    worktree = {"TRAIN_WT": "cd ../study-wt", "SCORE_WT": "cd ../score-wt"}
    def expand(words: list[str]) -> list[str]:  # the script's option strings ($STUDY, $COMMON, $BASE) as words
        return [w for a in words for w in (expand(var[a[1:]].split()) if a[1:] in var and a != "$RUNS" else [a])]

    for wt, args in steps:
        words = expand(args.split())
        flags = _flags(["B" if w == '"$budget"' else w for w in words])
        assert flags["--runs"] == "$RUNS"
        flags["--runs"] = "../study-runs"
        assert (worktree[wt], flags) in documented, (wt, args)
    assert [wt for wt, _ in steps] == ["TRAIN_WT", "TRAIN_WT", "SCORE_WT"]
    assert ["--train-only" in a for _, a in steps] == [True, True, False]
    assert all(a.startswith("$STUDY ") for _, a in steps) and "extrapolation-candidates" not in script
    rule = re.search(r'\.venv/bin/python (bench/pilot_rule\.py "\$RUNS/study_extrapolation" [^)]*?)\)', script, re.S)
    assert rule is not None
    rule_words = shlex.split(rule.group(1).replace("\\\n", " ").replace('"$RUNS', '"../study-runs'))
    assert f"cd ../rule-wt && .venv/bin/python {' '.join(rule_words)}" in _shell_commands(readme)
    assert subprocess.run(["bash", "-n", str(ROOT / "bench" / "study_queue.sh")]).returncode == 0
    for commit in (var["TRAIN_COMMIT"], var["SCORE_COMMIT"], var["RULE_COMMIT"]):
        assert subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"]).returncode == 0
    rule_wt = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "--name-only", var["RULE_COMMIT"], "bench/"],
                             capture_output=True, text=True, check=True).stdout.split()
    assert {"bench/pilot_rule.py", "bench/study_replay.py"} <= set(rule_wt)  # what the queue runs from there


def test_readmes_encoding_tables_have_a_row_for_every_registered_encoding() -> None:
    """README's two tables under "Positional encodings" (``model.input_pe``, ``model.attention_pe``) list exactly
    the registry's names, each once, and every augmentation method of ``model.augment`` has its row."""
    from typing import get_args

    from models.positional import REGISTRY
    from models.positional.augment import Method

    section = (ROOT / "README.md").read_text().split("## Positional encodings", 1)[1].split("\n## ", 1)[0]
    for level in ("input", "attention"):
        table = section.split(f"| `model.{level}_pe` |", 1)[1].split("\n\n", 1)[0]
        rows = re.findall(r"^\| `(\w+)` \|", table, re.M)
        assert len(rows) == len(set(rows)) and set(rows) == set(REGISTRY[level]), level
    methods = re.findall(r"^\| `(\w+)` \|", section.split("| `method` |", 1)[1].split("\n\n", 1)[0], re.M)
    assert methods == [m for m in get_args(Method) if m != "none"]


def test_readmes_encoding_lists_and_quoted_errors_follow_the_registry() -> None:
    """README's augmentation table names every encoding that sees only i - j (SHAPE refused) and every one defined
    on real positions (CAPE), from the registry's declarations; its quoted errors are what the code says."""
    from models.positional import REGISTRY
    from utils.config import ConfigError, load_config

    readme = (ROOT / "README.md").read_text()
    classes = [(name, getattr(cls, "shift_invariant", False), getattr(cls, "positions", "integer"))
               for level in ("input", "attention") for name, cls in REGISTRY[level].items()
               if cls is not None and name != "none"]
    shift = re.search(r"refused where every encoding in use sees only i − j \(([^)]*)\)", readme)
    assert shift and re.findall(r"`(\w+)`", shift.group(1)) == [n for n, shifts, _ in classes if shifts]
    real = re.search(r"\| the encodings defined on real positions: ([^|]*) \|", readme)
    assert real and re.findall(r"`(\w+)`", real.group(1)) == [n for n, _, p in classes if p == "real"]
    demo = ROOT / "configs" / "demo.yaml"
    for sets in (["model.augment.method=cape", "model.input_pe=learnable"], ["model.attention_pe=rpoe"]):
        with pytest.raises(ConfigError) as err:
            load_config(demo, sets)
        said = " ".join(str(err.value).split())
        assert said in " ".join(readme.replace("`", "").split()), said
