"""The optimizer's share of the step, and the remedies that shrink it without changing the
training: another implementation of the same update, ``zero_grad(set_to_none=True)``.

Reads the step's parts as the probes timed them inside the script's own steps (``optimizer``:
``Optimizer.step``; ``zero_grad``, ``clip_grad``, ``grad_scaler``, ``lr_scheduler``) and the
update replayed per implementation (:mod:`looptune.diagnose.update_replay`). The bound of a faster
implementation scales the update's in-step time by the replay's ratio, so it is in the step's own
seconds, as the bf16 bound is (:mod:`looptune.diagnose.rules.compute`).
"""

from __future__ import annotations

from looptune.diagnose.rules.records import Remedy
from looptune.measure.records import Measurements

__all__ = ["OPTIMIZER_PARTS", "optimizer_s", "update_memory_s", "update_remedies"]

# the parts of a step that belong to the update (measure/probes.py PART_NAMES)
OPTIMIZER_PARTS = ("optimizer", "zero_grad", "clip_grad", "grad_scaler", "lr_scheduler")
_FLAG = {"fused": "fused=True", "foreach": "foreach=True", "for-loop": "foreach=False"}


def optimizer_s(part_s: dict[str, float]) -> float:
    """The update's parts together, seconds per step (medians of each part)."""
    return sum(part_s.get(k, 0.0) for k in OPTIMIZER_PARTS)


def update_memory_s(m: Measurements, part_s: dict[str, float]) -> float:
    """Seconds per step of the update that are its size, not its per-op cost: the in-step update
    less the share the replay on 1-element tensors takes of the replay at full size. 0 when the
    update was not replayed (then all of it counts as per-step cost)."""
    u, r = part_s.get("optimizer", 0.0), m.update
    if not (u > 0 and r is not None and r.dispatch_s is not None and r.step_s.get(r.impl)):
        return 0.0
    return u * max(0.0, 1.0 - r.dispatch_s / r.step_s[r.impl])


def update_remedies(m: Measurements, part_s: dict[str, float], step_s: float) -> list[Remedy]:
    """A faster implementation of the script's own update, measured; zero_grad(set_to_none=True)
    when the script zeroes its gradients in place."""
    return [r for r in (_impl_remedy(m, part_s, step_s), _zero_grad_remedy(m, part_s, step_s))
            if r is not None]


def _impl_remedy(m: Measurements, part_s: dict[str, float], step_s: float) -> Remedy | None:
    r, u = m.update, part_s.get("optimizer", 0.0)
    best = None if r is None else r.best
    if r is None or best is None or best == r.impl or u <= 0 or step_s <= 0:
        return None
    ratio = r.step_s[best] / r.step_s[r.impl]
    saved = u * (1 - ratio)
    times = ", ".join(f"{i} {t * 1e3:.3f} ms" for i, t in sorted(r.step_s.items(),
                                                                  key=lambda kv: kv[1]))
    skipped = "".join(f"; {i} not measured ({why})" for i, why in r.skipped.items())
    reason = (f"the update ({r.optimizer}.step, {r.impl}) takes {u * 1e3:.3f} ms of the "
              f"{step_s * 1e3:.3f} ms step ({u / step_s:.1%}); replayed on copies of the "
              f"script's {r.params} parameter tensors ({r.elements:,} elements) and gradients: "
              f"{times}{skipped}; {best} takes {ratio:.2f}x the time of {r.impl}, so the step "
              f"saves {saved * 1e3:.3f} ms: {step_s * 1e3:.3f} / {(step_s - saved) * 1e3:.3f}. "
              "The same update, the same training")
    return Remedy(action=f"torch.optim.{r.optimizer}(..., {_FLAG[best]})",
                  expected_speedup=round(step_s / max(step_s - saved, 1e-12), 2), reason=reason,
                  kind="optimizer")


def _zero_grad_remedy(m: Measurements, part_s: dict[str, float], step_s: float) -> Remedy | None:
    z = part_s.get("zero_grad", 0.0)
    if not m.zero_grad_kept or z <= 0 or step_s <= 0:
        return None
    return Remedy(
        action="optimizer.zero_grad(set_to_none=True) (torch's default since 2.0)",
        expected_speedup=round(step_s / max(step_s - z, 1e-12), 2), kind="zero_grad",
        reason=(f"zero_grad(set_to_none=False) writes zeros into every gradient: "
                f"{z * 1e3:.3f} ms of the {step_s * 1e3:.3f} ms step ({z / step_s:.1%}); with "
                "set_to_none=True the next backward writes the gradients instead of adding to "
                f"zeros, so at most that goes: {step_s * 1e3:.3f} / {(step_s - z) * 1e3:.3f}"))
