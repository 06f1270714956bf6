"""Token-count batching with length bucketing, distributed sharding and resumable epochs.

A batch's cost is ``n_sentences * max(max_src_len + 1, max_tgt_len + 1)``: the padded size of the
larger of the source (tokens + eos) and target (bos + tokens) tensors. Pairs are sorted by
(source length, target length) - ties broken by a seeded shuffle when ``shuffle`` - and grouped
greedily; the batches are fixed for a given seed, and their order is reshuffled each epoch with
``numpy.random.default_rng([seed, epoch])``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from data.cache import TokenizedSplit


def make_batches(src_lengths: np.ndarray, tgt_lengths: np.ndarray, max_tokens: int,
                 order: np.ndarray) -> list[np.ndarray]:
    """Greedily group ``order`` (indices, already sorted by length) into batches of cost <= max_tokens.

    A single pair costlier than ``max_tokens`` forms a batch of its own.
    """
    src = src_lengths[order] + 1
    tgt = tgt_lengths[order] + 1
    widths = np.maximum(src, tgt).tolist()
    batches: list[np.ndarray] = []
    start, width = 0, 0
    for i, w in enumerate(widths):
        new_width = max(width, w)
        if i > start and (i - start + 1) * new_width > max_tokens:
            batches.append(order[start:i])
            start, new_width = i, w
        width = new_width
    if len(widths) > start:
        batches.append(order[start:])
    return batches


class TokenBatchSampler:
    """Yields ``list[int]`` batches of indices into a split, for one rank of ``world_size``.

    ``src_lengths``/``tgt_lengths``: int [n] token counts without bos/eos. Batches are fixed for a
    seed; ``set_epoch`` picks the order (rank ``r`` gets batches r, r+W, ...; all ranks get
    ``len(self)`` batches, the tail that does not divide evenly is dropped).
    """

    def __init__(self, src_lengths: np.ndarray, tgt_lengths: np.ndarray, max_tokens: int, shuffle: bool,
                 seed: int, rank: int = 0, world_size: int = 1) -> None:
        src = np.asarray(src_lengths, dtype=np.int64)
        tgt = np.asarray(tgt_lengths, dtype=np.int64)
        if src.shape != tgt.shape or src.ndim != 1:
            raise ValueError(f"src_lengths {src.shape} and tgt_lengths {tgt.shape} must be equal 1-D shapes")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in 0..{world_size - 1}")
        self.max_tokens, self.shuffle, self.seed = max_tokens, shuffle, seed
        self.rank, self.world_size = rank, world_size
        self.epoch, self.skip = 0, 0
        if shuffle:
            tie = np.random.default_rng(seed).permutation(len(src))
            order = np.lexsort((tie, tgt, src))  # last key is primary: src, then tgt, then random
        else:
            order = np.lexsort((np.arange(len(src)), tgt, src))
        self.batches = make_batches(src, tgt, max_tokens, order)
        self.per_rank = len(self.batches) // world_size

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        """The next ``__iter__`` yields epoch ``epoch``'s batches, minus the first ``skip`` (resuming)."""
        if skip < 0:
            raise ValueError(f"skip must be >= 0, got {skip}")
        self.epoch, self.skip = epoch, skip

    def epoch_batches(self, epoch: int) -> list[np.ndarray]:
        """This rank's batches for ``epoch``, in order (no skipping)."""
        order = np.arange(len(self.batches))
        if self.shuffle:
            order = np.random.default_rng([self.seed, epoch]).permutation(len(self.batches))
        mine = order[self.rank::self.world_size][:self.per_rank]
        return [self.batches[i] for i in mine]

    def __len__(self) -> int:
        return self.per_rank

    def __iter__(self) -> Iterator[list[int]]:
        skip, self.skip = self.skip, 0  # skipping applies to the next pass only
        for batch in self.epoch_batches(self.epoch)[skip:]:
            yield batch.tolist()


@dataclass
class Batch:
    """A padded batch. ``src``: [B,S] tokens+eos; ``tgt_in``: [B,T] bos+tokens; ``tgt_out``: [B,T]
    tokens+eos (all int64, right-padded with pad_id); ``index``: [B] rows in the split;
    ``n_tgt_tokens``: non-pad entries of ``tgt_out``."""

    src: torch.Tensor
    tgt_in: torch.Tensor
    tgt_out: torch.Tensor
    index: torch.Tensor
    n_tgt_tokens: int

    def __len__(self) -> int:
        return self.src.shape[0]

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """A copy with every tensor on ``device``."""
        return Batch(self.src.to(device, non_blocking=non_blocking),
                     self.tgt_in.to(device, non_blocking=non_blocking),
                     self.tgt_out.to(device, non_blocking=non_blocking),
                     self.index.to(device, non_blocking=non_blocking), self.n_tgt_tokens)


def collate(split: TokenizedSplit, indices: list[int], pad_id: int, bos_id: int, eos_id: int) -> Batch:
    """Pad the pairs ``indices`` of ``split`` into a :class:`Batch` (S = max src len + 1, T = max tgt len + 1)."""
    idx = np.asarray(indices, dtype=np.int64)
    b = len(idx)
    s_len = split.src_lengths[idx]
    t_len = split.tgt_lengths[idx]
    s_max = int(s_len.max()) + 1 if b else 1
    t_max = int(t_len.max()) + 1 if b else 1
    src = np.full((b, s_max), pad_id, dtype=np.int64)
    tgt_in = np.full((b, t_max), pad_id, dtype=np.int64)
    tgt_out = np.full((b, t_max), pad_id, dtype=np.int64)
    for row, i in enumerate(idx):
        s, t = split.pair(int(i))
        src[row, :len(s)] = s
        src[row, len(s)] = eos_id
        tgt_in[row, 0] = bos_id
        tgt_in[row, 1:len(t) + 1] = t
        tgt_out[row, :len(t)] = t
        tgt_out[row, len(t)] = eos_id
    return Batch(torch.from_numpy(src), torch.from_numpy(tgt_in), torch.from_numpy(tgt_out),
                 torch.from_numpy(split.index[idx].astype(np.int64)), int(t_len.sum()) + b)


class BatchIterable:
    """Iterates :class:`Batch` objects of ``split`` in the order of ``sampler`` (what the trainer consumes)."""

    def __init__(self, split: TokenizedSplit, sampler: TokenBatchSampler, pad_id: int, bos_id: int,
                 eos_id: int) -> None:
        self.split, self.sampler = split, sampler
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        self.sampler.set_epoch(epoch, skip)

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[Batch]:
        for indices in self.sampler:
            yield collate(self.split, indices, self.pad_id, self.bos_id, self.eos_id)
