"""What the rules conclude from the measurements: a :class:`Verdict` (the bottleneck, the phase
shares, the evidence), pre-flight :class:`Finding` s and ranked :class:`Remedy` s. Pure data,
JSON-ready, no torch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["Bottleneck", "Finding", "Remedy", "Verdict"]

Bottleneck = Literal["data_loading", "host_to_device", "overhead", "compute", "memory"]


@dataclass(frozen=True, kw_only=True)
class Finding:
    """A pre-flight observation about the environment or settings."""

    name: str  # e.g. "workers_vs_cores"
    severity: Literal["info", "warning"]
    message: str  # the observation with its numbers and what to do


@dataclass(frozen=True, kw_only=True)
class Remedy:
    action: str  # the exact knob and value, e.g. "DataLoader(num_workers=2, persistent_workers=True)"
    expected_speedup: float  # upper bound on the whole-step speedup, from the measured shares
    reason: str  # the numbers it is derived from
    kind: str = ""  # machine-readable tag, e.g. "loader", "sync", "batch", "precision"
    measured_speedup: float | None = None  # --verify: the remedy applied and measured
    # --verify: the rerun trained like the original (same losses within its noise); False: it
    # changed the training and its speed-up does not count; None: not checked
    loss_parity: bool | None = None
    # its bound rests on an assumed fraction (what torch.compile fuses, a per-step cost taken as
    # fixed) rather than on this script's own work replayed or read: ranked after every remedy
    # whose bound was measured, whatever it promises (issue 32: compile promised 1.11x on an
    # estimate, measured 0.85x, above a bf16 replay's 1.10x that measured 1.30x)
    estimated: bool = False
    # batch: the learning rate that goes with the larger batch, as (optimizer class, factor) by
    # its class's scaling rule; --verify's rerun applies both. None: no rule for that optimizer
    lr_scale: tuple[str, float] | None = None


@dataclass(frozen=True, kw_only=True)
class Verdict:
    bottleneck: Bottleneck
    shares: dict[str, float]  # per phase (PHASES), summing to 1 within rounding
    step_ms: float  # median step time
    phase_ms: dict[str, float]  # median ms per phase
    evidence: dict[str, Any]  # the numbers behind the verdict
    findings: list[Finding]
    remedies: list[Remedy]  # ranked, largest expected speedup first
    # the step's own parts (median host ms per step): "forward" (with the loss, when the model
    # was timed), "backward", "optimizer" (update + zero_grad + clip_grad + grad_scaler +
    # lr_scheduler), and each of those optimizer parts the step ran as "optimizer.<part>"
    part_ms: dict[str, float] = field(default_factory=dict)
    part_shares: dict[str, float] = field(default_factory=dict)  # the same, as shares of the step
    # when the step waits for data: which link of the input chain starves it (rules/chain.py):
    # "storage" | "decode" | "collate" | "transfer" | "contention"; None: not data-bound, or the
    # chain was not seen; input_chain: its numbers (per-batch ms per link, shares, bytes)
    data_cause: str | None = None
    input_chain: dict[str, Any] = field(default_factory=dict)
