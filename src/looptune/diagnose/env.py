"""Facts about the machine the diagnosis needs: matmul rate, memory limits, /dev/shm, TF32."""

from __future__ import annotations

import contextlib
import functools
import os
import time
import warnings
from collections.abc import Iterator

import torch

from looptune.measure.records import Environment
from looptune.measure.timing import sync

__all__ = ["alloc_retries", "busy_processes", "cpu_capacity", "environment", "matmul_rate",
           "memory_limit"]


def matmul_rate(device: torch.device, *, n: int = 1024, reps: int = 5,
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


def _spin(n: int) -> None:
    acc = 0
    for i in range(n):
        acc += i & 7


def cpu_capacity(cores: int, rounds: int = 3, round_s: float = 0.05) -> float | None:
    """Cores of CPU work this machine delivers to ``cores`` busy processes right now.

    The same pure-Python loop runs alone, then while ``cores - 1`` forked copies spin beside
    it; if it slows by f, each process got 1/f of a core: ``cores / f`` (clipped to [1, cores]),
    median of ``rounds``. On a dedicated machine it is ~``cores``; on a VM whose host lends the
    vCPUs to neighbours it is lower (seen on a 2-vCPU VM: 1.0-1.9 within minutes), and
    DataLoader workers then gain less than the core count promises. None: one core, or no fork.
    """
    if cores < 2 or not hasattr(os, "fork"):
        return None
    t0, n = time.perf_counter(), 20_000
    _spin(n)
    n = max(n, int(n * round_s / max(time.perf_counter() - t0, 1e-6)))
    found = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        _spin(n)
        alone = time.perf_counter() - t0
        with busy_processes(cores - 1, seconds=10 * round_s + 1.0):
            t0 = time.perf_counter()
            _spin(n)
            together = time.perf_counter() - t0
        found.append(min(float(cores), max(1.0, cores * alone / together)))
    return sorted(found)[len(found) // 2]


@contextlib.contextmanager
def busy_processes(k: int, seconds: float) -> Iterator[list[int]]:
    """``k`` forked processes spinning pure Python beside this one (as busy DataLoader workers
    would), for at most ``seconds``; killed and reaped when the block ends. Needs os.fork.
    Yields their pids."""
    children: list[int] = []
    try:
        for _ in range(k):
            with warnings.catch_warnings():  # 3.12+: fork with threads warns; the child only spins
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
            if pid == 0:  # child: spin until the deadline, then leave without cleanup
                try:
                    deadline = time.monotonic() + seconds
                    while time.monotonic() < deadline:
                        _spin(10_000)
                finally:
                    os._exit(0)
            children.append(pid)
        time.sleep(0.005)  # let the children start spinning
        yield children
    finally:
        for pid in children:
            try:
                os.kill(pid, 9)
            finally:
                os.waitpid(pid, 0)


def environment(device: torch.device, threads: int | None = None,
                capacity: bool = False) -> Environment:
    """Facts about where the script ran; ``threads``: its intra-op threads (default: torch's);
    ``capacity``: also measure :func:`cpu_capacity` (~0.3 s)."""
    cuda = device.type == "cuda"
    name = torch.cuda.get_device_name(device) if cuda else _cpu_name()
    major = torch.cuda.get_device_capability(device)[0] if cuda else None
    return Environment(
        cpu_count=os.cpu_count() or 1, device_type=device.type, device_name=name,
        device_total_bytes=memory_limit(device) if cuda else None, shm_bytes=_shm_bytes(),
        tf32_supported=None if major is None else major >= 8,
        tf32_enabled=torch.backends.cuda.matmul.allow_tf32 if cuda else None,
        threads=threads or torch.get_num_threads(),
        cpu_capacity=cpu_capacity(os.cpu_count() or 1) if capacity and not cuda else None)


def _shm_bytes() -> int | None:
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return None
    return st.f_frsize * st.f_blocks


def _cpu_name() -> str:
    from looptune.measure.provenance import cpu_name

    return cpu_name()
