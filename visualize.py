"""Draw what a trained model's positional encoding does: attention maps of one sentence, and the encoding itself.

    python visualize.py --model_path runs/demo_latest --src_text "Le chat dort sur le canapé."
    python visualize.py --model_path RUN/checkpoints/last.pt --src_text "Bonjour." --tgt_text "Hello." --out figs/
    python visualize.py --model_path runs/demo_latest --src_text "Le petit chat dort." --alignment
    python visualize.py --model_path runs/demo_latest --alignment --input data/demo/test.fr \
        --tgt_input data/demo/test.en

Attention maps (every head of every encoder, decoder and cross-attention layer, plus the head average) are
drawn for the greedy translation of --src_text, or for --tgt_text (teacher forcing). Position figures
depend on the encoding: input tables (heatmap, cosine similarity, MDS for learned tables), dot product vs
distance (sinusoidal, RoPE, xPos), RoPE length-extension scalings, ALiBi/T5/KERPLE/Sandwich/FIRE/DPB bias matrices,
Shaw relative tables, CoPE's table and contextual positions, and a training-time augmentation's positions.
Cross-attention rows are labelled with the target token being predicted, as alignment plots are.
--alignment adds the hard alignment (argmax source token of each predicted target token, one layer, head
mean) and its agreement with the monotone diagonal; with --input FILE [--tgt_input FILE] it aligns every
line and writes Pharaoh links ("src-tgt", 0-based, per line) to <out>/alignment.txt.
Figures go to TensorBoard (<run>/tb/visualize, step = the checkpoint's training iteration when it records
one, else 0) and as PNG files to --out (default <run>/visualize/).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from utils.cli import add_alias_args, add_set_arg, run_main, setup_logging

if TYPE_CHECKING:
    from models.config import ModelConfig

#: Positions of the bias grids and augmentation draws (``position_figures``' ``bias_length``).
BIAS_LENGTH = 32


def build_parser() -> argparse.ArgumentParser:
    """The command line of visualize.py."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="YAML config (default: the run directory's config.yaml)")
    add_alias_args(parser, "model_path", required=True, help="checkpoint .pt or run directory")
    add_alias_args(parser, "src_text", help="source sentence whose attention is drawn")
    add_alias_args(parser, "tgt_text", help="target sentence to teacher-force (default: the greedy translation)")
    parser.add_argument("--out", help="folder for the PNG files (default: <run>/visualize)")
    parser.add_argument("--length", type=int, default=64, help="positions drawn for input tables (default 64)")
    parser.add_argument("--alignment", action="store_true",
                        help="also draw the hard alignment (argmax source token per predicted target token)")
    parser.add_argument("--layer", type=int, default=-1, help="cross-attention layer of the alignment (-1: last)")
    parser.add_argument("--input", help="with --alignment: align every line of this source file (no figures); "
                        "writes Pharaoh 'i-j' links (source-target, 0-based) per line to --out/alignment.txt")
    parser.add_argument("--tgt_input", "--tgt-input", help="with --input: target file to teacher-force, line by line")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                        help="where the model runs (default auto: the config's train.device)")
    add_set_arg(parser)
    return parser


def main() -> int:
    parser = build_parser()
    args = parser.parse_args()
    setup_logging()

    from utils.config import ConfigError
    from utils.run.load import load_run

    if args.input is not None:
        if not args.alignment or args.src_text is not None:
            parser.error("--input goes with --alignment and without --src_text")
        return align_file(args)
    if args.src_text is None:
        parser.error("give --src_text (or --alignment --input FILE)")
    if not args.src_text.strip():
        raise ConfigError("--src_text is empty: give a sentence to visualize")
    if args.tgt_text is not None and not args.tgt_text.strip():
        raise ConfigError("--tgt_text is empty: leave it out to use the greedy translation")
    if args.length < 1:
        raise ConfigError(f"--length must be >= 1, got {args.length}")
    check_length(args)
    run = load_run(args.model_path, args.config, args.overrides, args.device)
    from utils.figures.maps import check_layer
    from utils.io import ensure_dir
    from utils.run.layout import RunDir

    if args.alignment:
        check_layer(args.layer, run.model.cfg.decoder_layers)  # before anything is written
    rd = RunDir(run.run_dir)
    out_dir = ensure_dir(args.out if args.out else rd.figures, "--out")

    from torch.utils.tensorboard import SummaryWriter

    from utils.figures.maps import (
        alignment,
        alignment_figure,
        attention_from_ids,
        encode_pair,
        figures_from_attention,
        position_figures,
        write_figures,
    )

    step = run.step
    src_ids, tgt_ids, target = encode_pair(run.model, run.tokenizer, args.src_text, args.tgt_text, run.cfg.decode)
    src_tokens, tgt_tokens, attention = attention_from_ids(run.model, run.tokenizer, src_ids, tgt_ids)
    figs = figures_from_attention(src_tokens, tgt_tokens, attention)
    aligned = None
    if args.alignment:
        aligned = alignment(src_tokens, tgt_tokens, attention, args.layer)
        figs["alignment"] = alignment_figure(aligned)
    position, notes = position_figures(run.model, run.cfg, length=args.length, bias_length=BIAS_LENGTH)
    figs.update(position)

    tb_dir = rd.tb_figures
    writer = SummaryWriter(log_dir=str(tb_dir))
    try:
        tags = list(figs)
        paths = write_figures(figs, out_dir, writer, step)
    finally:
        writer.close()

    print(f"checkpoint: {run.checkpoint} (step {step})")
    print(f"source: {args.src_text}")
    print(f"{'target (teacher-forced)' if args.tgt_text is not None else 'greedy'}: {target}")
    print(f"source tokens: {' '.join(src_tokens)}")
    print(f"target tokens: {' '.join(tgt_tokens)}")
    if aligned is not None:
        links = " ".join(f"{aligned.tgt_tokens[i]}->{aligned.src_tokens[j]}" for i, j in enumerate(aligned.links))
        print(f"alignment (layer {aligned.layer}): {links}")
        print(f"alignment agreement with the diagonal (±2 tokens): {aligned.diagonal_agreement():.1%}")
    for note in notes:
        print(f"note: {note}")
    print(f"wrote {len(paths)} PNG files to {out_dir}")
    print(f"wrote {len(tags)} TensorBoard images to {tb_dir} (step {step}): {', '.join(tags)}")
    return 0


