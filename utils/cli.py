"""Shared command-line plumbing: logging setup, the --set option, and one-line errors for users."""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from collections.abc import Callable


def setup_logging(log_file: str | None = None) -> None:
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file:
        handlers.append(logging.FileHandler(log_file, encoding="utf-8"))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S",
                        handlers=handlers, force=True)
    for noisy in ("httpx", "huggingface_hub", "datasets", "urllib3", "filelock", "ignite"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=".*torch.jit.*")


def add_alias_args(parser: argparse.ArgumentParser, name: str, **kwargs) -> None:
    """Accept both --snake_case and --kebab-case spellings of an option."""
    flags = [f"--{name}"]
    if "_" in name:
        flags.append(f"--{name.replace('_', '-')}")
    parser.add_argument(*flags, dest=name, **kwargs)


def add_set_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config value, e.g. --set model.attention_pe=rope (repeatable)")


def run_main(main: Callable[[], int | None]) -> None:
    """Run ``main``; expected user errors print one line 'error: ...' and exit 2, never a traceback."""
    from data.sources import DataError
    from models.positional import PositionLimitError
    from tokenizer import TokenizerError
    from utils.checkpoint import CheckpointError
    from utils.config import ConfigError
    from utils.translate import InputError

    try:
        sys.exit(main() or 0)
    except (ConfigError, CheckpointError, DataError, TokenizerError, InputError, PositionLimitError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
