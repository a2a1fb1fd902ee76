"""``Diagnosis``: the frozen record ``diagnose()`` returns and ``--json`` writes."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from looptune._io import atomic_write_text
from looptune.measure.records import LoaderInfo
from looptune.diagnose.rules.records import Finding, Remedy
from looptune.errors import MeasurementError

__all__ = ["KIND", "MAX_WARMUP_STEPS", "Diagnosis"]

KIND = "diagnosis"  # the "kind" key of the JSON (looptune report tells results apart by it)
MAX_WARMUP_STEPS = 1000  # warm-up step times kept in the record (a bound on the JSON's size)


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
    # the status `python script.py` would have exited with: 0 also when diagnose stopped it after
    # the measured steps; sys.exit(N) -> N; an uncaught exception -> 1
    exit_code: int = 0
    # what marked a step: "optimizer.step" (a torch.optim optimizer); when the script built none
    # (weights updated by hand, a third-party optimizer): "parameter update" (in-place ops on the
    # parameters after a backward, one per update) or "backward" (one per backward call)
    step_signal: str = "optimizer.step"
    verify: dict[str, Any] | None = None  # --verify: remedy, before/after step ms, speedup
    trace: dict[str, Any] | None = None  # --trace: files written and the top operators table
    provenance: dict[str, Any] = field(default_factory=dict)
    rank: int | None = None  # RANK in a distributed job (torchrun, --nproc); None: one process
    world_size: int | None = None  # WORLD_SIZE of that job; None: one process
    # per measured step (as step_s): seconds blocked in collectives, waiting for the other ranks
    # and the transfer (DDP's all-reduce after this rank's backward, blocking dist.* calls);
    # None: one process, or not measurable (CUDA/NCCL)
    wait_s: list[float] | None = None
    # per measured step (as step_s): seconds blocked on the next batch, to tell data stalls apart
    data_wait_step_s: list[float] | None = None
    # the steps before the measurement (warm-up, the FLOP-counted step, a profiler window), at
    # most the last MAX_WARMUP_STEPS of them: how long start-up took to settle
    warmup_step_s: list[float] = field(default_factory=list)
    # the step's own parts, median ms per step and as shares of the step: "forward" (with the
    # loss), "backward", "optimizer" (all its parts) and "optimizer.<part>" (update, zero_grad,
    # clip_grad, grad_scaler, lr_scheduler) for those the step ran (measure/probes.py)
    part_ms: dict[str, float] = field(default_factory=dict)
    part_shares: dict[str, float] = field(default_factory=dict)
    # every step's loss from the first (warm-up included; None where none was seen): the loss
    # the step's backward started from, the mean over its backward calls
    losses: list[float | None] = field(default_factory=list)
    # when the bottleneck is data_loading: the link of the input chain that starves the step
    # ("storage" | "decode" | "collate" | "transfer" | "contention"), and the chain's numbers
    # (per-batch ms of each link, shares, bytes from storage vs the page cache; "note": what was
    # not seen). See diagnose/rules/chain.py
    data_cause: str | None = None
    input_chain: dict[str, Any] = field(default_factory=dict)
    # --plan: the rounds (diagnosis/plan.py PlanRound: verdict, remedy rerun, promised, measured,
    # loss parity, kept, why) and the remedies this diagnosis ran with, applied from outside
    plan: list[dict[str, Any]] | None = None
    plan_applied: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": KIND, **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Diagnosis:
        """The inverse of :meth:`to_dict` (a ``--json`` file read back).

        Raises:
            MeasurementError: ``data`` is not a diagnosis record (missing or unknown fields).
        """
        if isinstance(data, dict) and data.get("kind", KIND) == KIND:
            data = {k: v for k, v in data.items() if k != "kind"}
        fields = dataclasses.fields(cls)
        names = {f.name for f in fields}
        required = {f.name for f in fields if f.default is dataclasses.MISSING
                    and f.default_factory is dataclasses.MISSING}
        if not isinstance(data, dict) or not required <= set(data) or not set(data) <= names:
            got = sorted(data) if isinstance(data, dict) else type(data).__name__
            raise MeasurementError(
                f"not a diagnosis record: needs the fields {sorted(required)} (and at most "
                f"{sorted(names - required)}), got {got}. Was it written by looptune diagnose "
                "--json of another version? Rerun the diagnosis.")
        try:
            return cls(**{**data, "findings": [Finding(**f) for f in data["findings"]],
                          "remedies": [Remedy(**{**r, "lr_scale": tuple(r["lr_scale"])})
                                       if r.get("lr_scale") else Remedy(**r)
                                       for r in data["remedies"]],
                          "loaders": [LoaderInfo(**ld) for ld in data["loaders"]]})
        except TypeError as err:  # a finding / remedy / loader with other fields
            raise MeasurementError(f"not a diagnosis record: {err}. Rerun the diagnosis.") from None

    @classmethod
    def read_json(cls, path: str | os.PathLike) -> Diagnosis:
        """Read a diagnosis written by :meth:`write_json`.

        Raises:
            MeasurementError: the file is missing, not JSON, or not a diagnosis record.
        """
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise MeasurementError(f"cannot read the diagnosis {str(path)!r}: {err}. Rerun the "
                                   "diagnosis to write it again.") from None
        try:
            return cls.from_dict(data)
        except MeasurementError as err:
            raise MeasurementError(f"{str(path)!r}: {err}") from None

    def write_json(self, path: str | os.PathLike) -> None:
        """Atomic: an interrupted write never leaves half a file at ``path``."""
        atomic_write_text(path, json.dumps(self.to_dict(), indent=2, allow_nan=False) + "\n")
