"""The Studies section of the site (docs/study_pages.py, docs/pages/studies/): one results page per published study,
whose primary table and per-seed chrF table hold exactly the numbers of the study's results.json (parsed back from
the page, compared with results.json, not with any prose); the pre-registration page holds the section exactly as
the commit that first fixed it (read from the git history here, independently of the generator), with the later
amendments after it, each dated; the committed pages are what the generator gives; every figure a page shows
exists; the power table of the findings page is results.json's."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, kept_run_archive

from docs import study_pages

STUDIES = ROOT / "bench" / "studies"
PAGES = ROOT / "docs" / "pages" / "studies"
PUBLISHED = study_pages.published()  # every study folder with results.json, and each look of the second with about.json
HEADING = ("### Pre-registration: does an attention-level encoding extrapolate in translation? "
           "(fixed 2026-11-25, before any run)")


def _results(name: str) -> dict[str, Any]:
    return json.loads((study_pages.folder_of(name) / "results.json").read_text(encoding="utf-8"))


def _same(text: str, value: float | None) -> bool:
    """``text`` is ``value`` as printed: to the decimals it shows, ``< 0.0001`` below that, ``-`` for none."""
    text = text.strip()
    if value is None:
        return text == "-"
    if text == "< 0.0001":
        return value < 1e-4
    decimals = len(text.split(".")[1]) if "." in text else 0
    return abs(float(text) - value) <= 0.5 * 10 ** -decimals + 1e-9


def _table_after(page: str, heading: re.Pattern[str]) -> list[list[str]]:
    """The cells of each body row of the first table after the first heading matching ``heading``."""
    lines = page.splitlines()
    start = next(i for i, line in enumerate(lines) if heading.match(line))
    rows, seen = [], False
    for line in lines[start + 1:]:
        if line.startswith("|"):
            seen = True
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif seen:
            break
    assert rows and set(rows[1][0]) <= {"-"}, "no table"
    return rows[2:]


def _mean_length(results: dict[str, Any], system: str, split: str, decoder: str) -> float | None:
    values = results["systems"][system]["splits"][split][decoder].get("length_ratio")
    return sum(values) / len(values) if values else None


def primary_mismatches(page: str, results: dict[str, Any]) -> list[str]:
    """Every cell of the page's primary table that is not results.json's value."""
    rows = _table_after(page, re.compile(r"## (Primary|Main) analysis"))
    tests = results["primary"]["tests"]
    if len(rows) != len(tests):
        return [f"{len(rows)} rows for {len(tests)} tests"]
    bad = []
    for cells, t in zip(rows, tests, strict=True):
        where = f"{t['system']} / {t['label']}"
        system, label, per_seed, delta, seed, paired, ci, boot, length, resolved = cells
        b, q = t["bootstrap"], t["quantity"]
        checks = [(system == t["system"] and label == t["label"], "system/quantity"),
                  (all(_same(x, v) for x, v in zip(per_seed.split(","), t["per_seed_delta"], strict=True)),
                   "Δ per seed"),
                  (_same(delta, t["delta"]), "Δ mean"),
                  (_same(seed.split(" (")[0], t["seed_test"]["p_value"])
                   and _same(seed.split(" (")[1].rstrip(")"), t["seed_test"]["p_holm"]), "seed test"),
                  (_same(paired.split(" (")[0], t["paired_t"]["p_value"])
                   and _same(paired.split(" (")[1].rstrip(")"), t["paired_t"]["p_holm"]), "paired t"),
                  (resolved == ("**yes**" if t["resolved"] else "no"), "resolved")]
        if b is None:
            checks += [(ci == "-" and boot == "-", "bootstrap")]
        else:
            lo, hi = ci.strip("[]").split(",")
            checks += [(_same(lo, b["ci95"][0]) and _same(hi, b["ci95"][1]), "bootstrap CI"),
                       (_same(boot.split(" (")[0], b["p_value"]) and _same(boot.split(" (")[1].rstrip(")"),
                                                                           b["p_holm"]), "bootstrap p")]
        mine, base = length.split(" / ")
        checks += [(_same(mine, _mean_length(results, t["system"], q["split"], q["decoder"]))
                    and _same(base, _mean_length(results, t.get("against") or results["baseline"], q["split"],
                                                 q["decoder"])), "len")]
        bad += [f"{where}: {what}" for ok, what in checks if not ok]
    return bad


def chrf_mismatches(page: str, results: dict[str, Any]) -> list[str]:
    """Every cell of the page's per-seed chrF table that is not results.json's (mean, std, seeds, length ratio)."""
    rows = _table_after(page, re.compile(r"## chrF, beam 5 \(each seed\)"))
    if [r[0] for r in rows] != list(results["systems"]):
        return ["systems"]
    bad = []
    cell = re.compile(r"(\S+) ± (\S+) \(([^)]*)\)(?: · len (\S+))?")
    for cells in rows:
        for split, text in zip(results["splits"], cells[1:], strict=True):
            row = results["systems"][cells[0]]["splits"][split]["beam5"]
            m = cell.fullmatch(text)
            ok = m is not None and _same(m[1], row["chrf_mean_std"][0]) and _same(m[2], row["chrf_mean_std"][1]) \
                and all(_same(x, v) for x, v in zip(m[3].split(","), row["chrf"], strict=True)) \
                and (m[4] is None) == (not row.get("length_ratio")) \
                and (m[4] is None or _same(m[4], _mean_length(results, cells[0], split, "beam5")))
            if not ok:
                bad.append(f"{cells[0]} / {split}")
    return bad


def test_one_results_page_per_published_study_and_the_pre_registration() -> None:
    assert {"all-encodings", "extrapolation", "extrapolation-2700", "extrapolation-candidates", "seed-table"} <= set(
        PUBLISHED)
    assert set(study_pages.pages()) == {f"studies/{n}.md" for n in PUBLISHED} | {
        "studies/preregistration-extrapolation.md", "studies/preregistration-extrapolation-sequential.md"}
    for name in PUBLISHED:  # the facts results.json does not record are kept beside it, for every study
        about = json.loads((study_pages.folder_of(name) / "about.json").read_text(encoding="utf-8"))
        assert {"title", "question", "established", "setup", "machine", "date", "trained_by", "scored_by"} <= set(
            about), name
        page = (PAGES / f"{name}.md").read_text(encoding="utf-8")
        assert page.startswith(f"# {about['title']}\n") and _results(name)["spec"]["command"] in page
        # the answer a reader can quote, near the top; a second look says first that it is one
        assert f'!!! abstract "What is established"\n\n    {about["established"]}\n' in page[:4000], name
        declared = _results(name)["primary"]["family"].get("declared", "")
        if "second look" in declared:
            assert about["established"].startswith("A second look, not pre-registered."), name


@pytest.mark.parametrize("name", PUBLISHED)
def test_the_primary_and_chrf_tables_hold_results_json(name: str) -> None:
    page = (PAGES / f"{name}.md").read_text(encoding="utf-8")
    results = _results(name)
    assert primary_mismatches(page, results) == []
    assert chrf_mismatches(page, results) == []
    pr = results["primary"]
    assert f"**{pr['resolved']} of {pr['size']} tests resolved" in page


def test_a_changed_number_is_caught() -> None:
    """The checks above can fail: one digit changed in a table is found, in the cell it is in."""
    page = (PAGES / "extrapolation.md").read_text(encoding="utf-8")
    results = _results("extrapolation")
    row = "| alibi | chrF test.tatoeba.x4 (beam 5) | +2.98, +3.12, +2.96 | +3.02 |"
    assert row in page
    assert primary_mismatches(page.replace(row, row.replace("+3.02", "+3.03")), results) == [
        "alibi / chrF test.tatoeba.x4 (beam 5): Δ mean"]
    assert primary_mismatches(page.replace("| 0.35 / 0.30 | **yes** |", "| 0.35 / 0.30 | no |", 1), results) == [
        "alibi / chrF test.tatoeba.x4 (beam 5): resolved"]
    assert chrf_mismatches(page.replace("61.69 ± 0.22", "61.69 ± 0.23"), results) == ["alibi / test.tatoeba"]


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout


def test_the_pre_registration_is_the_text_of_the_commit_that_first_fixed_it() -> None:
    commit = _git("log", "--reverse", "--format=%H", "-S", HEADING, "--", "README.md").split()[0]
    assert commit == study_pages.PREREGISTRATION_COMMIT
    readme = _git("show", f"{commit}:README.md").split("\n")
    start = readme.index(HEADING) + 1
    end = next(i for i in range(start, len(readme)) if re.match(r"#{1,3} ", readme[i]))
    frozen = "\n".join(readme[start:end]).strip("\n")
    page = (PAGES / "preregistration-extrapolation.md").read_text(encoding="utf-8")
    before, rest = page.split(study_pages.FROZEN_BEGIN)
    body, after = rest.split(study_pages.FROZEN_END)
    assert body.strip("\n") == frozen and "- **Primary endpoint**" in frozen
    date = _git("log", "-1", "--format=%ad", "--date=short", commit).strip()
    assert date == "2026-11-25" and f"Fixed on {date}, in commit {commit[:7]}" in before
    amendments = re.findall(r"^### (.*)$", after, flags=re.M)
    assert len(amendments) >= 10 and all(re.match(r"20\d\d-\d\d-\d\d — ", a) for a in amendments)
    assert [a[:10] for a in amendments] == sorted(a[:10] for a in amendments)  # in the order decided
    continuation = after.split("Declared after the 2,250-step results")[1].split("\n### ")[0]
    assert "A second look, not pre-registered" in continuation and "47 minutes later" in continuation
    assert "A second look, not pre-registered" in (PAGES / "extrapolation-2700.md").read_text(encoding="utf-8")


def test_the_committed_pages_are_what_the_generator_gives() -> None:
    pages = study_pages.pages()
    assert pages == study_pages.pages()  # deterministic
    stale = [path for path, text in pages.items()
             if (ROOT / "docs" / "pages" / path).read_text(encoding="utf-8") != text]
    assert stale == [], "run: python docs/generate.py"


@pytest.mark.parametrize("name", PUBLISHED)
def test_every_figure_a_page_shows_exists_and_every_figure_is_shown(name: str) -> None:
    page = (PAGES / f"{name}.md").read_text(encoding="utf-8")
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", page)
    assert links and all(link.startswith(f"{name}/figures/") for link in links)
    figures = study_pages.folder_of(name) / "figures"
    assert all((figures / Path(link).name).is_file() for link in links)
    assert sorted(Path(link).name for link in links) == sorted(p.name for p in figures.glob("*"))


def test_the_findings_power_table_is_results_json() -> None:
    page = (PAGES / "findings.md").read_text(encoding="utf-8")
    rows = _table_after(page, re.compile(r"## Why \"not resolved\" is not \"no difference\""))
    assert sorted(re.search(r"\(([^)]+)\.md\)", r[0])[1] for r in rows) == PUBLISHED
    for study, sd, power, needed, seeds in rows:
        pw = _results(re.search(r"\(([^)]+)\.md\)", study)[1])["primary"]["power"]
        assert _same(sd, pw["pooled_residual_sd"]) and _same(power, pw["power_at_smallest_effect"]), study
        assert _same(needed, pw["detectable_at_80"]) and int(seeds) == pw["seeds_for_80_at_smallest_effect"], study


def test_the_second_pre_registration_is_never_edited_and_its_page_holds_it() -> None:
    """Its file was added by the commit the page names and no commit changed it since; the page's frozen block is
    that file, dated by that commit."""
    path = f"bench/studies/{study_pages.SEQUENTIAL}/preregistration.md"
    commits = _git("log", "--format=%H", "--", path).split()
    assert commits == [study_pages.SEQUENTIAL_COMMIT]  # added once, never changed
    fixed = _git("show", f"{commits[0]}:{path}").strip("\n")
    assert fixed == (ROOT / path).read_text(encoding="utf-8").strip("\n")  # nor changed in the working tree
    page = (PAGES / f"preregistration-{study_pages.SEQUENTIAL}.md").read_text(encoding="utf-8")
    before, rest = page.split(study_pages.FROZEN_BEGIN)
    body, after = rest.split(study_pages.FROZEN_END)
    assert body.strip("\n") == fixed and "- **Looks and spending.**" in fixed and "- **Compute plan.**" in fixed
    date = _git("log", "-1", "--format=%ad", "--date=short", commits[0]).strip()
    assert date == study_pages.SEQUENTIAL_DATE and f"Fixed on {date}, in commit {commits[0][:7]}" in before
    assert "## After the pre-registration" in after
    amendments = after.split("## Where the study stands")[0]
    assert all(re.match(r"20\d\d-\d\d-\d\d — ", a) for a in re.findall(r"^### (.*)$", amendments, flags=re.M))


def test_the_second_studys_page_says_where_it_stands_from_its_committed_files() -> None:
    """After the amendments: the noise pilot's published endpoint as committed, the design its rule gave, each
    figure read from design.json, and the looks reached."""
    page = (PAGES / f"preregistration-{study_pages.SEQUENTIAL}.md").read_text(encoding="utf-8")
    status = page.split("## Where the study stands", 1)[1]
    ratio = (STUDIES / "noise-pilot" / "ratio.md").read_text(encoding="utf-8")
    assert ratio.split("\n", 1)[1].strip("\n") in status  # the endpoint, every line, without its title
    d = json.loads((STUDIES / study_pages.SEQUENTIAL / "design.json").read_text(encoding="utf-8"))
    assert f"- **Arm:** {d['arm']} (`--set train.cooldown=0.2 --set train.ema_decay=0.99`)" in status
    assert f"ratio cool / plain {d['ratio']:.2f}" in status and f"cool − plain −{abs(d['x1_chrf_gap']):.2f}" in status
    assert f"- **Seeds per system:** {d['seeds']}; **looks** at {', '.join(map(str, d['looks']))} seeds" in status
    assert f"{d['power']:.3f} by the normal approximation" in status and f"{d['power_seed_test']:.3f} for the seed" \
        in status
    assert f"- **Runs:** {5 * d['seeds'] + 15} ({5 * d['seeds']} in the short-trained arm" in status
    looks = sorted((STUDIES / study_pages.SEQUENTIAL / "looks").glob("look-*/results.json"))
    assert ("No look is reached yet." in status) == (not looks)
    for results in looks:  # each scored look, with its resolved tests and the alpha spent there
        primary = json.loads(results.read_text(encoding="utf-8"))["primary"]
        assert (f"- **{results.parent.name}:** {primary['resolved']} of {primary['size']} primary tests resolved, "
                f"α spent {primary['design']['alpha_spent']:.2g} of 0.05; ") in status


def test_the_second_studys_page_counts_its_committed_runs_and_what_is_left(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The runs kept so far are the archives in records/, by arm (a pilot's or another file is not counted), against
    the plan: 5 systems x the design's seeds short-trained, 15 natural-length; each look's runs still to go, and the
    training compute left at 55 core-minutes a run."""
    import shutil

    shutil.copytree(STUDIES / "noise-pilot", tmp_path / "noise-pilot", ignore=shutil.ignore_patterns("records"))
    folder = tmp_path / study_pages.SEQUENTIAL
    (folder / "records").mkdir(parents=True)
    shutil.copy(STUDIES / study_pages.SEQUENTIAL / "design.json", folder / "design.json")
    for arm, system, seed in (("short", "sinusoidal", 1), ("short", "learnable", 1), ("short", "alibi", 1),
                              ("natural", "rope", 2), ("pilot-cool", "rope", 3)):  # a pilot's: not the study's
        study = "study_extrapolation-sequential" + ("-natural" if arm == "natural" else "")
        kept_run_archive(tmp_path / "runs", folder / "records" / f"{arm}.{system}.seed{seed}.tar.xz", study, system,
                         seed, 3240.0 if arm != "natural" else 6840.0, 360.0)  # 1 and 2 core-hours a run
    (folder / "records" / "same_training.json").write_text("{}", encoding="utf-8")
    monkeypatch.setattr(study_pages, "STUDIES", tmp_path)
    d = json.loads((folder / "design.json").read_text(encoding="utf-8"))
    status = "\n".join(study_pages.sequential_status())
    total, short, first = 5 * d["seeds"] + 15, 5 * d["seeds"], 5 * d["looks"][0]
    assert f"4 of {total} runs are trained, decoded and committed" in status
    assert f"3 of {short} in the short-trained arm, 1 of 15 in the natural-length arm" in status
    assert f"short arm's {first} runs of seeds 1-{d['looks'][0]} ({first - 3} to go), then the natural arm's 15 " \
        "(14 to go)" in status
    for k, seeds in enumerate(d["looks"][1:], 2):  # each later look's runs, counted from the same archives
        assert f"look {k}, the short arm's {5 * seeds} runs of seeds 1-{seeds} ({5 * seeds - 3} to go)" in status
    assert f"The whole plan has {total - 4} runs to go, about {(total - 4) * 55 / 60:.0f} CPU core-hours" in status
    assert ("The runs kept so far cost 5.0 CPU core-hours (4.6 training, 0.4 decoding; wall time x threads, every "
            f"segment of a resumed run), 1.25 a run: at that mean the {total - 4} runs to go need about "
            f"{(total - 4) * 1.25:.0f} CPU core-hours.") in status
    assert status.index("### Runs kept") < status.index("No look is reached yet.")


