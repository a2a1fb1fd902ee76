"""Verdict rules: Measurements -> Verdict (bottleneck, pre-flight findings, ranked remedies).

Pure and deterministic (no torch, no clocks), so a recorded run can be re-diagnosed and every rule
is tested with hand-built numbers. Each decision carries its numbers (evidence, messages, reasons).
Expected speedups are Amdahl bounds from the measured shares: removing a fraction ``f`` of a phase
taking a share ``s`` of the step bounds the step at ``1 / (1 - s*f)`` times faster.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import median
from typing import Any

from looptune.diagnose.batch_rule import batch_remedy, batch_verdict, scaled_step
from looptune.diagnose.cpu_compute import bf16_action, cpu_compute_remedies
from looptune.diagnose.findings import REMEDY_SHARE, _gib, _mib, _overhead_share
from looptune.diagnose.findings import findings as _findings
from looptune.diagnose.update_rule import (
    OPTIMIZER_PARTS, optimizer_s, update_memory_s, update_remedies)
from looptune.diagnose.workers_rule import workers_remedy
from looptune.measure.records import PHASES, Measurements, StepSample
from looptune.diagnose.rules.records import Remedy, Verdict
from looptune.errors import MeasurementError

__all__ = ["amdahl", "analyze", "render_breakdown"]

# A loader phase must own this much of the step *and* be its largest phase to be the bottleneck:
# below that, the step's own work still sets the pace once the wait is hidden.
LOADER_SHARE = 0.30
# peak / device limit where the CUDA caching allocator starts failing cudaMalloc, flushing its
# cache and retrying (a full sync each time); the last few % go to fragmentation.
MEM_FRACTION = 0.92
# achieved / large-matmul FLOP rate from which the arithmetic dominates: a real step mixes
# elementwise kernels and small GEMMs, so even a clean one seldom passes ~0.5 of that rate.
COMPUTE_RATIO = 0.35
# without a FLOP count: sync + unattributed host time this large is overhead, and so is >= 1 sync
# per step taking SYNC_SHARE
OVERHEAD_SHARE, SYNC_SHARE = 0.30, 0.10
SYNC_REMEDY_SHARE = 0.05  # dropping .item() is a one-line fix, so a smaller share is worth naming
MIN_SPEEDUP = 1.05  # below this a remedy is lost in run-to-run noise
# a larger batch changes the training and its bound is per sample, not per result: more samples
# are needed to the same loss (a regression loop measured 3.9x per sample at 4x the batch and
# took 1.9x as long to its loss target). It ranks above a remedy that keeps the training only when
# its bound is this much larger. (bf16's bound is per step over the same steps; --verify checks
# that the loss still follows, as for every rerun.)
PER_SAMPLE_DISCOUNT = {"batch": 1.25}
MAX_REMOVED = 0.99  # cap s*f: a bound beyond 100x says nothing more, and inf is not JSON


@dataclass(frozen=True)
class _Profile:
    """What every rule reads: median seconds per phase, shares, per-step means, the device."""

    phase_s: dict[str, float]
    shares: dict[str, float]
    step_s: float
    part_s: dict[str, float]  # median seconds per step part ("forward", "optimizer", ...)
    syncs_per_step: float
    pageable_bytes_per_step: float
    h2d_bytes_per_step: float
    on_cuda: bool


def analyze(m: Measurements) -> Verdict:
    """Turn what the probes measured into a bottleneck, findings and ranked remedies.

    Args:
        m: the measured (post-warm-up) steps, loaders, environment and memory numbers.

    Returns:
        A :class:`Verdict`; ``shares`` sum to exactly 1.0; ``remedies`` are ranked: memory
        fixes first when the bottleneck is memory, then the largest expected speedup first.

    Raises:
        MeasurementError: no steps, or step times that are negative, not finite or all zero.

    Example:
        >>> from looptune.measure.records import Measurements, StepSample
        >>> v = analyze(Measurements(steps=[StepSample(step_s=0.1, data_wait_s=0.062)],
        ...                          warmup_steps=0))
        >>> v.bottleneck, v.shares["data_wait"], v.evidence["speedup_if_removed"]
        ('data_loading', 0.62, 2.63)
    """
    p = _profile(m)
    timing, evidence = _timing_bottleneck(m, p)
    bottleneck, memory_ev = timing, _memory_evidence(m, p)
    if memory_ev is not None:  # memory wins; the timing verdict still picks the speedup remedies
        evidence = {**memory_ev, "timing_bottleneck": timing, "timing": evidence}
        bottleneck = "memory"
    parts = _step_parts(p)
    return Verdict(
        bottleneck=bottleneck, shares=dict(p.shares), step_ms=round(p.step_s * 1e3, 4),
        phase_ms={k: round(v * 1e3, 4) for k, v in p.phase_s.items()},
        evidence={**_common_evidence(m, p), **evidence},
        findings=_findings(m, p, bottleneck), remedies=_remedies(m, p, bottleneck, timing),
        part_ms={k: round(v * 1e3, 4) for k, v in parts.items()},
        part_shares={k: round(v / p.step_s, 4) if p.step_s > 0 else 0.0
                     for k, v in parts.items()})


def _step_parts(p: _Profile) -> dict[str, float]:
    """forward, backward, optimizer (its parts together) and each optimizer part as
    "optimizer.<part>" ("optimizer.update" for the step itself), seconds per step."""
    out = {k: p.part_s[k] for k in ("forward", "backward") if k in p.part_s}
    mine = [k for k in OPTIMIZER_PARTS if k in p.part_s]
    if mine:
        out["optimizer"] = optimizer_s(p.part_s)
        out.update({f"optimizer.{'update' if k == 'optimizer' else k}": p.part_s[k]
                    for k in mine})
    return out


def amdahl(share: float, fraction: float = 1.0) -> float:
    """Whole-step speedup bound from removing ``fraction`` of a phase taking ``share`` of it."""
    return 1.0 / (1.0 - min(MAX_REMOVED, max(0.0, share * fraction)))


def render_breakdown(v: Verdict) -> list[tuple[str, float, float]]:
    """(phase, median ms, share) rows in PHASES order, for a report to render."""
    return [(k, v.phase_ms[k], v.shares[k]) for k in PHASES]


def _split(s: StepSample) -> dict[str, float]:
    """One step's phases in seconds (they sum to step_s unless probes overlapped)."""
    remaining = max(0.0, s.step_s - s.data_wait_s - s.h2d_s - s.sync_s)
    # CUDA: the GPU's busy time is the arithmetic; host time past it is launch/dispatch overhead.
    # CPU: the arithmetic runs on the host thread, so all the remaining time is compute.
    compute = remaining if s.device_busy_s is None else min(s.device_busy_s, remaining)
    return {"data_wait": s.data_wait_s, "host_to_device": s.h2d_s, "sync": s.sync_s,
            "compute": compute, "other": max(0.0, remaining - compute)}


