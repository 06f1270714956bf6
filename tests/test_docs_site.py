"""The documentation site: built in strict mode (a broken link, anchor or page missing from the nav fails), every
generator checkable against the committed pages (each generator's own test file compares them), README a short
front page whose links resolve, and the built site read in headless Chromium: the home page, a reference page, an
encoding's formula, and the site search for "rope" finding the encoding's page (screenshots kept in the test's
temporary folder; ``FR2EN_DOCS_SCREENSHOTS=DIR`` copies them there)."""

from __future__ import annotations

import functools
import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, once

from docs import generate

MKDOCS = [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "docs" / "mkdocs.yml")]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    def build() -> Path:
        out = tmp_path_factory.mktemp("site")
        res = subprocess.run([*MKDOCS, "-d", str(out)], capture_output=True, text=True, timeout=600,
                             env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
        assert res.returncode == 0, res.stderr[-5000:]
        (out / "build.log").write_text(res.stderr, encoding="utf-8")
        return out

    return once("test_docs_site.site", build)


def test_the_site_builds_in_strict_mode_with_every_page(site: Path) -> None:
    log = (site / "build.log").read_text(encoding="utf-8")
    assert "WARNING" not in log, log
    nav_pages = re.findall(r"^\s*-\s*(?:[^:\n]+:\s*)?([\w/.-]+\.md)\s*$",
                           (ROOT / "docs" / "mkdocs.yml").read_text(encoding="utf-8"), re.M)
    assert len(nav_pages) >= 35
    for page in nav_pages:
        html = site / (page.removesuffix(".md").removesuffix("index") + "/index.html").lstrip("/")
        html = site / "index.html" if page == "index.md" else html
        assert html.is_file(), page
    # the generated folders' pages are in the nav too, each encoding and each command
    for folder in ("reference/encodings", "reference/commands"):
        for md in (ROOT / "docs" / "pages" / folder).glob("*.md"):
            if md.name != "index.md":
                assert (site / folder / md.stem / "index.html").is_file(), md
    # figures served from bench/ (not copied into docs/pages)
    assert (site / "studies" / "extrapolation-2700" / "figures" / "primary_contrasts.png").is_file()
    assert (site / "assets" / "figures" / "demo_page.png").is_file()


def test_a_broken_link_fails_the_strict_build(tmp_path: Path) -> None:
    """The site's settings (strict, and link validation as warnings) are what make a broken link fail the build: a
    two-page site with those settings builds, and does not once a page links to a page or an anchor that does not
    exist."""
    config = yaml.safe_load((ROOT / "docs" / "mkdocs.yml").read_text(encoding="utf-8"))
    for key in ("hooks", "extra_javascript", "extra_css"):
        config.pop(key)
    config["nav"] = [{"Home": "index.md"}, {"Other": "other.md"}]
    (tmp_path / "pages").mkdir()
    (tmp_path / "pages" / "index.md").write_text("# Home\n\n[other](other.md#part)\n", encoding="utf-8")
    (tmp_path / "pages" / "other.md").write_text("# Other\n\n## Part\n", encoding="utf-8")
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    build = [sys.executable, "-m", "mkdocs", "build", "-f", str(tmp_path / "mkdocs.yml"), "-d", str(tmp_path / "site")]
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    assert subprocess.run(build, capture_output=True, text=True, timeout=300, env=env).returncode == 0
    for broken, named in (("[gone](no-such-page.md)", "no-such-page.md"), ("[gone](other.md#no-such-part)",
                                                                           "no-such-part")):
        (tmp_path / "pages" / "index.md").write_text(f"# Home\n\n{broken}\n", encoding="utf-8")
        res = subprocess.run(build, capture_output=True, text=True, timeout=300, env=env)
        assert res.returncode != 0 and named in res.stderr, res.stderr


def test_the_generated_pages_are_checked_against_what_the_code_gives(tmp_path: Path) -> None:
    """Every generator module is importable and gives pages; ``stale`` finds a missing page and a hand-edited one
    (each generator's own test compares its committed pages with ``pages()``)."""
    import importlib

    for name in generate.GENERATORS:
        assert callable(importlib.import_module(f"docs.{name}").pages), name
    pages = {"a.md": "# A\n", "sub/b.md": "# B\n", "fig.png": b"\x89PNG"}
    generate.write(pages, tmp_path)
    assert generate.stale(pages, tmp_path) == []
    (tmp_path / "sub" / "b.md").write_text("# B, edited by hand\n", encoding="utf-8")
    (tmp_path / "a.md").unlink()
    assert generate.stale(pages, tmp_path) == ["a.md: missing", "sub/b.md: differs from what the code gives"]
    assert not list(tmp_path.rglob("*.tmp"))


def test_readme_is_a_short_front_page_whose_links_resolve() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if not re.match(r"[a-z]+://", link)]
    assert len(local) >= 10
    for link in local:
        assert (ROOT / link).exists(), link
    for heading in ("## Quick start", "## What it does", "## What the studies found", "## Documentation"):
        assert heading in text, heading


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def served(site: Path) -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_the_site_in_a_headless_browser(served: str, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    shots = []
    from bench.demo_page import headless_chromium

    driver = headless_chromium("1200,900")
    try:
        wait = WebDriverWait(driver, 60)
        # the home page: the table of what a user wants to do, each row a link into the site
        driver.get(served + "/")
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "article h1"))
        assert driver.find_element(By.CSS_SELECTOR, "article h1").text == "fr2en-pe"
        targets = [a.get_attribute("href") for a in driver.find_elements(By.CSS_SELECTOR, "article table a")]
        assert len(targets) == 11 and all(t.startswith(served) for t in targets)
        assert served + "/guide/training/#resuming" in targets
        shots.append(tmp_path / "home.png")
        driver.save_screenshot(str(shots[-1]))
        # a reference page: the config keys, with a key the README never listed
        driver.get(served + "/reference/config/")
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "article table"))
        cells = [c.text for c in driver.find_elements(By.CSS_SELECTOR, "article table td:first-child")]
        assert "train.label_smoothing" in cells and "model.dropout" in cells and "train.patience" in cells
        shots.append(tmp_path / "reference_config.png")
        driver.save_screenshot(str(shots[-1]))
        # an encoding's page, its formula rendered by the KaTeX copy the site ships (no internet needed)
        driver.get(served + "/reference/encodings/rope/")
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "article .katex-display"))
        assert driver.find_element(By.CSS_SELECTOR, "article h1").text == "RoPE (rope)"
        assert not [e for e in driver.find_elements(By.CSS_SELECTOR, "article .katex-error")]
        shots.append(tmp_path / "reference_rope.png")
        driver.save_screenshot(str(shots[-1]))
        # the site search: "rope" finds the encoding's page
        driver.get(served + "/")
        box = wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "input.md-search__input"))
        wait.until(lambda d: box.is_displayed())
        box.click()
        box.send_keys("rope")

        def results(d) -> list[str]:
            return [a.get_attribute("href") for a in d.find_elements(By.CSS_SELECTOR, ".md-search-result__item a")]

        wait.until(lambda d: any("/reference/encodings/rope/" in (h or "") for h in results(d)))
        assert results(driver)[0].split("#")[0].split("?")[0].endswith("/reference/encodings/rope/")
        shots.append(tmp_path / "search_rope.png")
        driver.save_screenshot(str(shots[-1]))
    finally:
        driver.quit()
    for shot in shots:
        data = shot.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, shot
    keep = os.environ.get("FR2EN_DOCS_SCREENSHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        for shot in shots:
            shutil.copy(shot, Path(keep) / shot.name)
