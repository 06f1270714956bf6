"""Encoder-decoder Transformer (Vaswani et al. 2017) with positional encodings from the registry.

Shapes: src ``[B, S]`` and tgt ``[B, T]`` token ids, right-padded; memory ``[B, S, D]``; logits
``[B, T, V]``. Pre-LN (Xiong et al. 2020; final LayerNorm on each stack) or post-LN (the original).
With a shared vocabulary and ``tie_embeddings`` one table serves source, target and output
(Press & Wolf 2017).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from models.attention import LayerCache, MultiHeadAttention
from models.config import ModelConfig
from models.positional import AttentionPE, build_input_pe, position_limit
from models.positional.augment import augmented_positions
from models.positional.base import SharedPositions


class FeedForward(nn.Module):
    """Position-wise FFN: Linear(D, F) -> activation -> activation_dropout -> Linear(F, D)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(cfg.d_model, cfg.d_ff)
        self.fc2 = nn.Linear(cfg.d_ff, cfg.d_model)
        self.act = F.gelu if cfg.activation == "gelu" else F.relu
        self.dropout = nn.Dropout(cfg.activation_dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.dropout(self.act(self.fc1(x))))


class Residual(nn.Module):
    """x + dropout(f(norm(x))) for pre-LN; norm(x + dropout(f(x))) for post-LN."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.pre = cfg.norm == "pre"
        self.norm = nn.LayerNorm(cfg.d_model)
        self.dropout = nn.Dropout(cfg.dropout)

    def inner(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x) if self.pre else x

    def outer(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = x + self.dropout(y)
        return out if self.pre else self.norm(out)


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg, "encoder")
        self.ff = FeedForward(cfg)
        self.res1, self.res2 = Residual(cfg), Residual(cfg)

    def forward(
        self, x: torch.Tensor, key_mask: torch.Tensor, pos: torch.Tensor, need_weights: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        h, w = self.self_attn(self.res1.inner(x), key_mask=key_mask, q_pos=pos, need_weights=need_weights)
        x = self.res1.outer(x, h)
        x = self.res2.outer(x, self.ff(self.res2.inner(x)))
        return x, w


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg, "decoder")
        self.cross_attn = MultiHeadAttention(cfg, "cross")
        self.ff = FeedForward(cfg)
        self.res1, self.res2, self.res3 = Residual(cfg), Residual(cfg), Residual(cfg)

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor,
        src_mask: torch.Tensor,
        pos: torch.Tensor,
        src_pos: torch.Tensor,
        cache: tuple[LayerCache, LayerCache] | None = None,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        self_cache, cross_cache = cache if cache is not None else (None, None)
        h, w_self = self.self_attn(
            self.res1.inner(x), causal=True, q_pos=pos, cache=self_cache, need_weights=need_weights
        )
        x = self.res1.outer(x, h)
        h, w_cross = self.cross_attn(
            self.res2.inner(x), memory=memory, key_mask=src_mask, q_pos=pos, k_pos=src_pos,
            cache=cross_cache, need_weights=need_weights,
        )
        x = self.res2.outer(x, h)
        x = self.res3.outer(x, self.ff(self.res3.inner(x)))
        return x, w_self, w_cross

    def forward_parts(self, x: torch.Tensor, rows: list[int], parts: list[StepPart], layer: int) -> torch.Tensor:
        """One cached step of several independent batches (``Seq2SeqTransformer.decode_step``): x ``[sum(rows), 1,
        D]``; linear layers over all rows at once, attention per part with its own positions and caches."""
        self_parts = [dict(causal=True, q_pos=p.pos, cache=p.cache.layers[layer][0]) for p in parts]
        x = self.res1.outer(x, self.self_attn.forward_parts(self.res1.inner(x), rows, self_parts))
        cross_parts = [dict(memory=p.memory, key_mask=p.src_mask, q_pos=p.pos, k_pos=p.src_pos,
                            cache=p.cache.layers[layer][1]) for p in parts]
        x = self.res2.outer(x, self.cross_attn.forward_parts(self.res2.inner(x), rows, cross_parts))
        return self.res3.outer(x, self.ff(self.res3.inner(x)))


@dataclass
class DecoderCache:
    """Per-layer (self-attention, cross-attention) key/value caches and the decoded length so far."""

    layers: list[tuple[LayerCache, LayerCache]]
    length: int = 0

    def reorder(self, index: torch.Tensor, cross: bool = True) -> None:
        """Keep/reorder batch rows in place: cached tensors ``[N, H, T, Dh]`` -> ``[len(index), ...]``.

        ``cross=False`` reorders only the self-attention caches. Beam search does that at every step: it
        keeps one cross-attention K/V per *sentence*, shared by the sentence's beams, and reorders those
        (``reorder_cross``) only when sentences leave.
        """
        for self_c, cross_c in self.layers:
            _select_rows(self_c, index)
            if cross:
                _select_rows(cross_c, index)

    def reorder_cross(self, index: torch.Tensor) -> None:
        """Keep/reorder the cross-attention caches only (rows = sentences in beam search)."""
        for _, cross_c in self.layers:
            _select_rows(cross_c, index)


def _select_rows(cache: LayerCache, index: torch.Tensor) -> None:
    for key in cache:
        cache[key] = cache[key].index_select(0, index)


@dataclass
class StepPart:
    """One batch of a shared decoding step: its new tokens ``[N, 1]``, encoder memory ``[n, S, D]`` and mask ``[n, S]``
    (n = N, or N / beams when a sentence's beams share one memory row) and its own cache."""

    tokens: torch.Tensor
    memory: torch.Tensor
    src_mask: torch.Tensor
    cache: DecoderCache
    pos: torch.Tensor = field(init=False)
    src_pos: torch.Tensor = field(init=False)

    def __post_init__(self) -> None:
        device = self.tokens.device
        self.pos = torch.arange(self.cache.length, self.cache.length + 1, device=device)
        self.src_pos = torch.arange(self.memory.shape[1], device=device)


@dataclass
class Attention:
    """Attention weights per layer, each ``[B, H, Tq, Tk]``."""

    encoder: list[torch.Tensor] = field(default_factory=list)
    decoder: list[torch.Tensor] = field(default_factory=list)
    cross: list[torch.Tensor] = field(default_factory=list)


class Seq2SeqTransformer(nn.Module):
    """The translation model. ``encode`` once, then ``decode`` (full, or step by step with a cache)."""

    def __init__(self, cfg: ModelConfig, vocab_size: int, pad_id: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.pad_id = pad_id
        self.vocab_size = vocab_size
        self.src_embed = nn.Embedding(vocab_size, cfg.d_model)
        self.tgt_embed = self.src_embed if cfg.tie_embeddings else nn.Embedding(vocab_size, cfg.d_model)
        self.embed_scale = math.sqrt(cfg.d_model) if cfg.scale_embeddings else 1.0
        self.src_pe = build_input_pe(cfg, "encoder")
        self.tgt_pe = build_input_pe(cfg, "decoder")
        self.dropout = nn.Dropout(cfg.dropout)
        self.encoder = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.decoder = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.decoder_layers))
        pre = cfg.norm == "pre"
        self.encoder_norm = nn.LayerNorm(cfg.d_model) if pre else nn.Identity()
        self.decoder_norm = nn.LayerNorm(cfg.d_model) if pre else nn.Identity()
        self.output = None if cfg.tie_embeddings else nn.Linear(cfg.d_model, vocab_size, bias=False)
        shared = SharedPositions()  # per-forward position data (RoPE angles) computed once for all layers
        for module in self.modules():
            if isinstance(module, AttentionPE):
                module.shared = shared
        self._init_weights()

    def _init_weights(self) -> None:
        """Token embeddings N(0, d^-0.5), linear weights Xavier, biases 0; positional modules keep their own init."""
        for name, p in self.named_parameters():
            if name.startswith(("src_pe.", "tgt_pe.")) or ".pe." in name:
                continue
            if name.startswith(("src_embed", "tgt_embed")):
                nn.init.normal_(p, 0.0, self.cfg.d_model**-0.5)
            elif p.dim() > 1:
                nn.init.xavier_uniform_(p)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    @property
    def max_length(self) -> int | None:
        """Longest sequence both input encodings support (None: unbounded)."""
        return position_limit(self.src_pe, self.tgt_pe)

    @property
    def device(self) -> torch.device:
        return self.src_embed.weight.device

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def positions(self, length: int, device: torch.device) -> torch.Tensor:
        """A stack's positions ``[length]``: 0..length-1, or in training mode those ``model.augment`` draws
        (SHAPE, randomized, CAPE; each stack its own draw). Never in eval mode nor in KV-cached decoding."""
        if self.training and self.cfg.augment.method != "none":
            return augmented_positions(self.cfg.augment, length, device)
        return torch.arange(length, device=device)

    def encode(
        self, src: torch.Tensor, need_weights: bool = False, attention: Attention | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """src ``[B, S]`` -> (memory ``[B, S, D]``, src_mask ``[B, S]`` True on real tokens)."""
        src_mask = src != self.pad_id
        pos = self.positions(src.shape[1], src.device)
        x = self.dropout(self.src_pe(self.src_embed(src) * self.embed_scale, pos))
        for layer in self.encoder:
            x, w = layer(x, src_mask, pos, need_weights)
            if attention is not None and w is not None:
                attention.encoder.append(w)
        return self.encoder_norm(x), src_mask

    def new_cache(self) -> DecoderCache:
        return DecoderCache([({}, {}) for _ in self.decoder])

    def decode(
        self,
        tgt: torch.Tensor,
        memory: torch.Tensor,
        src_mask: torch.Tensor,
        cache: DecoderCache | None = None,
        attention: Attention | None = None,
        keep: torch.Tensor | None = None,
        output: bool = True,
    ) -> torch.Tensor:
        """tgt ``[B, T]`` (bos first) -> logits ``[B, T, V]``, or ``[N, V]`` for the N True positions of ``keep``.

        With a ``cache``, ``tgt`` holds only the new tokens, at positions ``cache.length ...``. ``keep``
        (``[B, T]`` bool, e.g. the non-pad targets) skips the output layer, the largest matrix product of a
        training step, at positions no loss is taken on. ``output=False`` returns the final states
        (``[..., D]``) before the output layer ``output_weight``, for a loss that applies it chunk by chunk
        (``models/loss.py``).
        """
        if cache is None:
            pos = self.positions(tgt.shape[1], tgt.device)
        else:  # a cached step at its true offset, never augmented
            pos = torch.arange(cache.length, cache.length + tgt.shape[1], device=tgt.device)
        src_pos = torch.arange(memory.shape[1], device=tgt.device)
        x = self.dropout(self.tgt_pe(self.tgt_embed(tgt) * self.embed_scale, pos))
        need = attention is not None
        for i, layer in enumerate(self.decoder):
            layer_cache = cache.layers[i] if cache is not None else None
            x, w_self, w_cross = layer(x, memory, src_mask, pos, src_pos, layer_cache, need)
            if need:
                attention.decoder.append(w_self)
                attention.cross.append(w_cross)
        if cache is not None:
            cache.length += tgt.shape[1]
        x = self.decoder_norm(x if keep is None else x[keep])
        return F.linear(x, self.output_weight) if output else x

    def decode_step(self, parts: list[StepPart]) -> list[torch.Tensor]:
        """One cached decoding step of several independent batches at once -> each part's logits ``[N_i, V]``.

        Iteration-level batching (Orca, Yu et al. 2022): batches begun at different times, each at its own
        position with its own cache, share the step's matrix products (embedding, projections, feed-forward,
        output layer: over all rows at once); attention and the positional encodings run per part, as
        ``decode`` runs them for that part alone. So a server can start new sentences at every step instead of
        waiting for a batch to end. Eval mode only (no dropout, no augmented positions).
        """
        rows = [p.tokens.shape[0] for p in parts]
        x = torch.cat([self.tgt_pe(self.tgt_embed(p.tokens) * self.embed_scale, p.pos) for p in parts])
        for i, layer in enumerate(self.decoder):
            x = layer.forward_parts(x, rows, parts, i)
        for p in parts:
            p.cache.length += 1
        return list(F.linear(self.decoder_norm(x[:, -1]), self.output_weight).split(rows))

    @property
    def output_weight(self) -> torch.Tensor:
        """The output layer ``[V, D]`` (bias-free): its own, or the tied target embedding."""
        return self.output.weight if self.output is not None else self.tgt_embed.weight

    def forward(self, src: torch.Tensor, tgt: torch.Tensor, keep: torch.Tensor | None = None,
                output: bool = True) -> torch.Tensor:
        """Teacher-forced logits ``[B, T, V]`` (``[N, V]`` at the True positions of ``keep``; the final states
        ``[..., D]`` instead with ``output=False``)."""
        memory, src_mask = self.encode(src)
        return self.decode(tgt, memory, src_mask, keep=keep, output=output)

    def forward_with_attention(self, src: torch.Tensor, tgt: torch.Tensor) -> tuple[torch.Tensor, Attention]:
        """Teacher-forced logits plus every layer's attention weights (explicit path)."""
        attention = Attention()
        memory, src_mask = self.encode(src, need_weights=True, attention=attention)
        return self.decode(tgt, memory, src_mask, attention=attention), attention
