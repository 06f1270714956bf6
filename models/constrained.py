"""Lexically constrained beam search with dynamic beam allocation (Post & Vilar 2018, NAACL: "Fast Lexically
Constrained Decoding with Dynamic Beam Allocation for Neural Machine Translation").

Each sentence names phrases its output must contain. A phrase is a token id sequence (e.g. a term's subwords), or
several alternative sequences, any of which meets it: a subword tokenizer may write a word differently before
punctuation (``water`` as ``▁wat er``, ``water.`` as ``▁water.``), and the alternatives of a phrase form a tree
of token paths. Every hypothesis carries which phrases it has met, and where it stands in the one it is in:

- a phrase is met token by token along one of its paths. Once a hypothesis has produced a phrase's first token it
  is *in* that phrase, and only a token continuing one of the paths it is on keeps it there; any other token
  abandons it (its progress is lost, and that token may start a phrase itself). Outside a phrase, a token starts
  the first unmet phrase that begins with it. Phrases are met one at a time, as in Sockeye: a phrase produced
  inside another, or overlapping another's end, does not count there;
- the candidates of a sentence at each step are the top 2K extensions over all its beams (those
  ``models.decoding.BeamSearch`` takes), plus every beam extended with the next token of each of its unmet phrases
  (only the current phrase's next tokens while it is in one), plus every beam's best extension;
- the candidates are put in banks by the number of constraint tokens they have met (0 to C, C the tokens of the
  sentence's phrases, each counted by its first path), and the K beam slots are dealt out round-robin: each bank in
  turn, the bank with the most met first, takes its best remaining candidate, until K are taken or none is left.
  Each bank gets K / (C + 1) slots, the remainder going to the banks with the most met, and a bank's unused slots go
  to the others; so hypotheses at every stage of progress survive, even where those that have met more score lower;
- end-of-sentence (EOS) is blocked (log-probability -inf) for a hypothesis with a phrase unmet, so only complete
  hypotheses finish: the EOS candidates among the K that the allocation picks are set aside as finished, then the
  K beams that continue are allocated among the other candidates;
- at the length cap every beam ends, met or not; a hypothesis failing a phrase is marked
  (``Hypothesis.constraints_met`` False) and ranks below every hypothesis meeting them all. The cap is raised to
  at least the target prefix's tokens and the phrases' (within the model's position limit);
- scores are the model's own log-probabilities (nothing renormalised), stopping as in beam search (``bound`` or
  ``k_finished``), and a sentence with no phrases is decoded exactly as ``BeamSearch`` decodes it.

Greedy search takes no constraints: one beam slot cannot hold hypotheses at several stages of progress.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from models.decoding import BeamSearch, Hypothesis, OnDone, length_penalty
from models.transformer import Seq2SeqTransformer

#: A phrase: one token id sequence, or its alternatives (sequences of token ids, the first counting its length).
Phrase = Sequence[int] | Sequence[Sequence[int]]
Constraints = Sequence[Sequence[Phrase]]  # per sentence, its phrases


def _paths(phrase: Phrase) -> list[list[int]]:
    """A phrase's alternative token paths."""
    if phrase and not isinstance(phrase[0], Sequence):
        return [[int(t) for t in phrase]]  # type: ignore[union-attr]
    return [[int(t) for t in path] for path in phrase]  # type: ignore[union-attr]


class _Tree:
    """The phrases of one sentence as one tree of nodes (a phrase's paths share their common beginnings): each
    node's token, parent node (-1: a phrase's first token), phrase, depth, and whether it completes its phrase."""

    def __init__(self, phrases: Sequence[Phrase], vocab: int | None, sentence: int) -> None:
        self.tok: list[int] = []
        self.parent: list[int] = []
        self.phrase: list[int] = []
        self.depth: list[int] = []
        self.ends: list[bool] = []
        self.weight: list[int] = []  # tokens of each phrase's first path
        for p, phrase in enumerate(phrases):
            paths = _paths(phrase)
            flat = [t for path in paths for t in path]
            if not paths or not all(paths) or min(flat) < 0 or (vocab is not None and max(flat) >= vocab):
                raise ValueError(f"sentence {sentence}: a constraint phrase must be one or more non-empty sequences of "
                                 f"token ids in 0..{vocab - 1 if vocab else 'vocab'}, got {phrase}")
            self.weight.append(len(paths[0]))
            children: dict[tuple[int, int], int] = {}
            for path in paths:
                node = -1
                for depth, t in enumerate(path, 1):
                    if node >= 0 and self.ends[node]:
                        break  # a shorter path already completes the phrase here
                    if (node, t) not in children:
                        children[node, t] = len(self.tok)
                        self.tok.append(t)
                        self.parent.append(node)
                        self.phrase.append(p)
                        self.depth.append(depth)
                        self.ends.append(False)
                    node = children[node, t]
                else:
                    self.ends[node] = True


