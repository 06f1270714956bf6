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

    input: str | None = Field(None, description="This stack's input-level encoding (a `model.input_pe` name); null: "
                              "`model.input_pe`.")
    attention: str | None = Field(None, description="This stack's self-attention encoding (a `model.attention_pe` "
                                  "name); null: `model.attention_pe`.")


class TransformerConfig(Section):
    """The Transformer's own fields (``models.config.ModelConfig`` adds the training-time position augmentation
    and each encoding's settings section)."""

    d_model: int = Field(512, ge=1, le=65536, description="Width of the model: embeddings and every layer's input and "
                         "output.")
    n_heads: int = Field(8, ge=1, le=1024, description="Attention heads per layer; must divide `model.d_model` (head "
                         "dimension = d_model / n_heads).")
    encoder_layers: int = Field(6, ge=1, le=1000, description="Layers of the encoder.")
    decoder_layers: int = Field(6, ge=1, le=1000, description="Layers of the decoder.")
    d_ff: int = Field(2048, ge=1, le=1_000_000, description="Hidden width of each layer's feed-forward network.")
    dropout: float = Field(0.1, ge=0, lt=1, description="Dropout rate on the embeddings and on the output of every "
                           "attention and feed-forward block (residual dropout); 0: none.")
    attention_dropout: float = Field(0.0, ge=0, lt=1, description="Dropout rate on the attention weights.")
    activation_dropout: float = Field(0.0, ge=0, lt=1, description="Dropout rate on the feed-forward hidden layer "
                                      "(fairseq's; 0 in the original Transformer).")
    activation: Literal["relu", "gelu"] = Field("relu", description="Activation of the feed-forward hidden layer.")
    norm: Literal["pre", "post"] = Field(
        "pre", description="Where LayerNorm sits: `pre` normalises each block's input, the residual path stays "
        "un-normalised and each stack ends with a LayerNorm (pre-LN, Xiong et al. 2020: trains stably); `post` "
        "normalises after each residual addition, as the original Transformer.")
    tie_embeddings: bool = Field(True, description="One embedding table for source, target and output layer (the "
                                 "vocabulary is shared by both languages; Press & Wolf 2017).")
    scale_embeddings: bool = Field(True, description="Multiply token embeddings by sqrt(`model.d_model`) before the "
                                   "input positional encoding is added (Vaswani et al. 2017).")
    input_pe: str = Field("sinusoidal", description="Input-level positional encoding, added to the token embeddings "
                          "of both stacks (unless `model.encoder_pe.input` / `model.decoder_pe.input` set their "
                          "own).")
    attention_pe: str = Field("none", description="Attention-level positional encoding inside the self-attention of "
                              "both stacks (unless `model.encoder_pe.attention` / `model.decoder_pe.attention` set "
                              "their own).")
    cross_attention_pe: str = Field("none", description="Attention-level positional encoding in cross-attention "
                                    "(target position i, source position j); `none` as in the original "
                                    "Transformer. Source and target positions are not aligned: an experiment.")
    max_positions: int = Field(1024, ge=1, le=1_000_000, description="Positions of the learned tables (`learnable`, "
                               "`learnable_ln`; `binary` takes ceil(log2 of it) bits): a longer input is an "
                               "error.")
    gaussian_sigma: float = Field(2.0, ge=1e-3, le=1e6, description="Only with input encoding `gaussian`: width "
                                  "(standard deviation, in positions) of the normal window around each position.")
    encoder_pe: StackPE = Field(default_factory=StackPE, description="The encoder's own encodings, where they "
                                "differ from the shorthand.")
    decoder_pe: StackPE = Field(default_factory=StackPE, description="The decoder's own encodings, where they "
                                "differ from the shorthand (cross-attention: `model.cross_attention_pe`).")

    def pe(self, stack: Stack, level: Level) -> str:
        """The registry name of ``stack``'s ``level`` encoding: its own if set, else the shorthand."""
        own = getattr(getattr(self, f"{stack}_pe"), level)
        return own if own is not None else getattr(self, f"{level}_pe")

    def pe_key(self, stack: Stack, level: Level) -> str:
        """The key that chose it: ``model.<stack>_pe.<level>`` if set, else ``model.<level>_pe``."""
        own = getattr(getattr(self, f"{stack}_pe"), level)
        return f"model.{stack}_pe.{level}" if own is not None else f"model.{level}_pe"

    def describe_pe(self, name: str, level: Level) -> str:
        """The encoding ``name`` at ``level`` in a few words: here its name; ``models.config.ModelConfig`` asks the
        encoding's class (``describe``, e.g. ``rope (ntk x4)``)."""
        return name

    def describe_encodings(self) -> str:
        """``sinusoidal``, ``rope (ntk x4)``, ``sinusoidal + alibi``, ``encoder rope, decoder none``, ``... + t5 in
        cross-attention``, ``none (no positional information)``: the encodings in a few words, for people."""

        def stack(name: Stack) -> str:
            parts = [self.describe_pe(self.pe(name, level), level) for level in ("input", "attention")
                     if self.pe(name, level) != "none"]
            return " + ".join(parts) or "none"

        enc, dec = stack("encoder"), stack("decoder")
        parts = ([] if enc == "none" else [enc]) if enc == dec else [f"encoder {enc}, decoder {dec}"]
        if self.cross_attention_pe != "none":
            parts.append(f"{self.describe_pe(self.cross_attention_pe, 'attention')} in cross-attention")
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
