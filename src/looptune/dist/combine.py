"""One RunResult for the whole job from every rank's own measurements."""

from __future__ import annotations

import dataclasses
import statistics

from looptune.dist.context import DistContext
from looptune.measure.results import RunResult

__all__ = ["combine_ranks"]


def combine_ranks(result: RunResult, ctx: DistContext) -> RunResult:
    """The job's result on every rank (one all-gather): time is the slowest rank's (the job ends
    when it does), samples are summed over ranks, data wait is the ranks' mean, peak memory the
    largest; each rank's own figures are kept in ``extra["per_rank"]``.

    Losses are already global (all-reduced per epoch by the loop); so is the accuracy when the
    evaluation was sharded (``looptune.dist.ddp.sharded_accuracy``).
    """
    if not ctx.enabled:
        return result
    steps = max(result.epochs * result.batches_per_epoch, 1)
    mine = {"rank": ctx.rank, "wall_s": result.wall_s, "epoch_s": list(result.epoch_s),
            "samples_per_epoch": result.samples_per_epoch, "samples_per_s": result.samples_per_s,
            "step_ms": 1000.0 * result.wall_s / steps, "data_wait_s": result.data_wait_s,
            "data_wait_fraction": result.data_wait_fraction,
            "peak_mem_bytes": result.peak_mem_bytes, "setup_s": result.setup_s}
    ranks = ctx.gather(mine)  # sync: a collective, once per run
    wall = max(r["wall_s"] for r in ranks)
    per_epoch = sum(r["samples_per_epoch"] for r in ranks)
    wait = statistics.fmean(r["data_wait_s"] for r in ranks)
    slowest = max(ranks, key=lambda r: r["wall_s"])["rank"]
    return dataclasses.replace(
        result, wall_s=wall,
        epoch_s=[max(r["epoch_s"][e] for r in ranks) for e in range(len(result.epoch_s))],
        samples_per_epoch=per_epoch, samples_per_s=per_epoch * result.epochs / wall if wall else 0.0,
        data_wait_s=wait, data_wait_fraction=min(wait / wall, 1.0) if wall else 0.0,
        peak_mem_bytes=max((r["peak_mem_bytes"] or 0) for r in ranks) or result.peak_mem_bytes,
        setup_s=max(r["setup_s"] for r in ranks),
        extra={**result.extra, "world_size": ctx.world_size, "backend": ctx.backend,
               "slowest_rank": slowest, "per_rank": ranks})
