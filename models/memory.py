"""The memory a config's model will take in training, estimated from the config before anything is built, and the
limit it is held to: the machine's memory, or less (``FR2EN_MEMORY_GIB``).

The estimate adds up, in bytes, float32 unless stated:

- the token embeddings (``tokenizer.vocab_size`` x ``model.d_model``; three tables when they are not tied) and the
  layers (attention projections, feed-forward networks, LayerNorms), exactly as ``models.transformer`` builds them;
- every positional encoding's own share, which it states on its class (``memory``, a ``Share``: its tables and
  buffers, its build and what one training forward computes, e.g. CoPE's ``[B, H, T, npos_max]`` scores), once per
  place it serves (each stack's input, each attention layer), for sequences of ``data.max_len`` tokens with their
  bos/eos, positions as ``model.augment`` draws them, and batches of ``data.max_tokens`` tokens;
- what a training step computes and keeps for the backward pass (activations): per token of a batch, each layer's
  inputs to its projections and feed-forward network and its attention weights, and one layer's gradients; the
  logits of the output layer (one chunk of them with ``train.fused_loss``, all of them without);
- the training state: each parameter's gradient, AdamW's two moments and its step's temporaries, four more
  copies of the parameters (``TRAINING_COPIES``).

It leaves out decoding (the decoder's cache, beams), whose size the input sets, not the config. ``check`` refuses,
in one line naming the setting that weighs most and its value, a config whose estimate exceeds the limit.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from models.positional import REGISTRY
from models.positional.base import F32, Share, Use
from models.transformer_config import TransformerConfig
from utils.schema import ConfigError

#: Copies of the parameters that training holds: the parameters, their gradients, AdamW's two moments, and one for
#: the temporaries of its step and the allocator's slack (measured: 4.5 GiB for 0.9 GiB of parameters).
TRAINING_COPIES = 5
#: Environment variable: the most memory, in GiB, a config may ask for (below the machine's).
LIMIT_ENV = "FR2EN_MEMORY_GIB"
GIB = 2**30
#: A pretrained Marian vocabulary is not known before it is loaded: the opus-mt models' are below this.
MARIAN_VOCAB = 65536
#: The usual value of each size that the parts of the model name (``most_unusual``): the base Transformer's.
USUAL = {"tokenizer.vocab_size": 8000, "model.d_model": 512, "model.d_ff": 2048, "model.encoder_layers": 6,
         "model.decoder_layers": 6, "data.max_tokens": 4096}
#: Logits per chunk of the fused output layer and loss (``models.loss.CHUNK_ELEMENTS``).
LOSS_CHUNK = 1 << 22


class Sized(Protocol):
    """What the estimate reads of a whole config (``utils.config.Config`` is one)."""

    @property
    def model(self) -> TransformerConfig: ...

    @property
    def data(self) -> Any: ...

    @property
    def tokenizer(self) -> Any: ...

    @property
    def train(self) -> Any: ...


@dataclass(frozen=True)
class Part:
    """One part of the estimate: ``what`` it is, for people, the ``key`` that sizes it most, and its ``share``
    (bytes) times ``count`` (the layers that each hold one)."""

    what: str
    key: str
    share: Share
    count: int = 1

    @property
    def held(self) -> int:
        """Bytes of parameters and buffers the built model holds for this part."""
        return self.count * (self.share.parameters + self.share.buffers)

    @property
    def total(self) -> int:
        """Bytes in training: the parameters' ``TRAINING_COPIES``, buffers, working memory."""
        s = self.share
        return self.count * (TRAINING_COPIES * s.parameters + s.buffers + s.working)


@dataclass(frozen=True)
class Estimate:
    """The parts of a config's model and its training, and the values of the keys that size them."""

    parts: tuple[Part, ...]
    values: dict[str, Any]

    @property
    def model(self) -> int:
        """Bytes of the model's parameters and buffers (a table that grows to the positions trained on, grown)."""
        return sum(p.held for p in self.parts)

    @property
    def total(self) -> int:
        """Bytes in training (``Part.total`` of every part)."""
        return sum(p.total for p in self.parts)

    def dominant(self) -> tuple[str, int, list[str]]:
        """(the key whose parts weigh most, their bytes in training, what they are)."""
        by_key: dict[str, tuple[int, list[str]]] = {}
        for p in self.parts:
            size, whats = by_key.get(p.key, (0, []))
            by_key[p.key] = (size + p.total, whats if p.what in whats else [*whats, p.what])
        key = max(by_key, key=lambda k: by_key[k][0])
        return key, *by_key[key]


