"""``Diagnosis``: the frozen record ``diagnose()`` returns and ``--json`` writes."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Any

from looptune._io import atomic_write_text
from looptune.diagnose.model import Finding, LoaderInfo, Remedy

__all__ = ["Diagnosis"]


@dataclass(frozen=True, kw_only=True)
class Diagnosis:
    bottleneck: str  # data_loading | host_to_device | overhead | compute | memory
    shares: dict[str, float]  # per phase, summing to 1
    step_ms: float  # median wall time of a measured step
    phase_ms: dict[str, float]  # median ms per phase
    steps_measured: int
    steps_requested: int | None  # None: measured for --seconds, not a step count
    warmup_steps: int
    evidence: dict[str, Any]  # the numbers behind the verdict
    findings: list[Finding]
    remedies: list[Remedy]  # ranked by expected speedup
    loaders: list[LoaderInfo]
    step_s: list[float]  # every measured step's wall time (stalls, warm-up tail)
    peak_mem_bytes: int | None
    peak_mem_kind: str
    script: str  # what ran: the path or "-m module" and its arguments
    stopped: str  # "steps" | "seconds" | "script_ended" | "exit N" | "error"
    error: str | None = None  # the script's exception, if it raised
    verify: dict[str, Any] | None = None  # --verify: remedy, before/after step ms, speedup
    trace: dict[str, Any] | None = None  # --trace: files written and the top operators table
    provenance: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def write_json(self, path: str | os.PathLike) -> None:
        """Atomic: an interrupted write never leaves half a file at ``path``."""
        atomic_write_text(path, json.dumps(self.to_dict(), indent=2, allow_nan=False) + "\n")
