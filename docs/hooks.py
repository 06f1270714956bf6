"""mkdocs hooks of the site (docs/mkdocs.yml).

- The figures the pages show live beside what they belong to, not copied into the site's sources: each published
  study's figures (``bench/studies/<name>/figures/*.png``, or a look's) are served as ``studies/<name>/figures/*.png``,
  and ``bench/figures/*.png`` as ``assets/figures/*.png``.
- A nav entry ``Title: <folder>/index.md`` whose folder holds generated pages (one per encoding, one per command)
  becomes a section holding the index and every other page of that folder, in name order.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent
EXPANDED = ("reference/encodings/", "reference/commands/")


def served_figures() -> dict[str, Path]:
    """Site path -> source file of every figure served from outside ``docs/pages``."""
    out = {f"assets/figures/{p.name}": p for p in sorted((ROOT / "bench" / "figures").glob("*.png"))}
    from docs.study_pages import folder_of, published

    for name in published():
        for fig in sorted((folder_of(name) / "figures").glob("*.png")):
            out[f"studies/{name}/figures/{fig.name}"] = fig
    return out


def _expand(entry, docs_dir: Path):
    if isinstance(entry, list):
        return [_expand(e, docs_dir) for e in entry]
    if isinstance(entry, dict):
        out = {}
        for title, value in entry.items():
            if isinstance(value, str) and any(value == f"{folder}index.md" for folder in EXPANDED):
                folder = value[: -len("index.md")]
                others = sorted(p.relative_to(docs_dir).as_posix() for p in (docs_dir / folder).glob("*.md")
                                if p.name != "index.md")
                out[title] = [value, *others]
            else:
                out[title] = _expand(value, docs_dir)
        return out
    return entry


def on_config(config, **kwargs):
    config["nav"] = _expand(config["nav"], Path(config["docs_dir"]))
    return config


def on_files(files: Files, config, **kwargs) -> Files:
    for dest, src in served_figures().items():
        files.append(File.generated(config, dest, abs_src_path=str(src)))
    return files
