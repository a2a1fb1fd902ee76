"""The bench's results: provenance plus one RunResult per recipe. JSON is the source of truth."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from looptune._io import atomic_write_text
from looptune.errors import DataError
from looptune.measure.parity import epoch_loss_parity
from looptune.measure.results import RunResult

__all__ = ["SCHEMA_VERSION", "BenchResults"]

SCHEMA_VERSION = 1


@dataclass(frozen=True, kw_only=True)
class BenchResults:
    workload: str
    epochs: int
    seed: int
    provenance: dict[str, Any]
    runs: list[RunResult]
    world_size: int = 1  # ranks that trained each run together (torch.distributed)
    backend: str | None = None  # "gloo" | "nccl" when world_size > 1
    # samples/s of each recipe in one process, measured in the same command (bench --nproc N):
    # scaling efficiency = samples/s on N ranks / (N x this)
    single_process: dict[str, float] | None = None
    unit: str = "samples"  # what samples_per_s counts ("windows": token windows of an LM)

    def speedups(self) -> list[float]:
        """Each run's speedup in training time against the first run (1.0 for the first)."""
        base = self.runs[0].wall_s
        return [base / r.wall_s for r in self.runs]

    def loss_parity(self) -> list[dict[str, Any] | None]:
        """Per run: does it still train as the first (baseline) run did? Its last-epoch loss
        against the baseline's (:func:`~looptune.measure.parity.epoch_loss_parity`); None for
        the baseline itself. A faster run without parity is not the same training."""
        base = self.runs[0] if self.runs else None
        return [None if i == 0 or base is None else
                epoch_loss_parity(base.first_loss, base.epoch_loss, r.epoch_loss)
                for i, r in enumerate(self.runs)]

    def scaling_efficiency(self) -> list[float | None]:
        """Per run: samples/s / (world_size x single-process samples/s); None without a baseline."""
        base = self.single_process or {}
        return [r.samples_per_s / (self.world_size * base[r.recipe]) if base.get(r.recipe) else None
                for r in self.runs]

    def to_dict(self) -> dict[str, Any]:
        runs = []
        for run, speedup, eff, parity in zip(self.runs, self.speedups(),
                                             self.scaling_efficiency(), self.loss_parity()):
            runs.append({**run.to_dict(), "speedup": speedup, "scaling_efficiency": eff,
                         "loss_parity": parity})
        return {"kind": "bench", "schema_version": SCHEMA_VERSION, "workload": self.workload,
                "epochs": self.epochs, "seed": self.seed, "world_size": self.world_size,
                "backend": self.backend, "single_process": self.single_process, "unit": self.unit,
                "provenance": self.provenance, "runs": runs}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BenchResults:
        """Rebuild results from :meth:`to_dict` output (derived fields are recomputed)."""
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise DataError(f"results schema_version={version!r} is not supported: this looptune "
                            f"reads version {SCHEMA_VERSION}. Re-run the bench with this version.")
        derived = {"speedup", "s_per_epoch", "scaling_efficiency", "loss_parity"}
        runs = [RunResult(**{k: v for k, v in run.items() if k not in derived})
                for run in data["runs"]]
        return cls(workload=data["workload"], epochs=data["epochs"], seed=data["seed"],
                   provenance=data["provenance"], runs=runs,
                   world_size=data.get("world_size", 1), backend=data.get("backend"),
                   single_process=data.get("single_process"), unit=data.get("unit", "samples"))

    @classmethod
    def read_json(cls, path: str | os.PathLike) -> BenchResults:
        with open(path, encoding="utf-8") as f:
            return cls.from_dict(json.load(f))

    def write_json(self, path: str | os.PathLike) -> None:
        """Write atomically: an interrupted write never leaves a half file at ``path``."""
        atomic_write_text(path, json.dumps(self.to_dict(), indent=2) + "\n")
