"""The positional-encoding reference (docs/reference_encodings.py) is generated from the registry: one page per
registered name, the index lists them all, each page holds the class's paper, formula and settings keys, a new
encoding registered in one line gets its page (settings, refusal line, no figure when it has nothing to plot), the
committed pages are what the code gives, and every figure a page links exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from conftest import once
from pydantic import Field

from docs import generate, reference_encodings
from models.positional import REGISTRY
from models.positional.augment import CapeConfig, RandomizedConfig, ShapeConfig
from models.positional.base import AttentionPE
from utils.config import ModelConfig
from utils.schema import Section

FOLDER = "reference/encodings"


class SlopeSettings(Section):
    """The throwaway encoding's own settings (``model.slope``)."""

    init: float = Field(0.1, gt=0)  # the slope's initial value, learned


class SlopeBiasPE(AttentionPE):
    """-s |i - j| added to every head's scores, s one learned scalar: ALiBi with a single slope."""

    settings = ("slope", SlopeSettings)

    def __init__(self, cfg: ModelConfig, kind: str) -> None:
        super().__init__(cfg, kind)  # type: ignore[arg-type]
        self.slope = torch.nn.Parameter(torch.tensor(cfg.slope.init))

    def bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor, q: torch.Tensor | None = None) -> torch.Tensor:
        return -self.slope * (q_pos[:, None] - k_pos[None, :]).abs().float()[None, None]


@pytest.fixture(scope="module")
def pages() -> dict[str, str | bytes]:
    return once("test_docs_encodings.pages", reference_encodings.pages)


def _names() -> list[str]:
    return list(dict.fromkeys(name for level in REGISTRY.values() for name in level))


