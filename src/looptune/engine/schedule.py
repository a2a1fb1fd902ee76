"""Learning-rate schedules: a pure factor of the peak lr per optimizer step, and its scheduler.

:func:`lr_factor` depends only on the step index, so a run resumed at step ``k`` gets exactly
the lr an uninterrupted run had there. :func:`build_scheduler` wraps it in torch's ``LambdaLR``,
which the caller steps **once per optimizer step** (after ``optimizer.step()``), so the factor's
argument is the index of the next optimizer step.

Shapes, over the steps after warm-up (``t`` runs from 0 to 1 across them):

* constant: 1.
* cosine: ``min + (1 - min) * (1 + cos(pi t)) / 2``, from 1 down to ``min_lr_fraction``.
* onecycle: torch ``OneCycleLR``'s defaults: a cosine rise from 1/25 (``div_factor=25``) to 1
  over ``pct_start``, then a cosine fall to 1/25/1e4 (``final_div_factor=1e4``), both floored
  at ``min_lr_fraction``. The floor keeps lr off exactly 0 so no step is wasted at lr 0.
* cyclic: a triangle between ``min_lr_fraction`` and 1 with period ``cycle_steps``, starting
  at the bottom.
* step: ``gamma ** (steps // step_size)``.

Warm-up ramps linearly, ``(step + 1) / warmup_steps``, up to the value the schedule starts at
(1 for constant/cosine/step; onecycle and cyclic start low, so the ramp joins them without a
jump). The schedule reaches its end value at ``step == total_steps`` and holds it after.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch

from looptune.errors import ConfigError
from looptune.recipe import ScheduleConfig, ScheduleName

__all__ = ["FactorLR", "build_scheduler", "lr_factor", "problems"]

_ONECYCLE_START = 1 / 25  # torch OneCycleLR div_factor=25
_ONECYCLE_END = _ONECYCLE_START / 1e4  # torch OneCycleLR final_div_factor=1e4


def lr_factor(step: int, *, total_steps: int, cfg: ScheduleConfig) -> float:
    """The multiplier of the peak lr for optimizer step ``step`` (0-based), in [0, 1].

    Args:
        step: the optimizer step index; steps past ``total_steps`` hold the final value.
        total_steps: the run's optimizer steps (epochs x optimizer steps per epoch).
        cfg: the schedule.

    Returns:
        The factor; a pure function of its arguments.

    Raises:
        ConfigError: ``cfg``, ``total_steps`` or ``step`` is invalid (see :func:`build_scheduler`).

    Example:
        >>> cfg = ScheduleConfig(name="cosine", warmup_steps=10)
        >>> [round(lr_factor(s, total_steps=110, cfg=cfg), 3) for s in (0, 9, 60, 110)]
        [0.1, 1.0, 0.5, 0.0]
    """
    found = problems(cfg, total_steps)
    if not _is_int(step) or step < 0:
        found.append(f"step={step!r} is invalid: must be an integer >= 0 (the 0-based "
                     "optimizer step index).")
    if found:
        raise ConfigError(found)
    return _factor(step, total_steps=total_steps, cfg=cfg)


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: ScheduleConfig, *,
                    total_steps: int) -> FactorLR:
    """A ``LambdaLR`` setting each group's lr to its initial lr x :func:`lr_factor`.

    Call ``scheduler.step()`` once per optimizer step, after ``optimizer.step()`` (also after a
    step that fp16's GradScaler skipped, so the step index stays the schedule's clock). A
    tensor lr (a capturable optimizer) is updated in place, so CUDA graphs see it.

    Its ``state_dict()`` holds only plain values (the step count, base and last lrs; the factor
    function is rebuilt from the recipe, not saved), so ``torch.load(weights_only=True)`` reads
    it. To resume: build the optimizer and this scheduler as for a fresh run, then
    ``optimizer.load_state_dict(...)`` and ``scheduler.load_state_dict(...)`` (torch's order:
    building a scheduler overwrites the optimizer's lr).

    Args:
        optimizer: the optimizer whose lr the schedule drives; its current lr is the peak.
        cfg: the schedule.
        total_steps: the run's optimizer steps, >= 1 and >= ``cfg.warmup_steps``.

    Returns:
        The scheduler; the optimizer's lr is already set for step 0.

    Raises:
        ConfigError: listing every problem, e.g. ``warmup_steps=500 exceeds the run's 469
            optimizer steps: lower warmup_steps or train longer.``

    Example:
        >>> opt = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
        >>> sched = build_scheduler(opt, ScheduleConfig(name="step", step_size=2, gamma=0.5),
        ...                         total_steps=10)
        >>> for _ in range(2):
        ...     opt.step(); sched.step()
        >>> opt.param_groups[0]["lr"]
        0.05
    """
    found = problems(cfg, total_steps)
    if found:
        raise ConfigError(found)
    # A partial, not a lambda: it pickles, and LambdaLR saves its (empty) __dict__ rather than
    # the function, so the saved state stays plain data.
    factor = functools.partial(_factor, total_steps=total_steps, cfg=cfg)
    return FactorLR(optimizer, lr_lambda=factor)


class FactorLR(torch.optim.lr_scheduler.LambdaLR):
    """``LambdaLR`` whose ``step()`` sets the same lr (``base_lr * factor(last_epoch)``) without
    ``LRScheduler.step``'s per-call machinery (the order warnings, a context manager, a list
    built twice): ~3 us an optimizer step on a 2-core CPU, 1.5% of a batch-64 MNIST MLP step.
    The first call, a deprecated ``epoch`` argument and tensor learning rates (capturable
    optimizers: filled in place) take torch's own path."""

    def step(self, epoch: int | None = None) -> None:
        groups = self.optimizer.param_groups
        if (epoch is not None or self._step_count == 1
                or any(isinstance(g["lr"], torch.Tensor) for g in groups)):
            return super().step(epoch)
        self._step_count += 1
        self.last_epoch += 1
        for group, fn, base in zip(groups, self.lr_lambdas, self.base_lrs, strict=True):
            group["lr"] = base * fn(self.last_epoch)
        self._last_lr = [g["lr"] for g in groups]
        return None


