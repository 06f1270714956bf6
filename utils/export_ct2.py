"""Export a trained run to CTranslate2 (Klein et al. 2020, https://opennmt.net/CTranslate2), and translate with it.

The model is described with ``ctranslate2.specs`` (a ``TransformerSpec`` whose weights are ours), saved
with the run's tokenizer and resolved config, so text is tokenized and detokenized exactly as the run
does. Every input-level encoding exports as an explicit position table (learnable_ln and binary folded into
the token tables); RoPE (rotate-half layout; linear and NTK scaling), ALiBi (decoder: native; encoder: a
relative-bias table with one exact bucket per distance), Shaw (keys, and values when used) and T5 (one
table per layer) as CTranslate2's own relative schemes. Each encoding class says how (``ct2_token_weight``,
``ct2_stack``, ``ct2_fill``) or why not (``ct2_refusal``); this module only assembles the spec.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from models.transformer import Seq2SeqTransformer
from utils.config import Config, ConfigError

MARKER = "fr2en_ctranslate2.json"  # written into an export: what it is and how it was made
TABLE_LENGTH = 2048  # positions written for an unbounded input encoding


class ExportError(ConfigError):
    """A model CTranslate2 cannot represent exactly, as one line naming why."""


def check_exportable(cfg: Config) -> None:
    """ExportError, one line, for what CTranslate2 cannot compute exactly (each encoding says, ``ct2_refusal``)."""
    from models.positional import REGISTRY

    m = cfg.model
    reasons = [REGISTRY["input"][m.input_pe].ct2_refusal(cfg)]
    for key in ("model.cross_attention_pe", "model.attention_pe"):
        cls = REGISTRY["attention"][getattr(m, key.split(".")[1])]
        reasons.append(None if cls is None else cls.ct2_refusal(cfg, key))
    reason = next((r for r in reasons if r is not None), None)
    if reason is not None:
        raise ExportError(reason)


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().cpu().numpy()


def _linear(spec: Any, layer: torch.nn.Linear) -> None:
    spec.weight = _np(layer.weight)
    spec.bias = _np(layer.bias) if layer.bias is not None else np.zeros(layer.weight.shape[0], np.float32)


def _norm(spec: Any, norm: torch.nn.LayerNorm) -> None:
    spec.gamma = _np(norm.weight)
    spec.beta = _np(norm.bias)


def input_table(model: Seq2SeqTransformer, side: str, length: int) -> np.ndarray:
    """The additive position table ``[length, D]`` of one side's input encoding (zeros for ``none``)."""
    pe = model.src_pe if side == "src" else model.tgt_pe
    x = torch.zeros(1, length, model.cfg.d_model)
    with torch.no_grad():
        return _np(pe(x, torch.arange(length))[0])