def _check_steps(steps: list[StepSample]) -> None:
    if not steps:
        raise MeasurementError("no measured steps: the verdict needs at least one optimizer step "
                               "after warm-up. Measure more steps or use fewer warm-up steps.")
    for i, s in enumerate(steps):
        times = (s.step_s, s.data_wait_s, s.h2d_s, s.sync_s)
        if not all(math.isfinite(t) and t >= 0 for t in times):
            raise MeasurementError(f"step {i} has times {times!r} (step, data wait, h2d, sync): "
                                   "each must be finite seconds >= 0; the probe clocks are broken.")


def _profile(m: Measurements) -> _Profile:
    _check_steps(m.steps)
    splits = [_split(s) for s in m.steps]
    # medians, not means: one stall (GC, checkpoint, epoch start) must not move the verdict
    phase_s = {k: median(sp[k] for sp in splits) for k in PHASES}
    if sum(phase_s.values()) <= 0:
        raise MeasurementError(f"all {len(m.steps)} measured steps took 0 s: the step clock "
                               "never advanced, so there is nothing to split into phases.")
    n = len(m.steps)  # means below: one .item() every 10 steps is 0.1/step, a median says 0
    # a part some steps ran and others did not (a scheduler stepped per epoch) counts 0 there
    names = {k for s in m.steps for k in s.parts_s}
    part_s = {k: median(s.parts_s.get(k, 0.0) for s in m.steps) for k in sorted(names)}
    return _Profile(
        phase_s=phase_s, shares=_rounded_shares(phase_s), step_s=median(s.step_s for s in m.steps),
        part_s=part_s,
        syncs_per_step=sum(s.syncs for s in m.steps) / n,
        pageable_bytes_per_step=sum(s.h2d_pageable_bytes for s in m.steps) / n,
        h2d_bytes_per_step=sum(s.h2d_bytes for s in m.steps) / n, on_cuda=_on_cuda(m))


