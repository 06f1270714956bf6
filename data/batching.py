"""Token-count batching with length bucketing, distributed sharding and resumable epochs.

A batch's cost is ``n_sentences * max(max_src_len + 1, max_tgt_len + 1)``: the padded size of the
larger of the source (tokens + eos) and target (bos + tokens) tensors. Pairs are sorted by
(source length, target length) - ties broken by a seeded shuffle when ``shuffle`` - and grouped
greedily; the batches are fixed for a given seed, and their order is reshuffled each epoch with
``numpy.random.default_rng([seed, epoch])``.

Static shapes (``static_shapes=True``, ``train.static_shapes``): every batch is padded to one of a few
``(rows, length)`` shapes, so that compiled code and CUDA graphs see a handful of shapes instead of a new one
nearly every step. A batch of width ``w`` takes the length ``L`` = the first of ``static_lengths`` (8, 10, 13,
16, 20, 25, 32, ...: three steps per doubling, the split's widest pair last) that holds ``w``. Source and target
are both padded to ``L``, and to ``rows = max_tokens // L`` rows, padding rows holding no target token. The
greedy grouping counts each batch at its padded length, so a padded batch never exceeds ``max_tokens``
positions; the pairs' order (sort, ties, epoch shuffle, sharding, resuming) is the one without static shapes.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from data.cache import TokenizedSplit


def static_lengths(max_width: int) -> list[int]:
    """The padded lengths of static-shape batches of a split whose widest pair is ``max_width`` (source tokens +
    eos, or bos + target tokens): three steps per doubling, ``round(8 * 2 ** (k / 3))`` = 8, 10, 13, 16, 20, 25,
    32, 40, 51, 64, 81, 102, 128, ... below ``max_width``, a step within 1/8 of it dropped, and ``max_width``
    itself last (beyond 8, a length is less than 26 % longer than the narrowest width it holds)."""
    steps = [8]
    while steps[-1] < max_width:
        steps.append(round(8 * 2 ** (len(steps) / 3)))
    return [n for n in steps if 8 * n < 7 * max_width] + [max_width]


def make_batches(src_lengths: np.ndarray, tgt_lengths: np.ndarray, max_tokens: int,
                 order: np.ndarray, lengths: Sequence[int] | None = None) -> list[np.ndarray]:
    """Greedily group ``order`` (indices, already sorted by length) into batches of cost <= max_tokens.

    A single pair costlier than ``max_tokens`` forms a batch of its own. ``lengths`` (static shapes, increasing,
    the last one at least the widest pair's width): a batch costs its rows times the first of ``lengths`` that
    holds its width.
    """
    src = src_lengths[order] + 1
    tgt = tgt_lengths[order] + 1
    widths = np.maximum(src, tgt)
    if lengths is not None:
        ladder = np.asarray(lengths, dtype=np.int64)
        widths = ladder[np.searchsorted(ladder, widths)]
    widths = widths.tolist()
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
    ``len(self)`` batches, the tail that does not divide evenly is dropped). ``static_shapes``: batches
    grouped for, and padded to, the few shapes of ``static_lengths`` (see the module doc; ``shape``).
    """

    def __init__(self, src_lengths: np.ndarray, tgt_lengths: np.ndarray, max_tokens: int, shuffle: bool,
                 seed: int, rank: int = 0, world_size: int = 1, static_shapes: bool = False) -> None:
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
        self.src_lengths, self.tgt_lengths = src, tgt
        self.lengths = static_lengths(int(max(src.max(), tgt.max())) + 1) if static_shapes and len(src) else None
        self.batches = make_batches(src, tgt, max_tokens, order, self.lengths)
        self.per_rank = len(self.batches) // world_size

    def shape(self, batch: Sequence[int] | np.ndarray) -> tuple[int, int] | None:
        """The static (rows, length) that ``batch`` (indices) is padded to; None without static shapes."""
        if self.lengths is None:
            return None
        idx = np.asarray(batch, dtype=np.int64)
        width = int(max(self.src_lengths[idx].max(), self.tgt_lengths[idx].max())) + 1
        length = self.lengths[bisect_left(self.lengths, width)]
        return max(1, self.max_tokens // length), length

    def shapes(self) -> list[tuple[int, int]]:
        """Every static (rows, length) the batches take, sorted by length; empty without static shapes."""
        if self.lengths is None:
            return []
        return sorted({shape for batch in self.batches if (shape := self.shape(batch)) is not None},
                      key=lambda s: s[1])

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
    tokens+eos (all int64, right-padded with pad_id); ``index``: [B] rows in the split (-1: a padding row of
    a static shape, source eos, target bos, no target token); ``n_tgt_tokens``: non-pad entries of ``tgt_out``
    (the real target tokens); ``n_src_tokens``: real source tokens (eos included, padding rows' not)."""

    src: torch.Tensor
    tgt_in: torch.Tensor
    tgt_out: torch.Tensor
    index: torch.Tensor
    n_tgt_tokens: int
    n_src_tokens: int

    def __len__(self) -> int:
        return self.src.shape[0]

    @property
    def n_positions(self) -> int:
        """Source and target positions the model computes (``src`` and ``tgt_in`` entries)."""
        return self.src.numel() + self.tgt_in.numel()

    @property
    def n_padding(self) -> int:
        """Those of ``n_positions`` that are padding (no real source token, no real target token)."""
        return self.n_positions - self.n_src_tokens - self.n_tgt_tokens

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """A copy with every tensor on ``device``."""
        return Batch(self.src.to(device, non_blocking=non_blocking),
                     self.tgt_in.to(device, non_blocking=non_blocking),
                     self.tgt_out.to(device, non_blocking=non_blocking),
                     self.index.to(device, non_blocking=non_blocking), self.n_tgt_tokens, self.n_src_tokens)


def collate(split: TokenizedSplit, indices: list[int], pad_id: int, bos_id: int, eos_id: int,
            shape: tuple[int, int] | None = None) -> Batch:
    """Pad the pairs ``indices`` of ``split`` into a :class:`Batch` (S = max src len + 1, T = max tgt len + 1).

    ``shape`` (rows, length): pad to that static shape instead, S = T = length, the rows past the pairs being
    padding rows (source eos, target bos, ``index`` -1, no target token: no loss, no gradient)."""
    idx = np.asarray(indices, dtype=np.int64)
    b = len(idx)
    s_len = split.src_lengths[idx]
    t_len = split.tgt_lengths[idx]
    s_max = int(s_len.max()) + 1 if b else 1
    t_max = int(t_len.max()) + 1 if b else 1
    rows = b
    if shape is not None:
        rows, length = shape
        if rows < b or length < max(s_max, t_max):
            raise ValueError(f"a batch of {b} rows and width {max(s_max, t_max)} does not fit the shape {shape}")
        s_max = t_max = length
    src = np.full((rows, s_max), pad_id, dtype=np.int64)
    tgt_in = np.full((rows, t_max), pad_id, dtype=np.int64)
    tgt_out = np.full((rows, t_max), pad_id, dtype=np.int64)
    index = np.full(rows, -1, dtype=np.int64)
    index[:b] = split.index[idx]
    src[b:, 0] = eos_id  # padding rows: one source token to attend to, bos to start from (no row without a key)
    tgt_in[b:, 0] = bos_id
    for row, i in enumerate(idx):
        s, t = split.pair(int(i))
        src[row, :len(s)] = s
        src[row, len(s)] = eos_id
        tgt_in[row, 0] = bos_id
        tgt_in[row, 1:len(t) + 1] = t
        tgt_out[row, :len(t)] = t
        tgt_out[row, len(t)] = eos_id
    return Batch(torch.from_numpy(src), torch.from_numpy(tgt_in), torch.from_numpy(tgt_out),
                 torch.from_numpy(index), int(t_len.sum()) + b, int(s_len.sum()) + b)


class BatchIterable:
    """Iterates :class:`Batch` objects of ``split`` in the order of ``sampler`` (what the trainer consumes), each
    padded to its static shape when the sampler has them."""

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
            yield collate(self.split, indices, self.pad_id, self.bos_id, self.eos_id, self.sampler.shape(indices))


@dataclass
class PaddingCount:
    """Padding among the positions trained on (``Batch.n_padding`` over ``Batch.n_positions``): over the whole
    run, and over the window since the last ``take_window``."""

    positions: int = 0
    padding: int = 0
    window_positions: int = 0
    window_padding: int = 0

    def add(self, batch: Batch) -> None:
        positions, padding = batch.n_positions, batch.n_padding
        self.positions += positions
        self.padding += padding
        self.window_positions += positions
        self.window_padding += padding

    @property
    def share(self) -> float:
        """The run's share of padding, 0 to 1 (0 before any batch)."""
        return self.padding / self.positions if self.positions else 0.0

    def take_window(self) -> float:
        """The share of padding since the last call (0 without a batch), and a new window."""
        share = self.window_padding / self.window_positions if self.window_positions else 0.0
        self.window_positions = self.window_padding = 0
        return share
