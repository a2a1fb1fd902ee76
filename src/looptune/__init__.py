"""looptune: make PyTorch training loops fast, and say why yours are slow."""

from __future__ import annotations

from looptune._version import __version__
from looptune.api import train
from looptune.bench.results import BenchResults
from looptune.bench.runner import bench
from looptune.data.pack import open_packed, pack, verify_packed
from looptune.diagnose.result import Diagnosis
from looptune.diagnose.plan import plan as diagnose_plan
from looptune.diagnose.runner import diagnose, watch
from looptune.tune.batch import tune_batch_size
from looptune.tune.loader import tune_loader
from looptune.errors import ConfigError, DataError, LooptuneError, MeasurementError, ScriptFailed
from looptune.measure.results import RunResult
from looptune.presets import RECIPES
from looptune.recipe import (Decision, LoaderConfig, OptimConfig, Recipe,
                             ScheduleConfig, StepConfig)

__all__ = [
    "__version__", "train", "bench", "diagnose", "diagnose_plan", "watch", "Diagnosis", "tune_loader",
    "tune_batch_size", "pack", "open_packed", "verify_packed", "BenchResults", "RunResult",
    "Recipe", "LoaderConfig", "StepConfig", "OptimConfig", "ScheduleConfig", "RECIPES", "Decision", "LooptuneError",
    "ConfigError", "DataError", "MeasurementError", "ScriptFailed",
]
