"""The two engines that translate, side by side: a run's PyTorch model and its CTranslate2 export. Both give
``cfg`` and ``translate(texts, decode)`` -> each text's n-best list (``Translation``), as the server and
inference.py use them."""

from __future__ import annotations

import hashlib
import json
import threading
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Protocol

from models.decoding import length_penalty
from tokenizer import Tokenizer, load_tokenizer
from utils.config import Config, DecodeConfig, load_config
from utils.run.layout import RunDir
from utils.run.load import LoadedRun
from utils.translation.export import MARKER, TABLE_LENGTH
from utils.translation.translate import (
    Guide,
    OnDone,
    Translation,
    Writer,
    encode_guides,
    encode_sources,
    encode_target,
    guide_problem,
    outputs_per_sentence,
    translate,
)


class Engine(Protocol):
    """What translates: a config and ``translate(texts, decode, on_done)`` (n-best lists, best first; ``on_done``
    called for each text as soon as its list is final, so a server can answer it before the rest of the batch),
    which is all ``inference.py`` needs. The server (``utils/serve``) reads the other members: ``TorchEngine`` and
    ``CT2Model`` have them all; another engine (a stand-in) may leave them out, and the server reads their defaults
    (``utils.serve.engine.Served``). A CTranslate2 export also gives ``attention_layers`` and ``cross_attention``."""

    cfg: Config
    #: The PyTorch run it decodes with (an ensemble's ``LoadedEnsemble``); None: a CTranslate2 export.
    run: LoadedRun | None
    #: What reads its sources and names its tokens.
    tokenizer: Tokenizer
    #: Its position limit: tokens of a source or target, eos included (None: none known).
    max_length: int | None
    #: Translates for it in a process of its own (the server's decoding process, ``utils.serve.worker``); None: no
    #: such process.
    decoder: Any
    #: Whether a server hands requests to ``decoder.submit`` (joining its decoding in flight) rather than batches.
    continuous: bool

    def translate(self, texts: list[str], decode: DecodeConfig,
                  on_done: OnDone | None = None) -> list[list[Translation]]: ...

    def problem(self, decode: Any, prefix: bool = False, constraints: bool = False,
                details: bool = False) -> str | None:
        """Why it cannot decode as ``decode`` says, with target prefixes (``prefix``), terminology constraints
        (``constraints``) or token details (``details``), in one line; None if it can."""


class TorchEngine:
    """A run's PyTorch model: ``translate(texts, decode)`` as ``utils.translation.translate.translate`` does."""

    def __init__(self, run: LoadedRun) -> None:
        self.run, self.cfg, self.tokenizer, self.max_length = run, run.cfg, run.tokenizer, run.model.max_length
        #: Translates for it with the same model (the server's decoding process, ``utils.serve.worker``).
        self.decoder: Any = None
        #: Whether requests go to ``decoder.submit`` (iteration-level batching in the decoder) rather than
        #: ``translate``.
        self.continuous = False

    def translate(self, texts: list[str], decode: DecodeConfig, on_done: OnDone | None = None,
                  guides: Sequence[Guide | None] | None = None) -> list[list[Translation]]:
        """``guides``: per text, its target prefix and constraints (``Guide``) or None."""
        if self.decoder is not None:
            if guides is not None:
                raise ValueError("the server's decoding process takes no target prefix or constraints")
            return self.decoder.translate(texts, decode, on_done)
        return translate(self.run.model, self.run.tokenizer, texts, decode, strict=False, on_done=on_done,
                         guides=guides)

    def problem(self, decode: Any, prefix: bool = False, constraints: bool = False,
                details: bool = False) -> str | None:
        """Why it cannot decode as ``decode`` says with target prefixes or constraints (``guide_problem``); every
        mode and details otherwise."""
        return guide_problem(decode, prefix, constraints)


#: Why an export cannot decode as asked (``CT2Model.problem``), one line each.
CT2_CONSTRAINTS = ("terminology constraints (--constraints) need a PyTorch run: CTranslate2 has no constrained "
                   "beam search")
