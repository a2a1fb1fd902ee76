"""Compute or per-step overhead, and what a larger batch gains: from the model replayed at the
step's batch B and at k x B (:mod:`looptune.diagnose.scaling`), not from one big matmul's rate.

The step at k x B, per step: data wait and host-to-device copies grow with the batch (k times);
the compute the replayed forward + backward accounts for (on a CPU: the model's forward and
backward as timed inside the script's own steps, so that a slow phase of the machine during the
script and a quiet one during the replay do not turn compute into "fixed" time) grows as it did
in the replay; the rest
of the compute (optimizer update, loss, the script's Python), syncs and other host time stay per
step. Per sample, the larger batch is faster by ``k x step(B) / step(kB)``: that is the batch
remedy's bound. The share of the busy time (compute + sync + other) that does not grow with the
batch decides the verdict: overhead from BUSY_OVERHEAD_SHARE, else compute. The optimizer update is
paid per step too, but the part of it that streams the parameters (its time less its per-op cost,
measured: :func:`looptune.diagnose.rules.update.update_memory_s`) is work, not overhead: it is
named as the update (its own share and remedy) and left out of the overhead share.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from looptune.diagnose.rules.profile import MAX_REMOVED
from looptune.diagnose.rules.records import Remedy
from looptune.measure.records import BatchScaling, Measurements

__all__ = ["BUSY_OVERHEAD_SHARE", "FALLBACK_FACTOR", "FALLBACK_FIXED_REMOVED", "LINEAR_LR",
           "SQRT_LR", "ScaledStep", "batch_remedy", "batch_verdict", "lr_rule", "scaled_step"]

# the per-step (batch-independent) share of the busy time (compute + sync + other) from which the
# step is overhead, measured by the model's replay at B and k x B. Assumed; checked by
# benchmarks/verdict_check.py, whose independent verdicts (the whole script rerun at B and 4B)
# agreed 12/12 at this threshold (docs/step-parts.md).
BUSY_OVERHEAD_SHARE = 0.30
# the replay at the script's batch and the same module(s) timed in the script's steps: outside
# this factor of each other the reason says the scaling is less certain (issue 32: replays that
# did not time what the script did). Assumed: they agree within ~1.1x on the planted scripts
# here; a VM's slow phase during one of them moves it by up to ~2x
REPLAY_AGREES = 2.0
# without a replay: the larger batch suggested is this many times the step's (the replay's own
# factor, diagnose/scaling.py). Assumed, not measured.
FALLBACK_FACTOR = 4
# without a replay: the share of the per-step cost a FALLBACK_FACTOR x larger batch removes per
# sample (it is paid once per k x the samples: 1 - 1/4). Assumed, not measured.
FALLBACK_FIXED_REMOVED = 0.75
# the learning rate that goes with k x the batch, by the optimizer's class: linear (x k) for SGD
# (Goyal et al. 2017, "Accurate, Large Minibatch SGD"), square root (x sqrt(k)) for Adam and the
# other adaptive methods (Malladi et al. 2022, "On the SDEs and Scaling Rules for Adaptive
# Gradient Algorithms"). Others (LBFGS's line search, Rprop's signs, Adadelta's unit-free steps):
# no rule, the rate is left as it is and the action says so
LINEAR_LR = ("SGD", "ASGD")
SQRT_LR = ("Adam", "AdamW", "Adamax", "NAdam", "RAdam", "RMSprop", "Adagrad", "SparseAdam")


@dataclass(frozen=True, kw_only=True)
class ScaledStep:
    factor: int
    step_s: float  # the step at B: the sum of its median phases
    large_s: float  # the step predicted at factor x B
    busy_s: float  # compute + sync + other at B
    busy_large_s: float  # the same at factor x B
    replayed_s: float  # the replayed forward + backward's share of compute at B (per step)
    update_s: float = 0.0  # the optimizer update's size-bound time per step (not overhead)

    @property
    def speedup(self) -> float:
        """Per-sample speedup of the whole step at factor x B."""
        return self.factor * self.step_s / self.large_s

    @property
    def fixed_share(self) -> float:
        """Share of the busy time that does not grow with the batch (linear model in B)."""
        k, busy = self.factor, self.busy_s
        if busy <= 0:
            return 0.0
        return min(1.0, max(0.0, (k * busy - self.busy_large_s) / ((k - 1) * busy)))

    @property
    def overhead_share(self) -> float:
        """The fixed share less the update's size-bound part: per-step overhead proper."""
        if self.busy_s <= 0:
            return 0.0
        return max(0.0, self.fixed_share - self.update_s / self.busy_s)


