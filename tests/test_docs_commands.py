"""The documentation's runnable command blocks, read from the pages themselves and run in a fresh copy of the
project (no runs/, no cache), in the site's order (docs/mkdocs.yml's nav, the getting-started page first), as a new
user would: pages and code cannot drift apart. A block runs when the line before its ```bash fence is
``<!-- runnable -->``. Every command runs as written, except that ``--config configs/demo.yaml`` gets ``--set``
overrides shrinking the demo model to the tests' tiny one, validated twice, trained for half the demo's epochs (330
steps: six periodic checkpoints, so ``--average 5`` still averages five; its schedule unchanged): the demo's own
model takes minutes on 2 free cores, far longer on a busy CI machine. The study
queue's commands are those the published study page gives, at the same pinned commits."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import yaml
from conftest import ROOT

from utils.run.layout import RunDir

TINY = ("model.d_model=32", "model.d_ff=64", "model.n_heads=2", "model.encoder_layers=1", "model.decoder_layers=1",
        "tokenizer.vocab_size=400", "train.valid_bleu_sentences=4", "train.log_attention_every=0",
        "train.eval_every=165", "train.epochs=30")
MARK = re.compile(r"^<!-- runnable -->\n```bash\n(.*?)```", re.S | re.M)
DOCS = ROOT / "docs"


def nav_pages() -> list[Path]:
    """The site's pages in nav order (docs/mkdocs.yml)."""
    def walk(entry) -> list[str]:
        if isinstance(entry, str):
            return [entry]
        if isinstance(entry, list):
            return [p for e in entry for p in walk(e)]
        return [p for v in entry.values() for p in walk(v)]

    nav = yaml.safe_load((DOCS / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]
    return [DOCS / "pages" / p for p in walk(nav)]


def runnable_blocks(text: str) -> list[str]:
    """The command blocks of a page marked for this test, in page order."""
    return [m.group(1) for m in MARK.finditer(text)]


def shrink(block: str) -> str:
    """``block`` with the tiny model's overrides after each ``--config configs/demo.yaml`` (training, and the
    commands that must describe the same model)."""
    return block.replace("--config configs/demo.yaml", "--config configs/demo.yaml " +
                         " ".join(f"--set {s}" for s in TINY))


def fresh_copy(dest: Path) -> Path:
    """The tracked and the new (not ignored) files of the project, as a fresh clone of it would have them."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout
    for name in filter(None, files.split("\0")):
        src = ROOT / name
        if src.is_file() and not name.startswith("docs/pages/"):
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def test_runnable_blocks_are_marked_only_before_bash_fences() -> None:
    """A marker that does not stand right before a ```bash fence would silently run nothing."""
    for page in nav_pages():
        text = page.read_text(encoding="utf-8")
        assert len(re.findall(r"^<!-- runnable -->$", text, re.M)) == len(runnable_blocks(text)), page


def test_the_documentations_demo_commands_run_as_written(tmp_path: Path) -> None:
    pages = [(p, runnable_blocks(p.read_text(encoding="utf-8"))) for p in nav_pages()]
    blocks = [(p.relative_to(DOCS / "pages"), b) for p, bs in pages for b in bs]
    assert blocks[0] == (Path("getting-started.md"), "python train.py --config configs/demo.yaml\n")
    assert {str(p) for p, _ in blocks} >= {"getting-started.md", "guide/translating.md", "guide/scoring.md"}
    project = fresh_copy(tmp_path / "project")
    bin_dir = Path(sys.executable).parent  # `python` is this environment's, as in an activated virtual environment
    assert (bin_dir / "python").exists()
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    for page, block in blocks:
        res = subprocess.run(["bash", "-euo", "pipefail", "-c", shrink(block)], cwd=project, env=env,
                             capture_output=True, text=True, timeout=1200)
        assert res.returncode == 0, f"{page}\n{block}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
        assert "Traceback" not in res.stderr, (page, block)
    terms = (project / "terms.tsv").read_text(encoding="utf-8").split("\n")[:-1]  # the page's terminology set
    assert len(terms) == 40 and sum(map(bool, terms)) == 38 and all("\t" not in t for t in terms)
    assert len((project / "constrained.en").read_text(encoding="utf-8").splitlines()) == 40
    runs = project / "runs"
    assert len((project / "hyp.en").read_text(encoding="utf-8").splitlines()) == 40  # one line per input line
    nbest = [line.split("\t") for line in (project / "hyp.nbest").read_text(encoding="utf-8").splitlines()]
    assert len(nbest) == 40 * 3 and [int(n[0]) for n in nbest] == [i for i in range(40) for _ in range(3)]
    assert all(len(n) == 3 and float(n[1]) <= 0 for n in nbest)  # INDEX <TAB> SCORE <TAB> TRANSLATION
    latest = RunDir(runs / "demo_latest").root.resolve()  # the link, through runs/.latest/<run>
    assert len(list(runs.glob("demo_2*"))) == 1 and latest == max(runs.glob("demo_2*"))  # averaged as it is
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


def test_the_study_queue_runs_the_study_pages_commands_at_their_pinned_commits() -> None:
    """bench/study_queue.sh chains the commands the continued extrapolation study's page gives to reproduce it, in
    the page's order (the study trained to 2,250 steps, its continuation trained to the budget the rule sets and
    scored there): each from its worktree, with the same flags and values and the same pinned commits, the rule with
    the page's own command, so the script and the published page cannot drift apart. A budget the rule decides
    (``--steps "$budget"``) matches the page's ``--steps B``."""
    script = (ROOT / "bench" / "study_queue.sh").read_text()
    var = {k: v.strip('"') for k, v in re.findall(r'^\s*([A-Z_]+)=("[^"]*"|\S+)', script, re.M)}
    page = (DOCS / "pages" / "studies" / "extrapolation-2700.md").read_text(encoding="utf-8")
    for name, folder in (("TRAIN_COMMIT", "study-wt"), ("SCORE_COMMIT", "score-wt"), ("RULE_COMMIT", "rule-wt")):
        assert f"git worktree add --detach ../{folder} {var[name]}" in page, name
    documented = []
    for command in _shell_commands(page):
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
    assert f"cd ../rule-wt && .venv/bin/python {' '.join(rule_words)}" in _shell_commands(page)
    assert subprocess.run(["bash", "-n", str(ROOT / "bench" / "study_queue.sh")]).returncode == 0
    for commit in (var["TRAIN_COMMIT"], var["SCORE_COMMIT"], var["RULE_COMMIT"]):
        assert subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"]).returncode == 0
    rule_wt = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "--name-only", var["RULE_COMMIT"], "bench/"],
                             capture_output=True, text=True, check=True).stdout.split()
    assert {"bench/pilot_rule.py", "bench/study_replay.py"} <= set(rule_wt)  # what the queue runs from there
