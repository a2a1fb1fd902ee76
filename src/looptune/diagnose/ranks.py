"""Many ranks' diagnoses -> one report: a per-rank breakdown and the slowest rank.

Pure (no torch, no processes, no clocks): the ranks of a distributed job each diagnose
themselves; this merges their :class:`Diagnosis` records.

Which rank is slowest: in a synchronized job (DDP) every step ends with an all-reduce that waits
for the last rank, so all ranks' step times are the same and cannot say who is late. Each rank's
*own* time per step (its step minus its time blocked in collectives: waiting for the others,
plus the transfer) can: the straggler waits least and works longest. That is what is compared
when every rank's collectives were timed (CPU/gloo); otherwise (CUDA/NCCL, or a rank without
them) the median step time is, and the report says so.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import median
from typing import Any

from looptune._io import atomic_write_text
from looptune.measure.records import PHASES
from looptune.diagnose.result import Diagnosis
from looptune.errors import ConfigError

__all__ = ["BALANCED", "RankReport", "RankRow", "merge_ranks"]

# slowest / fastest below this is run-to-run noise (the verdict's MIN_SPEEDUP): "balanced"
BALANCED = 1.05


@dataclass(frozen=True, kw_only=True)
class RankRow:
    """One rank's line of the breakdown; shares of its median step, summing to ~1."""

    rank: int
    steps_measured: int
    step_ms: float  # median step time (the same on every rank of a synchronized job)
    own_ms: float | None  # median of (step - wait): the rank's own work; None: waits unknown
    wait_ms: float | None  # median ms per step blocked in collectives; None: not measured
    shares: dict[str, float]  # PHASES with that time taken out of compute, plus "collectives"
    peak_mem_bytes: int | None
    peak_mem_kind: str
    bottleneck: str
    error: str | None  # the rank's script raised this


@dataclass(frozen=True, kw_only=True)
class RankReport:
    world_size: int
    ranks: list[Diagnosis]  # in rank order; only the ranks that reported
    rows: list[RankRow]  # the same order
    slowest_rank: int
    fastest_rank: int
    compared_by: str  # "own_ms" | "step_ms": the time the ranks were compared on
    slowdown: float  # slowest / fastest on that time (1.0 with a single rank)
    balanced: bool  # slowdown < BALANCED: within run-to-run noise
    reason: str  # the decision with its numbers
    missing_ranks: list[int]  # ranks of the job that wrote no diagnosis

    @property
    def slowest(self) -> Diagnosis:
        return self.ranks[[r.rank for r in self.rows].index(self.slowest_rank)]

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "diagnose-ranks", "world_size": self.world_size,
                "ranks": [d.to_dict() for d in self.ranks],
                "slowest_rank": self.slowest_rank, "fastest_rank": self.fastest_rank,
                "compared_by": self.compared_by, "slowdown": self.slowdown,
                "balanced": self.balanced, "reason": self.reason,
                "missing_ranks": self.missing_ranks,
                "rows": [vars(r) for r in self.rows]}

    def write_json(self, path: str | os.PathLike) -> None:
        """Atomic: an interrupted write never leaves half a file at ``path``."""
        atomic_write_text(path, json.dumps(self.to_dict(), indent=2, allow_nan=False) + "\n")


def merge_ranks(diagnoses: Sequence[Diagnosis], *, world_size: int | None = None) -> RankReport:
    """Merge the diagnoses of a distributed job's ranks and name the slowest rank.

    Args:
        diagnoses: one per rank that reported, any order. Each ``rank`` is used; if none has one
            (diagnoses made outside a launcher), their positions are the ranks.
        world_size: ranks in the job (default: the ``world_size`` the diagnoses recorded, else
            how many there are); ranks below it without a diagnosis are listed as missing.

    Returns:
        A frozen :class:`RankReport`: rows in rank order, slowest and fastest rank, the ratio
        and the reason for the choice.

    Raises:
        ConfigError: no diagnoses, a rank given twice or outside ``0..world_size-1``, or some
            diagnoses with a rank and some without.

    Example:
        >>> report = merge_ranks([d0, d1])  # doctest: +SKIP
        >>> report.slowest_rank, f"{report.slowdown:.2f}x", report.reason
    """
    ranked = _ranked(diagnoses)
    world = _world_size(ranked, world_size)
    rows = [_row(rank, d) for rank, d in ranked]
    by_own = all(r.own_ms is not None for r in rows)
    key = "own_ms" if by_own else "step_ms"
    slowest = max(rows, key=lambda r: (getattr(r, key), -r.rank))  # ties: the lowest rank
    fastest = min(rows, key=lambda r: (getattr(r, key), r.rank))
    slow_ms, fast_ms = getattr(slowest, key), getattr(fastest, key)
    slowdown = round(slow_ms / fast_ms, 4) if fast_ms > 0 else 1.0
    return RankReport(
        world_size=world, ranks=[d for _, d in ranked], rows=rows, slowest_rank=slowest.rank,
        fastest_rank=fastest.rank, compared_by=key, slowdown=slowdown,
        balanced=slowdown < BALANCED, reason=_reason(rows, slowest, fastest, key, slowdown),
        missing_ranks=sorted(set(range(world)) - {r.rank for r in rows}))


