"""Shared command-line plumbing: logging setup, the --set option, and one-line errors for users."""

from __future__ import annotations

import argparse
import logging
import logging.handlers
import math
import os
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path

LOG_FORMAT = logging.Formatter("%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")


class StderrHandler(logging.StreamHandler):
    """A ``StreamHandler`` writing to whatever ``sys.stderr`` is when a record is logged, not to the stream it
    found at setup (as ``logging.lastResort`` does): logs follow a redirected or replaced standard error, and a
    stream closed since (a caller's capture) is never written to."""

    def __init__(self, level: int = logging.NOTSET) -> None:
        logging.Handler.__init__(self, level)

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value: object) -> None:  # StreamHandler.setStream: the current stderr is always the target
        pass


class StopError(RuntimeError):
    """A command stopped for a reason its message states in one line (e.g. training diverged)."""


#: The errors a user's input can cause, by the module that defines each: ``run_main`` prints them as one line. An
#: error can only be raised by a module the program imported, so they are looked up among the imported modules and
#: none is imported for it (a command that needs no torch, such as bench/sequential_design.py, starts without it).
USER_ERRORS = (("data.lines", "DataError"), ("models.positional.absolute", "PositionLimitError"),
               ("tokenizer.base", "TokenizerError"), ("utils.schema", "ConfigError"), ("utils.io", "PathError"),
               ("utils.run.checkpoint", "CheckpointError"), ("utils.translation.translate", "InputError"))


def user_errors() -> tuple[type[Exception], ...]:
    """``StopError`` and those of ``USER_ERRORS`` whose module is imported."""
    return (StopError, *(getattr(sys.modules[module], name) for module, name in USER_ERRORS if module in sys.modules))


#: The repository root: the project's scripts (train.py, test.py, ...) are named relative to it.
ROOT = Path(__file__).resolve().parents[1]


def set_flags(overrides: Iterable[str]) -> list[str]:
    """``["a=1", "b=2"]`` -> ``["--set", "a=1", "--set", "b=2"]``: overrides as the project's scripts take them."""
    return [x for o in overrides for x in ("--set", o)]


def project_command(script: str, *args: str | Path, overrides: Iterable[str] = (), python: str | None = None
                    ) -> list[str]:
    """``python SCRIPT ARGS --set O ...`` for one of the project's own scripts (train.py, test.py, inference.py),
    named relative to ``ROOT``: run it with ``cwd=ROOT``."""
    return [python or sys.executable, script, *map(str, args), *set_flags(overrides)]


def setup_logging(log_file: str | None = None, buffer: bool = False) -> None:
    """INFO logs to the current stderr (and ``log_file``). ``buffer``: also keep them until ``attach_log_file``
    names the file they belong in (train.py logs before its run directory exists)."""
    handlers: list[logging.Handler] = [StderrHandler()]
    if log_file:
        handlers.append(logging.FileHandler(log_file, encoding="utf-8"))
    if buffer:
        handlers.append(logging.handlers.MemoryHandler(capacity=1_000_000, flushLevel=logging.CRITICAL + 1))
    for h in handlers:
        h.setFormatter(LOG_FORMAT)
    logging.basicConfig(level=logging.INFO, handlers=handlers, force=True)
    for noisy in ("httpx", "huggingface_hub", "urllib3", "filelock", "ignite"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=".*torch.jit.*")


def attach_log_file(path: str) -> None:
    """Log to ``path`` from now on, starting with what ``setup_logging(buffer=True)`` kept."""
    root = logging.getLogger()
    file_handler = logging.FileHandler(path, encoding="utf-8")
    file_handler.setFormatter(LOG_FORMAT)
    for h in list(root.handlers):
        if isinstance(h, logging.handlers.MemoryHandler):
            h.setTarget(file_handler)
            h.flush()
            root.removeHandler(h)
    root.addHandler(file_handler)


def add_alias_args(parser: argparse.ArgumentParser, name: str, **kwargs) -> None:
    """Accept both --snake_case and --kebab-case spellings of an option."""
    flags = [f"--{name}"]
    if "_" in name:
        flags.append(f"--{name.replace('_', '-')}")
    parser.add_argument(*flags, dest=name, **kwargs)


def add_set_arg(parser: argparse.ArgumentParser,
                help: str = "override a config value, e.g. --set model.attention_pe=rope (repeatable)") -> None:
    """--set KEY=VALUE (repeatable) into ``args.overrides``, as every script and benchmark spells it."""
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help=help)


def decode_overrides(args: argparse.Namespace) -> list[str]:
    """``--set`` values followed by the decoding flags given (--beam, --lenpen, --batch_size, --nbest, --min_len_a,
    --min_len_b, --no_repeat_ngram_size), as config overrides: a flag the script does not declare or the user did
    not give changes nothing."""
    overrides = list(args.overrides)
    for key in ("beam", "lenpen", "batch_size", "nbest", "min_len_a", "min_len_b", "no_repeat_ngram_size"):
        value = getattr(args, key, None)
        if value is not None:
            overrides.append(f"decode.{key}={value}")
    return overrides


def add_average_args(parser: argparse.ArgumentParser) -> None:
    """--average N and --save_average (checkpoint averaging, see utils.run.checkpoint.average_checkpoints)."""
    parser.add_argument("--average", type=int, metavar="N",
                        help="use the parameters averaged over the run's last N periodic checkpoints")
    add_alias_args(parser, "save_average", action="store_true",
                   help="with --average: also save the average as checkpoints/average<N>_....pt")


