"""Greedy and beam search over a ``Seq2SeqTransformer``, batched, with a key/value cache.

Both encode once and decode one token per step through the cache. Sentences leave the batch as soon
as they finish (their cache rows are dropped). Beam search (as in fairseq / Wu et al. 2016):

- scores are sums of log-probabilities;
- each step takes the top 2K candidates of a sentence's K beams; end-of-sentence candidates ranked
  among the top K are set aside as finished, the best K others continue;
- ``stop="bound"`` (default): a sentence is done once no alive beam can still beat its ``nbest``-th best
  finished hypothesis. An alive beam's final score is at most ``logprob / lp(cap + 1)`` (log-probs only
  fall as tokens are added, and for ``alpha >= 0`` the penalty is largest at the cap), so the search
  stops exactly when further steps could not change the returned n-best list;
- ``stop="k_finished"`` (fairseq's rule): a sentence is done when it has K finished hypotheses, even if
  an alive beam still scores better;
- in both, a sentence also ends at its length cap ``max_len = a * src_len + b`` (every beam then ends
  with EOS);
- a length floor ``min_len = a' * src_len + b'`` (fairseq's ``--min-len``, per sentence; at most the cap; off
  when both are 0) blocks EOS until a hypothesis has that many tokens, in greedy and beam search alike;
- a target prefix (``forced``: token ids per sentence, each its own length) is forced at the first steps: a row
  still in its prefix may take only the prefix's next token, at the model's log-probability for it, so the prefix
  stays in the output and counts in its score as teacher forcing scores it; the search goes on after it (greedy
  or beam, with the cache, alone or in ``decode_together``). The cap is at least the prefix's length;
- ``no_repeat_ngram`` n > 0 (fairseq's ``--no-repeat-ngram-size``, Hugging Face's ``no_repeat_ngram_size``, Eole's
  ``block_ngram_repeat``): a token that would complete an n-gram of tokens the hypothesis already holds is
  blocked (``repeated_ngrams``), in every search; a target prefix's tokens count, and are never blocked;
- finished hypotheses are ranked by ``logprob / lp`` with the GNMT length penalty
  ``lp = ((5 + |Y|) / 6) ** alpha`` (Wu et al. 2016, eq. 14), |Y| counting EOS;
- cross-attention keys/values are computed once per sentence and shared by its beams (they attend as
  extra queries of their sentence), so they are never copied per beam, and are reordered only when
  sentences leave the batch; the encoder memory and source mask likewise stay one row per sentence.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from models.transformer import Seq2SeqTransformer, StepPart

STOP_RULES = ("bound", "k_finished")
OnDone = Callable[[int, list["Hypothesis"]], None]  # (sentence index in src, its final n-best list)


@dataclass
class Hypothesis:
    """One output: token ids (no bos/eos), summed log-probability, and length-penalised score; ``token_logprobs``: the
    log-probability of each token, EOS last when it ended with one (their float32 running sum is ``logprob``)."""

    tokens: list[int]
    logprob: float
    score: float
    token_logprobs: list[float] = field(default_factory=list)
    constraints_met: bool = True  # False: it reached the cap without a phrase of its constraints (models.constrained)


def length_penalty(length: torch.Tensor | int, alpha: float) -> torch.Tensor | float:
    """GNMT length penalty ((5 + length) / 6) ** alpha."""
    return ((5 + length) / 6) ** alpha


def max_lengths(src_mask: torch.Tensor, a: float, b: int, model: Seq2SeqTransformer) -> torch.Tensor:
    """Per-sentence cap on output tokens (EOS excluded): a * src_len + b, within the model's position limit."""
    src_len = src_mask.sum(1) - 1  # source eos not counted
    cap = (a * src_len.float() + b).clamp(max=2**31).floor().long().clamp(min=1)  # no int overflow at a huge a
    if model.max_length is not None:
        cap = cap.clamp(max=model.max_length - 1)
    return cap


def min_lengths(src_mask: torch.Tensor, a: float, b: int, cap: torch.Tensor) -> torch.Tensor | None:
    """Per-sentence floor on output tokens (EOS excluded) before EOS may end a hypothesis: a * src_len + b, at
    most the sentence's ``cap``; None when ``a`` and ``b`` are both 0 (no floor: nothing is blocked)."""
    if a == 0 and b == 0:
        return None
    src_len = src_mask.sum(1) - 1  # source eos not counted, as in max_lengths
    floor = (a * src_len.float() + b).clamp(max=2**31).floor().long()
    return torch.minimum(floor, cap)