def test_the_second_studys_page_names_the_cpus_of_its_kept_runs_and_each_seed_split_across_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Which CPUs trained the runs kept so far, from each archive's cpu.txt (model name and a hash of its flags, runs
    counted per CPU, both arms), and each seed of an arm whose runs were trained on more than one CPU, named (item 2 of
    the amendment "the study's runs two at a time from a queue", 2026-11-30: a replaced machine splits a seed); a
    seed on one CPU is not named."""
    import shutil

    shutil.copytree(STUDIES / "noise-pilot", tmp_path / "noise-pilot", ignore=shutil.ignore_patterns("records"))
    folder = tmp_path / study_pages.SEQUENTIAL
    (folder / "records").mkdir(parents=True)
    shutil.copy(STUDIES / study_pages.SEQUENTIAL / "design.json", folder / "design.json")
    for arm, system, seed, cpu in (("short", "sinusoidal", 1, "CPU A"), ("short", "learnable", 1, "CPU B"),
                                   ("short", "alibi", 2, "CPU A"), ("natural", "rope", 2, "CPU B")):
        study = "study_extrapolation-sequential" + ("-natural" if arm == "natural" else "")
        seed_folder = tmp_path / "runs" / study / "runs" / system / f"seed{seed}"
        seed_folder.mkdir(parents=True)
        (seed_folder / "cpu.txt").write_text(f"Model name: {cpu}\nFlags: sse2 avx2\nHost: vm\n", encoding="utf-8")
        if system != "sinusoidal":  # packages.txt (keep_runs' pip freeze): not kept before 2026-12-02
            tokenizers = "0.23.3" if cpu == "CPU A" else "0.23.1"
            (seed_folder / "packages.txt").write_text(f"torch==2.13.0+cpu\ntokenizers=={tokenizers}\n"
                                                      "sacrebleu @ file:///wheels/sacrebleu-2.6.0.whl\n")
        kept_run_archive(tmp_path / "runs", folder / "records" / f"{arm}.{system}.seed{seed}.tar.xz", study, system,
                         seed, 3240.0, 360.0)
    monkeypatch.setattr(study_pages, "STUDIES", tmp_path)
    status = "\n".join(study_pages.sequential_status())
    line = next(x for x in status.splitlines() if x.startswith("CPUs that trained the runs"))
    assert re.search(r": CPU A, flags [0-9a-f]{8} \(2 runs\); CPU B, flags [0-9a-f]{8} \(2 runs\)\. ", line), line
    assert "**Seed 1 (short-trained arm): its systems were trained on more than one CPU**" in line  # not seed 2:
    assert "Seed 2" not in line and "Seeds" not in line  # each arm's seed 2 on one CPU
    assert status.index("### Runs kept") < status.index("CPUs that trained") < status.index("No look is reached")
    line = next(x for x in status.splitlines() if x.startswith("Packages of the environments"))
    assert line.endswith(": 2 of 3 at one version in the 3 runs that record them; **these differ**: tokenizers "
                         "0.23.1 (2 runs), 0.23.3 (1 run); not recorded for 1 run."), line
    assert status.index("CPUs that trained") < status.index("Packages of the") < status.index("No look is reached")


def test_a_look_with_its_about_json_is_a_results_page_linked_from_where_the_study_stands(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A look of the second study (looks/look-K/, as bench/study_sequential.sh keeps it: results.json, report.md,
    figures/, hypotheses/) is published once its about.json is written: a page extrapolation-sequential-look-K whose
    raw outputs name the look's folder, whose figures are served from it, and which the study's status links; a
    look without about.json is listed, not published."""
    import shutil

    from docs import hooks

    shutil.copytree(STUDIES / "noise-pilot", tmp_path / "noise-pilot", ignore=shutil.ignore_patterns("records"))
    folder = tmp_path / study_pages.SEQUENTIAL
    folder.mkdir()
    shutil.copy(STUDIES / study_pages.SEQUENTIAL / "design.json", folder / "design.json")
    for k in (1, 2):  # seed-table's files stand for a look's: the same layout
        shutil.copytree(STUDIES / "seed-table", folder / "looks" / f"look-{k}")
        (folder / "looks" / f"look-{k}" / "stop.txt").write_text(f"continue: look {k} of 3\n", encoding="utf-8")
    (folder / "looks" / "look-2" / "about.json").unlink()
    shutil.copytree(STUDIES / "seed-table", folder / "looks" / "look-3")  # scored, its stopping rule not run yet
    monkeypatch.setattr(study_pages, "STUDIES", tmp_path)
    name = f"{study_pages.SEQUENTIAL}-look-1"
    assert name in study_pages.published() and f"{study_pages.SEQUENTIAL}-look-2" not in study_pages.published()
    page = study_pages.results_page(name)
    where = f"bench/studies/{study_pages.SEQUENTIAL}/looks/look-1"
    assert f"Everything is in the repository, in `{where}/`:" in page and f"cp -r {where} /tmp/{name}" in page
    figures = set(re.findall(rf"\]\(({name}/figures/[^)]+)\)", page))
    served = hooks.served_figures()
    assert figures and all(served[f"studies/{f}"] == folder / "looks" / "look-1" / "figures" / Path(f).name
                           for f in figures)
    status = "\n".join(study_pages.sequential_status())
    primary = json.loads((STUDIES / "seed-table" / "results.json").read_text(encoding="utf-8"))["primary"]
    scored = (f"{primary['resolved']} of {primary['size']} primary tests resolved, α spent "  # a fixed design: all
              f"{primary['design']['alpha_spent']:.2g} of {primary['design']['alpha']}; ")
    assert f"- **look-1:** {scored}continue: look 1 of 3 ([its results]({name}.md), `{where}`)" in status
    assert f"- **look-2:** {scored}continue: look 2 of 3 (`bench/studies/{study_pages.SEQUENTIAL}/looks/look-2`)" \
        in status
    assert (f"- **look-3:** {scored}scored; the stopping rule's answer (`stop.txt`) is written once the "
            "natural-length arm is scored beside it") in status
    assert "No look is reached yet." not in status
    natural = f"{study_pages.SEQUENTIAL}-natural"
    assert natural not in study_pages.published() and "natural-length arm**" not in status  # not scored yet