def _rank_in_runs(keys: torch.Tensor) -> torch.Tensor:
    """For ``keys`` sorted so that equal keys are adjacent: each element's position within its run of equal keys."""
    pos = torch.arange(keys.numel(), device=keys.device)
    new = torch.ones_like(keys, dtype=torch.bool)
    new[1:] = keys[1:] != keys[:-1]
    return pos - torch.where(new, pos, 0).cummax(0).values


def allocate(group: torch.Tensor, bank: torch.Tensor, score: torch.Tensor, eligible: torch.Tensor,
             slots: int) -> torch.Tensor:
    """Dynamic beam allocation: which candidates (a mask) fill each group's ``slots``, dealt round-robin over the
    banks, the highest bank first, each bank taking its best remaining eligible candidate in turn."""
    chosen = torch.zeros_like(eligible)
    idx = eligible.nonzero().squeeze(1)
    if idx.numel() == 0:
        return chosen
    g, b, s = group[idx], bank[idx], score[idx]
    order = torch.argsort(s, descending=True, stable=True)
    order = order[torch.argsort(b[order], stable=True)]
    order = order[torch.argsort(g[order], stable=True)]  # by group, bank, best first
    g, b = g[order], b[order]
    banks = int(b.max()) + 1
    turn = _rank_in_runs(g * banks + b) * banks + (banks - 1 - b)  # round r of the deal, highest bank first
    deal = torch.argsort(turn, stable=True)
    deal = deal[torch.argsort(g[deal], stable=True)]
    chosen[idx[order[deal[_rank_in_runs(g[deal]) < slots]]]] = True
    return chosen