def _logprobs(logits: torch.Tensor, eos: int, force_eos: torch.Tensor,
              block_eos: torch.Tensor | None = None) -> torch.Tensor:
    """Log-probabilities ``[N, V]`` from a step's logits ``[N, V]``; rows in ``force_eos`` may only emit EOS, rows
    in ``block_eos`` may not emit it (fairseq's minimum length: EOS at -inf, the rest not renormalised)."""
    logp = F.log_softmax(logits.float(), dim=-1)
    if force_eos.any():
        forced = torch.full_like(logp[0], float("-inf"))
        forced[eos] = 0.0
        logp = torch.where(force_eos[:, None], logp + forced, logp)
    if block_eos is not None and block_eos.any():
        blocked = torch.zeros_like(logp, dtype=torch.bool)
        blocked[:, eos] = block_eos
        logp = logp.masked_fill(blocked, float("-inf"))
    return logp


def repeated_ngrams(tokens: torch.Tensor, n: int, vocab: int) -> torch.Tensor | None:
    """Which next tokens would repeat an n-gram: ``tokens`` ``[N, L]`` (each row's tokens so far) -> ``[N, V]``
    bool, True where the row's last n - 1 tokens followed by that token already occur in the row (n = 1: every
    token already there); None when no row is long enough to hold an n-gram."""
    rows, length = tokens.shape
    if n < 1 or length < n:
        return None
    windows = tokens.unfold(1, n, 1)  # [N, L - n + 1, n]: every n-gram of each row
    if n == 1:
        match = torch.ones(windows.shape[:2], dtype=torch.long, device=tokens.device)
    else:
        match = (windows[:, :, :-1] == tokens[:, None, length - n + 1:]).all(-1).long()  # same n - 1 tokens as the end
    hits = torch.zeros(rows, vocab, dtype=torch.long, device=tokens.device).scatter_add_(1, windows[:, :, -1], match)
    return hits > 0


class Search:
    """A batch being decoded, one token per ``advance``: it encodes its sources when made, ``step_part()`` gives
    the model's input for the next step, ``advance(logits)`` takes that step's logits ``[N, V]``. ``run()`` decodes
    it alone; ``decode_together`` steps several at once (``Seq2SeqTransformer.decode_step``), so a batch can start
    while others are halfway (a server's iteration-level batching). Sentences leave the batch when they finish,
    reported to ``on_done(i, nbest)`` at once. ``min_len_a``/``min_len_b``: the length floor; ``forced``: each
    sentence's target prefix; ``no_repeat_ngram``: n-grams of that size never repeat (module docstring)."""

    def __init__(self, model: Seq2SeqTransformer, src: torch.Tensor, *, bos: int, eos: int, max_len_a: float,
                 max_len_b: int, use_cache: bool, on_done: OnDone | None, min_len_a: float = 0.0,
                 min_len_b: int = 0, forced: Sequence[Sequence[int]] | None = None, no_repeat_ngram: int = 0) -> None:
        if no_repeat_ngram < 0:
            raise ValueError(f"no_repeat_ngram must be >= 0, got {no_repeat_ngram}")
        self.model, self.eos, self.on_done, self.no_repeat_ngram = model, eos, on_done, no_repeat_ngram
        self.memory, self.src_mask = model.encode(src)
        self.n = src.shape[0]
        self.cap = max_lengths(self.src_mask, max_len_a, max_len_b, model)
        self.floor = min_lengths(self.src_mask, min_len_a, min_len_b, self.cap)  # None: no floor
        self.forced, self.n_forced = _forced_tokens(forced, self.n, model, src.device)  # [n, P] (-1: free), [n]
        self.cap = torch.maximum(self.cap, self.n_forced)
        self.alive = torch.arange(self.n, device=src.device)  # original sentence index of each alive sentence
        self.prefix = torch.full((self.n, 1), bos, dtype=torch.long, device=src.device)
        self.cache = model.new_cache() if use_cache else None
        self.step = 0

    @property
    def running(self) -> bool:
        return self.alive.numel() > 0

    def step_part(self) -> StepPart:
        """The next step's input for ``Seq2SeqTransformer.decode_step`` (cached decoding only)."""
        assert self.cache is not None, "decoding together needs the key/value cache"
        return StepPart(self.prefix[:, -1:], self.memory, self.src_mask, self.cache)

    def logits(self) -> torch.Tensor:
        """This batch's next-step logits ``[N, V]``, decoded alone (with a cache only the last token is run; without
        one the whole prefix is, for comparison)."""
        step_input = self.prefix[:, -1:] if self.cache is not None else self.prefix
        return self.model.decode(step_input, self.memory, self.src_mask, cache=self.cache)[:, -1]

    def blocked(self, width: int = 1) -> torch.Tensor | None:
        """Which rows (``width`` per alive sentence) may not end at this step (under their floor); None: none."""
        if self.floor is None:
            return None
        return (self.floor[self.alive] > self.step).repeat_interleave(width)

    def mask(self, logp: torch.Tensor, width: int = 1) -> torch.Tensor:
        """``logp`` ``[N, V]`` of this step's rows (``width`` per alive sentence) with the target prefix forced (a
        row still in its prefix keeps only the prefix's next token, at its own log-probability) and, with
        ``no_repeat_ngram``, the tokens that would repeat an n-gram blocked in the other rows."""
        tok = None
        if self.forced is not None and self.step < self.forced.shape[1]:
            tok = self.forced[self.alive, self.step].repeat_interleave(width)
        if self.no_repeat_ngram:
            banned = repeated_ngrams(self.prefix[:, 1:], self.no_repeat_ngram, logp.shape[-1])
            if banned is not None:
                if tok is not None:  # a row in its target prefix takes the prefix's token, repeated or not
                    banned &= (tok < 0)[:, None]
                logp = logp.masked_fill(banned, float("-inf"))
        if tok is None or not (rows := tok >= 0).any():
            return logp
        only = torch.full_like(logp, float("-inf")).scatter_(1, tok.clamp(min=0)[:, None], 0.0)
        return torch.where(rows[:, None], logp + only, logp)

    def advance(self, logits: torch.Tensor) -> None:
        raise NotImplementedError

    def run(self) -> None:
        while self.running:
            self.advance(self.logits())