def scaled_step(m: Measurements, phase_s: dict[str, float],
                update_s: float = 0.0) -> ScaledStep | None:
    sc = m.batch_scaling
    if sc is None or not sc.measured:
        return None
    k, compute = sc.factor, phase_s["compute"]
    replayed = sc.replayed_s(compute)  # timed in the script's steps when known (CPU)
    compute_large = (compute - replayed) + replayed * (sc.large_s / sc.small_s)
    per_step = phase_s["sync"] + phase_s["other"]
    grows = phase_s["data_wait"] + phase_s["host_to_device"]
    return ScaledStep(factor=k, step_s=sum(phase_s.values()),
                      large_s=k * grows + compute_large + per_step,
                      busy_s=compute + per_step, busy_large_s=compute_large + per_step,
                      replayed_s=replayed, update_s=update_s)


def replay_vs_in_step(sc: BatchScaling) -> float | None:
    """The replay's time per step at the script's batch over the same module(s) timed inside
    the script's steps (1.0: the replay times what the script does); None where not timed."""
    if not (sc.measured and sc.in_step_s):
        return None
    return sc.calls_per_step * sc.small_s / sc.in_step_s  # type: ignore[operator]


def _replay_text(sc: BatchScaling) -> str:
    big = sc.batch * sc.factor  # type: ignore[operator]
    own = (f"; in the script's steps: {sc.in_step_s * 1e3:.3f} ms per step" if sc.in_step_s
           else "")
    agree = replay_vs_in_step(sc)
    if agree is not None and not 1 / REPLAY_AGREES <= agree <= REPLAY_AGREES:
        own += (f" (the replay took {agree:.2f}x that: it may not time what the script does, "
                "or the machine's speed changed between them; the scaling is less certain)")
    calls = f", called {sc.calls_per_step}x per step" if sc.calls_per_step > 1 else ""
    where = f" (batch {sc.batch_evidence})" if sc.batch_evidence else ""
    apart = ("; each alone at that batch: " + ", ".join(f"{k} {v * 1e3:.3f} ms"
                                                         for k, v in sc.module_s.items())
             if sc.module_s else "")
    return (f"{sc.module} forward+backward replayed at batch {sc.batch}{where}{calls}: "
            f"{sc.small_s * 1e3:.3f} ms, at {big}: {sc.large_s * 1e3:.3f} ms "
            f"({sc.per_sample_gain:.2f}x per sample){apart}{own}")


def batch_verdict(m: Measurements, phase_s: dict[str, float],
                  update_s: float = 0.0) -> tuple[str, dict[str, Any]] | None:
    """("compute" | "overhead", evidence) from the measured scaling; None when not measured.
    ``update_s``: the optimizer update's size-bound seconds per step, left out of the overhead."""
    s = scaled_step(m, phase_s, update_s)
    if s is None:
        return None
    sc = m.batch_scaling
    name = "overhead" if s.overhead_share >= BUSY_OVERHEAD_SHARE else "compute"
    update = ""
    if s.update_s > 0 and s.busy_s > 0:
        update = (f"; of that, the optimizer update streaming the parameters takes "
                  f"{s.update_s * 1e3:.3f} ms ({s.update_s / s.busy_s:.1%}): work, not "
                  f"overhead, so {s.overhead_share:.1%} is per-step overhead")
    reason = (f"{_replay_text(sc)}; with the rest of the step's compute, syncs and host time per "
              f"step, {s.fixed_share:.1%} of its busy time ({s.busy_s * 1e3:.3f} ms) does not grow "
              f"with the batch{update} ({'>=' if name == 'overhead' else '<'} "
              f"{BUSY_OVERHEAD_SHARE:.0%}: {'per-step overhead' if name == 'overhead' else 'the work itself'})")
    return name, {"rule": name, "reason": reason, "fixed_share": round(s.fixed_share, 4),
                  "update_ms": round(s.update_s * 1e3, 4),
                  "overhead_share": round(s.overhead_share, 4),
                  "threshold": BUSY_OVERHEAD_SHARE, "batch_speedup": round(s.speedup, 3),
                  "replay_batch": sc.batch, "replay_factor": sc.factor,
                  "replay_small_ms": round(sc.small_s * 1e3, 4),
                  "replay_large_ms": round(sc.large_s * 1e3, 4), "replay_module": sc.module,
                  "replay_per_module_ms": {k: round(v * 1e3, 4) for k, v in sc.module_s.items()}
                  or None,
                  "batch_dim": sc.batch_dim, "batch_evidence": sc.batch_evidence,
                  "calls_per_step": sc.calls_per_step,
                  "in_step_ms": round(sc.in_step_s * 1e3, 4) if sc.in_step_s else None,
                  "replay_vs_in_step": (None if (r := replay_vs_in_step(sc)) is None
                                        else round(r, 3))}