CT2_EPSILON = "epsilon sampling (--epsilon) needs a PyTorch run: CTranslate2 has no epsilon sampling"
CT2_TOP_K_AND_P = ("--top_k with --top_p needs a PyTorch run: CTranslate2 applies top-p to the renormalised top-k "
                   "tokens, not to the whole distribution; give one of them")
CT2_OLD_ATTENTION = ("--format jsonl: this export predates its alignment heads (its attention is one head's); export "
                     "the run again")
#: ``ctranslate2.set_random_seed`` of this value: threads started afterwards seed themselves at random again.
UNSEEDED = 2**32 - 1
_SEEDING = threading.Lock()


@dataclass
class AlignedTranslation(Translation):
    """A ``Translation`` with its ``alignment``: for each output token (EOS included when it ended with one), the
    source position it attended to most (``CT2Model.translate`` with ``details``)."""

    alignment: list[int] = field(default_factory=list)


class CT2Model:
    """An exported model run by ``ctranslate2.Translator``, decoding as ``utils.translation.translate`` does: the same
    tokenizer, the source EOS, a cap of ``a * src_len + b`` tokens per sentence (see ``translate``), the
    same floor ``decode.min_len_a * src_len + decode.min_len_b`` (CTranslate2's ``min_decoding_length``, which
    counts tokens before EOS as ours does), and the K hypotheses of a beam re-ranked with our GNMT length penalty
    (CTranslate2's divides by |Y|^beta). Beam search stops as ``decode.beam_stop=k_finished`` does: after K finished
    hypotheses. CTranslate2 applies that rule only with a non-zero length penalty beta (with 0 it also waits
    for the top beam to finish); the log-probability is recovered as score * |Y|^beta. Two differences stay:
    in the step where the K-th hypothesis ends, CTranslate2 keeps every ending candidate and returns the K
    best by logprob / |Y|^beta (ours keep the first K and rank by GNMT); beta = 0.7 alpha orders lengths of
    5-40 tokens about as GNMT does, so our best is almost always among those K. And hypotheses that reach
    the cap: ours force EOS there, CTranslate2 stops. With ``decode.no_repeat_ngram_size`` CTranslate2 blocks the
    repeating tokens before its softmax, so its beam ranks by scores renormalised over the tokens left; the
    hypotheses it returns are scored again (``score_batch``), so their log-probabilities are the model's.

    The decoding modes, where CTranslate2 has them (``problem`` says why not, in one line, where it has not):

    - a target prefix (``guides``): CTranslate2's ``target_prefix``, kept in the output; the cap is at least its
      length, as ours;
    - sampling (``decode.sample``): ``sampling_temperature``, ``sampling_topk`` and ``sampling_topp`` (top-p on the
      tempered distribution, as ours), ``num_hypotheses`` samples per sentence; no epsilon sampling, and top-k with
      top-p means another distribution there (top-p of the top-k) than ours (both of the whole one): refused.
      CTranslate2 draws from one generator per worker thread, seeded when the thread first draws: with
      ``decode.seed``, each call decodes with a translator of its own, started after ``ctranslate2.set_random_seed``
      of a 32-bit seed made of ``decode.seed`` and the call's texts, so the same seed and texts repeat the samples
      (a sentence's samples depend on the others of its call, unlike ours);
    - MBR (``decode.mbr``): ``utils.translation.mbr.mbr_rank`` over CTranslate2's samples or its beam's N best;
    - scores: where CTranslate2's own are not the model's log-probabilities (a prefix, which it scores 0, and
      samples) or token log-probabilities are asked (``details``), each hypothesis is scored again by teacher
      forcing (``score_batch``: every token's log-probability, EOS included, as ours); ``logprob`` is their float32
      running sum and ``score`` follows from it as ours does. ``details`` also gives each hypothesis's alignment
      (``AlignedTranslation``) from the attention CTranslate2 returns while decoding: the last decoder layer's
      cross-attention, mean over its heads.
    - not ensembles, nor terminology constraints."""

    #: Not a PyTorch run, and it decodes in the server's process (``Engine``).
    run: LoadedRun | None = None
    decoder: Any = None
    continuous = False

    def __init__(self, export_dir: Path | str, device: str = "cpu", compute_type: str = "default",
                 threads: int = 0) -> None:
        """``device``: cpu, cuda, or auto (CTranslate2's choice: its GPU where it has one); ``threads``: CPU
        threads (0: CTranslate2's default)."""
        import ctranslate2

        export_dir = Path(export_dir)
        self.export_dir = export_dir
        self.cfg = load_config(RunDir(export_dir).config)
        self.tokenizer = load_tokenizer(RunDir(export_dir).tokenizer)
        self._options = dict(device=device, compute_type=compute_type, intra_threads=threads)
        self.translator = ctranslate2.Translator(str(export_dir), **self._options)
        self.device: str = self.translator.device  # what "auto" chose: "cpu" or "cuda"
        # Freed when this object goes, or at the latest when the interpreter starts to exit (atexit):
        # a CTranslate2 worker frees each finished job there, and a job holding a Python callback (greedy
        # decoding's ``stop_at_cap``) needs the GIL for that; during finalization Python ends such a thread and
        # the process aborts ("terminate called without an active exception"). Freeing the translator joins its
        # workers while the interpreter still runs.
        weakref.finalize(self, self.__dict__.pop, "translator", None)
        self.vocab = {t: i for i, t in enumerate(self.tokenizer.id_to_token(list(range(self.tokenizer.vocab_size))))}
        # Every export holds a position table (zeros where the model has none): CTranslate2 cannot go past it.
        marker = json.loads((export_dir / MARKER).read_text())
        self.max_length = int(marker.get("positions") or _max_length(self.cfg) or TABLE_LENGTH)
        # The attention CTranslate2 returns: exports before this entry averaged only the first head.
        self.attention_layers: dict[str, list[int]] = marker.get("attention") or {}

    def problem(self, decode: Any, prefix: bool = False, constraints: bool = False,
                details: bool = False) -> str | None:
        """Why this export cannot decode as ``decode`` says, with target prefixes (``prefix``), terminology
        constraints (``constraints``) or token details (``details``: per-token log-probabilities and alignments),
        in one line; None if it can. Sampling with a prefix is refused as for a PyTorch run (``guide_problem``)."""
        if constraints:
            return CT2_CONSTRAINTS
        why = guide_problem(decode, prefix, False)
        if why is not None:
            return why
        if decode.sample and decode.epsilon > 0:
            return CT2_EPSILON
        if decode.sample and 0 < decode.top_k < self.tokenizer.vocab_size and decode.top_p < 1:
            return CT2_TOP_K_AND_P
        if details and not self.attention_layers:
            return CT2_OLD_ATTENTION
        return None

    def translate(self, texts: list[str], decode: Any, on_done: OnDone | None = None,
                  guides: Sequence[Guide | None] | None = None, details: bool = False) -> list[list[Any]]:
        """Best-first hypotheses (``decode.nbest``; sampling: ``decode.num_samples``) for each text, as
        ``translate_ids`` gives; ``on_done`` for each text when the ``translate_batch`` call that holds it returns.
        ``guides``: per text, its target prefix (``Guide``) or None; ``details``: token log-probabilities and
        alignments (``AlignedTranslation``). ValueError, one line (``problem``), for what the export cannot do;
        InputError for a prefix over the position table.

        Each sentence gets exactly its own cap. Greedy: one ``translate_batch`` call for all the texts
        (CTranslate2 sorts them into batches of ``decode.batch_size``) up to the longest cap, a step callback
        stopping each sentence at its own (one call per distinct cap made greedy decoding 1.6x slower). Beam
        and sampling (no callback there): one call per distinct cap; one call for all with the longest cap wastes
        steps on every beam still open past its own cap and then has to decode those again (1.7x slower on TED
        for a model whose beams often run to the cap). A length floor (``decode.min_len_a``, ``min_len_b``) is
        CTranslate2's ``min_decoding_length``, one per call: the sentences are grouped by their floor too, so each
        gets exactly its own (with no floor, the default, one group as without)."""
        if guides is not None and len(guides) != len(texts):
            raise ValueError(f"{len(guides)} guides for {len(texts)} sentences")
        constrained = any(g is not None and g.constraints for g in guides or ())
        prefixed = any(g is not None and g.prefix.strip() for g in guides or ())
        why = self.problem(decode, prefixed, constrained, details)
        if why is not None:
            raise ValueError(why)
        ids = encode_sources(self.tokenizer, texts, self.max_length, strict=False)
        prefixes = [g.prefix for g in encode_guides(self.tokenizer, guides, self.max_length)] if prefixed else None
        results: list[list[Any]] = [[Translation("", 0.0, 0.0, [])] for _ in ids]
        if on_done is not None:
            for i in (i for i, seq in enumerate(ids) if not seq):
                on_done(i, results[i])
        caps = {i: min(max(1, int(decode.max_len_a * (len(seq) - 1) + decode.max_len_b)), self.max_length - 1)
                for i, seq in enumerate(ids) if seq}
        floors = {i: min(int(decode.min_len_a * (len(ids[i]) - 1) + decode.min_len_b), cap) for i, cap in caps.items()}
        if prefixes is not None:  # as ours: the cap is at least the prefix's length (the floor is not raised)
            caps = {i: max(cap, len(prefixes[i])) for i, cap in caps.items()}
        callback = decode.beam == 1 and not decode.sample
        groups: dict[tuple[int, int], list[int]] = {}
        for i, cap in caps.items():
            groups.setdefault((0 if callback else cap, floors[i]), []).append(i)
        # CTranslate2 blocks repeated n-grams before its softmax (its scores renormalised over the tokens left):
        # the model's own log-probabilities come from scoring the hypotheses again, as ours are
        exact = details or decode.sample or prefixes is not None or bool(decode.no_repeat_ngram_size)
        with self._seeded(decode, texts) as translator:
            for (cap, floor), rows in groups.items():
                top = cap or max(caps[i] for i in rows)
                decoded = self._decode(ids, rows, top, decode, caps, floor, translator=translator,
                                       prefixes=prefixes, attention=details)
                scored = self._score([ids[i] for i in rows], decoded, decode.batch_size) if exact else None
                for k, (i, res) in enumerate(zip(rows, decoded, strict=True)):
                    results[i] = self._hypotheses(res, decode, None if scored is None else scored[k], details)
                    if on_done is not None:
                        on_done(i, results[i])
        return results

    def cross_attention(self, text: str, target: str | None, decode: Any) -> tuple[list[int], list[int], str, Any]:
        """The last decoder layer's cross-attention, mean over heads, for one sentence: -> (source ids with eos,
        target ids, target text, weights ``[len(target) + 1, len(source)]``); row i is the step predicting target
        token i (the last row predicts eos), as ``utils.figures.maps.attention_from_ids`` gives for our model.

        The target is ``target`` (teacher forcing) or this export's greedy translation (``decode`` with beam 1).
        CTranslate2 gives it for the decoded tokens (``return_attention``, the export's alignment heads), so the
        target is forced as a prefix and one more step decoded for the eos row. ``InputError`` if empty or over
        the position table."""
        import numpy as np

        src = encode_sources(self.tokenizer, [text], self.max_length, strict=True)[0]
        if target is None:
            hyp = self.translate([text], decode.model_copy(update=dict(beam=1, nbest=1)))[0][0]
            tgt, target = list(hyp.tokens), hyp.text
        else:
            tgt = encode_target(self.tokenizer, target, self.max_length)
        res = self.translator.translate_batch(
            [self.tokenizer.id_to_token(src)], target_prefix=[self.tokenizer.id_to_token(tgt)], beam_size=1,
            max_decoding_length=len(tgt) + 1, min_decoding_length=0, return_attention=True, return_end_token=True,
            max_input_length=0)[0]
        weights = np.asarray(res.attention[0], dtype=np.float32)[: len(tgt) + 1]
        if weights.shape != (len(tgt) + 1, len(src)):
            raise RuntimeError(f"CTranslate2 returned attention of shape {weights.shape} for {len(tgt) + 1} target "
                               f"steps over {len(src)} source tokens")
        return src, tgt, target, weights

    def _decode(self, ids: list[list[int]], rows: list[int], cap: int, decode: Any, caps: dict[int, int],
                floor: int = 0, translator: Any = None, prefixes: list[tuple[int, ...]] | None = None,
                attention: bool = False) -> list[Any]:
        """``translate_batch`` on the sources ``ids[rows]`` up to ``cap`` tokens (greedy: each to its own cap), EOS
        blocked before ``floor`` tokens; ``prefixes``: each source's target prefix (ids); ``attention``: with the
        attention of every hypothesis. Sampling: ``decode.mbr`` or ``decode.num_samples`` samples per source."""

        def stop_at_cap(step: Any) -> bool:  # greedy only: CTranslate2 calls it for each token of beam size 1
            return step.step + 1 >= caps[rows[step.batch_id]]

        translator = translator or self.translator
        options: dict[str, Any] = dict(beam_size=decode.beam, num_hypotheses=decode.beam)
        top_k = decode.top_k if 0 < decode.top_k < self.tokenizer.vocab_size else 0  # 0: the whole vocabulary
        copies = 1
        if decode.sample:
            copies = decode.mbr or decode.num_samples
            # top-k 1 is the argmax (CTranslate2 then returns one hypothesis): each sample is that one
            options = dict(beam_size=1, num_hypotheses=1 if top_k == 1 else copies, sampling_topk=top_k,
                           sampling_topp=decode.top_p, sampling_temperature=decode.temperature)
        target_prefix = None
        if prefixes is not None:
            target_prefix = [self.tokenizer.id_to_token(list(prefixes[i])) for i in rows]
        results = translator.translate_batch(
            [self.tokenizer.id_to_token(ids[i]) for i in rows], target_prefix=target_prefix, **options,
            length_penalty=ctranslate2_penalty(decode.lenpen), max_decoding_length=cap, min_decoding_length=floor,
            no_repeat_ngram_size=decode.no_repeat_ngram_size,
            return_scores=True, return_end_token=True, return_attention=attention,
            max_input_length=0,  # sources are already cut to the position table, as ours are to max_length
            max_batch_size=decode.batch_size,
            callback=stop_at_cap if decode.beam == 1 and not decode.sample else None)
        if decode.sample and top_k == 1 and copies > 1:
            results = [SimpleNamespace(hypotheses=r.hypotheses * copies, scores=r.scores * copies,
                                       attention=r.attention * copies) for r in results]
        return results

    def _score(self, sources: list[list[int]], results: list[Any], batch_size: int) -> list[list[list[float]]]:
        """Each hypothesis of ``results`` (one per source) scored by teacher forcing (``score_batch``): the
        log-probability of each of its tokens, then of EOS (CTranslate2 appends it)."""
        pairs = [(self.tokenizer.id_to_token(src), tokens[:-1] if tokens and self.vocab[tokens[-1]] ==
                  self.tokenizer.eos_id else tokens) for src, res in zip(sources, results, strict=True)
                 for tokens in res.hypotheses]
        scored = iter(self.translator.score_batch([p[0] for p in pairs], [p[1] for p in pairs],
                                                  max_batch_size=batch_size, max_input_length=0))
        return [[list(next(scored).log_probs) for _ in res.hypotheses] for res in results]

    def _hypotheses(self, res: Any, decode: Any, scored: list[list[float]] | None = None,
                    details: bool = False) -> list[Any]:
        """CTranslate2's hypotheses as ``Translation``s, best first: beam by our GNMT penalty (the ``decode.nbest``
        best), samples by logprob / GNMT penalty as ours (all of them), MBR by expected utility (``decode.nbest``
        of the ``decode.mbr`` best). ``scored``: each hypothesis's token log-probabilities, EOS last (``_score``),
        which then give ``logprob`` (their float32 running sum); without, it is recovered from CTranslate2's
        score. ``details``: with each token's most attended source position (``AlignedTranslation``)."""
        beta = ctranslate2_penalty(decode.lenpen)
        hyps = []
        for k, (tokens, normalized) in enumerate(zip(res.hypotheses, res.scores, strict=True)):
            hyp_ids = [self.vocab[t] for t in tokens]
            ended = bool(hyp_ids) and hyp_ids[-1] == self.tokenizer.eos_id
            if ended:
                hyp_ids = hyp_ids[:-1]
            token_logprobs: list[float] = []
            if scored is None:
                logprob = normalized * max(len(tokens), 1) ** beta  # |Y| counts the returned EOS
            else:
                token_logprobs = scored[k] if ended else scored[k][:-1]  # EOS scored only where it was output
                logprob = float32_sum(token_logprobs)
            ranked = decode.beam > 1 or decode.sample
            score = logprob / length_penalty(len(hyp_ids) + 1, decode.lenpen) if ranked else logprob
            hyp = Translation(self.tokenizer.decode(hyp_ids), score, logprob, hyp_ids, token_logprobs)
            if details:
                import numpy as np

                weights = np.asarray(res.attention[k], dtype=np.float32)  # [tokens, source], EOS rows included
                hyp = AlignedTranslation(**vars(hyp), alignment=weights.argmax(axis=-1).tolist() if tokens else [])
            hyps.append(hyp)
        hyps.sort(key=lambda h: h.score, reverse=True)
        if decode.mbr:
            from utils.translation.mbr import mbr_rank  # sacreBLEU: only under MBR

            return mbr_rank(hyps[: decode.mbr], decode.mbr_utility)[: decode.nbest]
        return hyps[: outputs_per_sentence(decode)]

    @contextmanager
    def _seeded(self, decode: Any, texts: Sequence[str]) -> Iterator[Any]:
        """The translator to decode ``texts`` with: this one, or when sampling with ``decode.seed`` a fresh one whose
        worker thread draws from a generator seeded by ``seed_for(decode.seed, texts)`` (CTranslate2 seeds each
        thread's generator once, when it first draws), freed after; the global seed is reset for later threads."""
        if not decode.sample or decode.seed is None:
            yield self.translator
            return
        import ctranslate2

        with _SEEDING:
            ctranslate2.set_random_seed(seed_for(decode.seed, texts))
            translator = ctranslate2.Translator(str(self.export_dir), **self._options)
            try:
                yield translator
            finally:
                ctranslate2.set_random_seed(UNSEEDED)
                del translator