def apply_average_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int | None:
    """Check --average/--save_average, save the average if asked; the N to pass to ``load_run``."""
    if args.average is not None and args.average < 1:
        parser.error(f"--average must be >= 1, got {args.average}")
    if args.save_average and not args.average:
        parser.error("--save_average needs --average N")
    if args.save_average:
        from utils.run.load import save_average

        path = save_average(args.model_path, args.average)
        print(f"saved the average of the last {args.average} checkpoints as {path}", file=sys.stderr)
    return args.average


def add_run_args(parser: argparse.ArgumentParser) -> None:
    """What every script decoding a trained run takes: --config, --model_path, --lenpen, --min_len_a and
    --min_len_b, --no_repeat_ngram_size, --batch_size, --average and --save_average, --device, --threads, --set."""
    parser.add_argument("--config", help="YAML config (default: the run directory's config.yaml)")
    add_alias_args(parser, "model_path", required=True, nargs="+", metavar="PATH",
                   help="checkpoint .pt or run directory; several, or a study variant's folder of seeds "
                        "(runs/study_NAME/runs/VARIANT): decoded together as an ensemble (the mean of their "
                        "next-token probabilities; one tokenizer)")
    parser.add_argument("--lenpen", type=float, help="GNMT length penalty alpha (default: decode.lenpen)")
    add_alias_args(parser, "min_len_a", type=finite_float(0.0, 1000.0), metavar="A",
                   help="output length floor: end-of-sentence is blocked until a hypothesis has A * source length "
                        "+ B tokens, at most the length cap (default: decode.min_len_a, 0: no floor)")
    add_alias_args(parser, "min_len_b", type=int, metavar="B",
                   help="the B of the output length floor (default: decode.min_len_b, 0)")
    add_alias_args(parser, "no_repeat_ngram_size", type=int, metavar="N",
                   help="never repeat an n-gram of N tokens in a translation (default: decode.no_repeat_ngram_size, "
                        "0: off)")
    add_alias_args(parser, "batch_size", type=int, help="sentences per batch")
    add_average_args(parser)
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                        help="where the model runs (default auto: a run's train.device, CUDA when present; a "
                             "CTranslate2 export: its GPU when CTranslate2 has one)")
    parser.add_argument("--threads", type=int, metavar="N",
                        help="CPU threads for decoding (default: $OMP_NUM_THREADS, else every core); 1 when other "
                        "work shares the cores: more threads than free cores stall each other")
    add_set_arg(parser)


def apply_threads(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Check --threads and apply it to this process and to the processes it starts (``OMP_NUM_THREADS``: a
    server's decoding process); the number of threads decoding uses on CPU."""
    if args.threads is not None and args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    import torch

    if args.threads is not None:
        torch.set_num_threads(args.threads)
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    return torch.get_num_threads()


def threads_note(threads: int | None) -> str:
    """``", N thread(s)"`` to follow a CPU speed, or ``""`` where no count applies (a GPU run)."""
    return f", {threads} thread{'s' * (threads != 1)}" if threads else ""


def run_main(main: Callable[[], int | None]) -> None:
    """Run ``main``; expected user errors (``user_errors()``) print one line 'error: ...' and exit 2, never a
    traceback."""
    if sys.stderr is None:  # closed (2>&-): messages must not land in standard output, print()'s fallback
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - for the life of the process
    try:
        sys.exit(main() or 0)
    except user_errors() as e:  # evaluated when an exception reaches it: the modules imported by then
        print(f"error: {one_line(str(e))}", file=sys.stderr)
        sys.exit(2)
    except subprocess.CalledProcessError as e:  # a benchmark's child command failed: it said why above
        print(f"error: {' '.join(map(str, e.cmd))[:200]} failed with exit code {e.returncode}", file=sys.stderr)
        sys.exit(2)
    except BrokenPipeError:  # the reader went away (| head): stop quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(141)
    except OSError as e:  # a path that cannot be created or written (exists as a file, no permission, disk full)
        print(f"error: {os_error_line(e)}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)


def require_stdout(what: str) -> None:
    """PathError, one line, if standard output is closed (``>&-``) while ``what`` goes there: nothing lost silently."""
    from utils.io import PathError

    if sys.stdout is None:
        raise PathError(f"standard output is closed, and {what} would be lost; redirect it (> FILE)")


def one_line(message: str) -> str:
    """The first line of a message (library errors sometimes run over several)."""
    return message.strip().splitlines()[0] if message.strip() else message


def os_error_line(e: OSError) -> str:
    """``cannot write runs/x (Not a directory)``-style line for a filesystem error."""
    what = e.strerror or type(e).__name__
    paths = " -> ".join(str(p) for p in (e.filename, e.filename2) if p is not None)
    return f"{paths}: {what}" if paths else one_line(str(e)) or what


def finite_float(low: float, high: float | None = None, open_ends: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number in ``low``..``high`` (above ``low`` without ``high``; strictly between
    them with ``open_ends``), refused in one line otherwise (no NaN, no inf)."""
    if open_ends:
        where = f"between {low:g} and {high:g}" if high is not None else f"above {low:g}"
    else:
        where = f"in {low:g}..{high:g}" if high is not None else f">= {low:g}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number {where}, got {text[:40]!r}") from None
        inside = (low < value and (high is None or value < high)) if open_ends else \
            (low <= value and (high is None or value <= high))
        if not (math.isfinite(value) and inside):
            raise argparse.ArgumentTypeError(f"must be a finite number {where}, got {text[:40]}")
        return value

    return parse
