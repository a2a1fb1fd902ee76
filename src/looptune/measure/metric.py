"""What a workload is scored by: a named metric and which direction is better.

Classification scores top-1 accuracy (higher is better); a language model scores its validation
loss (lower is better). Time to target, tables and plots read the direction from here instead of
assuming accuracy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["MetricSpec", "ACCURACY", "VAL_LOSS", "metric_spec"]


@dataclass(frozen=True)
class MetricSpec:
    """A metric's name and direction; values are plain floats."""

    name: str  # e.g. "accuracy", "val_loss": the key results and tables use
    higher_is_better: bool  # accuracy: True; a loss: False
    fraction: bool = False  # a value in [0, 1], shown as a percentage (accuracy)

    def reached(self, value: float, target: float) -> bool:
        """Whether ``value`` is at or beyond ``target`` in the better direction."""
        return value >= target if self.higher_is_better else value <= target

    def target_problem(self, target: object) -> str | None:
        """Why ``target`` cannot be a target for this metric, or None when it can."""
        if isinstance(target, bool) or not isinstance(target, (int, float)) or not math.isfinite(target):
            return f"target={target!r} for {self.name} is invalid: give a finite number."
        if self.fraction and not 0 < target <= 1:
            return (f"target={target!r} for {self.name} is invalid: a fraction in (0, 1], "
                    "e.g. 0.975 for 97.5%.")
        if not self.fraction and not self.higher_is_better and target <= 0:
            return f"target={target!r} for {self.name} is invalid: a loss target must be > 0, e.g. 1.5."
        return None

    def format(self, value: float | None) -> str:
        if value is None:
            return "n/a"
        return f"{100 * value:.2f}%" if self.fraction else f"{value:.4f}"

    def format_target(self, target: float) -> str:
        return f"{100 * target:g}%" if self.fraction else f"{self.name} {target:g}"


ACCURACY = MetricSpec("accuracy", higher_is_better=True, fraction=True)
VAL_LOSS = MetricSpec("val_loss", higher_is_better=False)
_KNOWN = {m.name: m for m in (ACCURACY, VAL_LOSS)}


def metric_spec(name: str, higher_is_better: bool | None = None) -> MetricSpec:
    """A known metric by name, or a user's own (its direction must then be given)."""
    if name in _KNOWN and higher_is_better in (None, _KNOWN[name].higher_is_better):
        return _KNOWN[name]
    return MetricSpec(name, higher_is_better=True if higher_is_better is None else higher_is_better)
