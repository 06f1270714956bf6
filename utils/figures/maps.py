"""What each positional encoding does, as figures: attention maps of one sentence pair, and the encodings themselves.

Used by ``visualize.py`` (PNG files + TensorBoard images) and by the trainer (TensorBoard images).
Tags (PNG names replace '/' with '_'):

- ``attention/{encoder,decoder,cross}/layer_<i>``: every head of every layer, plus the head average.
- ``position/input/{heatmap,cosine}`` for a fixed input table; ``position/input/{encoder,decoder}/{heatmap,cosine,mds}``
  for a learned one (source and target tables are separate parameters).
- ``position/decay``: sinusoidal / RoPE / xPos dot product vs distance (and xPos's scales zeta^(k/B));
  ``position/rope_scaling``: RoPE length extension.
- ``position/bias/{encoder,decoder,cross}``: ALiBi / T5 / KERPLE / Sandwich / FIRE / DPB biases of the first layer, per
  head; ``position/cope/{table,positions,bias}/decoder``: CoPE's table, and its positions and term for random q, k.
- ``position/augment``: the positions ``model.augment`` gives one stack in training (one draw per batch), against
  the 0..T-1 of inference.
- ``position/shaw/{encoder,decoder,cross}``: Shaw et al.'s learned relative tables (a^K, and a^V if used) of the
  first layer. Their score term q·a^K_{j-i} depends on the query content, so instead of one arbitrary q the
  table itself is shown (distance x dim) with the cosine similarity between distances: how distinct and how
  smooth the learned distance representations are.
"""

from __future__ import annotations

import dataclasses
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from matplotlib.figure import Figure

from models.positional import AttentionPE
from models.positional.augment import augmented_positions
from models.positional.base import Plot
from models.transformer import Attention, Seq2SeqTransformer
from tokenizer import Tokenizer
from utils.config import Config, DecodeConfig, ModelConfig
from utils.figures import plots
from utils.translation.translate import InputError, encode_sources, encode_target, translate_ids

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

BOS_LABEL = "<s>"
EOS_LABEL = "</s>"
KINDS = ("encoder", "decoder", "cross")
TITLES = {"encoder": "encoder self-attention", "decoder": "decoder self-attention", "cross": "cross-attention"}


def encode_pair(
    model: Seq2SeqTransformer, tokenizer: Tokenizer, src_text: str, tgt_text: str | None = None,
    decode: DecodeConfig | None = None,
) -> tuple[list[int], list[int], str]:
    """-> (source ids with eos, target ids without bos/eos, target text).

    The target is ``tgt_text`` (teacher forcing) or else the greedy translation (``decode`` with beam 1).
    Empty or over-long inputs raise ``InputError``.
    """
    src_ids = encode_sources(tokenizer, [src_text], model.max_length, strict=True)[0]
    if tgt_text is None:
        greedy = (decode or DecodeConfig()).model_copy(update=dict(beam=1, nbest=1))
        hyp = translate_ids(model, tokenizer, [src_ids], greedy)[0][0]
        return src_ids, list(hyp.tokens), hyp.text
    return src_ids, encode_target(tokenizer, tgt_text, model.max_length), tgt_text


@torch.no_grad()
def attention_from_ids(
    model: Seq2SeqTransformer, tokenizer: Tokenizer, src_ids: list[int], tgt_ids: list[int]
) -> tuple[list[str], list[str], Attention]:
    """Every layer's attention for one pair: the decoder reads [bos] + ``tgt_ids``. Weights come back float32 on
    the CPU, ``[1, H, Tq, Tk]``; labels are the subword strings (source ends with eos, target starts with bos)."""
    was_training = model.training
    model.eval()
    try:
        src = torch.tensor([src_ids], dtype=torch.long, device=model.device)
        tgt = torch.tensor([[tokenizer.bos_id, *tgt_ids]], dtype=torch.long, device=model.device)
        _, attention = model.forward_with_attention(src, tgt)
    finally:
        model.train(was_training)
    cpu = lambda ws: [w.detach().float().cpu() for w in ws]
    attention = Attention(cpu(attention.encoder), cpu(attention.decoder), cpu(attention.cross))
    return tokenizer.id_to_token(src_ids), [BOS_LABEL, *tokenizer.id_to_token(tgt_ids)], attention


def attention_maps(
    model: Seq2SeqTransformer, tokenizer: Tokenizer, src_text: str, tgt_text: str | None = None,
    decode: DecodeConfig | None = None,
) -> tuple[list[str], list[str], Attention]:
    """(source tokens + '</s>', '<s>' + target tokens, every layer's weights) for one sentence pair.

    The target is the greedy translation unless ``tgt_text`` is given (teacher forcing).
    """
    src_ids, tgt_ids, _ = encode_pair(model, tokenizer, src_text, tgt_text, decode)
    return attention_from_ids(model, tokenizer, src_ids, tgt_ids)


