"""The step profile every rule reads (median seconds and shares per phase, per-step means, the
device) and the Amdahl bound the rules' expected speedups are built on.

Removing a fraction ``f`` of a phase taking a share ``s`` of the step bounds the step at
``1 / (1 - s*f)`` times faster. Pure and deterministic (no torch, no clocks).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import median
from typing import Any

from looptune.diagnose.rules.records import Remedy
from looptune.errors import MeasurementError
from looptune.measure.records import PHASES, Measurements, StepSample

__all__ = ["MAX_REMOVED", "REMEDY_SHARE", "StepProfile", "amdahl", "amdahl_remedy", "gib",
           "largest_phase", "mib", "step_profile"]

# cap s*f: a bound beyond 100x says nothing more, and inf is not JSON. Assumed, not measured.
MAX_REMOVED = 0.99
# a data-wait or copy share worth a remedy (and the pageable-copy finding): below it the bound is
# under 1.11x. Assumed, not measured.
REMEDY_SHARE = 0.10


@dataclass(frozen=True, kw_only=True)
class StepProfile:
    """What every rule reads: median seconds per phase, shares, per-step means, the device."""

    phase_s: dict[str, float]
    shares: dict[str, float]
    step_s: float
    part_s: dict[str, float]  # median seconds per step part ("forward", "optimizer", ...)
    syncs_per_step: float
    pageable_bytes_per_step: float
    h2d_bytes_per_step: float
    on_cuda: bool


def step_profile(m: Measurements) -> StepProfile:
    """The profile of the measured steps.

    Raises:
        MeasurementError: no steps, or step times that are negative, not finite or all zero.
    """
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
    return StepProfile(
        phase_s=phase_s, shares=_rounded_shares(phase_s), step_s=median(s.step_s for s in m.steps),
        part_s=part_s,
        syncs_per_step=sum(s.syncs for s in m.steps) / n,
        pageable_bytes_per_step=sum(s.h2d_pageable_bytes for s in m.steps) / n,
        h2d_bytes_per_step=sum(s.h2d_bytes for s in m.steps) / n, on_cuda=_on_cuda(m))


def amdahl(share: float, fraction: float = 1.0) -> float:
    """Whole-step speedup bound from removing ``fraction`` of a phase taking ``share`` of it."""
    return 1.0 / (1.0 - min(MAX_REMOVED, max(0.0, share * fraction)))


def amdahl_remedy(*, action: str, share: float, fraction: float, reason: str,
                  kind: str, estimated: bool = False) -> Remedy:
    """A remedy whose expected speedup is the Amdahl bound of removing ``fraction`` of ``share``."""
    return Remedy(action=action, expected_speedup=round(amdahl(share, fraction), 2),
                  reason=reason, kind=kind, estimated=estimated)


def largest_phase(values: dict[str, Any]) -> str:
    return max(PHASES, key=lambda k: values[k])  # ties: the first in PHASES, so deterministic


def mib(n: float | None) -> str:
    return f"{(n or 0) / 2**20:.1f} MiB"


def gib(n: float | None) -> str:
    return f"{(n or 0) / 2**30:.2f} GiB"


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


def _rounded_shares(phase_s: dict[str, float]) -> dict[str, float]:
    """Shares to 4 decimals summing to exactly 1.0; the rounding error goes to the largest."""
    total = sum(phase_s.values())
    units = {k: round(phase_s[k] / total * 10_000) for k in PHASES}
    units[largest_phase(units)] += 10_000 - sum(units.values())
    shares = {k: units[k] / 10_000 for k in PHASES}
    if sum(shares.values()) != 1.0:  # k/10000 is no exact binary fraction: the last non-zero
        # term in sum() order absorbs the error (an ulp or two, invisible at 4 decimals)
        last = [k for k in PHASES if units[k]][-1]
        shares[last] = 1.0 - sum(shares[k] for k in PHASES[:PHASES.index(last)])
    return shares


def _on_cuda(m: Measurements) -> bool:
    if m.env is not None:
        return m.env.device_type == "cuda"
    return any(s.device_busy_s is not None for s in m.steps)