def figures_memory(m: ModelConfig, length: int) -> int:
    """Bytes the position figures of ``m`` take at ``--length`` ``length``: each input encoding's (its table and
    the similarities between positions), the decay curves (``max(256, length)`` distances, float64, up to
    ``d_model`` dimensions), each attention encoding's at ``BIAS_LENGTH`` positions."""
    from models.positional import REGISTRY

    inputs = {m.pe(stack, "input") for stack in ("encoder", "decoder")}
    attention = {m.pe("encoder", "attention"), m.pe("decoder", "attention"), m.cross_attention_pe}
    need = sum(REGISTRY["input"][name].plot_memory(m, length) for name in inputs)
    need += sum(cls.plot_memory(m, BIAS_LENGTH) for cls in (REGISTRY["attention"][n] for n in attention) if cls)
    return need + max(256, length) * (24 * m.d_model + 256)


def check_length(args: argparse.Namespace) -> None:
    """ConfigError (one line) for a ``--length`` whose figures the machine cannot hold (``models.memory``'s
    limit), read from the run's config before the model is loaded, with the longest that fits."""
    from models.memory import human, memory_limit
    from utils.config import ConfigError, load_config
    from utils.run.layout import RunDir
    from utils.run.load import resolve_checkpoint

    run_dir, _ = resolve_checkpoint(args.model_path)
    m = load_config(args.config or RunDir(run_dir).config, args.overrides, warn=False).model
    limit, where = memory_limit()
    need = figures_memory(m, args.length)
    if need <= limit:
        return
    low, high = 0, args.length  # the longest --length that fits: figures_memory grows with it
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if figures_memory(m, mid) <= limit else (low, mid - 1)
    fits = f"--length {low} fits" if low else "the encodings' own figures need more at any --length"
    raise ConfigError(f"--length {args.length}: the position figures would need ~{human(need)} ({where}); {fits}")


def align_file(args: argparse.Namespace) -> int:
    """Hard alignments of every line of ``--input`` (greedy translation, or ``--tgt_input`` teacher-forced)."""
    import sys

    from utils.config import ConfigError
    from utils.figures.maps import alignment, attention_from_ids, check_layer, encode_pair
    from utils.io import atomic_write_text, ensure_dir
    from utils.run.load import load_run
    from utils.translation.translate import InputError, StreamReport, open_source, source_lines

    run = load_run(args.model_path, args.config, args.overrides, args.device)
    check_layer(args.layer, run.model.cfg.decoder_layers)  # every check before anything is written
    with open_source(args.input) as stream:
        sources = list(source_lines(stream, args.input, StreamReport()))
    targets: list[str | None] = [None] * len(sources)
    if args.tgt_input:
        with open_source(args.tgt_input) as stream:
            targets = list(source_lines(stream, args.tgt_input, StreamReport()))
        if len(targets) != len(sources):
            raise ConfigError(f"--tgt_input has {len(targets)} lines but --input has {len(sources)}")
    out_dir = ensure_dir(args.out if args.out else run.run_dir / "visualize", "--out")
    lines, agreement, skipped = [], [], 0
    for src, tgt in zip(sources, targets, strict=True):
        try:
            src_ids, tgt_ids, _ = encode_pair(run.model, run.tokenizer, src, tgt, run.cfg.decode)
        except InputError:  # an empty or over-long line: an empty alignment line, the others go on
            lines.append("")
            skipped += 1
            continue
        a = alignment(*attention_from_ids(run.model, run.tokenizer, src_ids, tgt_ids), args.layer)
        lines.append(" ".join(f"{j}-{i}" for i, j in enumerate(a.links)))
        agreement.append(a.diagonal_agreement())
    path = out_dir / "alignment.txt"
    atomic_write_text(path, "".join(f"{line}\n" for line in lines))  # one line per input line, none for none
    print(f"aligned {len(agreement)} sentences ({skipped} empty or too long skipped); Pharaoh links in {path}")
    if agreement:
        mean = sum(agreement) / len(agreement)
        print(f"agreement with the diagonal (±2 tokens), mean over sentences: {mean:.1%}", file=sys.stdout)
    else:
        print("agreement with the diagonal: no sentence aligned", file=sys.stdout)
    return 0


if __name__ == "__main__":
    run_main(main)