def build_spec(model: Seq2SeqTransformer, cfg: Config, tokens: list[str], specials: dict[str, str]) -> Any:
    """A ``ctranslate2.specs.TransformerSpec`` holding ``model``'s weights, every encoding mapped exactly."""
    from ctranslate2.specs import common_spec, transformer_spec

    from models.positional import REGISTRY

    m = cfg.model
    check_exportable(cfg)
    pre = m.norm == "pre"
    act = common_spec.Activation.GELU if m.activation == "gelu" else common_spec.Activation.RELU
    length = model.max_length or TABLE_LENGTH
    attention = REGISTRY["attention"][m.attention_pe]
    enc_kw: dict[str, Any] = {} if attention is None else attention.ct2_stack(m, "encoder")
    dec_kw: dict[str, Any] = {} if attention is None else attention.ct2_stack(m, "decoder")
    enc = transformer_spec.TransformerEncoderSpec(m.encoder_layers, m.n_heads, pre_norm=pre, activation=act, **enc_kw)
    dec = transformer_spec.TransformerDecoderSpec(m.decoder_layers, m.n_heads, pre_norm=pre, activation=act, **dec_kw)
    scale = model.embed_scale
    for side, stack, embed in (("src", enc, model.src_embed), ("tgt", dec, model.tgt_embed)):
        table = stack.embeddings[0] if side == "src" else stack.embeddings
        pe = model.src_pe if side == "src" else model.tgt_pe
        table.weight = _np(pe.ct2_token_weight(embed.weight.detach().float(), scale))
        stack.scale_embeddings = bool(m.scale_embeddings)
        if hasattr(stack, "position_encodings"):  # always explicit: with none, CTranslate2 adds its own sinusoid
            stack.position_encodings.encodings = input_table(model, side, length)
    if pre:
        _norm(enc.layer_norm, model.encoder_norm)
        _norm(dec.layer_norm, model.decoder_norm)
    for ours, theirs in zip(model.encoder, enc.layer, strict=True):
        if ours.self_attn.pe is not None:
            ours.self_attn.pe.ct2_fill(theirs.self_attention, length)
        _norm(theirs.self_attention.layer_norm, ours.res1.norm)
        _linear(theirs.self_attention.linear[0], ours.self_attn.qkv_proj)
        _linear(theirs.self_attention.linear[1], ours.self_attn.out_proj)
        _norm(theirs.ffn.layer_norm, ours.res2.norm)
        _linear(theirs.ffn.linear_0, ours.ff.fc1)
        _linear(theirs.ffn.linear_1, ours.ff.fc2)
    for ours, theirs in zip(model.decoder, dec.layer, strict=True):
        if ours.self_attn.pe is not None:
            ours.self_attn.pe.ct2_fill(theirs.self_attention, length)
        _norm(theirs.self_attention.layer_norm, ours.res1.norm)
        _linear(theirs.self_attention.linear[0], ours.self_attn.qkv_proj)
        _linear(theirs.self_attention.linear[1], ours.self_attn.out_proj)
        _norm(theirs.attention.layer_norm, ours.res2.norm)
        _linear(theirs.attention.linear[0], ours.cross_attn.q_proj)
        _linear(theirs.attention.linear[1], ours.cross_attn.kv_proj)
        _linear(theirs.attention.linear[2], ours.cross_attn.out_proj)
        _norm(theirs.ffn.layer_norm, ours.res3.norm)
        _linear(theirs.ffn.linear_0, ours.ff.fc1)
        _linear(theirs.ffn.linear_1, ours.ff.fc2)
    out = model.output.weight if model.output is not None else model.tgt_embed.weight
    dec.projection.weight = _np(out)
    dec.projection.bias = np.zeros(out.shape[0], np.float32)
    spec = transformer_spec.TransformerSpec(enc, dec)
    spec.register_source_vocabulary(tokens)
    spec.register_target_vocabulary(tokens)
    for key, value in specials.items():
        setattr(spec.config, key, value)
    return spec


def export(run_dir: Path, checkpoint: Path, model: Seq2SeqTransformer, cfg: Config, tokenizer: Any,
           out_dir: Path, quantization: str | None = None) -> Path:
    """Write a CTranslate2 model directory: model.bin + vocabularies, the run's tokenizer/ and config.yaml."""
    from utils.io import PathError, ensure_dir
    from utils.rundir import RunDir

    tokens = tokenizer.id_to_token(list(range(tokenizer.vocab_size)))
    specials = {"bos_token": tokens[tokenizer.bos_id], "eos_token": tokens[tokenizer.eos_id],
                "unk_token": tokens[tokenizer.unk_id], "decoder_start_token": tokens[tokenizer.bos_id]}
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise PathError(f"--export-ctranslate2 {out_dir} exists and is not a folder")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not is_export(out_dir):
        raise PathError(f"--export-ctranslate2 {out_dir} is a folder that holds something other than an export; "
                        "give a new or empty folder")
    spec = build_spec(model.cpu().eval(), cfg, tokens, specials)
    spec.validate()
    spec.optimize(quantization=quantization)
    # Written whole next to its place, then renamed there: a crash never leaves a half export behind a marker.
    ensure_dir(out_dir.parent, "--export-ctranslate2")
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=out_dir.parent))
    try:
        spec.save(str(tmp))
        shutil.copytree(RunDir(run_dir).tokenizer, RunDir(tmp).tokenizer)
        shutil.copy(RunDir(run_dir).config, RunDir(tmp).config)
        (tmp / MARKER).write_text(json.dumps({"run": str(run_dir), "checkpoint": str(checkpoint),
                                              "quantization": quantization,
                                              "positions": model.max_length or TABLE_LENGTH}, indent=1) + "\n")
        old = None
        if out_dir.exists():  # an earlier export (or an empty folder) is replaced
            old = out_dir.with_name(tmp.name + ".old")
            out_dir.rename(old)
        tmp.rename(out_dir)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


# ---------------------------------------------------------------------------------------------- translating


def is_export(path: Path | str) -> bool:
    """True for a directory written by ``export``."""
    return (Path(path) / MARKER).is_file()


