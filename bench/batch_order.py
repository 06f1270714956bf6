"""What the order of sentences costs a batched decoder: the same sentences decoded in batches of ``B`` taken in
their order (as a server forms batches from requests as they arrive), in the CLI's length-sorted batches, and by
``B`` clients that each send their next sentence when the last one is translated, decoded with iteration-level
batching (``utils/translation/continuous.py``: sentences join the decoding in flight between two decoder steps,
as the server's do).

    python bench/batch_order.py --model_path RUN_DIR [--input FILE] [--sentences 384] [--batch 32 64] [--beam 5]
        [--join 0.5]

One process, one thread (``torch.set_num_threads(1)``), the run's PyTorch model; each of the three decodes every
sentence (a first pass warms up), and must give the same translations. Prints sentences/s for each and the
ratio to the sorted batches: the ceiling of a server with ``B`` clients, without its HTTP work, against the CLI's
batch throughput (``bench/serve_load.py``'s reference).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as bench/batch_order.py: the repository root first

from bench.common import ROOT  # noqa: E402
from bench.serve_load import cpu_name, read_sentences  # noqa: E402


def closed_loop(model, tokenizer, sentences: list[str], decode, clients: int,  # noqa: ANN001
                join: float) -> tuple[list, float]:
    """``clients`` clients, each with one sentence in flight, sending the next (in file order) as soon as it has its
    translation; decoded with iteration-level batching -> (each sentence's n-best list, mean sentences per step)."""
    from utils.translation.continuous import ContinuousDecoder, Request
    from utils.translation.translate import encode_sources

    decoder = ContinuousDecoder(model, tokenizer, join=join)
    sources = encode_sources(tokenizer, sentences, model.max_length, strict=False)
    results: list = [None] * len(sentences)
    free, sent = clients, 0

    def raise_(err: BaseException) -> None:
        raise err

    def request(i: int) -> Request:
        def done(_: int, nbest: list) -> None:
            nonlocal free
            results[i] = nbest
            free += 1
        return Request([sources[i]], decode, done, raise_)

    while sent < len(sources) or decoder.busy:
        take = min(free, len(sources) - sent)
        decoder.add([request(i) for i in range(sent, sent + take)])
        sent, free = sent + take, free - take
        decoder.step()
    return results, decoder.sentence_steps / max(decoder.steps, 1)


def build_parser() -> argparse.ArgumentParser:
    """The command line of bench/batch_order.py."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model_path", "--model-path", required=True, help="run directory")
    parser.add_argument("--input", default=str(ROOT / "data" / "demo" / "test.fr"),
                        help="source sentences, one per line (.gz read as gzip)")
    parser.add_argument("--sentences", type=int, default=384, help="sentences (the file repeated if shorter)")
    parser.add_argument("--batch", type=int, nargs="+", default=[32, 64], help="batch sizes (default 32 64)")
    parser.add_argument("--beam", type=int, default=5, help="beam size (default 5)")
    parser.add_argument("--join", type=float, default=0.5,
                        help="continuous: waiting sentences join once they are this share of those decoding "
                             "(default 0.5, the server's)")
    return parser


def main() -> int:
    parser = build_parser()
    args = parser.parse_args()
    if args.sentences < 1 or args.beam < 1 or min(args.batch) < 1:
        parser.error("--sentences, --beam and --batch must be >= 1")
    if args.join < 0:
        parser.error("--join must be >= 0")
    import torch

    from utils.run.load import load_run
    from utils.translation.translate import translate

    torch.set_num_threads(1)
    run = load_run(args.model_path, device="cpu")
    sentences = read_sentences(Path(args.input), args.sentences)
    decode = run.cfg.decode.model_copy(update=dict(beam=args.beam))
    translate(run.model, run.tokenizer, sentences[: max(args.batch)], decode, strict=False)  # warm-up
    print(f"CPU: {cpu_name()}, one thread; {len(sentences)} sentences, beam {args.beam}, join {args.join}")
    print("| batch / clients | arrival order, static batches | length-sorted (the CLI) | continuous, B clients | "
          "arrival / sorted | continuous / sorted | continuous: mean sentences per step |")
    print("|---|---|---|---|---|---|---|")
    for size in args.batch:
        dec = decode.model_copy(update=dict(batch_size=size))
        began = time.perf_counter()
        arrival = [nbest for i in range(0, len(sentences), size)
                   for nbest in translate(run.model, run.tokenizer, sentences[i : i + size], dec, strict=False)]
        in_order = len(sentences) / (time.perf_counter() - began)
        began = time.perf_counter()
        cli = translate(run.model, run.tokenizer, sentences, dec, strict=False)  # sorts by length into batches
        sorted_rate = len(sentences) / (time.perf_counter() - began)
        began = time.perf_counter()
        continuous, per_step = closed_loop(run.model, run.tokenizer, sentences, dec, size, args.join)
        continuous_rate = len(sentences) / (time.perf_counter() - began)
        if not [n[0].text for n in arrival] == [n[0].text for n in cli] == [n[0].text for n in continuous]:
            raise SystemExit("error: the orders gave different translations")
        print(f"| {size} | {in_order:.1f} | {sorted_rate:.1f} | {continuous_rate:.1f} | "
              f"{in_order / sorted_rate:.2f}x | {continuous_rate / sorted_rate:.2f}x | {per_step:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    from utils.cli import run_main

    run_main(main)