def _rounded_shares(phase_s: dict[str, float]) -> dict[str, float]:
    """Shares to 4 decimals summing to exactly 1.0; the rounding error goes to the largest."""
    total = sum(phase_s.values())
    units = {k: round(phase_s[k] / total * 10_000) for k in PHASES}
    units[_largest(units)] += 10_000 - sum(units.values())
    shares = {k: units[k] / 10_000 for k in PHASES}
    if sum(shares.values()) != 1.0:  # k/10000 is no exact binary fraction: the last non-zero
        # term in sum() order absorbs the error (an ulp or two, invisible at 4 decimals)
        last = [k for k in PHASES if units[k]][-1]
        shares[last] = 1.0 - sum(shares[k] for k in PHASES[:PHASES.index(last)])
    return shares


def _largest(values: dict[str, Any]) -> str:
    return max(PHASES, key=lambda k: values[k])  # ties: the first in PHASES, so deterministic


def _on_cuda(m: Measurements) -> bool:
    if m.env is not None:
        return m.env.device_type == "cuda"
    return any(s.device_busy_s is not None for s in m.steps)


def _common_evidence(m: Measurements, p: _Profile) -> dict[str, Any]:
    ev = {"steps": len(m.steps), "warmup_steps": m.warmup_steps,
          "device": "cuda" if p.on_cuda else "cpu",
          "largest_phase": _largest(p.shares), "syncs_per_step": round(p.syncs_per_step, 4)}
    return ev if _mem_fraction(m) is None else {**ev, "mem_fraction": round(_mem_fraction(m), 4)}


def _mem_fraction(m: Measurements) -> float | None:
    if m.peak_mem_bytes is None or not m.mem_limit_bytes:
        return None
    return m.peak_mem_bytes / m.mem_limit_bytes


def _memory_evidence(m: Measurements, p: _Profile) -> dict[str, Any] | None:
    frac, causes = _mem_fraction(m), []
    if m.oom:
        causes.append("an out-of-memory error stopped the script")
    if m.alloc_retries > 0:
        causes.append(f"{m.alloc_retries} caching-allocator retries (cudaMalloc failed, cache "
                      "flushed, a full sync each time)")
    # GPU only: on the CPU the limit is physical RAM and the kernel swaps before it fails
    if p.on_cuda and frac is not None and frac >= MEM_FRACTION:
        causes.append(f"peak {_gib(m.peak_mem_bytes)} is {frac:.1%} of the device's "
                      f"{_gib(m.mem_limit_bytes)} (>= {MEM_FRACTION:.0%})")
    if not causes:
        return None
    return {"rule": "memory", "reason": "; ".join(causes), "oom": m.oom,
            "alloc_retries": m.alloc_retries, "mem_threshold": MEM_FRACTION}


