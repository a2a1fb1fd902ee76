"""The ``memory`` bottleneck (near the device limit, allocator retries, out of memory) and its
fixes. It wins over the timing verdict, whose speedup remedies still follow the fixes."""

from __future__ import annotations

from typing import Any

from looptune.diagnose.rules.profile import StepProfile, gib
from looptune.diagnose.rules.records import Remedy
from looptune.measure.records import Measurements

__all__ = ["MEM_FRACTION", "mem_fraction", "memory_evidence", "memory_remedies"]

# peak / device limit where the CUDA caching allocator starts failing cudaMalloc, flushing its
# cache and retrying (a full sync each time); the last few % go to fragmentation. Assumed, not
# measured.
MEM_FRACTION = 0.92


def mem_fraction(m: Measurements) -> float | None:
    """Peak memory / the device's limit; None when either is unknown."""
    if m.peak_mem_bytes is None or not m.mem_limit_bytes:
        return None
    return m.peak_mem_bytes / m.mem_limit_bytes


def memory_evidence(m: Measurements, p: StepProfile) -> dict[str, Any] | None:
    """The memory verdict's evidence, or None when memory is not the bottleneck."""
    frac, causes = mem_fraction(m), []
    if m.oom:
        causes.append("an out-of-memory error stopped the script")
    if m.alloc_retries > 0:
        causes.append(f"{m.alloc_retries} caching-allocator retries (cudaMalloc failed, cache "
                      "flushed, a full sync each time)")
    # GPU only: on the CPU the limit is physical RAM and the kernel swaps before it fails
    if p.on_cuda and frac is not None and frac >= MEM_FRACTION:
        causes.append(f"peak {gib(m.peak_mem_bytes)} is {frac:.1%} of the device's "
                      f"{gib(m.mem_limit_bytes)} (>= {MEM_FRACTION:.0%})")
    if not causes:
        return None
    return {"rule": "memory", "reason": "; ".join(causes), "oom": m.oom,
            "alloc_retries": m.alloc_retries, "mem_threshold": MEM_FRACTION}


def memory_remedies(m: Measurements, p: StepProfile) -> list[Remedy]:
    """Fixes, not speedups (expected 1.0): they go first when memory is the bottleneck."""
    b = m.loaders[0].batch_size if m.loaders else None
    size = f"batch_size {b} -> {b // 2}" if b and b > 1 else "halve the batch"
    out = [Remedy(action=f"{size} with gradient accumulation (looptune step.accumulate=2)",
                  expected_speedup=1.0, kind="memory", reason=(
                      f"{memory_evidence(m, p)['reason']}; the same effective batch at about "
                      "half the activation memory. torch.cuda.empty_cache() is not a fix: it "
                      "returns cached blocks to the driver but does not lower the peak"))]
    if p.on_cuda and m.alloc_retries > 0:
        out.append(Remedy(action="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
                          expected_speedup=1.0, kind="memory", reason=(
                              f"{m.alloc_retries} allocator retries, each a cache flush and a "
                              "full sync; expandable segments cut the fragmentation behind them")))
    return out