def ct2_jsonl_writer(engine: CT2Model) -> Writer:
    """``utils.translation.jsonl.jsonl_writer`` for an export's translations (``CT2Model.translate`` with
    ``details``): the same records, each alignment the one decoding returned."""
    from utils.translation.jsonl import hypothesis_record, jsonl_line

    tokenizer = engine.tokenizer

    def write(first: int, texts: list[str], results: list[list[Translation]], decode: DecodeConfig) -> list[str]:
        sources = encode_sources(tokenizer, texts, engine.max_length, strict=False)
        several = outputs_per_sentence(decode) > 1
        lines = []
        for i, (src, nbest) in enumerate(zip(sources, results, strict=True)):
            hyps = [hypothesis_record(tokenizer, hyp, getattr(hyp, "alignment", [])) for hyp in nbest]
            lines.append(jsonl_line(tokenizer, first + i, src, hyps, several))
        return lines

    return write


def seed_for(seed: int, texts: Sequence[str]) -> int:
    """CTranslate2's 32-bit seed (never ``UNSEEDED``) for sampling ``texts`` with our ``seed``: a hash of both, so
    that another input (another chunk of a file) draws other numbers."""
    digest = hashlib.sha256(json.dumps([seed, list(texts)], ensure_ascii=False).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % UNSEEDED


def float32_sum(values: Sequence[float]) -> float:
    """The float32 running sum of ``values``, as a search adds its tokens' log-probabilities."""
    import numpy as np

    return float(np.cumsum(np.asarray(values, dtype=np.float32))[-1]) if len(values) else 0.0


def ctranslate2_penalty(alpha: float) -> float:
    """CTranslate2's length penalty beta (score = logprob / |Y|^beta) for our GNMT alpha: never 0, so that
    beam search stops after K finished hypotheses; 0.7 alpha ranks 5-40-token hypotheses about as GNMT does."""
    beta = 0.7 * alpha
    return beta if abs(beta) >= 1e-3 else 1e-3


def _max_length(cfg: Config) -> int | None:
    """The model's position limit, as ``Seq2SeqTransformer.max_length`` gives it, without building the model."""
    from models.positional import build_input_pe, position_limit

    return position_limit(build_input_pe(cfg.model, "encoder"), build_input_pe(cfg.model, "decoder"))
