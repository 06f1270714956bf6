"""What the server accepts: its ``Limits`` (the ``--max-*`` and ``--request-timeout`` flags of ``inference.py
--serve``) and the sizes of a request measured against them before any of its work is queued.

Characters say little about the work a line asks for (one emoji is four byte tokens), so lines are measured in the
tokens the model reads: each line of a ``/translate`` request and the text and target of an ``/attention`` request
at most ``max_tokens``; a ``/translate`` request's source tokens times its beam, over its lines, at most
``max_beam_tokens``; the attention weights an ``/attention`` request computes (every layer and head, as
``visualize.py`` does; ``attention_size``) at most ``max_attention_weights``, which also bounds its answer (one
layer's weights, each head and their mean). Each refusal is a ``RequestError`` (413) whose line names the limit
and the flag that raises it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from tokenizer import Tokenizer
    from utils.config import Config, DecodeConfig
    from utils.serve.engine import Served


@dataclass
class Limits:
    """What one request may ask for, how requests are batched and queued, and what one connection may hold."""

    max_lines: int = 64  # lines in one /translate request
    max_chars: int = 2000  # characters in one line
    max_tokens: int = 256  # tokens of one line as the model reads it (a /translate line; /attention text or target)
    max_beam: int = 32
    max_beam_tokens: int = 16384  # one /translate request: source tokens x beam, summed over its lines
    max_attention_weights: int = 8_000_000  # attention weights one /attention request computes (``attention_size``)
    max_batch: int = 64  # sentences decoded together
    max_wait_ms: float = 2.0  # how long the worker waits for more requests to join a batch
    max_queue: int = 256  # requests waiting for the worker; one more is answered 503
    max_connections: int = 100  # connections open at once; one more is answered 503
    max_header_bytes: int = 65536  # the request line and headers of one request
    request_timeout: float = 10.0  # seconds for a request to arrive whole, and for a client to read its answer

    HELP: ClassVar[dict[str, str]] = {
        "max_lines": "most lines in one /translate request", "max_chars": "most characters in one line",
        "max_tokens": "most tokens in one line as the model reads it (a /translate line, an /attention text or "
                      "target)",
        "max_beam": "largest beam a request may ask for",
        "max_beam_tokens": "most source tokens x beam in one /translate request, summed over its lines",
        "max_attention_weights": "most attention weights one /attention request computes: heads x (encoder layers x "
                                 "S^2 + decoder layers x (T^2 + T x S)) for S source and T target tokens (the greedy "
                                 "translation counted at its longest)",
        "max_batch": "most sentences decoded together",
        "max_wait_ms": "milliseconds the worker waits for more requests to join a batch",
        "max_queue": "requests that may wait for the worker; more are answered 503",
        "max_connections": "connections open at once; one more is answered 503 and closed",
        "max_header_bytes": "bytes of one request's line and headers; more are answered 431",
        "request_timeout": "seconds a request has to arrive whole (else 408, connection closed), and a client to "
                           "read its answer"}
    #: The limits that are numbers with a fractional part, and their range (the others: integers >= their minimum).
    RANGES: ClassVar[dict[str, tuple[float, float]]] = {"max_wait_ms": (0.0, 1000.0), "request_timeout": (0.1, 3600.0)}
    MINIMUM: ClassVar[dict[str, int]] = {"max_header_bytes": 1024}

    def check(self) -> None:
        """ValueError, one line, for a limit that cannot work."""
        for name, value in vars(self).items():
            flag = f"--{name.replace('_', '-')}"
            if name in self.RANGES:
                low, high = self.RANGES[name]
                if not (isinstance(value, (int, float)) and low <= value <= high):  # NaN fails too
                    raise ValueError(f"{flag} must be in {low:g}..{high:g}, got {value}")
            elif value < self.MINIMUM.get(name, 1):
                raise ValueError(f"{flag} must be >= {self.MINIMUM.get(name, 1)}, got {value}")

    @property
    def max_body(self) -> int:
        """Bytes a request body may have: every line at its limit, JSON-escaped, and room for the options."""
        return 6 * self.max_lines * self.max_chars + 4096


class RequestError(Exception):
    """A request the server refuses: an HTTP status and one readable line."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


