"""Several translation models decoded as one: at every step the ensemble's distribution is the mean of the members'
probabilities, returned as its log, ``log(1/n sum_i p_i) = logsumexp_i(log p_i) - log n`` (fairseq's ensembles).

Each member keeps its own encoder output and key/value cache; the members must share one vocabulary (the same
tokenizer), while their sizes and positional encodings may differ. An ``Ensemble`` answers what the searches of
``models.decoding`` ask of a model (``encode``, ``decode``, ``decode_step``, ``new_cache``, ``max_length``,
``device``), so greedy, beam and sampling search decode it unchanged; an ensemble of one member returns that
member's logits untouched (the same outputs and scores as the model alone).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from models.transformer import Seq2SeqTransformer, StepPart


class Memories:
    """The members' encoder outputs (each ``[B, S, D_i]``), indexed by rows together as one tensor would be."""

    def __init__(self, parts: Sequence[torch.Tensor]) -> None:
        self.parts = list(parts)

    def __getitem__(self, index: torch.Tensor) -> Memories:
        return Memories([m[index] for m in self.parts])

    @property
    def shape(self) -> torch.Size:
        """Rows and source positions of the first member (every member has the same; ``D`` may differ)."""
        return self.parts[0].shape


@dataclass
class EnsembleCache:
    """One ``DecoderCache`` per member, reordered together (``models.transformer.DecoderCache``'s interface)."""

    caches: list

    @property
    def length(self) -> int:
        return self.caches[0].length

    def reorder(self, index: torch.Tensor, cross: bool = True) -> None:
        for cache in self.caches:
            cache.reorder(index, cross=cross)

    def reorder_cross(self, index: torch.Tensor) -> None:
        for cache in self.caches:
            cache.reorder_cross(index)


def _pe_names(model: Seq2SeqTransformer) -> str:
    cfg = model.cfg
    return f"{cfg.input_pe}/{cfg.attention_pe}"


class Ensemble(nn.Module):
    """Members decoded together; ``decode`` gives the log of their mean next-token probability (module docstring)."""

    def __init__(self, members: Sequence[Seq2SeqTransformer]) -> None:
        super().__init__()
        if not members:
            raise ValueError("an ensemble needs at least one model")
        sizes = {m.vocab_size for m in members}
        pads = {m.pad_id for m in members}
        if len(sizes) > 1 or len(pads) > 1:
            raise ValueError(f"ensemble members must share one vocabulary: sizes {sorted(sizes)}, pad ids "
                             f"{sorted(pads)}")
        self.members = nn.ModuleList(members)
        self.pad_id, self.vocab_size = members[0].pad_id, members[0].vocab_size

    def __len__(self) -> int:
        return len(self.members)

    @property
    def max_length(self) -> int | None:
        """The longest sequence every member supports (None: unbounded)."""
        limits = [m.max_length for m in self.members if m.max_length is not None]
        return min(limits) if limits else None

    @property
    def device(self) -> torch.device:
        return self.members[0].device

    def encode(self, src: torch.Tensor) -> tuple[Memories, torch.Tensor]:
        """src ``[B, S]`` -> (each member's memory, the source mask ``[B, S]``)."""
        outputs = [m.encode(src) for m in self.members]
        return Memories([memory for memory, _ in outputs]), outputs[0][1]

    def new_cache(self) -> EnsembleCache:
        return EnsembleCache([m.new_cache() for m in self.members])

    def combine(self, logits: Sequence[torch.Tensor]) -> torch.Tensor:
        """The members' logits ``[..., V]`` -> log of their mean probability (float32); one member: its logits."""
        if len(logits) == 1:
            return logits[0]
        logp = torch.stack([F.log_softmax(x.float(), dim=-1) for x in logits])
        return torch.logsumexp(logp, dim=0) - math.log(len(logits))

    def decode(self, tgt: torch.Tensor, memory: Memories, src_mask: torch.Tensor,
               cache: EnsembleCache | None = None) -> torch.Tensor:
        """As ``Seq2SeqTransformer.decode`` (full, or the new tokens with a cache): ``[B, T, V]`` log-probabilities
        of the ensemble."""
        caches = cache.caches if cache is not None else [None] * len(self.members)
        return self.combine([m.decode(tgt, mem, src_mask, cache=c)
                             for m, mem, c in zip(self.members, memory.parts, caches, strict=True)])

    def decode_step(self, parts: list[StepPart]) -> list[torch.Tensor]:
        """One cached step of several batches (``Seq2SeqTransformer.decode_step``), each member over all of them."""
        per_member = []
        for i, member in enumerate(self.members):
            member_parts = [StepPart(p.tokens, p.memory.parts[i], p.src_mask, p.cache.caches[i]) for p in parts]
            per_member.append(member.decode_step(member_parts))
        return [self.combine(list(logits)) for logits in zip(*per_member, strict=True)]

    def describe(self) -> str:
        """e.g. ``3 models (sinusoidal/none, none/rope, none/rope)``: how many, and each one's encodings."""
        return f"{len(self.members)} models ({', '.join(_pe_names(m) for m in self.members)})"


def last_cross_attention(model: Seq2SeqTransformer | Ensemble, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
    """Teacher-forced cross-attention of the last decoder layer, averaged over its heads (and over the members of an
    ensemble): src ``[B, S]``, tgt ``[B, T]`` (bos first) -> ``[B, T, S]``, each row summing to 1 over the source."""
    members = list(model.members) if isinstance(model, Ensemble) else [model]
    maps = [m.forward_with_attention(src, tgt)[1].cross[-1].float().mean(dim=1) for m in members]
    return torch.stack(maps).mean(dim=0)
