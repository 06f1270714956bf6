"""The config reference page (docs/reference_config.py -> docs/pages/reference/config.md) lists every key of the real
config with its default and meaning, is generated from the sections (not a hand-kept list), and is committed as
generated."""

from __future__ import annotations

from typing import Literal

import pytest
import yaml
from pydantic import BaseModel, Field

from docs import generate, reference_config
from models.positional import REGISTRY
from utils.config import Config
from utils.schema import Section


def leaves(section: type[BaseModel], prefix: str = "") -> list[tuple[str, type[BaseModel], str]]:
    """(dotted key, owning section class, field name) of every key below ``section``, walked through pydantic."""
    out = []
    for name, field in section.model_fields.items():
        key = f"{prefix}{name}"
        tp = field.annotation
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            out += leaves(tp, key + ".")
        else:
            out.append((key, section, name))
    return out


def sections(section: type[BaseModel], prefix: str = "") -> list[tuple[str, type[BaseModel]]]:
    out = []
    for name, field in section.model_fields.items():
        tp = field.annotation
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            out += [(f"{prefix}{name}", tp), *sections(tp, f"{prefix}{name}.")]
    return out


def table(page: str) -> dict[str, list[str]]:
    """Key -> [type, default, allowed, meaning] of every table row of ``page``."""
    rows = {}
    for line in page.splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip("|").replace("\\|", "\0").split("|")]
            cells = [c.replace("\0", "|") for c in cells]
            assert len(cells) == 5, line
            rows[cells[0].strip("`")] = cells[1:]
    return rows


@pytest.fixture(scope="module")
def page() -> str:
    return reference_config.pages()["reference/config.md"]


def test_every_key_of_the_config_is_on_the_page_with_its_default_and_meaning(page: str) -> None:
    rows = table(page)
    keys = leaves(Config)
    assert len(keys) > 100 and "model.rope.beta_fast" in [k for k, _, _ in keys]
    assert sorted(rows) == sorted(k for k, _, _ in keys)
    for key, owner, name in keys:
        field = owner.model_fields[name]
        default = field.default_factory() if field.default_factory is not None else field.default
        _type, shown, _allowed, meaning = rows[key]
        # The default as shown, typed into a config, gives the default.
        typed = yaml.safe_load(shown.strip("`"))
        assert getattr(owner.model_validate({name: typed}), name) == default, key
        assert meaning == " ".join(field.description.split()), key


def test_no_field_lacks_a_description_and_no_section_a_docstring() -> None:
    missing = [key for key, owner, name in leaves(Config) if not (owner.model_fields[name].description or "").strip()]
    assert missing == []
    assert [name for name, cls in sections(Config) if not (cls.__dict__.get("__doc__") or "").strip()] == []


def test_each_section_has_its_dotted_heading(page: str) -> None:
    headings = {line.lstrip("#").strip() for line in page.splitlines() if line.startswith("#")}
    for name, _ in sections(Config):
        assert name in headings, name
    assert "## train" in page.splitlines() and "### model.rope" in page.splitlines()
    assert "#### model.augment.cape" in page.splitlines()


def test_allowed_values_come_from_literals_ranges_and_the_registry(page: str) -> None:
    rows = table(page)
    assert rows["train.label_smoothing"][2] == "≥ 0, < 1"
    assert rows["train.nonfinite"][2] == "`stop`, `skip`"
    assert rows["train.amp_cpu"][2] == "`true`, `false`, `auto`"
    assert rows["train.max_steps"][:3] == ["integer or null", "`null`", "≥ 1, ≤ 10000000000, `null`"]
    assert rows["model.rope.theta"][2] == "> 1, ≤ 1e+12"
    assert rows["model.attention_pe"][2] == ", ".join(f"`{n}`" for n in REGISTRY["attention"])
    assert rows["model.decoder_pe.input"][2] == ", ".join(f"`{n}`" for n in [*REGISTRY["input"], None]).replace(
        "`None`", "`null`")


def test_keys_the_old_readme_lacked_have_meanings(page: str) -> None:
    rows = table(page)
    words = {"train.patience": "early stopping", "model.dropout": "dropout", "train.label_smoothing": "label smoothing",
             "train.max_steps": "optimizer steps"}
    for key, word in words.items():
        meaning = rows[key][3]
        assert word in meaning.lower() and len(meaning.split()) >= 8, (key, meaning)


def test_an_encodings_settings_section_says_which_encoding_reads_it(page: str) -> None:
    owned = {cls.settings[0]: name for level in REGISTRY.values() for name, cls in level.items()
             if cls is not None and cls.settings is not None}
    assert {"rope", "t5", "cope"} <= set(owned)
    for key, name in owned.items():
        note = reference_config.applies_only(f"model.{key}", Config)
        assert f"[`{name}`](encodings/{name}.md)" in note
        head = page.index(f"### model.{key}\n")
        assert note in page[head:page.index("| Key |", head)]
    assert "model.decoder_pe.attention" in reference_config.applies_only("model.cope", Config)
    assert "model.cross_attention_pe" not in reference_config.applies_only("model.cope", Config)
    assert reference_config.applies_only("model.augment.shape", Config) == \
        "Read only with `model.augment.method=shape`."
    assert reference_config.applies_only("train", Config) == ""


def test_the_page_follows_any_section_it_is_given() -> None:
    class Inner(Section):
        """Inner settings."""

        depth: int = Field(3, gt=0, le=9, description="How deep.")

    class Options(Section):
        """Options."""

        method: Literal["plain", "inner"] = Field("plain", description="Which method.")
        inner: Inner = Field(default_factory=Inner)

    class Toy(Section):
        """A throwaway config."""

        rate: float = Field(0.25, ge=0, lt=1, description="A rate | with a bar.")
        label: str | None = Field(None, description="A label.")
        options: Options = Field(default_factory=Options)

    rows = reference_config.config_rows(Toy)
    assert [(r.key, r.type, r.default, r.allowed) for r in rows] == [
        ("rate", "number", "0.25", "≥ 0, < 1"), ("label", "string or null", "null", "any, `null`")]
    assert [r.key for r in reference_config.config_rows(Inner, "options.inner")] == ["options.inner.depth"]
    assert [name for name, _ in reference_config.config_sections(Toy)] == ["", "options", "options.inner"]

    class Bigger(Toy):
        extra_key: list[int] = Field(default_factory=lambda: [1, 2], description="Added later.")

    text = reference_config.render(Bigger)
    assert "| `extra_key` | list of integers | `[1, 2]` | see meaning | Added later. |" in text
    assert "| `rate` | number | `0.25` | ≥ 0, < 1 | A rate \\| with a bar. |" in text
    assert "| `options.inner.depth` | integer | `3` | > 0, ≤ 9 | How deep. |" in text
    assert "### options.inner\n" in text and "Read only with `options.method=inner`." in text
    assert "[`options`](#options)" in text


def test_the_intro_shows_the_error_lines_the_code_gives(page: str) -> None:
    assert "error: train.label_smoothing: must be >= 0 and < 1, got 1.5" in page
    assert "error: model.attention_pe: 'rpoe' is not one of: " + ", ".join(REGISTRY["attention"]) in page


def test_the_committed_page_is_what_the_code_gives() -> None:
    pages = reference_config.pages()
    assert pages == reference_config.pages()  # deterministic
    assert generate.stale(pages) == [], "run: python docs/generate.py"