@torch.no_grad()
def decode_together(model: Seq2SeqTransformer, searches: list[Search]) -> None:
    """One step of every running search in ``searches``, their matrix products shared (``decode_step``)."""
    running = [s for s in searches if s.running]
    if running:
        for search, logits in zip(running, model.decode_step([s.step_part() for s in running]), strict=True):
            search.advance(logits)


class GreedySearch(Search):
    """Argmax at each step; ``hypotheses`` holds one hypothesis per sentence once it is done."""

    def __init__(self, model: Seq2SeqTransformer, src: torch.Tensor, *, bos: int, eos: int, max_len_a: float = 1.5,
                 max_len_b: int = 10, use_cache: bool = True, on_done: OnDone | None = None, min_len_a: float = 0.0,
                 min_len_b: int = 0, forced: Sequence[Sequence[int]] | None = None, no_repeat_ngram: int = 0) -> None:
        super().__init__(model, src, bos=bos, eos=eos, max_len_a=max_len_a, max_len_b=max_len_b, use_cache=use_cache,
                         on_done=on_done, min_len_a=min_len_a, min_len_b=min_len_b, forced=forced,
                         no_repeat_ngram=no_repeat_ngram)
        self.logprob = torch.zeros(self.n, device=src.device)
        self.token_logp = torch.zeros(self.n, 0, device=src.device)  # [n_alive, step] each token's log-probability
        self.done: list[Hypothesis | None] = [None] * self.n

    @property
    def hypotheses(self) -> list[Hypothesis]:
        return [h for h in self.done if h is not None]

    def advance(self, logits: torch.Tensor) -> None:
        eos = self.eos
        at_cap = self.cap[self.alive] <= self.step
        logp = self.mask(_logprobs(logits, eos, at_cap, self.blocked()))
        best, token = logp.max(dim=-1)
        # At its cap a sentence ends whatever the scores say (NaN scores never pick EOS by argmax).
        token = torch.where(at_cap, torch.full_like(token, eos), token)
        best = torch.where(at_cap, logp[:, eos], best)
        self.logprob = self.logprob + best
        self.token_logp = torch.cat((self.token_logp, best[:, None]), dim=1)
        finished = token == eos
        self.prefix = torch.cat((self.prefix, token[:, None]), dim=1)
        if finished.any():  # only the rows that end now leave Python-side
            rows = finished.nonzero().squeeze(1)
            for sent, toks, lp, tlp in zip(self.alive[rows].tolist(), self.prefix[rows, 1:-1].tolist(),
                                           self.logprob[rows].tolist(), self.token_logp[rows].tolist(), strict=True):
                self.done[sent] = Hypothesis(toks, lp, lp, tlp)
                if self.on_done is not None:
                    self.on_done(sent, [self.done[sent]])
            keep = (~finished).nonzero().squeeze(1)
            self.alive, self.prefix, self.logprob = self.alive[keep], self.prefix[keep], self.logprob[keep]
            self.token_logp = self.token_logp[keep]
            self.memory, self.src_mask = self.memory[keep], self.src_mask[keep]
            if self.cache is not None:
                self.cache.reorder(keep)
        self.step += 1


