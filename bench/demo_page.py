"""Drive the server's demo page in headless Chromium: type a sentence, press Translate, read the page back.

    python bench/demo_page.py --model_path runs/demo_latest --out bench/figures/demo_page.png \
        [--sentence "Le chat dort sur le canapé."]

Starts ``inference.py --serve`` on a free port, opens ``/`` in the system's Chromium (``chromium`` and
``chromium-driver`` from the distribution; selenium is pointed at both, so it downloads nothing), and saves a
screenshot. ``drive_page`` is what tests/test_server.py checks the page with.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as bench/demo_page.py: the repository root first

from bench.serve_load import start_server  # noqa: E402


@dataclass
class PageResult:
    """What the page shows after a translation, read from its DOM."""

    encoding: str
    details: str
    status: str
    nbest: list[str]  # hypothesis texts, best first
    scores: list[str]  # their score lines
    columns: list[str]  # attention map axis labels (source tokens for cross-attention)
    rows: list[str]
    cells: dict[tuple[int, int], float]  # (row, column) -> weight drawn
    note: str
    kinds: list[str]  # the attention kinds offered (a CTranslate2 export: cross only)
    layers: list[str]  # the layers offered for the kind shown
    tokens: list[list[tuple[str, float, str]]]  # per hypothesis, each token shown: (text, log-probability, tooltip)


def browser_paths() -> tuple[str, str]:
    """The Chromium binary and its chromedriver ($CHROMIUM, $CHROMEDRIVER, else the system's)."""
    binary = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    driver = os.environ.get("CHROMEDRIVER") or shutil.which("chromedriver")
    if not binary or not driver:
        raise RuntimeError("no chromium/chromedriver found: apt-get install chromium chromium-driver "
                           "(or set CHROMIUM and CHROMEDRIVER)")
    return binary, driver


def headless_chromium(window_size: str, *extra: str):
    """A selenium driver of the system's headless Chromium (``browser_paths``), window ``W,H``; never downloads one."""
    os.environ.setdefault("SE_OFFLINE", "true")  # selenium-manager must never try to download a browser
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    binary, driver_path = browser_paths()
    options = Options()
    options.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--window-size={window_size}", "--no-first-run", "--disable-extensions", *extra):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(executable_path=driver_path), options=options)


def drive_page(url: str, sentence: str, screenshot: Path | None = None, timeout: float = 60.0,
               prefix: str | None = None, no_repeat: int | None = None) -> PageResult:
    """Load the page at ``url``, type ``sentence`` (and ``prefix`` in the target prefix box, ``no_repeat`` in the
    box of the n-gram size never repeated), press Translate and wait
    for the n-best list and the attention map; read them back from the DOM and save a screenshot (PNG) of the
    window."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver = headless_chromium("1000,900", "--hide-scrollbars")
    try:
        driver.get(url)
        wait = WebDriverWait(driver, timeout)
        wait.until(lambda d: d.find_element(By.ID, "encoding").text not in ("", "loading…"))
        box = driver.find_element(By.ID, "source")
        box.clear()
        box.send_keys(sentence)
        if prefix is not None:
            driver.find_element(By.ID, "prefix").send_keys(prefix)
        if no_repeat is not None:
            field = driver.find_element(By.ID, "no-repeat")
            field.clear()
            field.send_keys(str(no_repeat))
        driver.find_element(By.ID, "translate").click()
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#nbest li")
                   and d.find_element(By.ID, "translate").is_enabled()
                   and (d.find_elements(By.CSS_SELECTOR, "#attention-map rect.cell")
                        or "error" in (d.find_element(By.ID, "status").get_attribute("class") or "")))
        text = lambda el: (el.get_attribute("textContent") or "").strip()
        cells = {(int(c.get_attribute("data-row")), int(c.get_attribute("data-col"))):
                 float(c.get_attribute("data-weight"))
                 for c in driver.find_elements(By.CSS_SELECTOR, "#attention-map rect.cell")}
        result = PageResult(
            encoding=text(driver.find_element(By.ID, "encoding")),
            details=text(driver.find_element(By.ID, "model-details")),
            status=text(driver.find_element(By.ID, "status")),
            nbest=[text(e) for e in driver.find_elements(By.CSS_SELECTOR, "#nbest li .text")],
            scores=[text(e) for e in driver.find_elements(By.CSS_SELECTOR, "#nbest li .score")],
            columns=[text(e) for e in driver.find_elements(By.CSS_SELECTOR, "#attention-map text.col-label")],
            rows=[text(e) for e in driver.find_elements(By.CSS_SELECTOR, "#attention-map text.row-label")],
            cells=cells,
            note=text(driver.find_element(By.ID, "attention-note")),
            kinds=[o.get_attribute("value") for o in driver.find_elements(By.CSS_SELECTOR, "#kind option")],
            layers=[o.get_attribute("value") for o in driver.find_elements(By.CSS_SELECTOR, "#layer option")],
            tokens=[[(t.get_attribute("textContent") or "", float(t.get_attribute("data-logprob")),
                      t.get_attribute("title") or "") for t in li.find_elements(By.CSS_SELECTOR, ".tokens .token")]
                    for li in driver.find_elements(By.CSS_SELECTOR, "#nbest li")],
        )
        if screenshot is not None:
            height = int(driver.execute_script("return document.documentElement.scrollHeight"))
            driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {  # the whole page, not the window
                "width": 1000, "height": min(max(height, 600), 2400), "deviceScaleFactor": 1, "mobile": False})
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            driver.save_screenshot(str(screenshot))
        return result
    finally:
        driver.quit()


def build_parser() -> argparse.ArgumentParser:
    """The command line of bench/demo_page.py."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model_path", "--model-path", required=True, help="run directory or CTranslate2 export")
    parser.add_argument("--out", default="bench/figures/demo_page.png", help="screenshot (PNG)")
    parser.add_argument("--sentence", default="Le chat dort sur le canapé.", help="sentence typed into the page")
    parser.add_argument("--beam", type=int, default=5, help="the server's beam size (default 5)")
    return parser


def main() -> int:
    parser = build_parser()
    args = parser.parse_args()
    out = Path(args.out)
    server = start_server(args.model_path, out.with_suffix(".server.log"), "--beam", str(args.beam))
    try:
        page = drive_page(server.url, args.sentence, out)
    finally:
        server.stop()
    out.with_suffix(".server.log").unlink(missing_ok=True)
    print(f"{page.encoding}: {page.nbest[0] if page.nbest else '(no translation)'}; {page.status}")
    print(f"attention map {len(page.rows)} x {len(page.columns)}; screenshot in {out}")
    return 0


if __name__ == "__main__":
    from utils.cli import run_main

    run_main(main)