def problems(cfg: ScheduleConfig, total_steps: int) -> list[str]:
    """Every problem of ``cfg`` for a run of ``total_steps`` optimizer steps (empty if none)."""
    out = cfg.problems()
    if not _is_int(total_steps) or total_steps < 1:
        out.append(f"total_steps={total_steps!r} is invalid: must be an integer >= 1, the run's "
                   "optimizer steps (epochs x ceil(batches per epoch / accumulate)).")
    elif _is_int(cfg.warmup_steps) and cfg.warmup_steps > total_steps:
        out.append(f"warmup_steps={cfg.warmup_steps} exceeds the run's {total_steps} optimizer "
                   "steps: lower warmup_steps or train longer.")
    if cfg.name == "cyclic" and cfg.warmup_steps and cfg.min_lr_fraction == 0:
        out.append(f"warmup_steps={cfg.warmup_steps} with schedule 'cyclic' and "
                   "min_lr_fraction=0: warm-up ramps to the cycle's bottom, so every warm-up "
                   "step would have lr 0. Set min_lr_fraction > 0 (e.g. 0.1) or warmup_steps=0.")
    return out


def _factor(step: int, *, total_steps: int, cfg: ScheduleConfig) -> float:
    step, warmup = min(step, total_steps), cfg.warmup_steps  # past the end: the final value
    shape = _SHAPES[cfg.name]
    if step < warmup:
        return (step + 1) / warmup * shape(0, 0.0, cfg)
    after, span = step - warmup, total_steps - warmup
    return shape(after, after / span if span else 1.0, cfg)


# Each shape takes (steps since warm-up, t in [0, 1] over the remaining steps, cfg).
Shape = Callable[[int, float, ScheduleConfig], float]


def _constant(after: int, t: float, cfg: ScheduleConfig) -> float:
    return 1.0


def _cosine(after: int, t: float, cfg: ScheduleConfig) -> float:
    return _cos_between(1.0, cfg.min_lr_fraction, t)


def _onecycle(after: int, t: float, cfg: ScheduleConfig) -> float:
    start = max(cfg.min_lr_fraction, _ONECYCLE_START)
    end = max(cfg.min_lr_fraction, _ONECYCLE_END)
    if t < cfg.pct_start:  # pct_start=0 skips the rise: t < 0 never holds
        return _cos_between(start, 1.0, t / cfg.pct_start)
    if cfg.pct_start >= 1:  # the whole run rises; the end (t=1) is the peak
        return 1.0
    return _cos_between(1.0, end, (t - cfg.pct_start) / (1 - cfg.pct_start))


def _cyclic(after: int, t: float, cfg: ScheduleConfig) -> float:
    phase = (after % cfg.cycle_steps) / cfg.cycle_steps
    triangle = 1 - abs(2 * phase - 1)  # 0 at the cycle's start, 1 halfway, back to 0
    return cfg.min_lr_fraction + (1 - cfg.min_lr_fraction) * triangle


def _step(after: int, t: float, cfg: ScheduleConfig) -> float:
    return cfg.gamma ** (after // cfg.step_size)


def _cos_between(first: float, last: float, u: float) -> float:
    """A half-cosine from ``first`` (u=0) to ``last`` (u=1)."""
    return last + (first - last) * 0.5 * (1 + math.cos(math.pi * u))


_SHAPES: dict[ScheduleName, Shape] = {
    "constant": _constant, "cosine": _cosine, "onecycle": _onecycle, "cyclic": _cyclic,
    "step": _step,
}


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