@torch.no_grad()
def greedy_search(
    model: Seq2SeqTransformer,
    src: torch.Tensor,
    *,
    bos: int,
    eos: int,
    max_len_a: float = 1.5,
    max_len_b: int = 10,
    use_cache: bool = True,
    on_done: OnDone | None = None,
    min_len_a: float = 0.0,
    min_len_b: int = 0,
    forced: Sequence[Sequence[int]] | None = None,
    no_repeat_ngram: int = 0,
) -> list[Hypothesis]:
    """src ``[B, S]`` -> one hypothesis per sentence (argmax at each step). ``on_done(i, [hypothesis])`` is called
    for sentence ``i`` as soon as it finishes, before the rest of the batch (a server answers it then).
    ``min_len_a``/``min_len_b``: EOS is blocked until a hypothesis has a * src_len + b tokens (at most the cap).
    ``forced``: each sentence's target prefix, token ids; ``no_repeat_ngram``: n-grams of that size never repeat
    (module docstring)."""
    search = GreedySearch(model, src, bos=bos, eos=eos, max_len_a=max_len_a, max_len_b=max_len_b, use_cache=use_cache,
                          on_done=on_done, min_len_a=min_len_a, min_len_b=min_len_b, forced=forced,
                          no_repeat_ngram=no_repeat_ngram)
    search.run()
    return search.hypotheses


def _keep_best_alive(finished: list[list[Hypothesis]], alive: torch.Tensor, done: torch.Tensor,
                     prefix: torch.Tensor, scores: torch.Tensor, width: int, step: int, lenpen: float,
                     token_logp: torch.Tensor) -> None:
    """A sentence that ends with no finished hypothesis (scores all NaN or -inf: a diverged model) keeps its
    first alive beam as its output, so every sentence gets at least one hypothesis. A sane model never
    gets here: at the cap every beam is offered EOS with a finite score."""
    for r in done.nonzero().squeeze(1).tolist():
        sent = int(alive[r])
        if not finished[sent]:
            lp = float(scores[r, 0])
            finished[sent].append(Hypothesis(prefix[r * width, 1:].tolist(), lp, lp / length_penalty(step + 1, lenpen),
                                             token_logp[r * width].tolist()))


