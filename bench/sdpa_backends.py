"""Our model's bf16 training step on CUDA under each set of allowed SDPA kernels, batches of varying shapes.

    python bench/sdpa_backends.py [--config configs/bench_small.yaml] [--set model.d_model=512 ...] [--steps 50]

Why: ``scaled_dot_product_attention`` with a float mask may pick cuDNN's kernel on Hopper, which builds a graph
for every new shape; token-bucketed batches bring new shapes at every step. The model therefore allows every
kernel but cuDNN's (``Attend.cuda_kernels`` in ``models/attend.py``). This times, on one process and one set of
random batches (``--steps`` timed after 10 warm-up, each of about 4,096 target tokens, shapes drawn from 10-60
tokens a side): every kernel allowed (PyTorch's default), the model's, efficient + math only, and every kernel
again (the shapes now seen: cuDNN's graphs cached). An idealised loop (no data loader, no validation): the real
loop's numbers come from ``bench/speed.py --device cuda --parts real``.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as bench/sdpa_backends.py: the root first

from bench.common import ROOT  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    """The command line of bench/sdpa_backends.py."""
    from utils.cli import add_set_arg

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/bench_small.yaml",
                        help="config of the model timed (default configs/bench_small.yaml)")
    parser.add_argument("--steps", type=int, default=50,
                        help="timed steps per set of kernels, after 10 warm-up steps (default 50)")
    add_set_arg(parser)
    return parser


def main() -> int:
    parser = build_parser()
    args = parser.parse_args()

    import torch
    from torch.nn.attention import SDPBackend

    from models.attend import Attend
    from models.transformer import Seq2SeqTransformer
    from utils.config import load_config

    if not torch.cuda.is_available():
        print("CUDA is not available: nothing to time")
        return 0
    cfg = load_config(ROOT / args.config, args.overrides or [])
    vocab = cfg.tokenizer.vocab_size
    model = Seq2SeqTransformer(cfg.model, vocab, 0).cuda()
    opt = torch.optim.AdamW(model.parameters(), 1e-4)
    rng = random.Random(0)
    shapes = [(rng.randint(10, 60), rng.randint(10, 60)) for _ in range(10 + args.steps)]

    def step(s: int, t: int) -> int:
        b = 4096 // max(s, t)
        src = torch.randint(4, vocab, (b, s), device="cuda")
        src[: b // 2, -3:] = 0  # padding: a key mask, as real batches have
        tgt = torch.randint(4, vocab, (b, t), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(src, tgt, torch.ones(b, t, dtype=torch.bool, device="cuda")).float().logsumexp(-1).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return b * t

    every = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH,
             SDPBackend.CUDNN_ATTENTION]
    ours = list(Attend.cuda_kernels)
    for name, backends in [("default choice (every kernel)", every), ("all but cuDNN (the model's)", ours),
                           ("efficient + math", [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]),
                           ("default choice again, shapes seen", every)]:
        Attend.cuda_kernels = backends  # what the model's attention allows around its kernel call
        for s, t in shapes[:10]:
            step(s, t)
        torch.cuda.synchronize()
        t0, n = time.perf_counter(), 0
        for s, t in shapes[10:]:
            n += step(s, t)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        print(f"{name}: {n / dt:,.0f} target tok/s ({dt / args.steps * 1e3:.1f} ms/step)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
