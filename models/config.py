"""The ``model`` section of the config: the Transformer and the settings of its positional encodings.

Each encoding declares its own settings next to it (``settings = ("rope", RopeConfig)`` in
models/positional/rotary.py, as fairseq registers a dataclass with each component); ``ModelConfig`` is the
Transformer's fields plus one such section per key found in ``models.positional.REGISTRY``. Which encodings
exist (``input_pe``, ``attention_pe``, ``cross_attention_pe``) is checked against the registry by
``utils.config`` when a whole config is validated. Adding an encoding, with or without settings, needs no
edit here.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

from pydantic import Field, create_model

from models.positional import REGISTRY
from models.positional.rotary import RopeConfig
from models.positional.shaw import ShawConfig
from models.positional.t5 import T5BiasConfig
from utils.schema import ConfigError, Section

__all__ = ["ConfigError", "Experiment", "ModelConfig", "RopeConfig", "Section", "ShawConfig", "T5BiasConfig",
           "TransformerConfig"]


class TransformerConfig(Section):
    """The Transformer's own fields (``ModelConfig`` adds the encodings' sections)."""

    d_model: int = Field(512, ge=1)
    n_heads: int = Field(8, ge=1)
    encoder_layers: int = Field(6, ge=1)
    decoder_layers: int = Field(6, ge=1)
    d_ff: int = Field(2048, ge=1)
    dropout: float = Field(0.1, ge=0, lt=1)
    attention_dropout: float = Field(0.0, ge=0, lt=1)
    activation_dropout: float = Field(0.0, ge=0, lt=1)  # FFN hidden layer (fairseq's; 0 in the paper)
    activation: Literal["relu", "gelu"] = "relu"
    norm: Literal["pre", "post"] = "pre"
    tie_embeddings: bool = True
    scale_embeddings: bool = True
    input_pe: str = "sinusoidal"
    attention_pe: str = "none"
    cross_attention_pe: str = "none"
    max_positions: int = Field(1024, ge=1)  # size of learned position tables; longer inputs are an error
    gaussian_sigma: float = Field(2.0, gt=0)  # input_pe=gaussian: width of the window around each position


def encoding_sections(registry: dict[str, dict[str, type | None]]) -> dict[str, type[Section]]:
    """Every settings section the encodings of ``registry`` declare, by key (``{"rope": RopeConfig, ...}``); two
    encodings may share one section, two different sections may not share a key."""
    sections: dict[str, type[Section]] = {}
    for level in registry.values():
        for cls in level.values():
            if cls is None or cls.settings is None:
                continue
            key, section = cls.settings
            if key in TransformerConfig.model_fields or sections.setdefault(key, section) is not section:
                raise TypeError(f"{cls.__name__}.settings: model.{key} is already another setting")
    return sections


def model_config_class(registry: dict[str, dict[str, type | None]]) -> type[TransformerConfig]:
    """``TransformerConfig`` plus a ``model.<key>`` section (defaults filled in) per section of ``registry``."""
    return create_model(
        "ModelConfig", __base__=TransformerConfig, __module__=__name__,
        __doc__="Encoder-decoder Transformer (Vaswani et al. 2017) with pluggable positional encodings.",
        **{key: (section, Field(default_factory=section)) for key, section in encoding_sections(registry).items()},
    )


ModelConfig = model_config_class(REGISTRY)


class Experiment(Protocol):
    """What an encoding's ``check`` reads of a whole config (``utils.config.Config`` is one)."""

    @property
    def model(self) -> ModelConfig: ...

    @property
    def data(self) -> Any: ...