def most_unusual(*keys: str, values: dict[str, Any]) -> str:
    """Of ``keys`` (each in ``USUAL``), the one furthest above its usual value: what makes a product of them large."""
    return max(keys, key=lambda k: values[k] / USUAL[k])


def training_use(m: TransformerConfig, max_len: int, max_tokens: int) -> Use:
    """What a training step gives the encodings: sequences of ``max_len`` tokens and bos/eos, positions as
    ``model.augment`` draws them, batches of ``max_tokens`` tokens."""
    length = max_len + 2
    positions, key = m.augment.positions(length)
    return Use(length=length, positions=positions, tokens=max(max_tokens, length), positions_key=key)


def activations(m: TransformerConfig, use: Use) -> int:
    """Bytes a training step's layers keep for the backward pass, and one layer's gradients, for ``use.tokens``
    tokens: per token, each encoder layer's ~14 ``d_model`` vectors (a decoder layer's ~22), its feed-forward
    hidden layer twice (and its dropout mask), its attention weights over ``use.length`` keys per head (the
    decoder's self and cross), and the embeddings'."""
    d, f, heads, t = m.d_model, m.d_ff, m.n_heads, use.length
    hidden = (2 + (m.activation_dropout > 0)) * f
    weights = (3 + (m.attention_dropout > 0)) * heads * t
    per_token = (m.encoder_layers * (14 * d + hidden + weights) + m.decoder_layers * (22 * d + hidden + 2 * weights)
                 + 2 * f + 4 * d + 2 * heads * t + 8 * d)
    return F32 * use.tokens * per_token


