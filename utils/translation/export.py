"""Export a trained run to CTranslate2 (Klein et al. 2020, https://opennmt.net/CTranslate2); ``engines`` runs it.

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
    reasons = [REGISTRY["input"][m.pe(stack, "input")].ct2_refusal(cfg) for stack in ("encoder", "decoder")]
    places = [("model.cross_attention_pe", m.cross_attention_pe, "cross"),
              *((m.pe_key(stack, "attention"), m.pe(stack, "attention"), stack) for stack in ("encoder", "decoder"))]
    for key, name, kind in places:
        cls = REGISTRY["attention"][name]
        reasons.append(None if cls is None else cls.ct2_refusal(cfg, key, kind))
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


def _self_attention(theirs: Any, ours: Any, length: int) -> None:
    """One layer's self-attention: its relative encoding (if any), pre-norm, fused QKV and output projections."""
    if ours.self_attn.pe is not None:
        ours.self_attn.pe.ct2_fill(theirs.self_attention, length)
    _norm(theirs.self_attention.layer_norm, ours.res1.norm)
    _linear(theirs.self_attention.linear[0], ours.self_attn.qkv_proj)
    _linear(theirs.self_attention.linear[1], ours.self_attn.out_proj)


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
    kw: dict[str, dict[str, Any]] = {}
    for stack in ("encoder", "decoder"):
        attention = REGISTRY["attention"][m.pe(stack, "attention")]
        kw[stack] = {} if attention is None else attention.ct2_stack(m, stack)
    enc_kw, dec_kw = kw["encoder"], kw["decoder"]
    enc = transformer_spec.TransformerEncoderSpec(m.encoder_layers, m.n_heads, pre_norm=pre, activation=act, **enc_kw)
    # CTranslate2 returns the cross-attention of one layer averaged over its first `alignment_heads` heads: the
    # last layer, every head, is the head mean that visualize.py and the server draw (``CT2Model.cross_attention``).
    dec = transformer_spec.TransformerDecoderSpec(m.decoder_layers, m.n_heads, pre_norm=pre, activation=act,
                                                  alignment_layer=-1, alignment_heads=m.n_heads, **dec_kw)
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
        _self_attention(theirs, ours, length)
        _norm(theirs.ffn.layer_norm, ours.res2.norm)
        _linear(theirs.ffn.linear_0, ours.ff.fc1)
        _linear(theirs.ffn.linear_1, ours.ff.fc2)
    for ours, theirs in zip(model.decoder, dec.layer, strict=True):
        _self_attention(theirs, ours, length)
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
    from utils.run.layout import RunDir

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
                                              "positions": model.max_length or TABLE_LENGTH,
                                              "attention": {"cross": [cfg.model.decoder_layers - 1]}},
                                             indent=1) + "\n")
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