def _default(value: object) -> str:
    """A default as the settings tables write it (YAML's spelling)."""
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value!r}`" if isinstance(value, float) else f"`{value}`"


def _classes() -> list[tuple[str, type]]:
    return [(name, cls) for level in REGISTRY.values() for name, cls in level.items() if cls is not None]


def test_one_page_per_registered_name_and_the_index_links_each(pages: dict[str, str | bytes]) -> None:
    names = _names()
    md = {p for p in pages if p.endswith(".md")}
    assert md == {f"{FOLDER}/{n}.md" for n in names} | {f"{FOLDER}/index.md", f"{FOLDER}/augment.md"}
    index = pages[f"{FOLDER}/index.md"]
    assert isinstance(index, str)
    rows = re.findall(r"^\| \[`(\w+)`\]\((\w+)\.md\) \| (input|attention) \|", index, re.M)
    assert sorted((n, level) for n, _, level in rows) == sorted(
        (n, level) for level, entries in REGISTRY.items() for n in entries)
    assert all(n == link for n, link, _ in rows)
    assert "| [`cope`](cope.md) | attention | decoder self only (causal) | Golovneva et al. 2024 | no | — |" in index
    assert "| [`rope`](rope.md) | attention | encoder self, decoder self, cross | Su et al. 2021 | yes |" in index


def test_each_page_holds_its_title_paper_formula_and_settings_keys(pages: dict[str, str | bytes]) -> None:
    for name, cls in _classes():
        page = pages[f"{FOLDER}/{name}.md"]
        assert isinstance(page, str)
        assert page.startswith(f"# {cls.title} (`{name}`)\n"), name
        assert cls.title and cls.summary and cls.formula, f"{name}: title, summary and formula are set on the class"
        assert f"$$\n{cls.formula}\n$$" in page
        if cls.paper:
            authors, title = re.match(r"(.+?) \(\d{4}\)\. (.+?)\. ", cls.paper).groups()  # type: ignore[union-attr]
            assert f"**Paper:** {authors}" in page and title in page, name
        else:
            assert "**Paper:** none of its own." in page
        if cls.settings is not None:
            key, section = cls.settings
            for field, info in section.model_fields.items():
                row = next(line for line in page.splitlines() if line.startswith(f"| `model.{key}.{field}` |"))
                assert row.split(" | ")[2] == _default(info.default), row
        for key in cls.reads:
            assert f"| `model.{key}` |" in page
        assert "## Where it is allowed" in page and "## CTranslate2 export" in page
    rope = pages[f"{FOLDER}/rope.md"]
    assert "| `model.rope.theta` | number, > 1, ≤ 1e+12 | `10000.0` |" in rope
    assert "| `model.rope.scaling` | one of `none`, `linear`, `ntk`, `yarn` | `none` |" in rope
    assert "| Hooks | `rotate` |" in rope
    assert "| cross-attention | no: model.cross_attention_pe=rope: CTranslate2's cross-attention has no positional " \
           "term |" in rope
    xpos = pages[f"{FOLDER}/xpos.md"]
    assert "| encoder self-attention | `model.encoder_pe.attention=xpos` | no: model.encoder_pe.attention=xpos puts " \
           "it in the encoder, but it is defined for causal (decoder) self-attention only" in xpos
    assert "| [`shape`](augment.md#shape) | no: model.augment.method=shape changes nothing here" in xpos
    learnable = pages[f"{FOLDER}/learnable.md"]
    assert "| [`cape`](augment.md#cape) | no: model.augment.method=cape draws real-valued positions, but " \
           "model.input_pe=learnable takes integer positions only" in learnable
    assert "| Longest input (default config) | 1024 positions (`model.max_positions=1024`) |" in learnable


def test_the_augmentation_page_has_each_method_its_paper_formula_and_keys(pages: dict[str, str | bytes]) -> None:
    page = pages[f"{FOLDER}/augment.md"]
    assert isinstance(page, str)
    for method, section in (("shape", ShapeConfig), ("randomized", RandomizedConfig), ("cape", CapeConfig)):
        assert f"## {section.title} (`{method}`) {{#{method}}}" in page
        assert f"$$\n{section.formula}\n$$" in page and section.paper.split(" (")[0] in page
        for field in section.model_fields:
            assert f"| `model.augment.{method}.{field}` |" in page
        assert f"![{method}: position/augment](augment_{method}.png)" in page
    cape = page.split("{#cape}")[1]
    takes = re.search(r"accepts it with, alone: (.*)\.", cape)
    assert takes is not None
    real = [n for n, cls in _classes() if cls.positions == "real" and n != "none" and n != "cope"]
    assert re.findall(r"\[`(\w+)`\]", takes.group(1)) == real  # cope reads only the order: every method refused


def test_a_new_encoding_registered_in_one_line_gets_its_page(pages: dict[str, str | bytes],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(REGISTRY["attention"], "slope", SlopeBiasPE)  # the one line
    out = reference_encodings.pages()
    page = out[f"{FOLDER}/slope.md"]
    assert isinstance(page, str)
    assert page.startswith("# `slope`\n")  # no title on the class: the name alone
    assert "-s \\|i - j\\| added" not in page and "-s |i - j| added to every head's scores" in page  # its docstring
    assert "| `model.slope.init` | number, > 0 | `0.1` | the slope's initial value, learned |" in page
    assert "| self-attention (both stacks) | no: model.attention_pe=slope: CTranslate2 has no equivalent of this " \
           "encoding |" in page
    assert "| Hooks | `bias` |" in page
    assert "Learned parameters per layer (default config: d_model 512, 8 heads) | 1 (encoder self-attention), " \
           "1 (decoder self-attention), 1 (cross-attention) |" in page
    assert "Nothing to plot: `visualize.py` draws no figure of this encoding (slope in encoder self-attention: " \
           "this encoding has nothing to plot" in page
    assert f"{FOLDER}/slope.png" not in out and "](slope.png)" not in page
    index = out[f"{FOLDER}/index.md"]
    assert "| [`slope`](slope.md) | attention | encoder self, decoder self, cross | — | no | shape, randomized |" \
        in index
    others = lambda ps: {p: c for p, c in ps.items() if p.rsplit("/", 1)[1] not in  # noqa: E731
                         ("slope.md", "index.md", "augment.md")}
    assert others(out) == others(pages)  # every other encoding's page and figure unchanged
    assert "[`slope`](slope.md)" in out[f"{FOLDER}/augment.md"]  # SHAPE and randomized take it


def test_committed_pages_are_what_the_code_gives(pages: dict[str, str | bytes]) -> None:
    assert generate.stale(pages) == [], "run: python docs/generate.py"
    committed = {p.relative_to(generate.PAGES).as_posix() for p in (generate.PAGES / FOLDER).iterdir()}
    assert committed == set(pages), "a page of the folder that the code no longer gives, or one it lacks"


def test_every_figure_a_page_links_exists(pages: dict[str, str | bytes]) -> None:
    linked = set()
    for path, content in pages.items():
        if isinstance(content, str):
            for target in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", content):
                linked.add(f"{FOLDER}/{target}")
                assert isinstance(pages.get(f"{FOLDER}/{target}"), bytes), f"{path} links {target}"
                assert (Path(generate.PAGES) / FOLDER / target).is_file()
    figures = {p for p, c in pages.items() if isinstance(c, bytes)}
    assert linked == figures
    assert all(pages[p][:8] == b"\x89PNG\r\n\x1a\n" for p in figures)  # type: ignore[index]
    # every encoding with something to draw has its figure; `none` alone draws nothing
    assert {p for p in figures if "augment" not in p} == {f"{FOLDER}/{n}.png" for n in _names() if n != "none"}