def _timing_bottleneck(m: Measurements, p: _Profile) -> tuple[str, dict[str, Any]]:
    sh, largest = p.shares, _largest(p.shares)
    for phase, name in (("data_wait", "data_loading"), ("host_to_device", "host_to_device")):
        if sh[phase] >= LOADER_SHARE and largest == phase:
            return name, _loader_evidence(p, phase, name)
    big = ", ".join(f"{k} {sh[k]:.1%}" for k in ("data_wait", "host_to_device")
                    if sh[k] >= LOADER_SHARE)
    contested = (f"{big} is >= {LOADER_SHARE:.0%} but {largest} ({sh[largest]:.1%}) is larger, "
                 "so the largest phase decides") if big else None
    if contested and largest in ("sync", "other"):  # host syncs/launches: overhead by definition
        return "overhead", {"rule": "overhead", "reason": contested,
                            "overhead_share": round(_overhead_share(m, p), 4)}
    name, ev = _compute_or_overhead(m, p)  # the largest is compute: the FLOP rule decides
    return name, ev if contested is None else {**ev, "contested": contested}


def _loader_evidence(p: _Profile, phase: str, name: str) -> dict[str, Any]:
    s = p.shares[phase]
    return {"rule": name, "reason": f"{phase} is {s:.1%} of the step (>= {LOADER_SHARE:.0%} and "
            f"the largest phase); removing it bounds the step at {amdahl(s):.2f}x",
            f"{phase}_share": s, "threshold": LOADER_SHARE,
            "speedup_if_removed": round(amdahl(s), 2)}


def _compute_or_overhead(m: Measurements, p: _Profile) -> tuple[str, dict[str, Any]]:
    # CPU: the step's own scaling; the update's size-bound part is no overhead
    measured = None if p.on_cuda else batch_verdict(m, p.phase_s, update_memory_s(m, p.part_s))
    busy_s = p.phase_s["compute"] + p.phase_s["sync"] + p.phase_s["other"]
    if not (m.flops_per_step and m.matmul_flops_per_s and busy_s > 0):
        return measured or _fallback_rule(m, p)
    achieved = m.flops_per_step / busy_s
    ratio = achieved / m.matmul_flops_per_s
    if measured is not None:  # the FLOP rate is context: the replay decides
        return measured[0], {**measured[1], "achieved_flops_per_s": achieved,
                             "flops_ratio": round(ratio, 4)}
    name = "compute" if ratio >= COMPUTE_RATIO else "overhead"
    reason = (f"{m.flops_per_step:.3g} FLOP per step in {busy_s * 1e3:.3f} ms (compute+sync+"
              f"other) = {achieved / 1e9:.3g} GFLOP/s, {ratio:.1%} of the measured matmul rate "
              f"{m.matmul_flops_per_s / 1e9:.3g} GFLOP/s ({'>=' if name == 'compute' else '<'} "
              f"{COMPUTE_RATIO:.0%})")
    return name, {"rule": name, "reason": reason, "achieved_flops_per_s": achieved,
                  "matmul_flops_per_s": m.matmul_flops_per_s, "flops_ratio": round(ratio, 4),
                  "threshold": COMPUTE_RATIO, "overhead_share": round(_overhead_share(m, p), 4)}


def _fallback_rule(m: Measurements, p: _Profile) -> tuple[str, dict[str, Any]]:
    sh = p.shares
    host = sh["sync"] + sh["other"]
    syncy = p.syncs_per_step >= 1 and sh["sync"] >= SYNC_SHARE
    name = "overhead" if host >= OVERHEAD_SHARE or syncy else "compute"
    reason = (f"FLOPs unknown (no FLOP count or matmul rate), decided by shares: sync+other "
              f"{host:.1%} (overhead from {OVERHEAD_SHARE:.0%}); {p.syncs_per_step:g} syncs/step "
              f"with sync {sh['sync']:.1%} (overhead from 1 and {SYNC_SHARE:.0%})")
    if not p.on_cuda:
        reason += "; on the CPU per-op dispatch overhead hides inside compute, so it may be larger"
    return name, {"rule": name, "reason": reason, "flops": "unknown",
                  "overhead_share": round(_overhead_share(m, p), 4)}