def _ranked(diagnoses: Sequence[Diagnosis]) -> list[tuple[int, Diagnosis]]:
    diagnoses = list(diagnoses)
    if not diagnoses:
        raise ConfigError("no rank diagnoses to merge: got an empty list. Pass one Diagnosis per "
                          "rank (each rank of the job writes one).")
    with_rank = [d.rank is not None for d in diagnoses]
    if any(with_rank) and not all(with_rank):
        missing = [i for i, has in enumerate(with_rank) if not has]
        raise ConfigError(f"diagnoses at positions {missing} have no rank while the others do: "
                          "give every diagnosis its rank, or none (positions are then the ranks).")
    ranks = [d.rank if d.rank is not None else i for i, d in enumerate(diagnoses)]
    twice = sorted({r for r in ranks if ranks.count(r) > 1})
    if twice:
        raise ConfigError(f"rank(s) {twice} given more than once: each rank reports once. "
                          "Were diagnoses of two runs mixed?")
    return sorted(zip(ranks, diagnoses), key=lambda pair: pair[0])


def _world_size(ranked: list[tuple[int, Diagnosis]], world_size: int | None) -> int:
    recorded = [d.world_size for _, d in ranked if d.world_size is not None]
    world = world_size if world_size is not None else max(recorded, default=len(ranked))
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise ConfigError(f"world_size={world!r} is invalid: must be an integer >= 1 (the "
                          "number of ranks in the job).")
    outside = [r for r, _ in ranked if not 0 <= r < world]
    if outside:
        raise ConfigError(f"rank(s) {outside} are outside 0..{world - 1} for world_size={world}: "
                          "pass the job's world_size, or diagnoses of that job only.")
    return world


def _row(rank: int, d: Diagnosis) -> RankRow:
    waits = d.wait_s if d.wait_s is not None and len(d.wait_s) == len(d.step_s) else None
    own_ms = wait_ms = None
    shares = {k: d.shares.get(k, 0.0) for k in PHASES}
    if waits and d.step_s:
        own_ms = round(1e3 * median(s - w for s, w in zip(d.step_s, waits)), 4)
        wait_ms = round(1e3 * median(waits), 4)
        # on the CPU the host blocks inside backward() / the collective: the probes count that
        # time as compute, so the wait is taken out of it (no more than compute holds)
        wait = min(shares["compute"], wait_ms / d.step_ms) if d.step_ms > 0 else 0.0
        shares["compute"] = round(shares["compute"] - wait, 4)
        shares["collectives"] = round(wait, 4)
    return RankRow(rank=rank, steps_measured=d.steps_measured, step_ms=d.step_ms, own_ms=own_ms,
                   wait_ms=wait_ms, shares=shares, peak_mem_bytes=d.peak_mem_bytes,
                   peak_mem_kind=d.peak_mem_kind, bottleneck=d.bottleneck, error=d.error)


def _reason(rows: list[RankRow], slowest: RankRow, fastest: RankRow, key: str,
            slowdown: float) -> str:
    if len(rows) == 1:
        return f"only rank {slowest.rank} reported: nothing to compare it with"
    what = ("own time per step (the step minus its time blocked in collectives)"
            if key == "own_ms" else "median step time")
    text = (f"by {what}: rank {slowest.rank} {getattr(slowest, key):.3f} ms vs rank "
            f"{fastest.rank} {getattr(fastest, key):.3f} ms, {slowdown:.2f}x "
            f"(+{100 * (slowdown - 1):.0f}%)")
    if slowdown < BALANCED:
        text += f"; below {BALANCED:.2f}x, within run-to-run noise: the ranks are balanced"
    elif key == "own_ms" and fastest.wait_ms is not None:
        text += (f"; rank {fastest.rank} spends {fastest.wait_ms:.3f} ms per step in collectives "
                 f"waiting for it, so every rank runs at rank {slowest.rank}'s pace")
    if key == "step_ms":
        unknown = [r.rank for r in rows if r.own_ms is None]
        text += (f"; time in collectives not measured on rank(s) {unknown} (CUDA/NCCL waits run "
                 "on the device, or a built-in DDP hook): in a synchronized job step times are "
                 "alike on every rank, so this comparison can miss a straggler")
    return text
