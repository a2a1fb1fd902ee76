"""Facts about the machine the diagnosis needs: matmul rate, memory limits, /dev/shm, TF32."""

from __future__ import annotations

import functools
import os
import time

import torch

from looptune.diagnose.model import Environment
from looptune.measure.timing import sync

__all__ = ["alloc_retries", "environment", "matmul_rate", "memory_limit"]


def matmul_rate(device: torch.device, n: int = 1024, reps: int = 5,
                threads: int | None = None, dtype: torch.dtype = torch.float32) -> float:
    """FLOP/s of an n x n matmul (fp32 unless ``dtype``) on ``device``, measured (best of
    ``reps``, after a warm-up).

    The yardstick for "compute" vs "overhead": a step whose FLOPs run far below this rate spends
    its time on something other than arithmetic. ``threads``: the CPU intra-op threads to measure
    with, the script's own (a script that calls ``torch.set_num_threads(1)`` is compared with
    one core's rate, not with this process's); None: the current setting.
    """
    now = torch.get_num_threads()
    threads = now if threads is None or device.type != "cpu" else threads
    if threads == now:
        return _matmul_rate(device, n, reps, threads, dtype)
    torch.set_num_threads(threads)
    try:
        return _matmul_rate(device, n, reps, threads, dtype)
    finally:
        torch.set_num_threads(now)


@functools.lru_cache(maxsize=8)
def _matmul_rate(device: torch.device, n: int, reps: int, threads: int,
                 dtype: torch.dtype = torch.float32) -> float:
    """:func:`matmul_rate` at the current thread count (``threads``: part of the cache key)."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    a @ b  # warm-up: library initialization, not arithmetic
    best = float("inf")
    for _ in range(reps):
        sync(device)
        t0 = time.perf_counter()
        a @ b
        sync(device)  # sync: the matmul must finish before the clock is read
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def memory_limit(device: torch.device) -> int | None:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def alloc_retries(device: torch.device) -> int:
    if device.type != "cuda":
        return 0
    return int(torch.cuda.memory_stats(device).get("num_alloc_retries", 0))


def environment(device: torch.device, threads: int | None = None) -> Environment:
    """Facts about where the script ran; ``threads``: its intra-op threads (default: torch's)."""
    cuda = device.type == "cuda"
    name = torch.cuda.get_device_name(device) if cuda else _cpu_name()
    major = torch.cuda.get_device_capability(device)[0] if cuda else None
    return Environment(
        cpu_count=os.cpu_count() or 1, device_type=device.type, device_name=name,
        device_total_bytes=memory_limit(device) if cuda else None, shm_bytes=_shm_bytes(),
        tf32_supported=None if major is None else major >= 8,
        tf32_enabled=torch.backends.cuda.matmul.allow_tf32 if cuda else None,
        threads=threads or torch.get_num_threads())


def _shm_bytes() -> int | None:
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return None
    return st.f_frsize * st.f_blocks


def _cpu_name() -> str:
    from looptune.measure.provenance import _cpu_name as name

    return name()
