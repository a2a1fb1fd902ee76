"""The measured record of one training run: data first, rendering elsewhere.

Field names carry their unit (``_s`` seconds, ``_bytes`` bytes). The same record is what the engine
returns, what the bench collects and what its JSON holds under ``runs``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from looptune.measure.metric import MetricSpec, metric_spec

__all__ = ["RunResult"]


@dataclass(frozen=True, kw_only=True)
class RunResult:
    recipe: str  # recipe name
    config: dict[str, Any]  # every resolved field of the recipe (after device adaptation)
    decisions: list[dict[str, Any]]  # automatic changes/warnings: {name, value, reason}
    device: str  # training device, e.g. "cpu" or "cuda:0"
    epochs: int
    batches_per_epoch: int
    samples_per_epoch: int
    setup_s: float  # building the batch source (dataset copies to the device, ...)
    wall_s: float  # training time: sum of epoch_s (evaluation excluded)
    epoch_s: list[float]  # per epoch, device synchronized at both ends
    samples_per_s: float  # samples_per_epoch * epochs / wall_s
    epoch_loss: list[float]  # per epoch: mean over batches of the batch-mean loss
    first_loss: float  # loss of the very first step (same seed -> same value in every recipe)
    data_wait_s: float  # host time blocked waiting for the next batch
    data_wait_fraction: float  # data_wait_s / wall_s
    peak_mem_bytes: int | None  # None = could not be measured
    peak_mem_kind: str  # what peak_mem_bytes measures, see measure.memory
    metric_name: str = "accuracy"  # what evaluation measured: "accuracy", "val_loss", a user's own
    metric: float | None = None  # its value on the evaluation data after training
    higher_is_better: bool = True  # the metric's direction (a loss: False)
    target: float | None = None  # what time_to_target_s measures against (in metric units)
    test_accuracy: float | None = None  # the metric when it is accuracy (fraction correct), else None
    eval_s: float | None = None  # evaluation time, excluded from wall_s
    evals: list[dict[str, Any]] = field(default_factory=list)  # {epoch, batches, train_s, accuracy, eval_s}
    target_accuracy: float | None = None  # target when the metric is accuracy, else None
    time_to_target_s: float | None = None  # training time until an evaluation reached the target
    compile_s: float = 0.0  # torch.compile time (first calls, recompilations), excluded from wall_s
    recompiles: int = 0  # graphs compiled after the first one (new shapes, guard failures)
    compile_fallback: str | None = None  # why the run fell back from torch.compile to eager
    optimizer_steps: int = 0  # optimizer updates (batches / accumulate, rounded up per epoch)
    optimizer_impl: str = ""  # the update kernels actually used: fused | foreach | for-loop
    skipped_steps: int = 0  # fp16: optimizer steps skipped for inf/nan gradients
    resumed_from: str | None = None  # the checkpoint this run continued from
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.metric is None and self.test_accuracy is not None and self.metric_name == "accuracy":
            object.__setattr__(self, "metric", self.test_accuracy)  # results written before metrics
        if self.target is None and self.target_accuracy is not None and self.metric_name == "accuracy":
            object.__setattr__(self, "target", self.target_accuracy)

    @property
    def s_per_epoch(self) -> float:
        return self.wall_s / self.epochs

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["s_per_epoch"] = self.s_per_epoch
        return d

    def with_eval(self, *, value: float, eval_s: float) -> RunResult:
        """This result with the metric measured after training (``value`` in metric units)."""
        accuracy = value if self.metric_name == "accuracy" else None
        return dataclasses.replace(self, metric=value, test_accuracy=accuracy, eval_s=eval_s)

    @property
    def metric_spec(self) -> MetricSpec:
        return metric_spec(self.metric_name, self.higher_is_better)


def metric_fields(spec: MetricSpec, value: float | None, target: float | None) -> dict[str, Any]:
    """RunResult's metric fields for ``spec`` (the accuracy-only fields filled when it is accuracy)."""
    accuracy = spec.name == "accuracy"
    return {"metric_name": spec.name, "metric": value, "higher_is_better": spec.higher_is_better,
            "target": target, "test_accuracy": value if accuracy else None,
            "target_accuracy": target if accuracy else None}
