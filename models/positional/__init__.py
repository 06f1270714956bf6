"""The one registry of positional encodings, looked up by name from the config.

A new encoding is one module with a class deriving from ``InputPE`` or ``AttentionPE`` plus one
line in ``REGISTRY`` below; its own settings, if any, are a Section declared on the class (``settings``)
and become ``model.<key>`` without an edit elsewhere. ``model.input_pe`` names an input-level entry;
``model.attention_pe`` (self-attention) and ``model.cross_attention_pe`` (cross-attention) name
attention-level entries.
The class carries everything else about the encoding: what to plot (``plots``), how to export to
CTranslate2 or why it cannot (``ct2_*``), and the memory it takes (``memory``, ``plot_memory``: what
``models.memory`` adds up before a model is built), with defaults in ``models/positional/base.py``; nothing
outside the registry switches on encoding names or classes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from models.positional.absolute import LearnableLNPE, LearnablePE, PositionLimitError, SinusoidalPE
from models.positional.alibi import ALiBiPE
from models.positional.base import AttentionKind, AttentionPE, InputPE, NoInputPE
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


__all__ = [
    "REGISTRY", "AttentionKind", "AttentionPE", "InputPE", "PositionLimitError",
    "build_attention_pe", "build_input_pe", "names", "position_limit",
]
