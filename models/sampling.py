"""Sampling search: each output token drawn from the model's (tempered, truncated) next-token distribution.

- ``temperature`` T divides the log-probabilities before they are renormalised (T < 1 sharper, T > 1 flatter);
- then the truncations, each computed on the tempered distribution, keep a token only if every one that is on
  keeps it: ``top_k`` K (the K most probable), ``top_p`` P (nucleus sampling, Holtzman et al. 2020: the fewest most
  probable tokens whose probabilities sum to at least P), ``epsilon`` E (epsilon sampling, Hewitt et al. 2022:
  tokens of probability at least E); the most probable token is always kept;
- ``num_samples`` N samples are drawn per sentence, independently; each sentence's list is ranked best first by
  score (ties keep the order drawn) and reported once all N have ended;
- a sample's ``logprob`` is the sum of the *model's* log-probabilities of its tokens (untempered, untruncated,
  EOS included), as greedy and beam search sum them; its ``score`` divides that by the GNMT length penalty, as
  beam search ranks;
- length cap and floor as in ``models.decoding`` (EOS forced at the cap, blocked under the floor), and a target
  prefix (``forced``) likewise: each sample starts with it, scored at the model's log-probabilities;
- randomness: the draws of a sentence come from a generator seeded by ``seed`` and the sentence's source token ids
  alone, so a sentence's samples do not depend on the other sentences of its batch nor on the batch size, and the
  same seed repeats them exactly (on the same device; on a GPU up to its floating-point nondeterminism). Without a
  seed each search draws a fresh one.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from models.decoding import Hypothesis, OnDone, Search, _logprobs, length_penalty

#: Uniform draws are made this many steps at a time per sentence.
BLOCK = 64


def check_sampling(temperature: float, top_k: int, top_p: float, epsilon: float, num_samples: int) -> None:
    """ValueError, one line, for settings outside their ranges."""
    if not (temperature > 0 and temperature < float("inf")):
        raise ValueError(f"temperature must be a finite number above 0, got {temperature}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0: off), got {top_k}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1] (1: off), got {top_p}")
    if not 0 <= epsilon < 1:
        raise ValueError(f"epsilon must be in [0, 1) (0: off), got {epsilon}")
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")


def sampling_logprobs(logp: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                      epsilon: float = 0.0) -> torch.Tensor:
    """The distribution samples are drawn from, as log-probabilities ``[N, V]``, from the model's ``logp``
    ``[N, V]``: tempered, truncated (top-k, top-p, epsilon; the argmax always kept) and renormalised."""
    x = F.log_softmax(logp / temperature, dim=-1) if temperature != 1.0 else logp
    vocab = x.shape[-1]
    remove = torch.zeros_like(x, dtype=torch.bool)
    if 0 < top_k < vocab:
        remove |= x < x.topk(top_k, dim=-1).values[:, -1:]
    if top_p < 1.0:
        sorted_x, order = x.sort(dim=-1, descending=True)
        probs = sorted_x.exp()
        before = probs.cumsum(dim=-1) - probs  # the mass of the more probable tokens
        remove |= torch.zeros_like(remove).scatter(1, order, before >= top_p)
    if epsilon > 0.0:
        remove |= x.exp() < epsilon
    if remove.any():
        remove.scatter_(1, x.argmax(dim=-1, keepdim=True), False)
        x = F.log_softmax(x.masked_fill(remove, float("-inf")), dim=-1)
    return x


def draw(logp: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """One token per row of ``logp`` ``[N, V]`` by inverting its cumulative distribution at ``uniforms`` ``[N]`` in
    [0, 1): a token of probability 0 is never drawn."""
    cdf = logp.exp().cumsum(dim=-1)
    point = uniforms.to(cdf) * cdf[:, -1]
    return torch.searchsorted(cdf, point[:, None], right=True).squeeze(1).clamp(max=logp.shape[-1] - 1)


def sentence_generator(seed: int, source: list[int]) -> torch.Generator:
    """A CPU generator seeded by ``seed`` and a sentence's source ids (eos included, no padding)."""
    digest = hashlib.sha256(f"{seed}|{','.join(map(str, source))}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))


class SampleSearch(Search):
    """``num_samples`` samples per sentence (module docstring); ``sample_lists`` holds each sentence's list, best
    first, once all are done. Rows are sentence-major: row ``i * N + j`` is sample ``j`` of sentence ``i``."""

    def __init__(self, model, src: torch.Tensor, *, bos: int, eos: int, num_samples: int = 1,
                 temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, epsilon: float = 0.0,
                 seed: int | None = None, lenpen: float = 0.6, max_len_a: float = 1.5, max_len_b: int = 10,
                 use_cache: bool = True, on_done: OnDone | None = None, min_len_a: float = 0.0,
                 min_len_b: int = 0, forced: Sequence[Sequence[int]] | None = None, no_repeat_ngram: int = 0) -> None:
        check_sampling(temperature, top_k, top_p, epsilon, num_samples)
        super().__init__(model, src, bos=bos, eos=eos, max_len_a=max_len_a, max_len_b=max_len_b, use_cache=use_cache,
                         on_done=on_done, min_len_a=min_len_a, min_len_b=min_len_b, forced=forced,
                         no_repeat_ngram=no_repeat_ngram)
        self.num_samples, self.lenpen = num_samples, lenpen
        self.temperature, self.top_k, self.top_p, self.epsilon = temperature, top_k, top_p, epsilon
        seed = int.from_bytes(os.urandom(8), "little") if seed is None else seed
        pad = model.pad_id
        self.generators = [sentence_generator(seed, row[row != pad].tolist()) for row in src.cpu()]
        device = src.device
        rows = torch.arange(self.n, device=device).repeat_interleave(num_samples)
        self.memory, self.src_mask = self.memory[rows], self.src_mask[rows]
        self.cap = self.cap[rows]
        self.floor = self.floor[rows] if self.floor is not None else None
        self.n_forced = self.n_forced[rows]  # a target prefix, as the other searches force it (``Search.mask``)
        self.forced = self.forced[rows] if self.forced is not None else None
        self.alive = torch.arange(self.n * num_samples, device=device)  # the row ids (sentence * N + sample)
        self.prefix = torch.full((self.n * num_samples, 1), bos, dtype=torch.long, device=device)
        self.logprob = torch.zeros(self.n * num_samples, device=device)
        self.token_logp = torch.zeros(self.n * num_samples, 0, device=device)
        self.uniforms = torch.zeros(self.n * num_samples, BLOCK, device=device)
        self.samples: list[list[Hypothesis | None]] = [[None] * num_samples for _ in range(self.n)]
        self.left = [num_samples] * self.n
        self.done: list[list[Hypothesis] | None] = [None] * self.n

    @property
    def sample_lists(self) -> list[list[Hypothesis]]:
        return [hyps for hyps in self.done if hyps is not None]

    def _refill(self) -> None:
        """The next ``BLOCK`` uniforms of every alive row, from its sentence's generator."""
        n_samples = self.num_samples
        alive = self.alive.tolist()
        draws = {s: torch.rand((n_samples, BLOCK), generator=self.generators[s]) for s in
                 dict.fromkeys(r // n_samples for r in alive)}
        self.uniforms = torch.stack([draws[r // n_samples][r % n_samples] for r in alive]).to(self.prefix.device)

    def advance(self, logits: torch.Tensor) -> None:
        eos, step = self.eos, self.step
        if step % BLOCK == 0:
            self._refill()
        at_cap = self.cap[self.alive] <= step
        logp = self.mask(_logprobs(logits, eos, at_cap, self.blocked()))
        token = draw(sampling_logprobs(logp, self.temperature, self.top_k, self.top_p, self.epsilon),
                     self.uniforms[:, step % BLOCK])
        token = torch.where(at_cap, torch.full_like(token, eos), token)
        token_logp = logp.gather(1, token[:, None])
        self.logprob = self.logprob + token_logp.squeeze(1)
        self.token_logp = torch.cat((self.token_logp, token_logp), dim=1)
        self.prefix = torch.cat((self.prefix, token[:, None]), dim=1)
        finished = token == eos
        if finished.any():
            rows = finished.nonzero().squeeze(1)
            for row, toks, lp, tlp in zip(self.alive[rows].tolist(), self.prefix[rows, 1:-1].tolist(),
                                          self.logprob[rows].tolist(), self.token_logp[rows].tolist(), strict=True):
                self._finish(row, Hypothesis(toks, lp, lp / length_penalty(len(toks) + 1, self.lenpen), tlp))
            keep = (~finished).nonzero().squeeze(1)
            self.alive, self.prefix, self.logprob = self.alive[keep], self.prefix[keep], self.logprob[keep]
            self.token_logp, self.uniforms = self.token_logp[keep], self.uniforms[keep]
            self.memory, self.src_mask = self.memory[keep], self.src_mask[keep]
            if self.cache is not None:
                self.cache.reorder(keep)
        self.step += 1

    def _finish(self, row: int, hyp: Hypothesis) -> None:
        sent, j = divmod(row, self.num_samples)
        self.samples[sent][j] = hyp
        self.left[sent] -= 1
        if self.left[sent] == 0:
            hyps = sorted((h for h in self.samples[sent] if h is not None), key=lambda h: h.score, reverse=True)
            self.done[sent] = hyps
            if self.on_done is not None:
                self.on_done(sent, hyps)


@torch.no_grad()
def sample_search(model, src: torch.Tensor, *, bos: int, eos: int, num_samples: int = 1, temperature: float = 1.0,
                  top_k: int = 0, top_p: float = 1.0, epsilon: float = 0.0, seed: int | None = None,
                  lenpen: float = 0.6, max_len_a: float = 1.5, max_len_b: int = 10, use_cache: bool = True,
                  on_done: OnDone | None = None, min_len_a: float = 0.0, min_len_b: int = 0,
                  forced: Sequence[Sequence[int]] | None = None, no_repeat_ngram: int = 0) -> list[list[Hypothesis]]:
    """src ``[B, S]`` -> for each sentence its ``num_samples`` samples, best first (module docstring)."""
    search = SampleSearch(model, src, bos=bos, eos=eos, num_samples=num_samples, temperature=temperature,
                          top_k=top_k, top_p=top_p, epsilon=epsilon, seed=seed, lenpen=lenpen, max_len_a=max_len_a,
                          max_len_b=max_len_b, use_cache=use_cache, on_done=on_done, min_len_a=min_len_a,
                          min_len_b=min_len_b, forced=forced, no_repeat_ngram=no_repeat_ngram)
    search.run()
    return search.sample_lists