def predicted_labels(tgt_tokens: list[str]) -> list[str]:
    """Decoder rows labelled by the token each predicts: the row reading '<s>' predicts the first target token,
    the row reading the last one predicts '</s>'."""
    return [*tgt_tokens[1:], EOS_LABEL]


def figures_from_attention(src_tokens: list[str], tgt_tokens: list[str], attention: Attention) -> dict[str, Figure]:
    """One ``attention_grid`` per layer and kind, tagged ``attention/<kind>/layer_<i>``.

    Self-attention rows are labelled with the token each position reads; cross-attention rows with the
    target token being predicted, as alignment plots are (the row reading "The" predicts "little", and
    attends to "petit"), and the figure says so.
    """
    figs: dict[str, Figure] = {}
    for kind in KINDS:
        for i, w in enumerate(getattr(attention, kind)):
            title = f"{TITLES[kind]}, layer {i}"
            if kind == "cross":
                grid = plots.attention_grid(w[0], predicted_labels(tgt_tokens), src_tokens,
                                            f"{title} (rows: the target token being predicted)",
                                            q_axis="predicted target token", k_axis="source token")
            else:
                tokens = src_tokens if kind == "encoder" else tgt_tokens
                grid = plots.attention_grid(w[0], tokens, tokens, title)
            figs[f"attention/{kind}/layer_{i}"] = grid
    return figs


@dataclasses.dataclass
class Alignment:
    """The argmax source position of each predicted target token (cross-attention of one layer, head mean)."""

    src_tokens: list[str]
    tgt_tokens: list[str]  # predicted tokens, '</s>' last
    links: list[int]  # source index per target row
    weights: torch.Tensor  # [Tt, Ts]
    layer: int

    def diagonal_agreement(self, window: int = 2) -> float:
        """Share of target tokens whose argmax source lies within ``window`` of the monotone diagonal."""
        tt, ts = len(self.links), len(self.src_tokens)
        near = [abs(j - i * (ts - 1) / max(tt - 1, 1)) <= window for i, j in enumerate(self.links)]
        return sum(near) / max(tt, 1)


def check_layer(layer: int, layers: int) -> None:
    """InputError, one line, unless ``layer`` names one of a decoder's ``layers`` (-1: the last)."""
    if not -layers <= layer < layers:
        raise InputError(f"--layer {layer}: the decoder has {layers} layers (0..{layers - 1}, or -1 for the last)")


def alignment(src_tokens: list[str], tgt_tokens: list[str], attention: Attention, layer: int = -1) -> Alignment:
    """Hard alignment from cross-attention ``layer`` (default the last), mean over heads."""
    n = len(attention.cross)
    check_layer(layer, n)
    w = attention.cross[layer][0].mean(0)
    return Alignment(src_tokens, predicted_labels(tgt_tokens), w.argmax(-1).tolist(), w, layer % n)


def alignment_figure(a: Alignment, window: int = 2) -> Figure:
    title = (f"alignment from cross-attention layer {a.layer}: {a.diagonal_agreement(window):.0%} of target tokens "
             f"within ±{window} of the diagonal")
    return plots.alignment_figure(a.weights, a.src_tokens, a.tgt_tokens, title)


def attention_figures(
    model: Seq2SeqTransformer, tokenizer: Tokenizer, src_text: str, tgt_text: str | None = None,
    decode: DecodeConfig | None = None,
) -> dict[str, Figure]:
    """Attention maps of one sentence pair as figures (see ``attention_maps`` and ``figures_from_attention``)."""
    return figures_from_attention(*attention_maps(model, tokenizer, src_text, tgt_text, decode))


def draw(plot: Plot) -> Figure:
    """The figure an encoding described: ``utils.figures.plots.<plot.draw>(*plot.args, **plot.kwargs)``."""
    return getattr(plots, plot.draw)(*plot.args, **plot.kwargs)


def _first_pe(model: Seq2SeqTransformer, kind: str) -> AttentionPE | None:
    layers = model.encoder if kind == "encoder" else model.decoder
    if len(layers) == 0:
        return None
    return getattr(layers[0], "cross_attn" if kind == "cross" else "self_attn").pe


def augment_plot(m: ModelConfig, length: int, draws: int = 200, seed: int = 0) -> Plot | None:
    """``position/augment``: ``draws`` draws (generator seeded with ``seed``, the same figure every call) of the
    positions ``m.augment`` gives a stack of ``length`` tokens in training (at most the randomized ``max_length``);
    None without augmentation."""
    a = m.augment
    if a.method == "none":
        return None
    if a.method == "randomized" and a.randomized.max_length is not None:
        length = min(length, a.randomized.max_length)
    generator = torch.Generator().manual_seed(seed)
    table = torch.stack([augmented_positions(a, length, generator=generator) for _ in range(draws)])
    title = (f"model.augment: {a.describe()}\ntraining positions of {length} tokens (each stack draws its own; "
             "off at inference)")
    return Plot("position/augment", "augment_positions", (table, title))


