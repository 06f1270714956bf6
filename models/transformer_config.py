"""The Transformer's own settings: sizes, the encodings chosen at each place (the shorthand and per stack),
and the protocol an encoding's ``check`` reads. The encodings in ``models/positional/`` annotate with these;
``models.config`` composes the full ``ModelConfig`` from them and the registry (so nothing here imports the
registry, and the registry never imports ``models.config``: no import circle).
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

from pydantic import Field

from utils.schema import Section

Stack = Literal["encoder", "decoder"]
Level = Literal["input", "attention"]


class StackPE(Section):
    """One stack's own positional encodings (``model.encoder_pe`` / ``model.decoder_pe``); unset (null) keeps the
    shorthand for both stacks, ``model.input_pe`` / ``model.attention_pe``. E.g. RoPE in the encoder and no
    position at all in the decoder, whose causal mask carries order (NoPE, Kazemnejad et al. 2023):
    ``model.encoder_pe.attention=rope``, ``model.decoder_pe.attention=none``, ``model.input_pe=none``."""

    input: str | None = None
    attention: str | None = None


class TransformerConfig(Section):
    """The Transformer's own fields (``models.config.ModelConfig`` adds the training-time position augmentation
    and each encoding's settings section)."""

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
    encoder_pe: StackPE = Field(default_factory=StackPE)  # the encoder's own, where it differs from the shorthand
    decoder_pe: StackPE = Field(default_factory=StackPE)  # the decoder's own (cross-attention: cross_attention_pe)

    def pe(self, stack: Stack, level: Level) -> str:
        """The registry name of ``stack``'s ``level`` encoding: its own if set, else the shorthand."""
        own = getattr(getattr(self, f"{stack}_pe"), level)
        return own if own is not None else getattr(self, f"{level}_pe")

    def pe_key(self, stack: Stack, level: Level) -> str:
        """The key that chose it: ``model.<stack>_pe.<level>`` if set, else ``model.<level>_pe``."""
        own = getattr(getattr(self, f"{stack}_pe"), level)
        return f"model.{stack}_pe.{level}" if own is not None else f"model.{level}_pe"

    def describe_encodings(self) -> str:
        """``sinusoidal``, ``rope (ntk x4)``, ``sinusoidal + alibi``, ``encoder rope, decoder none``, ``... + t5 in
        cross-attention``, ``none (no positional information)``: the encodings in a few words, for people."""

        def stack(name: Stack) -> str:
            parts = [p for p in (self.pe(name, "input"), self.pe(name, "attention")) if p != "none"]
            if self.pe(name, "attention") == "rope" and self.rope.scaling != "none":
                parts[-1] += f" ({self.rope.scaling} x{self.rope.factor:g})"
            return " + ".join(parts) or "none"

        enc, dec = stack("encoder"), stack("decoder")
        parts = ([] if enc == "none" else [enc]) if enc == dec else [f"encoder {enc}, decoder {dec}"]
        if self.cross_attention_pe != "none":
            parts.append(f"{self.cross_attention_pe} in cross-attention")
        return " + ".join(parts) if parts else "none (no positional information)"

    def encodings(self) -> dict[str, str]:
        """Every place an encoding acts and its name: ``{"encoder input": "sinusoidal", "encoder self-attention":
        "rope", "decoder input": ..., "decoder self-attention": ..., "cross-attention": ...}`` (logs, summaries)."""
        out = {}
        for stack in ("encoder", "decoder"):
            out[f"{stack} input"] = self.pe(stack, "input")
            out[f"{stack} self-attention"] = self.pe(stack, "attention")
        return {**out, "cross-attention": self.cross_attention_pe}


class Experiment(Protocol):
    """What an encoding's ``check`` reads of a whole config (``utils.config.Config`` is one)."""

    @property
    def model(self) -> TransformerConfig: ...

    @property
    def data(self) -> Any: ...
