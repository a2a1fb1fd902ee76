"""``looptune diagnose --plan N``: the next remedy after the first, measured round by round.

Each round diagnoses the script with the remedies kept so far applied from outside (as
``--verify`` applies them: DataLoader settings, batch size, pre-decoding, bf16, the optimizer's
implementation), reruns its top applicable remedy on top of them, and keeps it when the rerun
measured at least ``MIN_GAIN`` with the training intact (loss parity; a larger batch judged by
its time to the same loss). A remedy not kept (under ``MIN_GAIN``, the training changed, the
rerun failed: the reason is recorded) gives way to the next applicable one, up to ``TRIES`` a
round. The path stops at a round where none was kept, or after ``rounds`` kept remedies; a last
diagnosis then shows where the step stands with all of them. Remedies that need a change to the script's code are named with why the rerun
could not apply them (issue 32: a VAE and an RNN on per-sample decoded MNIST, pre-decoded, were
overhead-bound, and pre-decoding plus a larger batch measured 3.25x and 3.50x).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from looptune.diagnose.result import Diagnosis
from looptune.diagnose.runner import diagnose
from looptune.diagnose.verify import combined
from looptune.errors import ConfigError

__all__ = ["MIN_GAIN", "TRIES", "PlanRound", "plan", "switches"]

# a remedy is kept when its rerun measured at least this gain: under it the difference is within
# one rerun's spread on the VMs here (the same script rerun unchanged moves 2-4%). Assumed.
MIN_GAIN = 1.05
# remedies tried in one round before the path stops (each try is a diagnosis and a rerun)
TRIES = 3


@dataclass(frozen=True, kw_only=True)
class PlanRound:
    round: int  # from 1
    bottleneck: str  # the verdict with the remedies kept so far applied
    step_ms: float  # its median step, at its batch size
    applied: list[str]  # the remedies kept before this round, in order
    remedy: str | None  # the remedy rerun on top of them; None: nothing could be
    kind: str | None = None
    promised: float | None = None
    measured: float | None = None  # the rerun's gain (per sample / to the same loss for a batch)
    of_promise: float | None = None
    loss_parity: bool | None = None
    kept: bool = False
    why: str = ""  # why the path stops here, or how the gain was judged


def switches(verify: dict[str, Any]) -> dict[str, Any]:
    """The rerun's switches of a --verify record, to apply in every later run."""
    opt, lr = verify.get("optimizer"), verify.get("lr_scale")
    return {"loader_overrides": verify.get("overrides"), "autocast": verify.get("autocast"),
            "framework": verify.get("framework"),
            "lr_scale": None if not lr else (lr["class"], lr["factor"]),
            "optimizer": None if not opt else (opt["class"], {k: v for k, v in opt.items()
                                                             if k != "class"})}


def plan(target: str | Callable, args: Sequence[str] | str = (), *, rounds: int = 3,
         min_gain: float = MIN_GAIN, **kw: Any) -> Diagnosis:
    """Diagnose, apply the top remedy that can be applied from outside, rerun, keep it when it
    paid with the training intact, and diagnose again, up to ``rounds`` kept remedies. Returns
    the last diagnosis (all kept remedies applied) with the path in ``plan``; ``kw`` as
    :func:`diagnose` takes them (``verify`` is the plan's own).

    Raises:
        ConfigError: ``rounds`` or ``min_gain`` out of range, before anything runs.
    """
    if isinstance(rounds, bool) or not isinstance(rounds, int) or not 1 <= rounds <= 10:
        raise ConfigError([f"plan rounds={rounds!r} is invalid: 1 to 10 remedies to try in turn, "
                           "e.g. --plan 3."])
    if not isinstance(min_gain, (int, float)) or not 1.0 <= min_gain < 10:
        raise ConfigError([f"min_gain={min_gain!r} is invalid: a speedup of at least 1.0, "
                           f"e.g. {MIN_GAIN}."])
    kw.pop("verify", None)
    applied: dict[str, Any] = {}
    kept: list[str] = []
    path: list[PlanRound] = []
    n = 0
    while True:
        n += 1
        if len(kept) >= rounds:  # every round kept a remedy: where the step stands with them all
            d = diagnose(target, args, verify=False, applied=applied, **kw)
            break
        tried: list[str] = []
        for _ in range(TRIES):  # the round's remedies in rank order, until one pays
            d = diagnose(target, args, verify=True, applied=applied, verify_skip=tried, **kw)
            v = d.verify or {}
            gain = v.get("speedup")
            good = (bool(v.get("remedy")) and bool(v.get("applied")) and gain is not None
                    and gain >= min_gain and v.get("loss_parity") is not False
                    and not v.get("changes_training"))
            path.append(PlanRound(round=n, bottleneck=d.bottleneck, step_ms=d.step_ms,
                                  applied=list(kept), remedy=v.get("remedy"), kind=v.get("kind"),
                                  promised=v.get("expected_speedup"), measured=gain,
                                  of_promise=v.get("of_promise"),
                                  loss_parity=v.get("loss_parity"), kept=good,
                                  why=_why(v, gain, min_gain, good)))
            if good or not v.get("remedy"):
                break
            tried.append(v["remedy"])
        if not path[-1].kept:
            break
        applied = combined(applied, switches(d.verify or {}))
        kept.append(path[-1].remedy)  # type: ignore[arg-type]
    return dataclasses.replace(d, plan=[dataclasses.asdict(r) for r in path],
                               plan_applied=list(kept))


def _why(v: dict[str, Any], gain: float | None, min_gain: float, good: bool) -> str:
    if not v.get("remedy"):
        return v.get("reason", "nothing could be rerun")
    if not v.get("applied"):
        return v.get("reason") or v.get("error") or "the rerun did not apply it"
    if v.get("loss_parity") is False or v.get("changes_training"):
        return v.get("changes_training") or "it changed the training (loss parity lost)"
    if gain is None:
        return (v.get("error") or v.get("short") or v.get("reason") or v.get("not_comparable")
                or "nothing comparable was measured")
    if not good:
        return f"measured {gain:.2f}x, under the {min_gain:.2f}x a remedy must pay to be kept"
    return v.get("judged_by") or "the same steps, the same losses"