class ConstrainedBeamSearch(BeamSearch):
    """Beam search whose outputs must contain each sentence's ``constraints`` (module docstring); the other
    arguments as ``BeamSearch`` takes them."""

    def __init__(self, model: Seq2SeqTransformer, src: torch.Tensor, *, bos: int, eos: int, constraints: Constraints,
                 beam: int = 5, nbest: int = 1, lenpen: float = 0.6, max_len_a: float = 1.5, max_len_b: int = 10,
                 use_cache: bool = True, stop: str = "bound", on_done: OnDone | None = None, min_len_a: float = 0.0,
                 min_len_b: int = 0, forced: Sequence[Sequence[int]] | None = None, no_repeat_ngram: int = 0) -> None:
        if no_repeat_ngram:
            raise ValueError("terminology constraints and blocked n-gram repeats exclude each other: a phrase may "
                             "need an n-gram the output already holds")
        if beam < 2:
            raise ValueError("constrained decoding needs a beam of 2 or more (greedy search takes no constraints)")
        if len(constraints) != src.shape[0]:
            raise ValueError(f"{len(constraints)} constraint lists for {src.shape[0]} sentences")
        super().__init__(model, src, bos=bos, eos=eos, beam=beam, nbest=nbest, lenpen=lenpen, max_len_a=max_len_a,
                         max_len_b=max_len_b, use_cache=use_cache, stop=stop, on_done=on_done, min_len_a=min_len_a,
                         min_len_b=min_len_b, forced=forced)
        vocab = getattr(model, "vocab_size", None)
        trees = [_Tree(phrases, vocab, s) for s, phrases in enumerate(constraints)]
        nodes, count = max([len(t.tok) for t in trees] + [1]), max([len(t.weight) for t in trees] + [1])

        def table(field: str, width: int, fill: int | bool, dtype: torch.dtype) -> torch.Tensor:
            out = torch.full((self.n, width), fill, dtype=dtype)
            for s, tree in enumerate(trees):
                values = getattr(tree, field)
                out[s, : len(values)] = torch.tensor(values, dtype=dtype)
            return out.to(src.device)

        # Per sentence: its nodes [n, N] (token -1 and parent -2 past the last) and phrases [n, P] (weight 0 past).
        self.ntok, self.nparent = table("tok", nodes, -1, torch.long), table("parent", nodes, -2, torch.long)
        self.nphrase, self.ndepth = table("phrase", nodes, 0, torch.long), table("depth", nodes, 0, torch.long)
        self.nends, self.pweight = table("ends", nodes, False, torch.bool), table("weight", count, 0, torch.long)
        self.pvalid = self.pweight > 0
        self.ctotal = self.pweight.sum(1)  # constraint tokens of each sentence (C)
        need = self.n_forced + self.ctotal
        limit = model.max_length - 1 if model.max_length is not None else None
        if limit is not None and bool((need > limit).any()):
            s = int((need > limit).nonzero()[0])
            raise ValueError(f"sentence {s}: its target prefix and constraints take {int(need[s])} tokens, over the "
                             f"model's limit of {limit}")
        self.cap = torch.maximum(self.cap, need)
        self.bound_lp = length_penalty(self.cap.float() + 1, lenpen)
        self.met = torch.zeros((self.n, count), dtype=torch.bool, device=src.device)  # [rows, P]: phrases met
        self.last = torch.full((self.n,), -1, dtype=torch.long, device=src.device)  # [rows]: node inside, or -1

    # -- the constraint state of each row of the batch (``self.width`` rows per alive sentence) -----------------

    def _sentences(self, rows: torch.Tensor) -> torch.Tensor:
        return self.alive[torch.div(rows, self.width, rounding_mode="floor")]

    def complete(self, rows: torch.Tensor) -> torch.Tensor:
        """Whether each row has met every phrase of its sentence."""
        return (self.met[rows] | ~self.pvalid[self._sentences(rows)]).all(1)

    def transition(self, rows: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The state (phrases met ``[N, P]``, node inside or -1 ``[N]``) of row ``rows[i]`` extended with
        ``tokens[i]``."""
        sent = self._sentences(rows)
        met, last = self.met[rows], self.last[rows]
        tok, parent, phrase = self.ntok[sent], self.nparent[sent], self.nphrase[sent]
        hit = tok == tokens[:, None]
        child = hit & (parent == last[:, None]) & (last >= 0)[:, None]
        goes_on = child.any(1)
        start = hit & (parent == -1) & ~met.gather(1, phrase) & ~goes_on[:, None]  # else an abandoned phrase
        begun = start.any(1)
        node = torch.where(goes_on, child.long().argmax(1), torch.where(begun, start.long().argmax(1), -1))
        at = node.clamp(min=0)[:, None]
        done = (node >= 0) & self.nends[sent].gather(1, at).squeeze(1)
        met = met | (done[:, None] & (torch.arange(met.shape[1], device=met.device) == phrase.gather(1, at)))
        return met, torch.where((node >= 0) & ~done, node, -1)

    def progress(self, rows: torch.Tensor, met: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        """Constraint tokens met (the bank) of states ``met``, ``last`` of rows ``rows``: each met phrase's weight,
        and the depth reached in the current one (at most its weight - 1)."""
        sent = self._sentences(rows)
        at = last.clamp(min=0)[:, None]
        weight = self.pweight[sent].gather(1, self.nphrase[sent].gather(1, at)).squeeze(1)
        inside = torch.minimum(self.ndepth[sent].gather(1, at).squeeze(1), weight - 1)
        return (met * self.pweight[sent]).sum(1) + torch.where(last >= 0, inside, 0)

    def allowed(self, rows: torch.Tensor) -> torch.Tensor:
        """``[N, nodes]``: the nodes each row may take next to make progress (the next tokens of its current phrase,
        else the first tokens of each unmet phrase)."""
        sent = self._sentences(rows)
        parent, last = self.nparent[sent], self.last[rows]
        free = (parent == -1) & ~self.met[rows].gather(1, self.nphrase[sent])
        return torch.where((last >= 0)[:, None], parent == last[:, None], free)

    # -- hooks of BeamSearch -----------------------------------------------------------------------------------------

    def mask(self, logp: torch.Tensor, width: int = 1) -> torch.Tensor:
        """The target prefix forced (``Search.mask``), and EOS blocked for rows with a constraint unmet (except at
        the cap, where every row ends)."""
        logp = super().mask(logp, width)
        rows = torch.arange(logp.shape[0], device=logp.device)
        blocked = ~self.complete(rows) & (self.cap[self.alive] > self.step).repeat_interleave(width)
        if blocked.any():
            eos = torch.zeros_like(logp, dtype=torch.bool)
            eos[:, self.eos] = blocked
            logp = logp.masked_fill(eos, float("-inf"))
        return logp

    def choose(self, logp: torch.Tensor) -> tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                                                  tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """As ``BeamSearch.choose``, the sentences with constraints by dynamic beam allocation."""
        ends, cont = super().choose(logp)
        alive, width, beam, device = self.alive, self.width, self.beam, logp.device
        guided = (self.ctotal[alive] > 0).nonzero().squeeze(1)  # alive sentences with constraints
        if guided.numel() == 0:
            return ends, cont
        m, vocab = guided.numel(), logp.shape[-1]
        rows = (guided[:, None] * width + torch.arange(width, device=device)).view(-1)
        step_logp = logp[rows]
        cand = (self.scores[guided][:, :, None] + step_logp.view(m, width, vocab)).view(m, width * vocab)
        pool = torch.zeros_like(cand, dtype=torch.bool)
        pool.scatter_(1, cand.topk(min(2 * beam, width * vocab), dim=-1).indices, True)  # the top 2K
        per_row = pool.view(m * width, vocab)
        per_row.scatter_(1, step_logp.argmax(-1, keepdim=True), True)  # each beam's best extension
        r, j = self.allowed(rows).nonzero(as_tuple=True)
        per_row[r, self.ntok[self._sentences(rows[r]), j]] = True  # each beam with each unmet phrase's next tokens
        pool &= torch.isfinite(cand)
        g, idx = pool.nonzero(as_tuple=True)
        score = cand[g, idx]
        parent, tok = torch.div(idx, vocab, rounding_mode="floor"), idx % vocab
        rows_of = guided[g] * width + parent
        bank = self.progress(rows_of, *self.transition(rows_of, tok))
        is_eos = tok == self.eos
        slots = cont[0].shape[1]
        # Finished: the EOS candidates among the K the allocation picks; then the K continuing, among the others.
        end = (allocate(g, bank, score, torch.ones_like(is_eos), slots) & is_eos).nonzero().squeeze(1)
        end = end[torch.argsort(score[end], descending=True, stable=True)]
        end = end[torch.argsort(g[end], stable=True)]  # by sentence, best first, as BeamSearch sets them aside
        go = allocate(g, bank, score, ~is_eos, slots).nonzero().squeeze(1)
        go = go[torch.argsort(score[go], descending=True, stable=True)]
        go = go[torch.argsort(g[go], stable=True)]
        at = _rank_in_runs(g[go])
        cont_score, cont_beam, cont_tok = (t.clone() for t in cont)
        cont_score[guided] = float("-inf")  # fewer candidates than slots: dead beams (never extended, never ended)
        cont_beam[guided], cont_tok[guided] = 0, self.eos
        cont_score[guided[g[go]], at], cont_beam[guided[g[go]], at], cont_tok[guided[g[go]], at] = \
            score[go], parent[go], tok[go]
        end_rows, end_beam, end_score = ends
        plain = self.ctotal[alive[end_rows]] == 0
        ends = (torch.cat((end_rows[plain], guided[g[end]])), torch.cat((end_beam[plain], parent[end])),
                torch.cat((end_score[plain], score[end])))
        return ends, (cont_score, cont_beam, cont_tok)

    def ended(self, row: int, hyp: Hypothesis) -> Hypothesis:
        """A finished hypothesis, marked when it fails a constraint (it reached the cap)."""
        hyp.constraints_met = bool(self.complete(torch.tensor([row], device=self.met.device))[0])
        return hyp

    def carry(self, rows: torch.Tensor, tokens: torch.Tensor) -> None:
        """The next batch's rows are rows ``rows`` of this one extended with ``tokens``."""
        self.met, self.last = self.transition(rows, tokens)


@torch.no_grad()
def constrained_beam_search(model: Seq2SeqTransformer, src: torch.Tensor, *, bos: int, eos: int,
                            constraints: Constraints, beam: int = 5, nbest: int = 1, **kwargs: object
                            ) -> list[list[Hypothesis]]:
    """src ``[B, S]`` -> for each sentence its ``nbest`` best hypotheses, best first, each containing the sentence's
    ``constraints`` where it could (``Hypothesis.constraints_met``); the other arguments as ``beam_search``'s."""
    search = ConstrainedBeamSearch(model, src, bos=bos, eos=eos, constraints=constraints, beam=beam, nbest=nbest,
                                   **kwargs)  # type: ignore[arg-type]
    search.run()
    return search.nbest_lists
