"""The host machine: C allocator settings for training, the CPU's model and flags, and whether it computes bf16
natively."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
import platform
import sys
from pathlib import Path

log = logging.getLogger(__name__)

# glibc mallopt(3) parameters.
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4


def keep_freed_memory() -> bool:
    """Make glibc's malloc keep freed memory for reuse instead of returning it to the kernel.

    By default every allocation over the mmap threshold (at most 32 MiB: a batch's activations, the
    ``[N, V]`` logits) gets fresh pages from ``mmap`` and gives them back with ``munmap`` when freed, so
    each training step faults the same gigabytes in again: a 44-minute CPU run took 223 million minor
    page faults and 16% of its CPU time in the kernel. Serving large blocks from the heap and never
    trimming it (``M_MMAP_MAX=0``, ``M_TRIM_THRESHOLD`` at its maximum, as ``MALLOC_MMAP_MAX_=0
    MALLOC_TRIM_THRESHOLD_=...`` would) lets the next step reuse them. Returns False where mallopt
    is not available (not glibc).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = mallopt(M_MMAP_MAX, 0) == 1 and mallopt(M_TRIM_THRESHOLD, 2**31 - 1) == 1
    log.debug("malloc keeps freed memory: %s", ok)
    return ok


# oneDNN's primitive cache and ideep's cache of matmul/convolution setups: entries each, by default 1,024.
KERNEL_CACHES = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "8", "LRU_CACHE_CAPACITY": "8"}


def limit_kernel_caches() -> dict[str, str]:
    """Keep oneDNN's and ideep's per-shape kernel caches to a few entries, unless the environment sets them.

    Token-bucketed batches give nearly every step new matrix shapes, so the default caches (1,024 entries
    each) fill with kernels, reordered weights and buffers for shapes that rarely come back. On CPU with
    bf16 autocast (oneDNN's bf16 matmuls) that was most of a training run's memory: ``bench_small_rope``,
    60 steps, one thread, peak RSS 3,118 MB with the default caches and 1,435 MB with 8 entries each, at
    no cost in CPU time (147.6 against 154.6 user seconds). Must run before the process's first oneDNN
    kernel: both caches read their size once, when first used. Returns the values in effect.
    """
    for name, value in KERNEL_CACHES.items():
        os.environ.setdefault(name, value)
    return {name: os.environ[name] for name in KERNEL_CACHES}


def cpu_description(cpuinfo: Path | str = "/proc/cpuinfo") -> tuple[str, str]:
    """The CPU's model name and its instruction flags (``/proc/cpuinfo``'s first ones); the machine's architecture
    and ``""`` where that file does not say (not Linux)."""
    model, flags = "", ""
    try:
        text = Path(cpuinfo).read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if not model and key == "model name":
            model = value.strip()
        elif not flags and key in ("flags", "Features"):
            flags = " ".join(value.split())
    return model or platform.processor() or platform.machine(), flags


@functools.cache
def cpu_has_native_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """True when the CPU has bf16 arithmetic instructions (AVX512-BF16, AMX-BF16, or Arm BF16).

    Without them bf16 autocast on CPU emulates every product through fp32 conversions and is several
    times slower than fp32 (train.py: 3.4x on a 2-core AVX512 CPU without AVX512-BF16).
    """
    return bool(set(cpu_description(cpuinfo)[1].split()) & {"avx512_bf16", "amx_bf16", "bf16"})
