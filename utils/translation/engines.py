"""The two engines that translate, side by side: a run's PyTorch model and its CTranslate2 export. Both give
``cfg`` and ``translate(texts, decode)`` -> each text's n-best list (``Translation``), as the server and
inference.py use them."""

from __future__ import annotations

import json
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from models.decoding import length_penalty
from tokenizer import load_tokenizer
from utils.config import Config, DecodeConfig, load_config
from utils.run.layout import RunDir
from utils.run.load import LoadedRun
from utils.translation.export import MARKER, TABLE_LENGTH
from utils.translation.translate import Guide, OnDone, Translation, encode_sources, encode_target, translate


class Engine(Protocol):
    """What translates: a config and ``translate(texts, decode, on_done)`` (n-best lists, best first; ``on_done``
    called for each text as soon as its list is final, so a server can answer it before the rest of the batch)."""

    cfg: Config

    def translate(self, texts: list[str], decode: DecodeConfig,
                  on_done: OnDone | None = None) -> list[list[Translation]]: ...


class TorchEngine:
    """A run's PyTorch model: ``translate(texts, decode)`` as ``utils.translation.translate.translate`` does."""

    def __init__(self, run: LoadedRun) -> None:
        self.run, self.cfg = run, run.cfg
        #: Translates for it with the same model (the server's decoding process, ``utils.serve.worker``).
        self.decoder: Any = None
        #: Whether requests go to ``submit`` (iteration-level batching in the decoder) rather than ``translate``.
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

    def submit(self, texts: list[str], decode: DecodeConfig, on_done: OnDone,
               on_error: Callable[[BaseException], None]) -> None:
        """Continuous batching: ``texts`` join the decoder's decoding in flight; results come to the callbacks."""
        self.decoder.submit(texts, decode, on_done, on_error)

    @property
    def stats(self) -> tuple[int, int, int]:
        """The decoder's (batches started, decoder steps, sentence-steps)."""
        return self.decoder.stats


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
    the cap: ours force EOS there, CTranslate2 stops."""

    def __init__(self, export_dir: Path | str, device: str = "cpu", compute_type: str = "default",
                 threads: int = 0) -> None:
        import ctranslate2

        export_dir = Path(export_dir)
        self.cfg = load_config(RunDir(export_dir).config)
        self.tokenizer = load_tokenizer(RunDir(export_dir).tokenizer)
        self.translator = ctranslate2.Translator(str(export_dir), device=device, compute_type=compute_type,
                                                 intra_threads=threads)
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

    def translate(self, texts: list[str], decode: Any, on_done: OnDone | None = None) -> list[list[Any]]:
        """Best-first hypotheses (``decode.nbest``) for each text, as ``translate_ids`` gives; ``on_done`` for each
        text when the ``translate_batch`` call that holds it returns.

        Each sentence gets exactly its own cap. Greedy: one ``translate_batch`` call for all the texts
        (CTranslate2 sorts them into batches of ``decode.batch_size``) up to the longest cap, a step callback
        stopping each sentence at its own (one call per distinct cap made greedy decoding 1.6x slower). Beam
        (no callback there): one call per distinct cap; one call for all with the longest cap wastes steps
        on every beam still open past its own cap and then has to decode those again (1.7x slower on TED
        for a model whose beams often run to the cap). A length floor (``decode.min_len_a``, ``min_len_b``) is
        CTranslate2's ``min_decoding_length``, one per call: the sentences are grouped by their floor too, so each
        gets exactly its own (with no floor, the default, one group as without)."""
        ids = encode_sources(self.tokenizer, texts, self.max_length, strict=False)
        results: list[list[Any]] = [[Translation("", 0.0, 0.0, [])] for _ in ids]
        if on_done is not None:
            for i in (i for i, seq in enumerate(ids) if not seq):
                on_done(i, results[i])
        caps = {i: min(max(1, int(decode.max_len_a * (len(seq) - 1) + decode.max_len_b)), self.max_length - 1)
                for i, seq in enumerate(ids) if seq}
        floors = {i: min(int(decode.min_len_a * (len(ids[i]) - 1) + decode.min_len_b), cap) for i, cap in caps.items()}
        groups: dict[tuple[int, int], list[int]] = {}
        for i, cap in caps.items():
            groups.setdefault((cap if decode.beam > 1 else 0, floors[i]), []).append(i)
        for (cap, floor), rows in groups.items():
            top = cap or max(caps[i] for i in rows)
            for i, res in zip(rows, self._decode(ids, rows, top, decode, caps, floor), strict=True):
                results[i] = self._hypotheses(res, decode)
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
                floor: int = 0) -> list[Any]:
        """``translate_batch`` on the sources ``ids[rows]`` up to ``cap`` tokens (greedy: each to its own cap), EOS
        blocked before ``floor`` tokens."""

        def stop_at_cap(step: Any) -> bool:  # greedy only: CTranslate2 calls it for each token of beam size 1
            return step.step + 1 >= caps[rows[step.batch_id]]

        return self.translator.translate_batch(
            [self.tokenizer.id_to_token(ids[i]) for i in rows], beam_size=decode.beam, num_hypotheses=decode.beam,
            length_penalty=ctranslate2_penalty(decode.lenpen), max_decoding_length=cap, min_decoding_length=floor,
            return_scores=True, return_end_token=True,
            max_input_length=0,  # sources are already cut to the position table, as ours are to max_length
            max_batch_size=decode.batch_size, callback=stop_at_cap if decode.beam == 1 else None)

    def _hypotheses(self, res: Any, decode: Any) -> list[Any]:
        """CTranslate2's K hypotheses re-ranked with our GNMT penalty, the ``decode.nbest`` best."""
        beta = ctranslate2_penalty(decode.lenpen)
        hyps = []
        for tokens, normalized in zip(res.hypotheses, res.scores, strict=True):
            logprob = normalized * max(len(tokens), 1) ** beta  # |Y| counts the returned EOS
            hyp_ids = [self.vocab[t] for t in tokens]
            if hyp_ids and hyp_ids[-1] == self.tokenizer.eos_id:
                hyp_ids = hyp_ids[:-1]
            score = logprob / length_penalty(len(hyp_ids) + 1, decode.lenpen) if decode.beam > 1 else logprob
            hyps.append(Translation(self.tokenizer.decode(hyp_ids), score, logprob, hyp_ids))
        hyps.sort(key=lambda h: h.score, reverse=True)
        return hyps[: decode.nbest]


def ctranslate2_penalty(alpha: float) -> float:
    """CTranslate2's length penalty beta (score = logprob / |Y|^beta) for our GNMT alpha: never 0, so that
    beam search stops after K finished hypotheses; 0.7 alpha ranks 5-40-token hypotheses about as GNMT does."""
    beta = 0.7 * alpha
    return beta if abs(beta) >= 1e-3 else 1e-3


def _max_length(cfg: Config) -> int | None:
    """The model's position limit, as ``Seq2SeqTransformer.max_length`` gives it, without building the model."""
    from models.positional import build_input_pe, position_limit

    return position_limit(build_input_pe(cfg.model, "encoder"), build_input_pe(cfg.model, "decoder"))