def estimate(m: TransformerConfig, vocab_size: int, max_len: int, max_tokens: int,
             fused_loss: bool = True, ema_decay: float | None = None) -> Estimate:
    """The memory the model of ``m`` (``vocab_size`` tokens) takes in training on batches of ``max_tokens`` tokens,
    sentences of at most ``max_len``, with the output layer's loss fused (``train.fused_loss``) or not, and a moving
    average of the weights (``train.ema_decay``: one more copy of the parameters) or not; nothing is built."""
    d, f, le, ld = m.d_model, m.d_ff, m.encoder_layers, m.decoder_layers
    values: dict[str, Any] = {
        "tokenizer.vocab_size": vocab_size, "data.max_len": max_len, "data.max_tokens": max_tokens,
        **{f"model.{k}": getattr(m, k) for k in ("d_model", "d_ff", "encoder_layers", "decoder_layers", "n_heads")}}
    table = F32 * vocab_size * d
    # tied: one table whose gradient comes from the lookup and from the output layer, two dense [V, D] added
    embeddings = Share(parameters=table * (1 if m.tie_embeddings else 3), working=2 * table)
    attention = (le + 2 * ld) * (4 * d * d + 4 * d)  # q, k, v and output projections with biases
    feed_forward = (le + ld) * (2 * d * f + f + d)
    norms = (2 * le + 3 * ld + 2) * 2 * d  # one per block, and each stack's last (pre-LN)
    parts = [
        Part("the token embeddings", most_unusual("tokenizer.vocab_size", "model.d_model", values=values), embeddings),
        Part("the layers", most_unusual("model.d_model", "model.d_ff", "model.encoder_layers", "model.decoder_layers",
                                    values=values), Share(parameters=F32 * (attention + feed_forward + norms))),
    ]
    use = training_use(m, max_len, max_tokens)
    values[use.positions_key] = _value(m, use.positions_key, values)
    rows = min(max(LOSS_CHUNK // vocab_size, 1), use.tokens) if fused_loss else use.tokens
    logits = 4 * F32 * vocab_size * rows  # logits, their log-softmax, its gradient, the logits' gradient
    parts += [
        Part("the activations of a batch", most_unusual("data.max_tokens", "model.d_model", "model.d_ff",
                                                    "model.encoder_layers", "model.decoder_layers", values=values),
             Share(working=activations(m, use))),
        Part("the logits", "tokenizer.vocab_size" if fused_loss else most_unusual("tokenizer.vocab_size",
                                                                            "data.max_tokens", values=values),
             Share(working=logits)),
    ]
    for stack in ("encoder", "decoder"):
        name = m.pe(stack, "input")
        parts.append(_part(m, REGISTRY["input"][name].memory(m, use), f"{name} ({stack} input)",
                           m.pe_key(stack, "input"), 1, values))
    places = [("encoder", m.pe_key("encoder", "attention"), "encoder self-attention", le),
              ("decoder", m.pe_key("decoder", "attention"), "decoder self-attention", ld),
              ("cross", "model.cross_attention_pe", "cross-attention", ld)]
    for kind, key, where, layers in places:
        name = _value(m, key, values)
        cls = REGISTRY["attention"][name]
        if cls is not None:
            parts.append(_part(m, cls.memory(m, kind, use), f"{name} in {where}", key, layers, values))
    if m.augment.method != "none":
        parts.append(_part(m, m.augment.memory(), f"model.augment.method={m.augment.method}",
                           "model.augment.method", 1, values))
    if ema_decay is not None:
        values["train.ema_decay"] = ema_decay
        parts.append(Part("the moving average of the weights", "train.ema_decay",
                          Share(buffers=sum(p.count * p.share.parameters for p in parts))))
    return Estimate(tuple(parts), values)


def _part(m: TransformerConfig, share: Share, what: str, chose: str, count: int, values: dict[str, Any]) -> Part:
    key = share.key or chose
    values.setdefault(key, _value(m, key, values))
    return Part(what, key, share, count)


def _value(m: TransformerConfig, key: str, values: dict[str, Any]) -> Any:
    """The value of ``key``: a ``model.*`` key read from ``m``, else one of ``values``."""
    if key in values or not key.startswith("model."):
        return values[key]
    value: Any = m
    for part in key.split(".")[1:]:
        value = getattr(value, part)
    return value


def estimate_config(cfg: Sized) -> Estimate:
    """``estimate`` of a whole config: its model, vocabulary, longest sentence and largest batch."""
    t, d = cfg.tokenizer, cfg.data
    vocab = max(t.vocab_size, MARIAN_VOCAB) if t.type == "marian" else t.vocab_size
    return estimate(cfg.model, vocab, d.max_len, max(d.max_tokens, d.valid_max_tokens or 0), cfg.train.fused_loss,
                    cfg.train.ema_decay)


def check(cfg: Sized) -> Estimate:
    """The config's estimate, or ConfigError (one line) naming the setting that weighs most, its value, and the
    limit, where the estimate exceeds ``memory_limit``."""
    est = estimate_config(cfg)
    limit, where = memory_limit(training_device(cfg))
    if est.total > limit:
        key, size, whats = est.dominant()
        raise ConfigError(f"{key}: {_show(est.values[key])} would need ~{human(size)} for {', '.join(whats)} "
                          f"(training in all: ~{human(est.total)}; {where})")
    return est


def human(size: float) -> str:
    """Bytes for people: ``18.6 GiB``, ``512.0 MiB``."""
    return f"{size / GIB:.1f} GiB" if size >= GIB / 10 else f"{size / 2**20:.1f} MiB"


def _show(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def training_device(cfg: Sized) -> str:
    """Where ``cfg`` trains: ``cuda`` for ``train.device`` cuda, or auto with a GPU present; else ``cpu``."""
    device = getattr(getattr(cfg, "train", None), "device", "cpu")
    return "cuda" if device == "cuda" or (device == "auto" and torch.cuda.is_available()) else "cpu"


def memory_limit(device: str = "cpu") -> tuple[int, str]:
    """(bytes, where they come from): the memory of the device that holds the training, the first GPU's on
    ``cuda``, else the machine's (its total, or its cgroup's limit where lower); or ``FR2EN_MEMORY_GIB`` GiB where
    that is lower. A bad ``FR2EN_MEMORY_GIB`` is a ConfigError (one line)."""
    size, where = gpu_memory() if device == "cuda" and torch.cuda.is_available() else machine_memory()
    raw = os.environ.get(LIMIT_ENV)
    if raw is None or not raw.strip():
        return size, where
    try:
        gib = float(raw)
    except ValueError:
        gib = math.nan
    if not (math.isfinite(gib) and gib > 0):
        raise ConfigError(f"{LIMIT_ENV}={raw!r}: expected a positive number of GiB")
    cap = int(min(gib * GIB, 2**62))
    return (cap, f"limit: {human(cap)} from {LIMIT_ENV}") if cap < size else (size, where)


def gpu_memory() -> tuple[int, str]:
    """(bytes, where they come from) of the first CUDA device."""
    props = torch.cuda.get_device_properties(0)
    return int(props.total_memory), f"this GPU ({props.name}): {human(props.total_memory)}"


@functools.lru_cache(maxsize=1)
def machine_memory() -> tuple[int, str]:
    """(bytes, where they come from) of the memory this process may use: the machine's total (``/proc/meminfo``),
    or its cgroup's limit (v2 ``memory.max``, v1 ``memory.limit_in_bytes``) where that is lower."""
    total = _meminfo_total()
    where = f"this machine: {human(total)} total"
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < total:
            return int(text), f"this machine's memory limit (cgroup): {human(int(text))}"
    return total, where


def _meminfo_total() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 2**62  # unknown: no machine limit, FR2EN_MEMORY_GIB still applies
