"""Peak memory of a run: the CUDA allocator's peak on a GPU, the process's peak RSS on a CPU.

The two are different quantities, so every reading carries its ``kind``; a reading that cannot be
taken is ``None`` (shown as n/a), never a guess.
"""

from __future__ import annotations

import resource
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = ["MemoryReading", "PeakMemory"]

_CLEAR_REFS = Path("/proc/self/clear_refs")
_STATUS = Path("/proc/self/status")


@dataclass(frozen=True)
class MemoryReading:
    peak_bytes: int | None  # None when it could not be measured
    kind: str  # "cuda_max_allocated" | "cpu_peak_rss" | "cpu_peak_rss_since_start" | "unavailable"


class PeakMemory:
    """Tracks peak memory between :meth:`start` and :meth:`read`.

    On Linux the process's peak RSS (VmHWM) is reset at start by writing "5" to
    ``/proc/self/clear_refs``; where that is not allowed the reading is the peak since the process
    started and its kind says so.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._rss_reset = False

    def start(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        try:
            _CLEAR_REFS.write_text("5")
            self._rss_reset = True
        except OSError:
            self._rss_reset = False

    def read(self) -> MemoryReading:
        if self.device.type == "cuda":
            return MemoryReading(torch.cuda.max_memory_allocated(self.device), "cuda_max_allocated")
        hwm = _vm_hwm_bytes()
        if hwm is not None and self._rss_reset:
            return MemoryReading(hwm, "cpu_peak_rss")
        if sys.platform.startswith("linux"):  # ru_maxrss is KiB on Linux, bytes on macOS
            return MemoryReading(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                                 "cpu_peak_rss_since_start")
        if sys.platform == "darwin":
            return MemoryReading(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                                 "cpu_peak_rss_since_start")
        return MemoryReading(None, "unavailable")


def _vm_hwm_bytes() -> int | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # reported in kB
    except (OSError, ValueError, IndexError):
        return None
    return None
