"""DistributedDataParallel around the model, and the metrics every rank must agree on."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch.nn.parallel import DistributedDataParallel

from looptune.dist.context import DistContext

__all__ = ["no_sync", "sharded_accuracy", "sharded_mean", "unwrap", "wrap"]


def wrap(model: torch.nn.Module, device: torch.device, ctx: DistContext) -> torch.nn.Module:
    """``model`` as DDP when ``ctx`` has several ranks (its parameters broadcast from rank 0 at
    construction, so every rank starts identical); the model itself otherwise."""
    if not ctx.enabled:
        return model
    ids = [device.index] if device.type == "cuda" else None  # CPU/gloo: no device_ids
    return DistributedDataParallel(model, device_ids=ids)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The user's module inside a DDP wrapper (what checkpoints and evaluation use)."""
    return model.module if isinstance(model, DistributedDataParallel) else model


def no_sync(model: torch.nn.Module, skip: bool) -> contextlib.AbstractContextManager:
    """DDP's ``no_sync()`` when ``skip`` (a gradient-accumulation micro-step that does not step
    the optimizer: its gradients stay local until the stepping micro-step all-reduces them)."""
    if skip and isinstance(model, DistributedDataParallel):
        return model.no_sync()
    return contextlib.nullcontext()


def sharded_mean(score: Callable[[torch.nn.Module, int, int], tuple[float, int]],
                 model: torch.nn.Module, ctx: DistContext) -> float:
    """A metric's mean over the whole evaluation set, each rank scoring its shard.

    ``score(model, rank, world) -> (sum, count)`` scores samples ``rank::world`` (correct
    predictions, or summed per-sample losses); sums and counts are added over the ranks (one
    all-reduce), so every rank returns the same global mean. One process: its own sum / count.
    """
    total, count = score(unwrap(model), ctx.rank, ctx.world_size)
    if ctx.enabled:
        total, count = ctx.all_sum([total, count])
    return total / max(count, 1.0)


sharded_accuracy = sharded_mean  # the accuracy is the mean of per-sample 0/1 scores
