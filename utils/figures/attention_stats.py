"""Attention quantified rather than eyeballed: per layer and head, for encoder self-, decoder self- and
cross-attention, over a fixed sample of sentence pairs (teacher-forced, the explicit attention path).

For the weights a[i, j] of one head on one sentence (query i, key j, each row sums to 1):

- ``distance``: mean attended distance in tokens, mean_i sum_j a[i, j] |i - j| (Clark et al. 2019,
  "What does BERT look at?", sec. 3; Vig & Belinkov 2019);
- ``entropy``: mean_i -sum_j a[i, j] ln a[i, j], in nats (Clark et al. 2019): 0 is one key, ln(n) uniform;
- ``diagonal`` (cross-attention only): mean_i of the mass within +-``window`` source tokens of the monotone
  path j*(i) = i (S - 1) / (T - 1) that maps the decoder's T query positions (bos included) linearly onto the
  source's S keys (eos included), first to first and last to last: 1 is a monotone alignment, about
  (2 window + 1) / S uniform attention.

Sentences are pooled by query rows (a long sentence counts for its rows). Results are nested lists
``[layer][head]`` so they serialise to JSON as they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from models.transformer import Seq2SeqTransformer

KINDS = ("encoder", "decoder", "cross")


def head_statistics(weights: torch.Tensor, window: int | None = None) -> dict[str, torch.Tensor]:
    """Sums over the query rows of one sentence: weights ``[H, Tq, Tk]`` -> ``{"distance", "entropy"
    [, "diagonal"]}`` each ``[H]`` (divide by Tq for means). ``window`` adds the cross-attention diagonal."""
    _, tq, tk = weights.shape
    w = weights.double()
    i = torch.arange(tq, dtype=torch.float64)[:, None]
    j = torch.arange(tk, dtype=torch.float64)[None, :]
    out = {
        "distance": (w * (i - j).abs()).sum(dim=(1, 2)),
        "entropy": -(w * torch.log(w.clamp_min(1e-12))).sum(dim=(1, 2)),
    }
    if window is not None:
        path = i * (tk - 1) / max(tq - 1, 1)  # [Tq, 1]: the monotone path through the source
        near = ((j - path).abs() <= window).double()
        out["diagonal"] = (w * near).sum(dim=(1, 2))
    return out


@dataclass
class AttentionStatistics:
    """Means over the sample, ``[layer][head]``, per kind; ``rows``: query rows pooled per kind."""

    sentences: int
    window: int
    stats: dict[str, dict[str, list[list[float]]]] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        return {"sentences": self.sentences, "window": self.window, "rows": self.rows, "stats": self.stats}


@torch.no_grad()
def attention_statistics(model: Seq2SeqTransformer, bos_id: int, pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
                         window: int = 2) -> AttentionStatistics:
    """Statistics of every layer and head over ``pairs`` of (source ids with eos, target ids without bos);
    the decoder reads [bos] + target, as in training."""
    was_training = model.training
    model.eval()
    sums: dict[str, list[dict[str, torch.Tensor]]] = {}
    rows = dict.fromkeys(KINDS, 0)
    try:
        for src_ids, tgt_ids in pairs:
            if not src_ids or not tgt_ids:
                continue
            src = torch.tensor([list(src_ids)], dtype=torch.long, device=model.device)
            tgt = torch.tensor([[bos_id, *tgt_ids]], dtype=torch.long, device=model.device)
            _, attention = model.forward_with_attention(src, tgt)
            for kind in KINDS:
                layers = getattr(attention, kind)
                per_layer = [head_statistics(w[0].float().cpu(), window if kind == "cross" else None) for w in layers]
                if kind not in sums:
                    sums[kind] = per_layer
                else:
                    for acc, new in zip(sums[kind], per_layer, strict=True):
                        for name in acc:
                            acc[name] += new[name]
                rows[kind] += layers[0].shape[-2]
    finally:
        model.train(was_training)
    n = sum(1 for s, t in pairs if s and t)
    stats = {kind: {name: [(layer[name] / max(rows[kind], 1)).tolist() for layer in sums[kind]]
                    for name in sums[kind][0]} for kind in sums}
    return AttentionStatistics(n, window, stats, rows)