@torch.no_grad()
def position_figures(
    model: Seq2SeqTransformer, cfg: Config | ModelConfig, length: int = 64, bias_length: int = 32
) -> tuple[dict[str, Figure], list[str]]:
    """Figures of the model's positional encodings, and one-line notes on what has nothing to plot.

    ``length`` positions for input tables (capped at the model's limit), ``bias_length`` for bias matrices and
    the tokens of the augmentation figure.
    """
    m = cfg.model if isinstance(cfg, Config) else cfg
    n = min(length, model.max_length or length)
    inputs = {"encoder": (model.src_pe, m.pe("encoder", "input")), "decoder": (model.tgt_pe, m.pe("decoder", "input"))}
    if inputs["encoder"][1] == inputs["decoder"][1]:
        specs, notes = model.src_pe.plots(inputs["encoder"][1], n, {side: pe for side, (pe, _) in inputs.items()})
    else:  # a different encoding per stack: each plotted on its own, its tags under its side
        specs, notes = [], []
        for side, (pe, name) in inputs.items():
            own, said = pe.plots(name, n, {side: pe})
            specs += [s if s.tag.startswith(f"position/input/{side}/") else
                      replace(s, tag=s.tag.replace("position/input/", f"position/input/{side}/", 1)) for s in own]
            notes += [f"{side}: {note}" for note in said]
    pes = {kind: _first_pe(model, kind) for kind in KINDS}
    attention = [pe for pe in pes.values() if pe is not None]
    decay: dict[str, Any] = model.src_pe.decay()
    for pe in attention:
        decay = {**pe.decay(), **decay}  # the first that gives an argument wins
    if decay:
        specs.append(Plot("position/decay", "decay_curves", (max(256, length),), decay))
    for pe in attention:
        specs += pe.model_plots()
    augment = augment_plot(m, bias_length)
    if augment is not None:
        specs.append(augment)
    names = {"encoder": m.pe("encoder", "attention"), "decoder": m.pe("decoder", "attention"),
             "cross": m.cross_attention_pe}
    for kind, pe in pes.items():
        if pe is not None:
            own = pe.plots(f"{names[kind]}, {TITLES[kind]}, layer 0", bias_length)
            if not own and not pe.model_plots() and not pe.decay():
                notes.append(f"{names[kind]} in {TITLES[kind]}: this encoding has nothing to plot")
            specs += own
    figs: dict[str, Figure] = {}
    for spec in specs:
        if spec.tag not in figs:  # a model-wide figure comes from the first layer that gives it
            figs[spec.tag] = draw(spec)
    if names["encoder"] == names["decoder"] == "none":
        notes.append("attention_pe=none: no attention-level positional encoding in self-attention")
    elif "none" in (names["encoder"], names["decoder"]):
        stack = "encoder" if names["encoder"] == "none" else "decoder"
        notes.append(f"{m.pe_key(stack, 'attention')}=none: no attention-level positional encoding in {stack} "
                     "self-attention")
    if m.pe("encoder", "input") == "none" and names["encoder"] == "none":
        notes.append("no positional information in the encoder: it is permutation-equivariant")
    return figs, notes


def tag_filename(tag: str) -> str:
    """``attention/encoder/layer_0`` -> ``attention_encoder_layer_0.png``."""
    return tag.replace("/", "_") + ".png"


def write_figures(
    figs: dict[str, Figure], out_dir: Path | None = None, writer: SummaryWriter | None = None, step: int = 0,
    dpi: int = 120,
) -> list[Path]:
    """Save each figure as ``out_dir/<tag with / -> _>.png`` and/or a TensorBoard image ``tag`` at ``step``, at
    ``dpi``; close them all. Each figure is drawn once (its layout is most of the cost) and that one bitmap is both
    the PNG, written atomically, and the image. Returns the PNG paths written."""
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.image import imsave

    from utils.io import atomic_path

    paths: list[Path] = []
    if out_dir is None and writer is None:
        close_figures(figs)
        return paths
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
    try:
        for tag, fig in figs.items():
            fig.set_dpi(dpi)
            canvas = FigureCanvasAgg(fig)
            canvas.draw()
            rgba = np.asarray(canvas.buffer_rgba())  # (H, W, 4) uint8
            if out_dir is not None:
                path = out_dir / tag_filename(tag)
                with atomic_path(path, ".png") as tmp:
                    imsave(tmp, rgba, format="png", dpi=dpi)
                paths.append(path)
            if writer is not None:
                writer.add_image(tag, rgba[..., :3], step, dataformats="HWC")
    finally:
        close_figures(figs)
    return paths


def close_figures(figs: dict[str, Figure]) -> None:
    """Release the figures' memory (they are not in pyplot's registry, so clearing them is enough)."""
    for fig in figs.values():
        fig.clear()
