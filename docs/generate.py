"""Write the generated pages of the documentation site from the code, or check that they are up to date.

Each generator module has ``pages() -> dict[str, str | bytes]``: a path relative to ``docs/pages/`` and its content
(markdown text, or the bytes of a figure). The text pages are committed; ``--check`` (and the test suite) regenerate
them and fail on any difference, so the reference cannot drift from the code. Figures are written and checked for
presence only (their bytes depend on the plotting library's version).

    python docs/generate.py            # write every generated page
    python docs/generate.py --check    # exit 1 naming each page that differs from what the code gives
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

PAGES = Path(__file__).resolve().parent / "pages"
# The generator modules of docs/, each owning the pages it returns.
GENERATORS = ("reference_config", "reference_encodings", "reference_cli", "reference_http", "study_pages")


def generated() -> dict[str, str | bytes]:
    """Every generated page, path relative to ``docs/pages/`` -> content."""
    out: dict[str, str | bytes] = {}
    for name in GENERATORS:
        module = importlib.import_module(f"docs.{name}")
        for path, content in module.pages().items():
            if path in out:
                raise ValueError(f"{path} is generated twice (again by docs/{name}.py)")
            out[path] = content
    return out


def stale(pages: dict[str, str | bytes], root: Path = PAGES) -> list[str]:
    """The pages whose committed copy under ``root`` is missing or (for text) differs from ``pages``."""
    bad = []
    for path, content in sorted(pages.items()):
        file = root / path
        if not file.is_file():
            bad.append(f"{path}: missing")
        elif isinstance(content, str) and file.read_text(encoding="utf-8") != content:
            bad.append(f"{path}: differs from what the code gives")
    return bad


def write(pages: dict[str, str | bytes], root: Path = PAGES) -> None:
    """Write ``pages`` under ``root``, each atomically (a temporary file renamed over the old one)."""
    for path, content in pages.items():
        file = root / path
        file.parent.mkdir(parents=True, exist_ok=True)
        tmp = file.with_name(file.name + ".tmp")
        if isinstance(content, str):
            tmp.write_text(content, encoding="utf-8")
        else:
            tmp.write_bytes(content)
        tmp.replace(file)


def build_parser() -> argparse.ArgumentParser:
    """The command line of docs/generate.py."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a generated page is stale")
    return parser


def main() -> int:
    args = build_parser().parse_args()
    from utils.schema import ConfigError

    try:
        pages = generated()
    except ConfigError as e:  # a file a page is made from is damaged (e.g. a study's results.json): one line
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.check:
        bad = stale(pages)
        for line in bad:
            print(line, file=sys.stderr)
        if bad:
            print("run: python docs/generate.py", file=sys.stderr)
        return 1 if bad else 0
    write(pages)
    print(f"{len(pages)} generated pages written under {PAGES}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.exit(main())