def test_the_natural_length_arms_look_is_a_results_page_with_the_two_arms_side_by_side(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The natural-length arm's look (looks/natural/, scored after look 1, with bench/arms_table.py's arms.md) is
    published once its about.json is written, as extrapolation-sequential-natural: its page shows the arms table,
    names its folder, and the study's status lists it after look 1 with its own family's count."""
    import shutil

    from docs import hooks

    shutil.copytree(STUDIES / "noise-pilot", tmp_path / "noise-pilot", ignore=shutil.ignore_patterns("records"))
    looks = tmp_path / study_pages.SEQUENTIAL / "looks"
    looks.mkdir(parents=True)
    shutil.copy(STUDIES / study_pages.SEQUENTIAL / "design.json", looks.parent / "design.json")
    for look in ("look-1", "natural"):  # seed-table's files stand for a look's: the same layout
        shutil.copytree(STUDIES / "seed-table", looks / look)
    table = ("| system | arm | test.tatoeba.x4 |\n|---|---|---|\n| rope | short | 0.31 · 20.5 |\n"
             "| rope | natural | 0.97 · 41.0 |")
    (looks / "natural" / "arms.md").write_text(f"Length ratio · chrF.\n\n{table}\n", encoding="utf-8")
    monkeypatch.setattr(study_pages, "STUDIES", tmp_path)
    name = f"{study_pages.SEQUENTIAL}-natural"
    assert study_pages.published()[-2:] == [f"{study_pages.SEQUENTIAL}-look-1", name]
    page = study_pages.results_page(name)
    assert f"## The two arms side by side\n\nLength ratio · chrF.\n\n{table}\n" in page
    assert page.index("## The two arms side by side") < page.index("## Raw outputs")
    where = f"bench/studies/{study_pages.SEQUENTIAL}/looks/natural"
    assert f"Everything is in the repository, in `{where}/`:" in page
    figures = set(re.findall(rf"\]\(({name}/figures/[^)]+)\)", page))
    assert figures and all(hooks.served_figures()[f"studies/{f}"] == looks / "natural" / "figures" / Path(f).name
                           for f in figures)
    primary = json.loads((STUDIES / "seed-table" / "results.json").read_text(encoding="utf-8"))["primary"]
    status = "\n".join(study_pages.sequential_status())
    assert (f"- **natural-length arm** (seeds 1-3, one look, after look 1): {primary['resolved']} of "
            f"{primary['size']} tests of its own family resolved ([its results]({name}.md), `{where}`)") in status
    assert status.index("- **look-1:**") < status.index("- **natural-length arm**")
    assert "arms side by side" not in study_pages.results_page(f"{study_pages.SEQUENTIAL}-look-1")


def test_a_results_page_states_what_its_runs_cost(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A study whose results record their compute says it in the page's design list, per resolved comparison."""
    import shutil

    from utils.study.files import with_sha256

    shutil.copytree(STUDIES / "extrapolation", tmp_path / "extrapolation")
    doc = _results("extrapolation")
    doc.pop("sha256", None)
    doc["compute"] = {"runs": {}, "total": {"runs": 15, "train_cpu_hours": 9.0, "decode_cpu_hours": 1.5,
                                           "train_gpu_minutes": 0.0, "decode_gpu_minutes": 0.0,
                                           "threads_unrecorded": []}}
    (tmp_path / "extrapolation" / "results.json").write_text(json.dumps(with_sha256(doc), indent=1) + "\n")
    monkeypatch.setattr(study_pages, "STUDIES", tmp_path)
    page = study_pages.results_page("extrapolation")
    resolved = doc["primary"]["resolved"]
    assert "- **Compute:** 15 runs: **10.5 CPU core-hours** (9.0 training, 1.5 decoding the test sets)" in page
    assert (f"Per resolved comparison of the primary family ({resolved} of {doc['primary']['size']}): "
            f"{10.5 / resolved:.1f} CPU core-hours") in page
    assert "- **Compute:**" not in (PAGES / "extrapolation.md").read_text(encoding="utf-8")  # not recorded then
