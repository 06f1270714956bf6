"""Draw what a trained model's positional encoding does: attention maps of one sentence, and the encoding itself.

    python visualize.py --model_path runs/demo_latest --src_text "Le chat dort sur le canapé."
    python visualize.py --model_path RUN/checkpoints/last.pt --src_text "Bonjour." --tgt_text "Hello." --out figs/

Attention maps (every head of every encoder, decoder and cross-attention layer, plus the head average) are
drawn for the greedy translation of --src_text, or for --tgt_text (teacher forcing). Position figures
depend on the encoding: input tables (heatmap, cosine similarity, MDS for learned tables), dot product vs
distance (sinusoidal, RoPE), RoPE length-extension scalings, ALiBi/T5 bias matrices, Shaw relative tables.
Figures go to TensorBoard (<run>/tb/visualize, step = the checkpoint's training iteration when it records
one, else 0) and as PNG files to --out (default <run>/visualize/).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from utils.cli import add_alias_args, add_set_arg, run_main, setup_logging


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="YAML config (default: the run directory's config.yaml)")
    add_alias_args(parser, "model_path", required=True, help="checkpoint .pt or run directory")
    add_alias_args(parser, "src_text", required=True, help="source sentence whose attention is drawn")
    add_alias_args(parser, "tgt_text", help="target sentence to teacher-force (default: the greedy translation)")
    parser.add_argument("--out", help="folder for the PNG files (default: <run>/visualize)")
    parser.add_argument("--length", type=int, default=64, help="positions drawn for input tables (default 64)")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    add_set_arg(parser)
    args = parser.parse_args()
    setup_logging()

    from utils.config import ConfigError
    from utils.runs import load_run

    if not args.src_text.strip():
        raise ConfigError("--src_text is empty: give a sentence to visualize")
    if args.tgt_text is not None and not args.tgt_text.strip():
        raise ConfigError("--tgt_text is empty: leave it out to use the greedy translation")
    if args.length < 1:
        raise ConfigError(f"--length must be >= 1, got {args.length}")
    run = load_run(args.model_path, args.config, args.overrides, args.device)

    from torch.utils.tensorboard import SummaryWriter

    from utils.visualization import (
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
    position, notes = position_figures(run.model, run.cfg, length=args.length)
    figs.update(position)

    out_dir = Path(args.out) if args.out else run.run_dir / "visualize"
    tb_dir = run.run_dir / "tb" / "visualize"
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
    for note in notes:
        print(f"note: {note}")
    print(f"wrote {len(paths)} PNG files to {out_dir}")
    print(f"wrote {len(tags)} TensorBoard images to {tb_dir} (step {step}): {', '.join(tags)}")
    return 0


if __name__ == "__main__":
    run_main(main)
