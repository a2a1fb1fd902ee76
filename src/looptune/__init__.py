"""looptune: make PyTorch training loops fast, and say why yours are slow."""

from __future__ import annotations

__version__ = "0.1.0"

# imported after __version__: provenance and the downloader read it
from looptune.api import train  # noqa: E402
from looptune.bench.results import BenchResults  # noqa: E402
from looptune.bench.runner import bench  # noqa: E402
from looptune.data.pack import open_packed, pack, verify_packed  # noqa: E402
from looptune.diagnose.result import Diagnosis  # noqa: E402
from looptune.diagnose.runner import diagnose, watch  # noqa: E402
from looptune.tune.batch import tune_batch_size  # noqa: E402
from looptune.tune.loader import tune_loader  # noqa: E402
from looptune.errors import ConfigError, DataError, LooptuneError, MeasurementError  # noqa: E402
from looptune.measure.results import RunResult  # noqa: E402
from looptune.presets import RECIPES  # noqa: E402
from looptune.recipe import (Decision, LoaderConfig, OptimConfig, Recipe,  # noqa: E402
                             ScheduleConfig, StepConfig)

__all__ = [
    "__version__", "train", "bench", "diagnose", "watch", "Diagnosis", "tune_loader",
    "tune_batch_size", "pack", "open_packed", "verify_packed", "BenchResults", "RunResult",
    "Recipe", "LoaderConfig", "StepConfig", "OptimConfig", "ScheduleConfig", "RECIPES", "Decision", "LooptuneError",
    "ConfigError", "DataError", "MeasurementError",
]
