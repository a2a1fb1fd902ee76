"""train(): the training loop, readable top to bottom.

Every host-device sync point is marked ``# sync:``. The loop knows nothing about tables, JSON or
the CLI: it returns a :class:`~looptune.measure.results.RunResult` and, if given a ``progress``
sink, tells it how far it got.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Protocol

import torch

from looptune.data.loaders import BatchSource
from looptune.errors import MeasurementError
from looptune.engine.optim import build_optimizer
from looptune.engine.step import build_step
from looptune.measure.memory import PeakMemory
from looptune.measure.results import RunResult
from looptune.measure.timing import Stopwatch
from looptune.recipe import Decision, Recipe

__all__ = ["Progress", "train"]

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class Progress(Protocol):
    """Where the loop reports progress (a progress bar, a log); optional."""

    def advance(self, steps: int) -> None: ...

    def epoch_done(self, epoch: int, loss: float, seconds: float) -> None: ...


def train(*, model: torch.nn.Module, source: BatchSource, recipe: Recipe, loss_fn: LossFn,
          device: torch.device, epochs: int, setup_s: float = 0.0,
          decisions: list[Decision] | None = None, progress: Progress | None = None) -> RunResult:
    """Train ``model`` for ``epochs`` epochs on ``source`` under ``recipe``; measure it.

    Args:
        model: already on ``device``, initialized (seeded) by the caller.
        source: batches, built for ``recipe.loader`` by ``looptune.data.loaders.make``.
        recipe: the resolved recipe (see ``looptune.recipe.resolve``).
        loss_fn: ``loss_fn(logits, targets) -> scalar loss``.
        device: the training device.
        epochs: number of passes over the data, >= 1.
        setup_s: time the caller spent building ``source``, recorded as is.
        decisions: the reasons behind any automatic recipe changes, recorded as is.
        progress: optional sink for progress reports.

    Returns:
        The measurements of the run (no test accuracy: evaluation is the caller's).
    """
    optimizer = build_optimizer(model.parameters(), recipe.optim)
    step = build_step(model=model, optimizer=optimizer, loss_fn=loss_fn)
    memory, clock = PeakMemory(device), Stopwatch(device)
    per_step_read = recipe.loss_sync == "step"
    report_every = max(1, len(source) // 50)
    epoch_s, epoch_loss, first_loss, data_wait = [], [], None, 0.0
    model.train()
    memory.start()
    for epoch in range(epochs):
        clock.start()
        loss_host, loss_dev, n = 0.0, torch.zeros((), device=device), 0
        batches = iter(source.epoch(epoch))
        while True:
            t0 = time.perf_counter()
            batch = next(batches, None)  # the data wait: blocked until the next batch exists
            data_wait += time.perf_counter() - t0
            if batch is None:
                break
            x, y = source.to_device(*batch)
            loss = step(x, y)
            if first_loss is None:
                first_loss = loss
            if per_step_read:
                loss_host += loss.item()  # sync: .item() waits for the device (the reference)
            else:
                loss_dev += loss  # stays on the device: no sync
            n += 1
            if progress is not None and n % report_every == 0:
                progress.advance(report_every)
        if n == 0:
            raise MeasurementError(f"epoch {epoch} produced no batches: the dataset is empty or "
                                   "smaller than one batch with drop_last=True")
        total = loss_host + loss_dev.item()  # sync: once per epoch
        epoch_s.append(clock.stop())
        epoch_loss.append(total / max(n, 1))
        if progress is not None:
            progress.advance(n % report_every)
            progress.epoch_done(epoch, epoch_loss[-1], epoch_s[-1])
    mem = memory.read()
    wall = sum(epoch_s)
    return RunResult(
        recipe=recipe.name, config=recipe.to_dict(),
        decisions=[asdict(d) for d in decisions or []], device=str(device), epochs=epochs,
        batches_per_epoch=n, samples_per_epoch=source.samples_per_epoch, setup_s=setup_s,
        wall_s=wall, epoch_s=epoch_s, samples_per_s=source.samples_per_epoch * epochs / wall,
        epoch_loss=epoch_loss, first_loss=float(first_loss.item()),  # sync: once, after training
        data_wait_s=data_wait, data_wait_fraction=data_wait / wall,
        peak_mem_bytes=mem.peak_bytes, peak_mem_kind=mem.kind)