# ---------------------------------------------------------------------------------------------- sizes


def tokenizer_of(engine: Served) -> Tokenizer | None:
    """The tokenizer an engine reads sources with (a PyTorch run's, a CTranslate2 export's); None if it has none (a
    stand-in's names tokens at most)."""
    return engine.tokenizer if hasattr(engine.tokenizer, "encode_src") else None


def source_tokens(engine: Served, texts: list[str]) -> list[int]:
    """Tokens of each source as the model reads it (cleaned as the training data was, eos included). An engine
    without a tokenizer: the UTF-8 bytes plus one, which no subword tokenizer exceeds."""
    tokenizer = tokenizer_of(engine)
    if tokenizer is None:
        return [len(t.encode("utf-8")) + 1 for t in texts]
    from data.lines import clean_text

    return [len(ids) + 1 for ids in tokenizer.encode_src([clean_text(t) for t in texts])]


def target_tokens(engine: Served, text: str) -> int:
    """Tokens of a target as the decoder reads it (bos included); without a tokenizer as ``source_tokens``."""
    tokenizer = tokenizer_of(engine)
    return len(text.encode("utf-8")) + 1 if tokenizer is None else len(tokenizer.encode_tgt([text])[0]) + 1


def greedy_tokens(decode: DecodeConfig, source: int, max_length: int | None) -> int:
    """The most tokens (bos included) the greedy translation of a source of ``source`` tokens (eos included) may
    have: the decoder's cap ``a * (source - 1) + b`` (``models.decoding.max_lengths``), plus bos."""
    cap = max(1, math.floor(decode.max_len_a * (source - 1) + decode.max_len_b))
    return 1 + (cap if max_length is None else min(cap, max_length - 1))


def attention_size(cfg: Config, source: int, target: int) -> int:
    """Attention weights one sentence pair takes over every layer and head: encoder self-attention (S x S),
    decoder self-attention (T x T) and cross-attention (T x S), for ``source`` S and ``target`` T tokens."""
    m = cfg.model
    return m.n_heads * (m.encoder_layers * source**2 + m.decoder_layers * (target**2 + target * source))


def check_lines(counts: list[int], names: list[str], beam: int, limits: Limits) -> None:
    """413 for a line of more than ``max_tokens`` tokens, or a request over ``max_beam_tokens`` (its lines'
    ``counts`` summed, times ``beam``)."""
    for count, name in zip(counts, names, strict=True):
        if count > limits.max_tokens:
            raise RequestError(413, f"{name} has {count} tokens, over the limit of {limits.max_tokens} (--max-tokens): "
                                    "send a shorter sentence, or start the server with a larger --max-tokens")
    total = sum(counts)
    if total * beam > limits.max_beam_tokens:
        raise RequestError(413, f"this request asks for {total * beam} source tokens x beam ({len(counts)} line(s) of "
                                f"{total} tokens in all, beam {beam}), over the limit of {limits.max_beam_tokens} "
                                "(--max-beam-tokens): send fewer or shorter lines or a smaller beam, or start the "
                                "server with a larger --max-beam-tokens")


def check_attention(engine: Served, text: str, target: str | None, limits: Limits) -> None:
    """413 for an ``/attention`` text or target over ``max_tokens``, or a pair whose attention weights
    (``attention_size``; a greedy translation counted at its longest) exceed ``max_attention_weights``."""
    source = source_tokens(engine, [text])[0]
    check_lines([source], ["text"], 1, limits)
    if target is not None:
        tokens = target_tokens(engine, target)
        check_lines([tokens], ["target"], 1, limits)
        what = f"{source} source and {tokens} target tokens"
    else:
        tokens = greedy_tokens(engine.cfg.decode, source, engine.positions)
        what = f"{source} source tokens and a greedy translation of up to {tokens} tokens"
    size = attention_size(engine.cfg, source, tokens)
    if size > limits.max_attention_weights:
        raise RequestError(413, f"the attention of this sentence takes {size} weights ({what}), over the limit of "
                                f"{limits.max_attention_weights} (--max-attention-weights): send a shorter sentence"
                                f"{'' if target is not None else ' or a target'}, or start the server with a larger "
                                "--max-attention-weights")
