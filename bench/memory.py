"""Peak memory of one measurement: the CUDA allocator's peak, or on CPU the peak resident set size (VmHWM, reset
through ``/proc/self/clear_refs``; ``ru_maxrss`` where that is unavailable) less the file-backed pages (library
code) mapped meanwhile, each as growth over what was allocated when the meter started."""

from __future__ import annotations

import gc
import resource
import sys
from pathlib import Path
from typing import Any


def _proc_status_kib(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def _maxrss_bytes() -> int:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024


class MemoryMeter:
    """Peak memory growth from ``start()`` on: CUDA allocator peak, or the peak resident set size on CPU."""

    def __init__(self, device: Any) -> None:
        self.cuda = device.type == "cuda"
        self.file_growth = 0  # CPU: file-backed pages (library code) mapped since start(), not counted

    def start(self) -> None:
        import torch

        gc.collect()
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
            self.method = "cuda max_memory_allocated - memory_allocated at start"
            return
        try:
            Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
            hwm_reset = _proc_status_kib("VmHWM") is not None
        except OSError:
            hwm_reset = False
        rss = _proc_status_kib("VmRSS")
        self.file_base = _proc_status_kib("RssFile")
        if hwm_reset and rss is not None:
            self.base = rss * 1024
            self.method = "VmHWM (reset at start) - VmRSS at start - file-backed pages (library code) mapped since"
        else:
            self.base = rss * 1024 if rss is not None else _maxrss_bytes()
            self.method = "ru_maxrss - RSS at start - file-backed pages mapped since (peak not resettable: upper bound)"
        self.hwm_reset = hwm_reset

    def peak_bytes(self) -> int:
        import torch

        if self.cuda:
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated() - self.base
        peak = _proc_status_kib("VmHWM") * 1024 if self.hwm_reset else _maxrss_bytes()
        file_now = _proc_status_kib("RssFile")
        if self.file_base is not None and file_now is not None:
            self.file_growth = max(0, file_now - self.file_base) * 1024
        return peak - self.base - self.file_growth