def _remedies(m: Measurements, p: _Profile, bottleneck: str, timing: str) -> list[Remedy]:
    speedups = (_data_remedies(m, p) + _sync_remedies(p) + _h2d_remedies(p)
                + update_remedies(m, p.part_s, p.step_s))
    if timing == "overhead":
        speedups += _overhead_remedies(m, p, memory_bound=bottleneck == "memory")
    elif timing == "compute":
        speedups += _compute_remedies(m, p)
        if scaled_step(m, p.phase_s) is not None:  # measured: whatever it gains, say it
            speedups += [r for r in [batch_remedy(m, p.phase_s, fallback_share=0.0,
                                                  memory_bound=bottleneck == "memory")] if r]
    kept = [r for r in speedups if r.expected_speedup >= MIN_SPEEDUP]
    ranked = sorted(kept, key=_rank_key)  # stable: ties keep rule order
    return (_memory_remedies(m, p) if bottleneck == "memory" else []) + ranked


def _rank_key(r: Remedy) -> float:
    """Largest bound first; a per-sample bound (a larger batch) counts / its discount."""
    return -(r.expected_speedup / PER_SAMPLE_DISCOUNT.get(r.kind, 1.0))


def _remedy(action: str, share: float, fraction: float, reason: str, kind: str) -> Remedy:
    return Remedy(action=action, expected_speedup=round(amdahl(share, fraction), 2),
                  reason=reason, kind=kind)


def _data_remedies(m: Measurements, p: _Profile) -> list[Remedy]:
    s = p.shares["data_wait"]
    if s < REMEDY_SHARE:
        return []
    head = (f"data wait is {s:.1%} of the step ({p.phase_s['data_wait'] * 1e3:.3f} ms); removing "
            f"all of it bounds the step at {amdahl(s):.2f}x; ")
    if m.loaders and m.loaders[0].random_per_sample:  # augmentation: nothing to pre-decode once
        action = ("augment whole batches on the device: keep the un-augmented images as one "
                  "uint8 tensor, gather batches by index and apply the same random transforms to "
                  "each batch with tensor ops (affine_grid + grid_sample, torchvision.transforms.v2 "
                  "on batched tensors, kornia or DALI); looptune recipe 'batched-aug'")
        reason = head + (f"{m.loaders[0].dataset}[0] read twice differed, so its per-sample "
                         "transform is random and cannot be pre-computed once; the batched "
                         f"transform itself is assumed to keep ~15% of the wait: 1/(1 - {s:.4f} "
                         "x 0.85)")
        fraction = 0.85
    else:
        action = ("pre-decode the dataset into a tensor and gather batches by index (looptune "
                  "recipe 'tensorized' / 'device')")
        wait, g = p.phase_s["data_wait"], m.gather_s
        if g is not None and wait > 0:  # measured: a DataLoader over a pre-decoded copy
            fraction = max(0.0, 1 - g / wait)
            reason = head + (f"a shuffled DataLoader over a pre-decoded dataset of the same "
                             f"batch bytes gathered a batch in {g * 1e3:.3f} ms here (measured "
                             f"after the script), which stays: 1/(1 - {s:.4f} x {fraction:.3f})")
        else:
            fraction = 0.9
            reason = head + (f"indexing a pre-decoded tensor leaves ~10% of it (not measured: "
                             f"the batch's size is unknown): 1/(1 - {s:.4f} x 0.9)")
    # kind "tensorized", not "loader": --verify applies only DataLoader(...) keyword arguments
    return [_remedy(action, s, fraction, reason, "tensorized"), *workers_remedy(m, p, s)]


