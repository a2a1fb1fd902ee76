"""Timers that synchronize the device before reading the clock.

CUDA kernels run asynchronously: reading ``time.perf_counter()`` right after launching work measures
the launch, not the work. Every clock read here first waits for the device.
"""

from __future__ import annotations

import time

import torch

__all__ = ["sync", "Stopwatch"]


def sync(device: torch.device) -> None:
    """Block the host until all queued work on ``device`` is done (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # sync: waits for every kernel queued on the device


class Stopwatch:
    """Measures wall time of a region that ran on ``device``.

    Example:
        >>> sw = Stopwatch(torch.device("cpu")); sw.start(); _ = sum(range(10)); s = sw.stop()
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._t0: float | None = None

    def start(self) -> None:
        sync(self.device)  # sync: earlier queued work must not count against this region
        self._t0 = time.perf_counter()

    def stop(self) -> float:
        """Return seconds since :meth:`start`, after the device finished the region's work."""
        if self._t0 is None:
            raise RuntimeError("Stopwatch.stop() called before start()")
        sync(self.device)  # sync: the region's kernels must finish before we read the clock
        elapsed, self._t0 = time.perf_counter() - self._t0, None
        return elapsed
