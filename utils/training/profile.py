"""Where a training step's time goes: torch.profiler over a window of real steps, summed into phases.

``train.profile_steps = K`` (after ``train.profile_after`` steps of warm-up) records K optimizer steps of the
real loop with ``torch.profiler`` and writes, in the run directory's ``profile/``:

- ``phases.json``: milliseconds per step in each phase (rows of ``PHASES``) and their share of the step;
- the Chrome trace (``*.pt.trace.json``, ``tensorboard_trace_handler``'s format: Perfetto, chrome://tracing,
  or TensorBoard with the ``torch-tb-profiler`` plugin).

The loop marks its phases with ``record_function("phase:<name>")`` only while the profiler records. Forward
and backward time are split by operator: matrix products (``aten::mm``, ``addmm``, ``bmm``, ``linear``...),
attention (everything inside scaled dot-product attention and its backward), and the rest (softmax,
LayerNorm, dropout, additions, copies: elementwise; in the backward also the autograd engine's own time).
The forward's remainder, where no operator ran, is Python and dispatch; the remainder of the step (Ignite's
handlers, statistics) is "other".
Times are wall-clock on the training thread (an operator's CPU time includes waiting for its intra-op
threads), so the rows add up to the step.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule, tensorboard_trace_handler

from utils.io import atomic_write_text

MARK = "phase:"
#: The table's rows, in order.
PHASES = ("data", "forward: matmuls", "forward: attention", "forward: softmax, LayerNorm, elementwise",
          "forward: Python and dispatch", "loss", "backward: matmuls", "backward: attention",
          "backward: elementwise, autograd", "optimizer", "other")
#: Phases split by operator kind: the row of each kind, and where the phase's own time (no operator) goes.
SPLIT = {"forward": ("forward: matmuls", "forward: attention", "forward: softmax, LayerNorm, elementwise",
                     "forward: Python and dispatch"),
         "backward": ("backward: matmuls", "backward: attention", "backward: elementwise, autograd",
                      "backward: elementwise, autograd")}
MATMULS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
                     "aten::addmv", "aten::mv", "aten::dot", "aten::einsum", "mkldnn::_linear_pointwise"})
ATTENTION = ("scaled_dot_product", "scaleddotproduct")  # lower-cased: the ops, their backward and autograd nodes


def _ancestors(event: Any) -> Iterator[Any]:
    parent = event.cpu_parent
    while parent is not None:
        yield parent
        parent = parent.cpu_parent


def phase_times(events: Iterable[Any], steps: int) -> dict[str, float]:
    """Milliseconds per step in each row of ``PHASES`` from a profiler's events (``prof.events()``).

    ``steps``: the number of optimizer steps recorded. Each outermost ``phase:`` mark counts whole in its phase;
    within ``phase:forward`` and ``phase:backward`` the self times (µs) of the operators below go to their kind
    (``SPLIT``; see the module), and so do those of other threads during ``phase:backward`` (on CUDA the autograd
    engine runs the backward on a thread of its own). "other" is the recorded steps' time outside every mark."""
    events = list(events)
    steps_thread = {e.thread for e in events if e.name.startswith("ProfilerStep")}
    backward = [(e.time_range.start, e.time_range.end) for e in events
                if e.name == MARK + "backward" and e.thread in steps_thread]
    us = dict.fromkeys(PHASES, 0.0)
    step_us = 0.0
    for e in events:
        if e.name.startswith("ProfilerStep"):  # "ProfilerStep#N" in the trace, "ProfilerStep*" in events()
            step_us += e.cpu_time_total
            continue
        chain = [a.name for a in _ancestors(e)]
        marks = [n[len(MARK):] for n in chain if n.startswith(MARK)]
        if not marks and e.thread not in steps_thread and any(a <= e.time_range.start < b for a, b in backward):
            marks = ["backward"]  # the autograd engine's device thread (CUDA): the backward it runs for the step
        if e.name.startswith(MARK):
            if not marks:
                name = e.name[len(MARK):]
                us[SPLIT[name][3] if name in SPLIT else name] += e.cpu_time_total
            continue
        if not marks or marks[-1] not in SPLIT:
            continue  # counted whole in its phase (or outside every phase: "other")
        matmuls, attention, rest, own = SPLIT[marks[-1]]
        if any(k in n.lower() for n in [e.name, *chain] for k in ATTENTION):
            key = attention
        elif e.name in MATMULS:
            key = matmuls
        else:
            key = rest
        us[key] += e.self_cpu_time_total
        us[own] -= e.self_cpu_time_total
    us["other"] = step_us - sum(us[p] for p in PHASES if p != "other")
    return {p: v / 1e3 / max(steps, 1) for p, v in us.items()}


def phase_table(ms: dict[str, float]) -> str:
    """A Markdown table of ``phase_times``: ms per step and share of the step."""
    total = sum(ms.values())
    rows = [f"| {p} | {ms[p]:.1f} | {100 * ms[p] / total:.1f} % |" for p in PHASES if p in ms]
    return "\n".join(["| phase | ms / step | share |", "|---|---|---|", *rows, f"| step | {total:.1f} | 100 % |"])


class StepProfiler:
    """torch.profiler over optimizer steps ``after + 1 .. after + steps`` (``after`` >= 1) of the training loop.

    ``phase(name)`` is the loop's mark: ``record_function("phase:<name>")`` while recording, else nothing.
    When the window closes, ``profile/phases.json`` and the trace are written and the table is logged."""

    def __init__(self, out: Path, after: int, steps: int, accumulate: int, log: Any) -> None:
        self.out, self.steps, self.log = Path(out), steps, log
        self.recording = False
        self._data: Any = None
        self._prof = profile(
            activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else []),
            # iterations after*acc .. (after + steps)*acc - 1 recorded; the one before them warms the profiler up
            schedule=schedule(skip_first=after * accumulate - 1, wait=0, warmup=1, active=steps * accumulate,
                              repeat=1),
            on_trace_ready=self._written)
        self.result: dict[str, Any] | None = None

    def phase(self, name: str) -> contextlib.AbstractContextManager:
        return record_function(MARK + name) if self.recording else contextlib.nullcontext()

    def _update_recording(self) -> None:
        self.recording = self._prof.current_action.name.startswith(("WARMUP", "RECORD"))

    def start(self) -> None:
        self._prof.start()
        self._update_recording()

    def data_started(self) -> None:
        if self.recording:
            self._data = record_function(MARK + "data")
            self._data.__enter__()

    def data_done(self) -> None:
        if self._data is not None:
            self._data.__exit__(None, None, None)
            self._data = None

    def step(self) -> None:
        """After each iteration: advance the profiler's schedule."""
        if self.result is not None:
            return
        self._prof.step()
        self._update_recording()

    def stop(self) -> None:
        """At the end of training; a window the run did not finish is dropped (nothing written)."""
        self.data_done()
        if self.result is None:
            self._prof.on_trace_ready = None
        self._prof.stop()
        self.recording = False

    def _written(self, prof: Any) -> None:
        tensorboard_trace_handler(str(self.out))(prof)
        ms = phase_times(prof.events(), self.steps)
        self.result = {"steps": self.steps, "ms_per_step": ms, "phases": list(PHASES)}
        atomic_write_text(self.out / "phases.json", json.dumps(self.result, indent=1) + "\n")
        self.log.info("profile of %d steps (%s):\n%s", self.steps, self.out, phase_table(ms))
