"""looptune: make PyTorch training loops fast, and say why yours are slow."""

from __future__ import annotations

__version__ = "0.1.0"

from looptune.bench.results import BenchResults  # noqa: E402
from looptune.bench.runner import bench  # noqa: E402
from looptune.errors import ConfigError, DataError, LooptuneError, MeasurementError  # noqa: E402
from looptune.measure.results import RunResult  # noqa: E402
from looptune.presets import RECIPES
from looptune.recipe import Decision, LoaderConfig, OptimConfig, Recipe, ScheduleConfig, StepConfig  # noqa: E402

__all__ = [
    "__version__", "bench", "BenchResults", "RunResult", "Recipe", "LoaderConfig", "OptimConfig",
    "RECIPES", "Decision", "LooptuneError", "ConfigError", "DataError", "MeasurementError",
]
