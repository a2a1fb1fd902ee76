"""The measurement window: what each step the probes' hook sees is for: warm-up, one FLOP-counted step, a profiler window (for
--trace, and on CUDA for the kernels' busy time), then the measured steps; stop when done."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from looptune.measure.memory import PeakMemory
from looptune.measure.probes import StopScript

__all__ = ["TRACE_STEPS", "UNBOUNDED", "MeasurementWindow"]

UNBOUNDED = 10**12  # "steps" when only seconds bound the measurement
TRACE_STEPS = 3  # steps inside the torch.profiler window (excluded from the measurement)
# On CUDA the same window always runs: kernel time per step (the device's busy time) can only be
# read from the profiler's CUPTI records; host clocks see launches, not kernels.


@dataclass(kw_only=True)
class MeasurementWindow:
    """Decides, at each step boundary, what the next steps are for: warm-up, FLOP count,
    profiler trace, measurement; and stops the script when enough was measured."""

    warmup: int
    steps: int  # a very large number when only seconds bound the measurement
    seconds: float | None
    trace_dir: Path | None
    device: torch.device
    flops: float | None = None
    ops: frozenset[str] = frozenset()  # aten op names of the FLOP-counted step
    device_busy_s: float | None = None  # CUDA: kernel time per step, from the profiler window
    first_measured: int | None = None  # 0-based index of the first measured sample
    stopped: str = "script_ended"
    done: bool = False  # enough was measured; later steps (a script catching StopScript) ignored
    trace: dict[str, Any] | None = None
    memory: PeakMemory | None = None
    captured: list[Any] = field(default_factory=list)  # the FLOP step's outermost module calls
    on_captured: Callable[[list[Any]], None] | None = None  # called with them, once captured
    on_measuring: Callable[[], None] | None = None  # called when the measured steps begin
    _flop_mode: Any = None
    _capture: Any = None
    _op_names: Any = None
    _profiler: Any = None
    _t_measure: float = 0.0
    _exit_stack: list[Callable[[], None]] = field(default_factory=list)

    def begin(self) -> None:
        """Before the script runs: with no warm-up, step 1 is the FLOP-counted one."""
        if self.warmup == 0:
            self._start_flops()

    def on_step(self, n: int) -> None:
        w = self.warmup
        if n == w:  # the next step runs under FlopCounterMode (slower: not measured)
            self._start_flops()
        elif n == w + 1:
            self._stop_flops()
            self._start_trace()
        if n == w + 1 + self._trace_steps():
            self._stop_trace()
            self.first_measured, self._t_measure = n, time.perf_counter()
            if self.on_measuring is not None:
                self.on_measuring()
            self.memory = PeakMemory(self.device)
            self.memory.start()
        self._maybe_stop(n)

    def restart(self) -> None:
        """Count the steps from the start again (the step boundaries changed: the probes
        found that what they counted were micro-batches); before any step was measured."""
        self.close()
        self.flops, self.ops, self.device_busy_s, self.captured = None, frozenset(), None, []
        self.first_measured, self.memory, self.trace = None, None, None
        self.begin()

    def end(self, reason: str) -> None:
        """How the script ended, unless the measurement had already ended it."""
        if not self.done:
            self.stopped = reason

    def _trace_steps(self) -> int:
        return TRACE_STEPS if self.trace_dir is not None or self.device.type == "cuda" else 0

    def _maybe_stop(self, n: int) -> None:
        if self.first_measured is None:
            return
        if self.done or n - self.first_measured >= self.steps:
            self.stopped, self.done = self.stopped if self.done else "steps", True
            raise StopScript  # again, if the script caught it and went on
        if self.seconds is not None and time.perf_counter() - self._t_measure >= self.seconds:
            self.stopped, self.done = "seconds", True
            raise StopScript

    def _start_flops(self) -> None:
        from torch.utils.flop_counter import FlopCounterMode

        from looptune.diagnose.scaling import ModelCapture

        self._flop_mode = FlopCounterMode(display=False)
        self._flop_mode.__enter__()
        self._op_names = _OpNames()
        self._op_names.__enter__()
        self._capture = ModelCapture().__enter__()  # the model and its inputs, for the replay

    def _stop_flops(self) -> None:
        if self._capture is not None:
            self._capture.__exit__(None, None, None)
            self.captured, self._capture = self._capture.calls, None
            if self.on_captured is not None:
                self.on_captured(self.captured)
        if self._op_names is not None:
            self._op_names.__exit__(None, None, None)
            self.ops, self._op_names = frozenset(self._op_names.names), None
        if self._flop_mode is not None:
            self._flop_mode.__exit__(None, None, None)
            self.flops = float(self._flop_mode.get_total_flops()) or None
            self._flop_mode = None

    def _start_trace(self) -> None:
        if self._trace_steps() == 0:
            return
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        self._profiler = profile(activities=activities, record_shapes=True)
        self._profiler.start()

    def _stop_trace(self) -> None:
        if self._profiler is None:
            return
        self._profiler.stop()
        averages = self._profiler.key_averages()
        if self.device.type == "cuda":
            self.device_busy_s = _kernel_seconds(self._profiler.events()) / TRACE_STEPS
        if self.trace_dir is None:
            self._profiler = None
            return
        self.trace_dir.mkdir(parents=True, exist_ok=True)
        path = self.trace_dir / "trace.json"
        self._profiler.export_chrome_trace(str(path))
        key = "self_device_time_total" if self.device.type == "cuda" else "self_cpu_time_total"
        table = averages.table(sort_by=key, row_limit=15)
        self.trace = {"chrome_trace": str(path), "steps": TRACE_STEPS, "top_ops": table,
                      "open_with": "https://ui.perfetto.dev or chrome://tracing"}
        self._profiler = None

    def close(self) -> None:
        """Leave no FlopCounterMode or profiler running if the script ended inside a window."""
        self._stop_flops()
        if self._profiler is not None:
            self._profiler.stop()
            self._profiler = None


class _OpNames(TorchDispatchMode):
    """Records the name of every aten op dispatched (e.g. which attention kernel ran)."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.add(func._overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def _kernel_seconds(events) -> float:
    """Device time of the kernels in a profiler window, each counted once: device-side events
    only (not the CPU ops that launched them), no annotations, no copies (those are the h2d phase)."""
    from torch.autograd import DeviceType

    total_us = 0.0
    for e in events:
        if e.device_type != DeviceType.CUDA or getattr(e, "is_user_annotation", False):
            continue
        if "memcpy" in e.name.lower() or "memset" in e.name.lower():
            continue
        total_us += e.time_range.elapsed_us()
    return total_us / 1e6
