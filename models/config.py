"""The ``model`` section of the config: the Transformer and the settings of its positional encodings.

Which encodings exist (``input_pe``, ``attention_pe``, ``cross_attention_pe``) is checked against
``models.positional.REGISTRY`` by ``utils.config`` when a whole config is validated, so that adding an
encoding needs no edit here.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

from pydantic import Field

from utils.schema import ConfigError, Section

__all__ = ["ConfigError", "Experiment", "ModelConfig", "RopeConfig", "Section", "ShawConfig", "T5BiasConfig"]


class RopeConfig(Section):
    """Rotary position embedding (Su et al. 2021) and its length-extension scalings.

    ``scaling``/``factor``/``original_max_len``/``beta_*`` change no parameter: set them at inference
    (``--set model.rope.scaling=yarn``) to run a trained model on longer inputs without retraining.
    """

    theta: float = Field(10000.0, gt=1)  # the base: every frequency base^(-2j/d) is then below 1
    dim: int | None = None  # rotate only the first `dim` dims of each head (partial rotary); None = all
    scaling: Literal["none", "linear", "ntk", "yarn"] = "none"
    factor: float = Field(1.0, ge=1)  # s: how many times longer than the training length
    original_max_len: int = Field(128, ge=1)  # L: the training length (tokens) the scaling starts from
    beta_fast: float = Field(32.0, gt=0)  # YaRN: dims with more than beta_fast rotations over L are left unchanged
    beta_slow: float = Field(1.0, gt=0)  # YaRN: dims with fewer than beta_slow rotations over L are fully interpolated


class ShawConfig(Section):
    """Relative position representations (Shaw et al. 2018)."""

    max_distance: int = Field(16, ge=1)  # k: relative distances are clipped to [-k, k]
    values: bool = False  # also add a_V to the values (needs the explicit attention path)


class T5BiasConfig(Section):
    """T5's bucketed relative attention bias (Raffel et al. 2020)."""

    num_buckets: int = Field(32, ge=2)
    max_distance: int = Field(128, ge=1)


class ModelConfig(Section):
    """Encoder-decoder Transformer (Vaswani et al. 2017) with pluggable positional encodings."""

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
    rope: RopeConfig = Field(default_factory=RopeConfig)
    shaw: ShawConfig = Field(default_factory=ShawConfig)
    t5: T5BiasConfig = Field(default_factory=T5BiasConfig)


class Experiment(Protocol):
    """What an encoding's ``check`` reads of a whole config (``utils.config.Config`` is one)."""

    @property
    def model(self) -> ModelConfig: ...

    @property
    def data(self) -> Any: ...
