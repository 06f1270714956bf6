"""The command-line flags of the decoding modes shared by inference.py and test.py: sampling (``--sample`` and its
settings), MBR (``--mbr``), ensembles (several ``--model_path``), and their checks (one line each)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pydantic: imported when a config is, not when the parser is built
    from utils.config import DecodeConfig

#: Flag -> config key of the sampling settings (each needs ``--sample`` or ``decode.sample``).
SAMPLING_FLAGS = {"temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "epsilon": "epsilon",
                  "num_samples": "num_samples", "seed": "seed"}


def number(kind: type, low: float, high: float, low_open: bool = False,
           high_open: bool = False) -> Callable[[str], float | int]:
    """An argparse type: an int or finite float between ``low`` and ``high`` (each end included unless ``*_open``),
    refused in one line otherwise."""
    where = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}" if kind is float else \
        f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
    what = "an integer" if kind is int else "a finite number"

    def parse(text: str) -> float | int:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what} in {where}, got {text[:40]!r}") from None
        inside = (low < value if low_open else low <= value) and (value < high if high_open else value <= high)
        if not (math.isfinite(value) and inside):
            raise argparse.ArgumentTypeError(f"must be {what} in {where}, got {text[:40]}")
        return value

    return parse


def add_mode_args(parser: argparse.ArgumentParser) -> None:
    """--sample, --temperature, --top_k, --top_p, --epsilon, --num_samples, --seed, --mbr, --mbr_utility."""
    group = parser.add_argument_group("sampling and MBR (default: the config's decode section)")
    group.add_argument("--sample", action="store_true", default=None,
                       help="draw translations at random from the model's distribution instead of beam search")
    for name, kind, help_text in (
        ("temperature", number(float, 0, 100, low_open=True, high_open=True),
         "with --sample: divide the log-probabilities by T (below 1 sharper, above 1 flatter; default 1)"),
        ("top_k", number(int, 0, 10**6), "with --sample: draw among the K most probable tokens only (0: off)"),
        ("top_p", number(float, 0, 1, low_open=True),
         "with --sample: nucleus sampling, draw among the fewest most probable tokens of total probability P (1: off)"),
        ("epsilon", number(float, 0, 1, high_open=True),
         "with --sample: epsilon sampling, draw among tokens of probability at least E (0: off)"),
        ("num_samples", number(int, 1, 1024),
         "with --sample: translations drawn per input line (above 1, written as --nbest writes its lists)"),
        ("seed", number(int, 0, 2**63 - 1),
         "with --sample: the samples of a sentence depend on this seed and the sentence alone, so the same seed "
         "repeats them exactly (default: a fresh seed each time)"),
    ):
        metavar = {"top_k": "K", "top_p": "P", "num_samples": "N"}.get(name, name.upper()[0])
        group.add_argument(f"--{name}", *([f"--{name.replace('_', '-')}"] if "_" in name else []), dest=name,
                           type=kind, metavar=metavar, help=help_text)
    group.add_argument("--mbr", type=number(int, 2, 1024), metavar="N",
                       help="minimum Bayes risk decoding over N candidates (N samples with --sample, else the beam's "
                            "N-best, N at most --beam): the output is the candidate of highest mean utility against "
                            "all candidates, itself included")
    group.add_argument("--mbr_utility", "--mbr-utility", dest="mbr_utility", choices=["chrf", "bleu"],
                       help="with --mbr: the utility, sentence-level chrF or BLEU (default: decode.mbr_utility, chrf)")


def mode_overrides(args: argparse.Namespace) -> list[str]:
    """The decoding-mode flags given, as ``decode.KEY=VALUE`` overrides (none for a flag not given)."""
    out = ["decode.sample=true"] if getattr(args, "sample", None) else []
    for key in (*SAMPLING_FLAGS, "mbr", "mbr_utility"):
        value = getattr(args, key, None)
        if value is not None:
            out.append(f"decode.{key}={value}")
    return out


def check_mode_flags(args: argparse.Namespace, decode: DecodeConfig) -> None:
    """ConfigError, one line, for a flag the decoding in force would not use: a sampling setting without sampling,
    ``--mbr_utility`` without MBR."""
    from utils.config import ConfigError

    if not decode.sample:
        given = [f"--{flag}" for flag in SAMPLING_FLAGS if getattr(args, flag, None) is not None]
        if given:
            raise ConfigError(f"{given[0]} applies to sampling: add --sample (or set decode.sample=true)")
    if not decode.mbr and getattr(args, "mbr_utility", None) is not None:
        raise ConfigError("--mbr_utility applies to MBR decoding: add --mbr N")


def model_paths(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """The ``--model_path`` values (several, or a study variant's folder of seeds: an ensemble); ``args.model_path``
    becomes the first. An ensemble with
    ``--save_average`` is refused (one line)."""
    from utils.run.ensemble import expand_model_paths

    paths = expand_model_paths(list(args.model_path) if isinstance(args.model_path, list) else [args.model_path])
    args.model_path = paths[0]
    if len(paths) > 1 and getattr(args, "save_average", False):
        parser.error("--save_average takes one --model_path (it writes the average into that run)")
    return paths


def describe_decoding(decode: DecodeConfig) -> str:
    """e.g. ``beam 5, lenpen 0.6``, ``greedy``, ``sampling (temperature 0.8, top-p 0.9), 4 samples``,
    ``MBR (chrf) over 16 samples (temperature 1)``, ``beam 5, lenpen 0.6, no repeated 3-grams``."""
    described = _describe(decode)
    return described + (f", no repeated {decode.no_repeat_ngram_size}-grams" if decode.no_repeat_ngram_size else "")


def _describe(decode: DecodeConfig) -> str:
    if decode.sample:
        settings = [f"temperature {decode.temperature:g}"]
        settings += [f"top-k {decode.top_k}"] * bool(decode.top_k)
        settings += [f"top-p {decode.top_p:g}"] * (decode.top_p < 1)
        settings += [f"epsilon {decode.epsilon:g}"] * bool(decode.epsilon)
        settings += [f"seed {decode.seed}"] * (decode.seed is not None)
        if decode.mbr:
            return f"MBR ({decode.mbr_utility}) over {decode.mbr} samples ({', '.join(settings)})"
        return f"sampling ({', '.join(settings)}), {decode.num_samples} sample{'s' * (decode.num_samples != 1)}"
    if decode.mbr:
        return f"MBR ({decode.mbr_utility}) over the {decode.mbr}-best of beam {decode.beam}, lenpen {decode.lenpen}"
    return "greedy" if decode.beam == 1 else f"beam {decode.beam}, lenpen {decode.lenpen}"
