"""The models bench/speed.py compares, built at the sizes of a config's ``model:``: ours, Hugging Face Marian and
``torch.nn.Transformer`` (embeddings, sinusoidal positions, tied output layer), and the two ways decoding is held
to a length cap on untrained models (an EOS offset for ours, a ``LogitsProcessor`` for Marian)."""

from __future__ import annotations

import math
from typing import Any

MODELS = ("ours", "marian", "torch")
LABELS = {"ours": "ours", "marian": "Marian", "torch": "nn.Transformer"}
EOS_OFFSET = 1e4  # subtracted from the EOS logit before a hypothesis reaches its length cap


def _torch_transformer_class() -> type:
    import torch
    import torch.nn.functional as F
    from torch import nn

    from models.positional.absolute import sinusoid_table  # the one sinusoid table (Vaswani et al. 2017)

    class TorchTransformer(nn.Module):
        """``nn.Transformer`` + scaled token embeddings + sinusoidal positions + tied output layer.

        Offers ``encode``/``decode`` like ``Seq2SeqTransformer`` (without a cache), so that our
        ``greedy_search`` can drive it.
        """

        def __init__(self, m: Any, vocab_size: int, pad_id: int, max_positions: int) -> None:
            super().__init__()
            self.pad_id = pad_id
            self.embed = nn.Embedding(vocab_size, m.d_model)
            self.scale = math.sqrt(m.d_model)
            self.dropout = nn.Dropout(m.dropout)
            self.transformer = nn.Transformer(
                d_model=m.d_model, nhead=m.n_heads, num_encoder_layers=m.encoder_layers,
                num_decoder_layers=m.decoder_layers, dim_feedforward=m.d_ff, dropout=m.dropout,
                activation=m.activation, batch_first=True, norm_first=m.norm == "pre",
            )
            nn.init.normal_(self.embed.weight, 0.0, m.d_model**-0.5)
            self.register_buffer("pe", sinusoid_table(max_positions, m.d_model), persistent=False)

        max_length = None

        def _embed(self, ids: torch.Tensor) -> torch.Tensor:
            return self.dropout(self.embed(ids) * self.scale + self.pe[: ids.shape[1]])

        def encode(self, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            src_mask = src != self.pad_id
            return self.transformer.encoder(self._embed(src), src_key_padding_mask=~src_mask), src_mask

        def decode(self, tgt: torch.Tensor, memory: torch.Tensor, src_mask: torch.Tensor,
                   cache: None = None) -> torch.Tensor:
            if cache is not None:
                raise ValueError("nn.Transformer has no incremental decoding")
            causal = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1], device=tgt.device)
            x = self.transformer.decoder(self._embed(tgt), memory, tgt_mask=causal, tgt_is_causal=True,
                                         memory_key_padding_mask=~src_mask)
            return F.linear(x, self.embed.weight)

        def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
            memory, src_mask = self.encode(src)
            return self.decode(tgt, memory, src_mask)

    return TorchTransformer


def build_model(name: str, cfg: Any, vocab: int, pad: int, eos: int, max_positions: int) -> Any:
    """One of the three models, randomly initialised from ``cfg.model``."""
    m = cfg.model
    if name == "ours":
        from models.transformer import Seq2SeqTransformer

        return Seq2SeqTransformer(m, vocab, pad)
    if name == "marian":
        from transformers import GenerationConfig, MarianConfig, MarianMTModel

        mc = MarianConfig(
            vocab_size=vocab, decoder_vocab_size=vocab, d_model=m.d_model,
            encoder_layers=m.encoder_layers, decoder_layers=m.decoder_layers,
            encoder_attention_heads=m.n_heads, decoder_attention_heads=m.n_heads,
            encoder_ffn_dim=m.d_ff, decoder_ffn_dim=m.d_ff, activation_function=m.activation,
            dropout=m.dropout, attention_dropout=m.attention_dropout, activation_dropout=m.activation_dropout,
            max_position_embeddings=max_positions, scale_embedding=True,
            pad_token_id=pad, eos_token_id=eos, decoder_start_token_id=pad, bos_token_id=None,
            forced_eos_token_id=None, share_encoder_decoder_embeddings=True, tie_word_embeddings=True,
        )
        mc._attn_implementation = "sdpa"
        model = MarianMTModel(mc)
        model.generation_config = GenerationConfig(
            decoder_start_token_id=pad, pad_token_id=pad, eos_token_id=eos, bos_token_id=None,
            forced_eos_token_id=None,
        )
        return model
    if name == "torch":
        return _torch_transformer_class()(m, vocab, pad, max_positions)
    raise ValueError(name)


class SuppressEos:
    """Wraps a model with ``encode``/``decode``: EOS logit lowered by EOS_OFFSET (our search forces it at the cap)."""

    def __init__(self, model: Any, eos: int) -> None:
        self.model, self.eos = model, eos

    @property
    def max_length(self) -> int | None:
        return self.model.max_length

    def encode(self, src: Any) -> Any:
        return self.model.encode(src)

    def new_cache(self) -> Any:
        return self.model.new_cache()

    def decode(self, tgt: Any, memory: Any, src_mask: Any, cache: Any = None) -> Any:
        logits = self.model.decode(tgt, memory, src_mask, cache=cache)
        logits[..., self.eos] -= EOS_OFFSET
        return logits


def length_cap_processor(caps: Any, eos: int) -> Any:
    """A ``LogitsProcessor``: row r may not emit EOS before ``caps[r]`` generated tokens and must emit it then."""
    import torch
    from transformers import LogitsProcessor

    class LengthCap(LogitsProcessor):
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            generated = input_ids.shape[1] - 1  # the decoder start token is not counted
            cap = caps.repeat_interleave(input_ids.shape[0] // caps.shape[0])
            before, at = generated < cap, generated >= cap
            eos_col = scores[:, eos].masked_fill(before, float("-inf"))
            scores = scores.masked_fill(at[:, None], float("-inf"))
            scores[:, eos] = torch.where(at, torch.zeros_like(eos_col), eos_col)
            return scores

    return LengthCap()