class BeamSearch(Search):
    """Beam search (module docstring); ``nbest_lists`` holds each sentence's ``nbest`` best once all are done."""

    def __init__(self, model: Seq2SeqTransformer, src: torch.Tensor, *, bos: int, eos: int, beam: int = 5,
                 nbest: int = 1, lenpen: float = 0.6, max_len_a: float = 1.5, max_len_b: int = 10,
                 use_cache: bool = True, stop: str = "bound", on_done: OnDone | None = None, min_len_a: float = 0.0,
                 min_len_b: int = 0, forced: Sequence[Sequence[int]] | None = None, no_repeat_ngram: int = 0) -> None:
        if stop not in STOP_RULES:
            raise ValueError(f"stop must be one of {', '.join(STOP_RULES)}, got {stop!r}")
        if not 1 <= nbest <= beam:
            raise ValueError(f"nbest must be in 1..beam ({beam}), got {nbest}")
        super().__init__(model, src, bos=bos, eos=eos, max_len_a=max_len_a, max_len_b=max_len_b, use_cache=use_cache,
                         on_done=on_done, min_len_a=min_len_a, min_len_b=min_len_b, forced=forced,
                         no_repeat_ngram=no_repeat_ngram)
        device = src.device
        self.beam, self.nbest, self.lenpen, self.stop = beam, nbest, lenpen, stop
        self.finished: list[list[Hypothesis]] = [[] for _ in range(self.n)]
        self.n_finished = torch.zeros(self.n, dtype=torch.long, device=device)
        # The nbest-th best finished score of each sentence (-inf until it has nbest), and the most the
        # length penalty can divide an alive beam's log-prob by (at the cap; at the next length if alpha < 0).
        self.kth_best = torch.full((self.n,), float("-inf"), device=device)
        self.bound_lp = length_penalty(self.cap.float() + 1, lenpen)
        self.width = 1  # beams per alive sentence: 1 at the first step (all beams would be identical)
        self.scores = torch.zeros(self.n, 1, device=device)  # [n_alive, width] summed log-probs
        self.token_logp = torch.zeros(self.n, 0, device=device)  # [n_alive * width, step] each token's log-prob

    @property
    def nbest_lists(self) -> list[list[Hypothesis]]:
        return [_best(hyps, self.nbest) for hyps in self.finished]  # never empty (see _keep_best_alive)

    def choose(self, logp: torch.Tensor) -> tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                                                  tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """This step's choice from the rows' log-probabilities ``logp`` ``[n_alive * width, V]``: the candidates
        that finish (alive sentence, beam, summed log-prob: the EOS candidates ranked among the top K of the top 2K)
        and those that continue (score, beam, token ``[n_alive, K]``: the best K others, best first)."""
        beam, width, n_alive, vocab = self.beam, self.width, self.alive.numel(), logp.shape[-1]
        cand = (self.scores[:, :, None] + logp.view(n_alive, width, vocab)).view(n_alive, width * vocab)
        top_score, top_idx = cand.topk(min(2 * beam, width * vocab), dim=-1)  # [n_alive, 2K]
        top_beam, top_tok = top_idx // vocab, top_idx % vocab
        is_eos = top_tok == self.eos
        eos_rows, eos_cols = (is_eos[:, :beam] & torch.isfinite(top_score[:, :beam])).nonzero(as_tuple=True)
        cont_score, cont_rank = top_score.masked_fill(is_eos, float("-inf")).topk(min(beam, top_score.shape[1]), dim=-1)
        return ((eos_rows, top_beam[eos_rows, eos_cols], top_score[eos_rows, eos_cols]),
                (cont_score, top_beam.gather(1, cont_rank), top_tok.gather(1, cont_rank)))

    def ended(self, row: int, hyp: Hypothesis) -> Hypothesis:
        """A hypothesis that finishes from row ``row`` of this step (a subclass may mark it)."""
        return hyp

    def carry(self, rows: torch.Tensor, tokens: torch.Tensor) -> None:
        """The next step's rows are rows ``rows`` of this one extended with ``tokens`` (a subclass's state follows)."""

    def advance(self, logits: torch.Tensor) -> None:
        beam, nbest, lenpen, stop, step, width = self.beam, self.nbest, self.lenpen, self.stop, self.step, self.width
        alive, finished, prefix = self.alive, self.finished, self.prefix
        n_alive = alive.numel()
        force = (self.cap[alive] <= step).repeat_interleave(width)
        logp = self.mask(_logprobs(logits, self.eos, force, self.blocked(width)), width)
        (eos_rows, eos_beam, eos_score), (cont_score, cont_beam, cont_tok) = self.choose(logp)

        # Set aside the finished candidates (EOS), then carry on with the others.
        if eos_rows.numel():
            rows = (eos_rows * width + eos_beam).tolist()
            lps = eos_score.tolist()
            eos_lps = logp[rows, self.eos].tolist()
            for r, row, lp, eos_lp in zip(eos_rows.tolist(), rows, lps, eos_lps, strict=True):
                sent = int(alive[r])
                if stop == "k_finished" and len(finished[sent]) >= beam:
                    continue
                hyps = finished[sent]
                hyp = Hypothesis(prefix[row, 1:].tolist(), lp, lp / length_penalty(step + 1, lenpen),
                                 self.token_logp[row].tolist() + [eos_lp])
                hyps.append(self.ended(row, hyp))
                self.n_finished[sent] += 1
                if len(hyps) >= nbest:
                    self.kth_best[sent] = sorted((h.score for h in hyps), reverse=True)[nbest - 1]

        if stop == "k_finished":
            done = self.n_finished[alive] >= beam
        else:
            if lenpen >= 0:
                best_possible = cont_score[:, 0] / self.bound_lp[alive]
            else:
                best_possible = cont_score[:, 0] / length_penalty(step + 2, lenpen)
            done = best_possible <= self.kth_best[alive]
        done |= self.cap[alive] <= step
        done |= ~torch.isfinite(cont_score[:, 0])
        _keep_best_alive(finished, alive, done, prefix, self.scores, width, step, lenpen, self.token_logp)
        if self.on_done is not None:
            for r in done.nonzero().squeeze(1).tolist():
                sent = int(alive[r])
                self.on_done(sent, _best(finished[sent], nbest))
        keep = (~done).nonzero().squeeze(1)
        self.step += 1
        if keep.numel() == 0:
            self.alive = alive[keep]
            return
        rows = (keep[:, None] * width + cont_beam[keep]).view(-1)  # rows of the current batch to carry on
        self.carry(rows, cont_tok[keep].view(-1))
        self.prefix = torch.cat((prefix[rows], cont_tok[keep].view(-1, 1)), dim=1)
        self.token_logp = torch.cat((self.token_logp[rows], logp[rows, cont_tok[keep].view(-1)][:, None]), dim=1)
        self.scores = cont_score[keep]
        # Source state stays one row per sentence (its beams share it): it changes only when sentences leave.
        leaving = keep.numel() < n_alive
        if leaving:
            self.memory, self.src_mask = self.memory[keep], self.src_mask[keep]
        if self.cache is not None:
            self.cache.reorder(rows, cross=False)
            if leaving:
                self.cache.reorder_cross(keep)
        self.alive = alive[keep]
        self.width = cont_beam.shape[1]


