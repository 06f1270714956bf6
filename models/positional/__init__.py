"""The one registry of positional encodings, looked up by name from the config.

A new encoding is one module with a class deriving from ``InputPE`` or ``AttentionPE`` plus one
line in ``REGISTRY`` below; its own settings, if any, are a Section declared on the class (``settings``)
and become ``model.<key>`` without an edit elsewhere. ``model.input_pe`` names an input-level entry;
``model.attention_pe`` (self-attention) and ``model.cross_attention_pe`` (cross-attention) name
attention-level entries.
The class carries everything else about the encoding: the checks of its settings (``check``, and its section's
``Settings.check``), the keys that act through it alone (``owns``), its description in logs (``describe``) and its
reference page (``title``, ``paper``, ``formula``, ``ct2_export``, ...), what to plot (``plots``), how to export to
CTranslate2 or why it cannot (``ct2_*``), and the memory it takes (``memory``, ``plot_memory``: what
``models.memory`` adds up before a model is built), with defaults in ``models/positional/base.py``. Validation asks
the registry (``check_settings``, ``effect_rules``); nothing outside it switches on encoding names or classes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from models.positional.absolute import LearnableLNPE, LearnablePE, PositionLimitError, SinusoidalPE
from models.positional.alibi import ALiBiPE
from models.positional.base import AttentionKind, AttentionPE, InputPE, NoInputPE, Settings
from models.positional.cope import CopePE
from models.positional.dpb import DpbPE
from models.positional.fire import FirePE
from models.positional.fixed import BinaryPE, GaussianPE, OneHotPE
from models.positional.kerple import KerpleLogPE, KerplePowerPE
from models.positional.rotary import RotaryPE
from models.positional.sandwich import SandwichPE
from models.positional.shaw import ShawPE
from models.positional.t5 import T5BiasPE
from models.positional.xpos import XposPE

if TYPE_CHECKING:  # models.config builds ModelConfig from this registry: never import it here
    from models.transformer_config import Experiment as Config
    from models.transformer_config import Stack
    from models.transformer_config import TransformerConfig as ModelConfig  # the composed class is one

REGISTRY: dict[str, dict[str, type | None]] = {
    "input": {
        "none": NoInputPE,
        "sinusoidal": SinusoidalPE,
        "learnable": LearnablePE,
        "learnable_ln": LearnableLNPE,
        "onehot": OneHotPE,
        "gaussian": GaussianPE,
        "binary": BinaryPE,
    },
    "attention": {
        "none": None,
        "rope": RotaryPE,
        "alibi": ALiBiPE,
        "t5": T5BiasPE,
        "shaw": ShawPE,
        "kerple_log": KerpleLogPE,
        "kerple_power": KerplePowerPE,
        "sandwich": SandwichPE,
        "fire": FirePE,
        "dpb": DpbPE,
        "cope": CopePE,
        "xpos": XposPE,
    },
}


def names(level: str) -> list[str]:
    """Registered names at ``level`` ("input" or "attention")."""
    return list(REGISTRY[level])


def build_input_pe(cfg: ModelConfig, stack: Stack = "encoder") -> InputPE:
    """``stack``'s input-level encoding (``model.<stack>_pe.input``, else ``model.input_pe``)."""
    return REGISTRY["input"][cfg.pe(stack, "input")](cfg)


def position_limit(*encodings: InputPE) -> int | None:
    """The fewest positions any of ``encodings`` represents (None: all unbounded)."""
    limits = [pe.max_length for pe in encodings if pe.max_length is not None]
    return min(limits) if limits else None


def build_attention_pe(cfg: ModelConfig, kind: AttentionKind) -> AttentionPE | None:
    """The attention-level encoding for one attention layer, or None: self-attention reads its stack's
    (``model.<stack>_pe.attention``, else ``model.attention_pe``), cross-attention ``model.cross_attention_pe``."""
    name = cfg.cross_attention_pe if kind == "cross" else cfg.pe(kind, "attention")
    cls = REGISTRY["attention"][name]
    return None if cls is None else cls(cfg, kind)


def owners(registry: dict[str, dict[str, type | None]] = REGISTRY) -> dict[str, dict[str, str]]:
    """Keys that act only under some encodings -> those encodings' names and levels: ``model.<key>`` of every
    settings section (``settings``) and every Transformer key an encoding ``owns``, the owned keys first."""
    owned: dict[str, dict[str, str]] = {}
    sections: dict[str, dict[str, str]] = {}
    for level, entries in registry.items():
        for name, cls in entries.items():
            if cls is None:
                continue
            for key in getattr(cls, "owns", ()):
                owned.setdefault(f"model.{key}", {})[name] = level
            if cls.settings is not None:
                sections.setdefault(f"model.{cls.settings[0]}", {})[name] = level
    return {**owned, **sections}


def _unused(key: str, by: dict[str, str]) -> Callable[[Config], str | None]:
    """Why ``key``, read by the encodings ``by`` (name -> level), acts nowhere in a config, or None where one of them
    is in use."""
    def why(c: Config) -> str | None:
        if set(by.values()) == {"input"}:  # read at the input: the two stacks' input encodings say it
            used = {stack: c.model.pe(stack, "input") for stack in ("encoder", "decoder")}
            return None if any(name in by for name in used.values()) else \
                f"the input encodings are {used['encoder']} (encoder) and {used['decoder']} (decoder)"
        places = c.model.encodings()
        if any(name in by for name in places.values()):
            return None
        return f"{key} is read by {' or '.join(by)}, which is in none of " + \
            ", ".join(f"{place} ({name})" for place, name in places.items())
    return why


def effect_rules(registry: dict[str, dict[str, type | None]] = REGISTRY) -> list[tuple[str, Callable[[Config],
                                                                                                  str | None]]]:
    """(key, why a ``--set`` of it would have no effect, or None) for every key that acts only under some
    encodings (``owners``): what the encodings declare, read by ``utils.config.check_effective``."""
    return [(key, _unused(key, by)) for key, by in owners(registry).items()]


def check_settings(model: ModelConfig, registry: dict[str, dict[str, type | None]] = REGISTRY) -> None:
    """Each encoding's settings section checks its own rules (``Settings.check``), once per section, in use or not:
    ConfigError, one line."""
    seen = set()
    for entries in registry.values():
        for cls in entries.values():
            if cls is None or cls.settings is None or cls.settings[0] in seen:
                continue
            seen.add(cls.settings[0])
            section = getattr(model, cls.settings[0], None)
            if isinstance(section, Settings):
                section.check(model)


__all__ = [
    "REGISTRY", "AttentionKind", "AttentionPE", "InputPE", "PositionLimitError", "Settings",
    "build_attention_pe", "build_input_pe", "check_settings", "effect_rules", "names", "owners", "position_limit",
]
