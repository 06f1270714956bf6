"""The ``model`` section of the config: the Transformer and the settings of its positional encodings.

Each encoding declares its own settings next to it (``settings = ("rope", RopeConfig)`` in
models/positional/rotary.py, as fairseq registers a dataclass with each component); ``ModelConfig`` is the
Transformer's fields plus one such section per key found in ``models.positional.REGISTRY``. Which encodings
exist (``input_pe``, ``attention_pe``, ``cross_attention_pe``) is checked against the registry by
``utils.config`` when a whole config is validated. Adding an encoding, with or without settings, needs no
edit here.
"""

from __future__ import annotations

from pydantic import Field, create_model

from models.positional import REGISTRY
from models.positional.augment import AugmentConfig
from models.positional.rotary import RopeConfig
from models.positional.shaw import ShawConfig
from models.positional.t5 import T5BiasConfig
from models.transformer_config import Experiment, Level, Stack, StackPE, TransformerConfig
from utils.schema import ConfigError, Section

__all__ = ["ConfigError", "Experiment", "ModelConfig", "RopeConfig", "Section", "ShawConfig", "Stack", "StackPE",
           "T5BiasConfig", "TransformerConfig"]

def encoding_sections(registry: dict[str, dict[str, type | None]]) -> dict[str, type[Section]]:
    """Every settings section the encodings of ``registry`` declare, by key (``{"rope": RopeConfig, ...}``); two
    encodings may share one section, two different sections may not share a key."""
    sections: dict[str, type[Section]] = {}
    for level in registry.values():
        for cls in level.values():
            if cls is None or cls.settings is None:
                continue
            key, section = cls.settings
            if key in (*TransformerConfig.model_fields, "augment") or sections.setdefault(key, section) is not section:
                raise TypeError(f"{cls.__name__}.settings: model.{key} is already another setting")
    return sections


def model_config_class(registry: dict[str, dict[str, type | None]]) -> type[TransformerConfig]:
    """``TransformerConfig`` plus ``model.augment`` and a ``model.<key>`` section (defaults filled in) per section
    of ``registry``; each encoding describes itself in ``describe_encodings`` (its class's ``describe``)."""
    sections = {"augment": AugmentConfig, **encoding_sections(registry)}  # augment: training-time positions

    class Described(TransformerConfig):
        def describe_pe(self, name: str, level: Level) -> str:
            cls = registry[level].get(name)
            return name if cls is None else cls.describe(self, name)  # type: ignore[attr-defined]

    return create_model(
        "ModelConfig", __base__=Described, __module__=__name__,
        __doc__="Encoder-decoder Transformer (Vaswani et al. 2017) with pluggable positional encodings.",
        **{key: (section, Field(default_factory=section)) for key, section in sections.items()},
    )


ModelConfig = model_config_class(REGISTRY)


def inference_only_keys(registry: dict[str, dict[str, type | None]] = REGISTRY) -> tuple[str, ...]:
    """Model keys (dotted, under ``model``) that shape no parameter and may differ between training and inference:
    dropout, the training-time position augmentation, and the keys each encoding's settings declare
    (``Settings.inference_only``, e.g. ``rope.scaling``)."""
    own = ("dropout", "attention_dropout", "activation_dropout",
           *(f"augment.{key}" for key in AugmentConfig.model_fields))  # training-time positions only
    return (*own, *(f"{key}.{name}" for key, section in encoding_sections(registry).items()
                    for name in getattr(section, "inference_only", ())))