class CT2Model:
    """An exported model run by ``ctranslate2.Translator``, decoding as ``utils.translate`` does: the same
    tokenizer, the source EOS, a cap of ``a * src_len + b`` tokens per sentence (see ``translate``),
    no minimum length, and the K hypotheses of a beam re-ranked with our GNMT length penalty (CTranslate2's
    divides by |Y|^beta). Beam search stops as ``decode.beam_stop=k_finished`` does: after K finished
    hypotheses. CTranslate2 applies that rule only with a non-zero length penalty beta (with 0 it also waits
    for the top beam to finish); the log-probability is recovered as score * |Y|^beta. Two differences stay:
    in the step where the K-th hypothesis ends, CTranslate2 keeps every ending candidate and returns the K
    best by logprob / |Y|^beta (ours keep the first K and rank by GNMT); beta = 0.7 alpha orders lengths of
    5-40 tokens about as GNMT does, so our best is almost always among those K. And hypotheses that reach
    the cap: ours force EOS there, CTranslate2 stops."""

    def __init__(self, export_dir: Path | str, device: str = "cpu", compute_type: str = "default",
                 threads: int = 0) -> None:
        import ctranslate2

        from tokenizer import load_tokenizer
        from utils.config import load_config
        from utils.rundir import RunDir

        export_dir = Path(export_dir)
        self.cfg = load_config(RunDir(export_dir).config)
        self.tokenizer = load_tokenizer(RunDir(export_dir).tokenizer)
        self.translator = ctranslate2.Translator(str(export_dir), device=device, compute_type=compute_type,
                                                 intra_threads=threads)
        self.vocab = {t: i for i, t in enumerate(self.tokenizer.id_to_token(list(range(self.tokenizer.vocab_size))))}
        # Every export holds a position table (zeros where the model has none): CTranslate2 cannot go past it.
        marker = json.loads((export_dir / MARKER).read_text())
        self.max_length = int(marker.get("positions") or _max_length(self.cfg) or TABLE_LENGTH)

    def translate(self, texts: list[str], decode: Any) -> list[list[Any]]:
        """Best-first hypotheses (``decode.nbest``) for each text, as ``utils.translate.translate_ids`` gives.

        Each sentence gets exactly its own cap. Greedy: one ``translate_batch`` call for all the texts
        (CTranslate2 sorts them into batches of ``decode.batch_size``) up to the longest cap, a step callback
        stopping each sentence at its own (one call per distinct cap made greedy decoding 1.6x slower). Beam
        (no callback there): one call per distinct cap; one call for all with the longest cap wastes steps
        on every beam still open past its own cap and then has to decode those again (1.7x slower on TED
        for a model whose beams often run to the cap)."""
        from utils.translate import Translation, encode_sources

        ids = encode_sources(self.tokenizer, texts, self.max_length, strict=False)
        results: list[list[Any]] = [[Translation("", 0.0, 0.0, [])] for _ in ids]
        caps = {i: min(max(1, int(decode.max_len_a * (len(seq) - 1) + decode.max_len_b)), self.max_length - 1)
                for i, seq in enumerate(ids) if seq}
        groups: dict[int, list[int]] = {}
        for i, cap in caps.items():
            groups.setdefault(cap if decode.beam > 1 else 0, []).append(i)
        for cap, rows in groups.items():
            top = cap or max(caps[i] for i in rows)
            for i, res in zip(rows, self._decode(ids, rows, top, decode, caps), strict=True):
                results[i] = self._hypotheses(res, decode)
        return results

    def _decode(self, ids: list[list[int]], rows: list[int], cap: int, decode: Any, caps: dict[int, int]) -> list[Any]:
        """``translate_batch`` on the sources ``ids[rows]`` up to ``cap`` tokens (greedy: each to its own cap)."""

        def stop_at_cap(step: Any) -> bool:  # greedy only: CTranslate2 calls it for each token of beam size 1
            return step.step + 1 >= caps[rows[step.batch_id]]

        return self.translator.translate_batch(
            [self.tokenizer.id_to_token(ids[i]) for i in rows], beam_size=decode.beam, num_hypotheses=decode.beam,
            length_penalty=ctranslate2_penalty(decode.lenpen), max_decoding_length=cap, min_decoding_length=0,
            return_scores=True, return_end_token=True,
            max_input_length=0,  # sources are already cut to the position table, as ours are to max_length
            max_batch_size=decode.batch_size, callback=stop_at_cap if decode.beam == 1 else None)

    def _hypotheses(self, res: Any, decode: Any) -> list[Any]:
        """CTranslate2's K hypotheses re-ranked with our GNMT penalty, the ``decode.nbest`` best."""
        from models.decoding import length_penalty
        from utils.translate import Translation

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
    from models.positional import build_input_pe

    return build_input_pe(cfg.model).max_length