def lr_rule(optimizer: str | None, k: int) -> tuple[float, str] | None:
    """(factor, its rule's name) for the learning rate at k x the batch; None: no rule."""
    if optimizer in LINEAR_LR:
        return float(k), "linear scaling for SGD"
    if optimizer in SQRT_LR:
        return round(k ** 0.5, 4), f"square-root scaling for {optimizer}"
    return None


def _lr_text(m: Measurements, k: int) -> tuple[str, tuple[str, float] | None]:
    name = m.update.optimizer if m.update is not None else None
    rule = lr_rule(name, k)
    if rule is None:
        return (f"scale the learning rate (no rule for {name}: tune it)" if name
                else "scale the learning rate"), None
    return f"learning rate x{rule[0]:g}: {rule[1]}", (name, rule[0])


def batch_remedy(m: Measurements, phase_s: dict[str, float], *, fallback_share: float,
                 memory_bound: bool) -> Remedy | None:
    """The batch-size remedy: its bound from the replay; without one, a flagged guess."""
    if memory_bound:  # a larger batch is the wrong way when memory is already the limit
        return None
    sc, s = m.batch_scaling, scaled_step(m, phase_s)
    if sc is not None and sc.batch_dim is None:  # no promise from a dimension that may be time
        return None
    b = m.loaders[0].batch_size if m.loaders and m.loaders[0].batch_size else (
        sc.batch if sc is not None and sc.batch else None)
    k = sc.factor if sc is not None else FALLBACK_FACTOR
    size = f"batch_size {b} -> {k * b}" if b else f"batch size B -> {k}B"
    lr_text, lr_scale = _lr_text(m, k)
    action = f"{size} (fewer, larger steps; {lr_text})"
    if s is not None:
        p = phase_s
        reason = (f"{_replay_text(sc)}; at {k}x the batch the data wait and copies grow {k}x, the "
                  f"replayed compute as measured, the rest ({(s.busy_s - s.replayed_s) * 1e3:.3f} "
                  f"ms) stays per step: {k} x {s.step_s * 1e3:.3f} / ({k} x "
                  f"{(p['data_wait'] + p['host_to_device']) * 1e3:.3f} + "
                  f"{(s.busy_large_s) * 1e3:.3f}) ms = {s.speedup:.2f}x per sample")
        return Remedy(action=action, expected_speedup=round(s.speedup, 2), reason=reason,
                      kind="batch", lr_scale=lr_scale)
    why = sc.note if sc is not None and sc.note else "the model was not replayed"
    gain = 1 / (1 - min(MAX_REMOVED, fallback_share * FALLBACK_FIXED_REMOVED))
    return Remedy(action=action, expected_speedup=round(gain, 2), kind="batch", estimated=True,
                  lr_scale=lr_scale, reason=(
        f"not measured ({why}): assumes the per-step cost, {fallback_share:.1%} of the step, is "
        f"fixed and paid once per {k}x the samples: 1/(1 - {fallback_share:.4f} x "
        f"{FALLBACK_FIXED_REMOVED}); "
        "--verify measures it"))