@torch.no_grad()
def beam_search(
    model: Seq2SeqTransformer,
    src: torch.Tensor,
    *,
    bos: int,
    eos: int,
    beam: int = 5,
    nbest: int = 1,
    lenpen: float = 0.6,
    max_len_a: float = 1.5,
    max_len_b: int = 10,
    use_cache: bool = True,
    stop: str = "bound",
    on_done: OnDone | None = None,
    min_len_a: float = 0.0,
    min_len_b: int = 0,
    forced: Sequence[Sequence[int]] | None = None,
    no_repeat_ngram: int = 0,
) -> list[list[Hypothesis]]:
    """src ``[B, S]`` -> for each sentence its ``nbest`` best hypotheses, best first.

    ``stop``: ``"bound"`` (stop when no alive beam can beat the finished n-best) or ``"k_finished"``
    (fairseq: stop after K finished hypotheses). ``on_done(i, nbest)`` is called for sentence ``i`` with its final
    list as soon as it leaves the batch, before the others finish. ``min_len_a``/``min_len_b``: EOS is blocked
    until a hypothesis has a * src_len + b tokens (at most the cap). ``forced``: each sentence's target prefix, token
    ids; ``no_repeat_ngram``: n-grams of that size never repeat (module docstring).
    """
    search = BeamSearch(model, src, bos=bos, eos=eos, beam=beam, nbest=nbest, lenpen=lenpen, max_len_a=max_len_a,
                        max_len_b=max_len_b, use_cache=use_cache, stop=stop, on_done=on_done, min_len_a=min_len_a,
                        min_len_b=min_len_b, forced=forced, no_repeat_ngram=no_repeat_ngram)
    search.run()
    return search.nbest_lists


def _best(hyps: list[Hypothesis], nbest: int) -> list[Hypothesis]:
    """The ``nbest`` highest-scoring hypotheses, best first, those meeting their constraints before those failing
    them (a stable sort: ties keep the order they finished in)."""
    return sorted(hyps, key=lambda h: (h.constraints_met, h.score), reverse=True)[:nbest]


def _forced_tokens(forced: Sequence[Sequence[int]] | None, n: int, model: Seq2SeqTransformer,
                   device: torch.device) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Target prefixes as ``[n, P]`` token ids (-1 past each one's end; None when none has any) and their lengths
    ``[n]``; ValueError, one line, for a count other than ``n``, a negative id, or a prefix over the position limit."""
    lengths = torch.zeros(n, dtype=torch.long, device=device)
    if forced is not None and len(forced) != n:
        raise ValueError(f"{len(forced)} target prefixes for {n} sentences")
    if not forced or not any(len(p) for p in forced):
        return None, lengths
    limit = model.max_length - 1 if model.max_length is not None else None
    table = torch.full((n, max(len(p) for p in forced)), -1, dtype=torch.long)
    for s, prefix in enumerate(forced):
        ids = [int(t) for t in prefix]
        if ids and min(ids) < 0:
            raise ValueError(f"sentence {s}: target prefix token ids must be >= 0, got {ids}")
        if limit is not None and len(ids) > limit:
            raise ValueError(f"sentence {s}: its target prefix has {len(ids)} tokens, over the model's limit of "
                             f"{limit}")
        table[s, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        lengths[s] = len(ids)
    return table.to(device), lengths
