"""Compute or per-step overhead, when the loader is not the bottleneck, and the remedies for
overhead: per-step syncs, kernel launches and dispatch, tiny batches.

The model's replay at B and k x B decides when there is one (:mod:`looptune.diagnose.rules.batch`,
on the CPU); else the step's FLOPs at the measured matmul rate; else the shares of host time.
"""

from __future__ import annotations

from typing import Any

from looptune.diagnose.rules.batch import batch_remedy, batch_verdict, scaled_step
from looptune.diagnose.rules.profile import StepProfile, amdahl_remedy
from looptune.diagnose.rules.records import Remedy
from looptune.diagnose.rules.update import update_memory_s
from looptune.measure.records import Measurements

__all__ = ["COMPUTE_RATIO", "HOST_OVERHEAD_SHARE", "SYNC_REMEDY_SHARE", "SYNC_SHARE",
           "compute_or_overhead", "overhead_remedies", "overhead_share", "sync_remedies"]

# achieved / large-matmul FLOP rate from which the arithmetic dominates: a real step mixes
# elementwise kernels and small GEMMs, so even a clean one seldom passes ~0.5 of that rate.
# Assumed, not measured.
COMPUTE_RATIO = 0.35
# without a FLOP count: sync + unattributed host time taking this share of the step is overhead.
# Assumed, not measured.
HOST_OVERHEAD_SHARE = 0.30
# without a FLOP count: >= 1 sync per step taking this share of the step is overhead too.
# Assumed, not measured.
SYNC_SHARE = 0.10
# dropping .item() is a one-line fix, so a smaller share than REMEDY_SHARE is worth naming.
# Assumed, not measured.
SYNC_REMEDY_SHARE = 0.05


def overhead_share(m: Measurements, p: StepProfile) -> float:
    """Share of the step that is fixed per-step cost: measured by the model's replay at B and 4B
    when there is one, else the busy time the arithmetic doesn't need at the matmul rate."""
    scaled = scaled_step(m, p.phase_s, update_memory_s(m, p.part_s))
    if scaled is not None and scaled.step_s > 0:
        return scaled.overhead_share * scaled.busy_s / scaled.step_s
    sh = p.shares
    busy_s = p.phase_s["compute"] + p.phase_s["sync"] + p.phase_s["other"]
    if m.flops_per_step and m.matmul_flops_per_s and busy_s > 0:
        needed_s = m.flops_per_step / m.matmul_flops_per_s
        return (sh["compute"] + sh["sync"] + sh["other"]) * max(0.0, 1.0 - needed_s / busy_s)
    return sh["sync"] + sh["other"]


def compute_or_overhead(m: Measurements, p: StepProfile) -> tuple[str, dict[str, Any]]:
    """("compute" | "overhead", evidence) for a step whose largest phase is its own work."""
    # CPU: the step's own scaling; the update's size-bound part is no overhead
    measured = None if p.on_cuda else batch_verdict(m, p.phase_s, update_memory_s(m, p.part_s))
    busy_s = p.phase_s["compute"] + p.phase_s["sync"] + p.phase_s["other"]
    if not (m.flops_per_step and m.matmul_flops_per_s and busy_s > 0):
        return measured or _by_shares(m, p)
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
                  "threshold": COMPUTE_RATIO, "overhead_share": round(overhead_share(m, p), 4)}


def _by_shares(m: Measurements, p: StepProfile) -> tuple[str, dict[str, Any]]:
    sh = p.shares
    host = sh["sync"] + sh["other"]
    syncy = p.syncs_per_step >= 1 and sh["sync"] >= SYNC_SHARE
    name = "overhead" if host >= HOST_OVERHEAD_SHARE or syncy else "compute"
    reason = (f"FLOPs unknown (no FLOP count or matmul rate), decided by shares: sync+other "
              f"{host:.1%} (overhead from {HOST_OVERHEAD_SHARE:.0%}); {p.syncs_per_step:g} "
              f"syncs/step with sync {sh['sync']:.1%} (overhead from 1 and {SYNC_SHARE:.0%})")
    if not p.on_cuda:
        reason += "; on the CPU per-op dispatch overhead hides inside compute, so it may be larger"
    return name, {"rule": name, "reason": reason, "flops": "unknown",
                  "overhead_share": round(overhead_share(m, p), 4)}


def sync_remedies(p: StepProfile) -> list[Remedy]:
    s = p.shares["sync"]
    if not (s >= SYNC_REMEDY_SHARE or (p.on_cuda and p.syncs_per_step >= 1)):
        return []
    reason = (f"{p.syncs_per_step:g} syncs per step block the host for "
              f"{p.phase_s['sync'] * 1e3:.3f} ms ({s:.1%} of the step): 1/(1 - {s:.4f}); "
              "counts only the measured wait, not the launch queue each sync drains")
    return [amdahl_remedy(action="drop the per-step .item(): accumulate the loss on the device "
                          "and read it once per epoch", share=s, fraction=1.0, reason=reason,
                          kind="sync")]


def overhead_remedies(m: Measurements, p: StepProfile, *, memory_bound: bool) -> list[Remedy]:
    o, other = overhead_share(m, p), p.shares["other"]
    out = [r for r in [batch_remedy(m, p.phase_s, fallback_share=o, memory_bound=memory_bound)] if r]
    if p.on_cuda:
        out.append(amdahl_remedy(
            action="torch.compile(model), or CUDA graphs (looptune recipe 'fast')", share=other,
            fraction=1.0, reason=(
                f"host time the GPU idles through (launches, dispatch) is {other:.1%} of the "
                f"step: 1/(1 - {other:.4f}); syncs are left to the sync remedy (a graph breaks at "
                ".item())"), kind="compile", estimated=True))
    return out