def _sync_remedies(p: _Profile) -> list[Remedy]:
    s = p.shares["sync"]
    if not (s >= SYNC_REMEDY_SHARE or (p.on_cuda and p.syncs_per_step >= 1)):
        return []
    reason = (f"{p.syncs_per_step:g} syncs per step block the host for "
              f"{p.phase_s['sync'] * 1e3:.3f} ms ({s:.1%} of the step): 1/(1 - {s:.4f}); "
              "counts only the measured wait, not the launch queue each sync drains")
    return [_remedy("drop the per-step .item(): accumulate the loss on the device and read it "
                    "once per epoch", s, 1.0, reason, "sync")]


def _h2d_remedies(p: _Profile) -> list[Remedy]:
    h, d = p.shares["host_to_device"], p.shares["data_wait"]
    if h < REMEDY_SHARE or not p.on_cuda:
        return []
    out = [_remedy("keep the dataset on the device and gather batches there (looptune recipe "
                   "'device')", h + d, 1.0, f"copies {h:.1%} + data wait {d:.1%} of the step go "
                   f"away: 1/(1 - {h + d:.4f}); needs the dataset to fit in device memory",
                   "device_resident")]
    if p.pageable_bytes_per_step > 0 or p.h2d_bytes_per_step == 0:  # else already pinned
        out.append(_remedy(
            "DataLoader(pin_memory=True) and .to(device, non_blocking=True)", h, 0.7,
            f"copies are {h:.1%} of the step, {_mib(p.pageable_bytes_per_step)} per step from "
            f"pageable memory; pinned non_blocking copies overlap compute, assumed ~70% hidden: "
            f"1/(1 - {h:.4f} x 0.7)", "transfer"))
    return out


def _overhead_remedies(m: Measurements, p: _Profile, *, memory_bound: bool) -> list[Remedy]:
    o, other = _overhead_share(m, p), p.shares["other"]
    out = [r for r in [batch_remedy(m, p.phase_s, fallback_share=o, memory_bound=memory_bound)] if r]
    if p.on_cuda:
        out.append(_remedy(
            "torch.compile(model), or CUDA graphs (looptune recipe 'fast')", other, 1.0,
            f"host time the GPU idles through (launches, dispatch) is {other:.1%} of the step: "
            f"1/(1 - {other:.4f}); syncs are left to the sync remedy (a graph breaks at .item())",
            "compile"))
    return out


def _compute_remedies(m: Measurements, p: _Profile) -> list[Remedy]:
    c = p.shares["compute"]
    if p.on_cuda:  # the optimizer's parts stay fp32 under autocast: not halved
        u = min(c, optimizer_s(p.part_s) / p.step_s) if p.step_s > 0 else 0.0
        less = f" less the optimizer's {u:.1%}" if u > 0 else ""
        return [_remedy(bf16_action(m, "cuda")[0], c - u, 0.5,
                        f"compute is {c:.1%} of the step{less}; bf16 tensor cores roughly halve "
                        f"it: 1/(1 - {c - u:.4f} x 0.5)", "precision")]
    return cpu_compute_remedies(m, step_s=p.step_s, compute_s=p.phase_s["compute"],
                                update_s=optimizer_s(p.part_s))


def _memory_remedies(m: Measurements, p: _Profile) -> list[Remedy]:
    """Fixes, not speedups (expected 1.0): they go first when memory is the bottleneck."""
    b = m.loaders[0].batch_size if m.loaders else None
    size = f"batch_size {b} -> {b // 2}" if b and b > 1 else "halve the batch"
    out = [Remedy(action=f"{size} with gradient accumulation (looptune step.accumulate=2)",
                  expected_speedup=1.0, kind="memory", reason=(
                      f"{_memory_evidence(m, p)['reason']}; the same effective batch at about "
                      "half the activation memory. torch.cuda.empty_cache() is not a fix: it "
                      "returns cached blocks to the driver but does not lower the peak"))]
    if p.on_cuda and m.alloc_retries > 0:
        out.append(Remedy(action="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
                          expected_speedup=1.0, kind="memory", reason=(
                              f"{m.alloc_retries} allocator retries, each a cache flush and a "
                              "full sync; expandable segments cut the fragmentation behind them")))
    return out
