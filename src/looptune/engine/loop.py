"""train(): the training loop, readable top to bottom.

Every host-device sync point is marked ``# sync:``. The loop knows nothing about tables, JSON or
the CLI: it returns a :class:`~looptune.measure.results.RunResult` and, if given a ``progress``
sink, tells it how far it got. Bookkeeping (checkpoint state, signals) lives in ``run_state.py``.
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Protocol

import torch

from looptune.data.faults import WORKER_GONE
from looptune.data.loaders import BatchSource
from looptune.data.store import store_in_autocast_dtype
from looptune.dist import ddp
from looptune.dist.context import DistContext
from looptune.dist.combine import combine_ranks
from looptune.engine import checkpoint as ckpt
from looptune.engine.evals import DeferredEvals
from looptune.engine.optim import build_optimizer, optimizer_kind
from looptune.engine.run_state import (
    CheckpointWriteError,
    Interrupted,
    RunOptions,
    RunState,
    cpu_threads,
    first_bad,
    nonfinite_loss,
    resume_problems,
    stop_signals,
)
from looptune.engine.schedule import build_scheduler
from looptune.engine.step import Stepper
from looptune.fastpath.threads import ThreadGovernor, governor_for
from looptune.errors import ConfigError, MeasurementError
from looptune.measure.memory import PeakMemory
from looptune.measure.results import RunResult, metric_fields
from looptune.measure.timing import Stopwatch
from looptune.recipe import Decision, Recipe

__all__ = ["Progress", "RunOptions", "train"]

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Evaluate = Callable[[torch.nn.Module], float]  # model -> the metric (options.metric names it)


class Progress(Protocol):
    """Where the loop reports progress (a progress bar, a log); optional."""

    def advance(self, steps: int) -> None: ...

    def epoch_done(self, epoch: int, loss: float, seconds: float) -> None: ...


def train(*, model: torch.nn.Module, source: BatchSource, recipe: Recipe, loss_fn: LossFn,
          device: torch.device, options: RunOptions, evaluate: Evaluate | None = None,
          setup_s: float = 0.0, decisions: list[Decision] | None = None,
          progress: Progress | None = None, dist: DistContext | None = None) -> RunResult:
    """Train ``model`` on ``source`` under ``recipe`` for ``options.epochs``; measure it.

    Args:
        model: already on ``device`` and initialized (seeded) by the caller.
        source: batches, built for ``recipe.loader`` by ``looptune.data.loaders.make``.
        recipe: the resolved recipe (see ``looptune.resolve.resolve``).
        loss_fn: ``loss_fn(logits, targets) -> scalar loss``.
        device: the training device.
        options: epochs, evaluation cadence, the metric and its target, checkpointing.
        evaluate: ``evaluate(model) -> metric value`` (``options.metric`` says which and its
            direction); used for ``eval_every``/``target``.
        setup_s, decisions: recorded as given (time to build ``source``; automatic changes).
        progress: optional sink for progress reports.
        dist: this rank's place in a data-parallel job (``looptune.dist.context.init``); the
            model is wrapped in DDP, ``source`` must yield this rank's share (``make(...,
            rank=, world=)``), metrics are all-reduced and only rank 0 writes checkpoints.

    Returns:
        The run's measurements. Evaluation and compilation time are excluded from ``wall_s``.

    Raises:
        NonFiniteLoss: the loss became NaN/inf (with ``stop_on_nonfinite``).
        Interrupted: SIGINT/SIGTERM; the run saved a checkpoint first if it has a folder.
    """
    run = _Training(model=model, source=source, recipe=recipe, loss_fn=loss_fn, device=device,
                    options=options, evaluate=evaluate, progress=progress,
                    ctx=dist or DistContext())
    stepper, state, n_batches = run.stepper, run.state, len(source)
    decisions = list(decisions or []) + run.decisions
    with cpu_threads(recipe.cpu_threads), stop_signals(state):
        decisions += run.set_up_step()  # the fast step and the thread governor, off the clock
        run.memory.start()
        for epoch in range(state.epoch, options.epochs):
            state.epoch = epoch
            with run.worker_failures_named():  # a dead or hung DataLoader worker, named
                batches = run.start_epoch(epoch)  # clock on; worker start-up is data wait
                while (batch := run.next_batch(batches)) is not None:  # the data wait
                    i = state.position
                    x, y = source.to_device(*batch)
                    loss = stepper(x, y, boundary=i == n_batches - 1)
                    run.record_loss(loss, i)
                    run.after_step(i)  # progress, NaN checks, evals, checkpoints: off the clock
                run.end_epoch(epoch)  # sync: the clock waits for the device; the epoch's loss
        stepper.check_skips()
    if run.threads is not None:  # what the thread counts measured, and every switch
        decisions.append(run.threads.decision())
    run.score_pending()  # the evaluation points kept during training (engine/evals.py)
    return combine_ranks(run.result(setup_s=setup_s, decisions=decisions), run.ctx)


class _Training:
    """One run's objects, and what ``train()``'s loop calls between its steps."""

    def __init__(self, *, model: torch.nn.Module, source: BatchSource, recipe: Recipe,
                 loss_fn: LossFn, device: torch.device, options: RunOptions,
                 evaluate: Evaluate | None, progress: Progress | None, ctx: DistContext) -> None:
        if len(source) == 0:
            raise MeasurementError("the data yields no batches: the dataset is empty or smaller "
                                   "than one batch with drop_last=True")
        self.ctx, self.module = ctx, model  # the user's module: checkpoints and evaluation
        if recipe.step.channels_last:
            model.to(memory_format=torch.channels_last)  # in place: parameters become NHWC
        model = ddp.wrap(model, device, ctx)  # DDP with several ranks, else the model itself
        self.model, self.source, self.recipe, self.device = model, source, recipe, device
        self.options, self.evaluate, self.progress = options, evaluate, progress
        capturable = recipe.step.cuda_graphs
        self.optimizer, self.decisions = build_optimizer(model.parameters(), recipe.optim,
                                                         device=device, capturable=capturable)
        steps_per_epoch = -(-len(source) // recipe.step.accumulate)
        self.scheduler = build_scheduler(self.optimizer, recipe.schedule,
                                         total_steps=steps_per_epoch * options.epochs)
        self.stepper = Stepper(model=model, optimizer=self.optimizer, scheduler=self.scheduler,
                               loss_fn=loss_fn, cfg=recipe.step, device=device)
        self.state, self.memory, self.clock = RunState(), PeakMemory(device), Stopwatch(device)
        self.threads: ThreadGovernor | None = None  # thread_policy='adaptive' (set_up_step)
        self._compile_before = 0.0  # compile seconds when the epoch started (start_epoch)
        self.deferred = DeferredEvals(self.module)
        self.report_every = max(1, len(source) // 50)
        if recipe.loader.store == "autocast":  # before any step: the batches' dtype is fixed
            self.decisions.append(store_in_autocast_dtype(source, self.module,
                                                          recipe.step.precision, device))
        if options.resume:
            self._resume()
        model.train()

    def set_up_step(self) -> list[Decision]:
        """The fast step for this run's batches (``looptune.fastpath``) and the adaptive thread
        governor, calibrated on it; their decisions."""
        recipe, stepper = self.recipe, self.stepper
        images = getattr(self.source, "images", None)  # a device-resident dataset: its dtype
        decisions = stepper.prepare(recipe.loader.batch_size, images.dtype if isinstance(
            images, torch.Tensor) and images.is_floating_point() else torch.float32)
        self.threads, off = governor_for(recipe.thread_policy, recipe.cpu_threads, self.device,
                                         self.ctx.world_size, calibrate=stepper.idle_call)
        return decisions + ([off] if off is not None else [])

    @contextlib.contextmanager
    def worker_failures_named(self) -> Iterator[None]:
        """A DataLoader worker that died or hung ends the epoch with an error naming it and the
        sample it was reading (``source.failure``), instead of torch's bare one."""
        try:
            yield
        except WORKER_GONE as err:
            try:  # first statement: torch's SIGCHLD handler, pending when the pipe broke, runs
                named = self._worker_failure(err)  # at the next call and raises its own error
            except WORKER_GONE as late:
                named, err = self._worker_failure(late), late
            if named is None:
                raise err
            raise named from err

    def _worker_failure(self, err: BaseException) -> BaseException | None:
        failure = getattr(self.source, "failure", None)
        return failure(err) if failure is not None else None

    def start_epoch(self, epoch: int) -> Iterator:
        """Start the clock and the epoch's batches (from ``state.position`` on a resume); the
        workers' start-up and the epoch's gather count as data wait."""
        state = self.state
        if state.position == 0:
            state.loss_host, state.losses = 0.0, torch.zeros(len(self.source), device=self.device)
        self._compile_before = self.stepper.stats.compile_s
        self._start_clock()
        t0 = time.perf_counter()
        batches = iter(self.source.epoch(epoch, start=state.position))
        state.data_wait_s += time.perf_counter() - t0
        if self.threads is not None:  # the epoch's set-up is not a step's time
            self.threads.new_window()
        return batches

    def next_batch(self, batches: Iterator):
        """The next host batch, or None at the epoch's end; the time blocked is data wait."""
        t0 = time.perf_counter()
        batch = next(batches, None)
        self.state.data_wait_s += time.perf_counter() - t0
        return batch

    def end_epoch(self, epoch: int) -> None:
        """Stop the clock, check the losses, record the epoch (its compile time excluded)."""
        self._pause_clock()
        self._check_finite(epoch, len(self.source))
        compiled = self.stepper.stats.compile_s - self._compile_before  # compiling isn't training
        self._end_epoch(epoch, self.state.epoch_partial_s - compiled)

    def after_step(self, i: int) -> None:
        """Count batch ``i`` as trained, then progress, NaN checks, evaluation, checkpoints and
        signals, off the training clock."""
        state = self.state
        if self.threads is not None:
            self.threads.tick()
        state.position, state.global_batches = i + 1, state.global_batches + 1
        self._between_steps(i)

    def record_loss(self, loss: torch.Tensor, i: int) -> None:
        state = self.state
        if state.first_loss is None:
            state.first_loss = loss.clone()  # clone: a graphed step overwrites its loss tensor
        if self.recipe.loss_sync == "step":
            value = loss.item()  # sync: .item() waits for the device (the reference's loop)
            state.loss_host += value
            if not math.isfinite(value):
                self._check_finite(state.epoch, i + 1)
        else:
            state.losses[i] = loss  # stays on the device: no sync

    def _between_steps(self, i: int) -> None:
        """Progress, NaN checks, evaluation, checkpoints and signals, off the training clock."""
        state, options, n = self.state, self.options, i + 1
        if self.progress is not None and n % self.report_every == 0:
            self.progress.advance(self.report_every)
        if self.recipe.loss_sync == "epoch" and n % options.nonfinite_check_every == 0:
            self._check_finite(state.epoch, n)
        steps = self.stepper.stats.optimizer_steps
        at_opt_step = n % self.recipe.step.accumulate == 0 or n == len(self.source)
        eval_due = bool(options.eval_every) and state.global_batches % options.eval_every == 0
        ckpt_due = bool(options.checkpoint_every) and at_opt_step and steps > 0 and (
            steps % options.checkpoint_every == 0)
        stop = state.stop_signal is not None and at_opt_step  # finish the optimizer step first
        if not (eval_due or ckpt_due or stop):
            return
        self._pause_clock()
        if eval_due:
            self._evaluate()
        if ckpt_due or stop:
            self._save_checkpoint(agreed=ckpt_due)
        if stop:
            self._interrupt()
        self._start_clock()

    def _start_clock(self) -> None:
        self.clock.start()
        if self.threads is not None:  # time off the clock is no step's
            self.threads.new_window()

    def _pause_clock(self) -> None:
        elapsed = self.clock.stop()  # sync: the device finishes the queued steps first
        self.state.train_s += elapsed
        self.state.epoch_partial_s += elapsed

    def _end_epoch(self, epoch: int, epoch_s: float) -> None:
        state, n_batches = self.state, len(self.source)
        total = state.loss_host + float(state.losses.sum().item())  # sync: once per epoch
        trained = max(state.position, 1)  # n_batches, unless a stream ended early
        (mean_loss,) = self.ctx.all_mean([total / trained])  # every rank: the global loss
        state.epoch_s.append(epoch_s)
        state.epoch_loss.append(mean_loss)
        state.epoch, state.position, state.epoch_partial_s = epoch + 1, 0, 0.0
        points = state.evals + [entry for entry, _ in self.deferred.pending]
        already = bool(points) and points[-1]["batches"] == state.global_batches
        if self.options.evaluates and not already:
            self._evaluate()
        if self.progress is not None:
            self.progress.advance(n_batches % self.report_every)
            self.progress.epoch_done(epoch, state.epoch_loss[-1], epoch_s)

    def _evaluate(self) -> None:
        if self.evaluate is None:
            return
        state = self.state
        entry = {"epoch": state.epoch, "batches": state.global_batches,
                 "train_s": self._train_s_now()}
        if self.deferred.enabled:  # scored after training (engine/evals.py)
            self.deferred.keep(self.module, entry)
            return
        t0 = time.perf_counter()
        value = self.evaluate(self.module)
        self.model.train()
        self._record_eval(entry, value, time.perf_counter() - t0)

    def score_pending(self) -> None:
        """Score the evaluation points kept so far (after training, before a checkpoint)."""
        if self.evaluate is not None:
            for entry, value, spent in self.deferred.score(self.module, self.evaluate):
                self._record_eval(entry, value, spent)

    def _record_eval(self, entry: dict, value: float, spent: float) -> None:
        state = self.state
        state.eval_s += spent
        metric, target = self.options.metric, self.options.target
        entry = {**entry, "metric": value, "eval_s": spent}
        if metric.name == "accuracy":
            entry["accuracy"] = value  # the key older results and reports read
        state.evals.append(entry)
        if target is not None and state.time_to_target_s is None and metric.reached(value, target):
            state.time_to_target_s = entry["train_s"]

    def _train_s_now(self) -> float:
        return self.state.train_s - self.stepper.stats.compile_s

    def _check_finite(self, epoch: int, upto: int) -> None:
        if not self.recipe.step.stop_on_nonfinite:
            return
        state = self.state
        window = state.losses[:upto]
        if self.recipe.loss_sync == "epoch" and bool(torch.isfinite(window).all()):  # sync: every
            return  # nonfinite_check_every batches
        if self.recipe.loss_sync == "step" and math.isfinite(state.loss_host):
            return
        bad = first_bad(window) if self.recipe.loss_sync == "epoch" else upto - 1
        raise nonfinite_loss(epoch, bad, state.global_batches - state.position + bad,
                             self.source.batch_indices(epoch, bad))

    def _save_checkpoint(self, agreed: bool = True) -> None:
        folder = self.options.checkpoint_dir
        if folder is None:
            return
        if agreed or self.ctx.world_size == 1:  # scoring is collective with several ranks
            self.score_pending()  # a resumed run continues from scored points
        if agreed and self.ctx.world_size > 1:  # every rank is here (same step): share the losses
            self._average_partial_losses()
        if not self.ctx.is_main:  # weights and optimizer state are identical on every rank
            return
        saved = self.state.to_checkpoint(model=self.module, optimizer=self.optimizer,
                                         scheduler=self.scheduler, scaler=self.stepper.scaler,
                                         recipe=self.recipe.to_dict())
        saved["train_s"] -= self.stepper.stats.compile_s  # a resumed run recompiles anyway
        step = self.stepper.stats.optimizer_steps
        try:
            ckpt.save_checkpoint(folder, saved, step=step)
        except OSError as err:
            _, kept, _ = ckpt.latest_checkpoint(folder)
            raise CheckpointWriteError(
                f"could not write the checkpoint of step {step} to {folder}: {err.strerror or err}"
                f" (errno {err.errno}). " + (f"The previous checkpoint {kept.name} is intact; "
                                            if kept else "No earlier checkpoint exists; ") +
                "free space or make the folder writable, then continue with --resume (or "
                "choose another --checkpoint folder).") from err

    def _average_partial_losses(self) -> None:
        """Replace this epoch's losses so far by their mean over the ranks, on every rank, so the
        checkpoint rank 0 writes holds the job's losses, not rank 0's (the epoch's final
        all-mean is linear, so averaging part of it early changes nothing else)."""
        state, done = self.state, self.state.position
        values = self.ctx.all_mean([state.loss_host, *state.losses[:done].tolist()])  # sync
        state.loss_host = values[0]
        if done:
            state.losses[:done] = torch.tensor(values[1:], dtype=state.losses.dtype,
                                               device=state.losses.device)

    def _resume(self) -> None:
        folder = self.options.checkpoint_dir
        saved, path, skipped = ckpt.latest_checkpoint(folder, map_location=self.device)
        for bad, reason in skipped:
            warnings.warn(f"skipped checkpoint {bad}: {reason}", stacklevel=3)
        if self.ctx.world_size > 1:  # every rank must continue from the same checkpoint
            chosen = self.ctx.gather(None if path is None else Path(path).name)
            if len(set(chosen)) > 1:
                raise ConfigError(
                    f"cannot resume: the ranks found different newest valid checkpoints in "
                    f"{folder} ({', '.join(f'rank {r}: {c}' for r, c in enumerate(chosen))}). "
                    "Every rank must see the same, shared checkpoint folder; check that it is "
                    "on a file system all ranks share and that no checkpoint is being written.")
        if saved is None:
            self.decisions.append(Decision("resume", False, reason=(
                f"no valid checkpoint in {folder}; started from scratch")))
            return
        problems, changes = resume_problems(saved, recipe=self.recipe.to_dict(), model=self.module)
        if problems:
            raise ConfigError([f"cannot resume from {path}: {p}" for p in problems])
        if changes:
            self.decisions.append(Decision("resume_changes", changes, reason=(
                f"resumed from {path} with recipe fields that differ from the checkpoint's; "
                "the new values apply from here on")))
        self.state.restore(saved, model=self.module, optimizer=self.optimizer,
                           scheduler=self.scheduler, scaler=self.stepper.scaler, device=self.device)
        self.stepper.stats.optimizer_steps = int(self.scheduler.last_epoch)
        self.state.resumed_from = str(path)

    def _interrupt(self) -> None:
        signum, folder = self.state.stop_signal, self.options.checkpoint_dir
        where = (f"checkpoint saved in {folder}; continue with --resume" if folder
                 else "no checkpoint folder was given (--checkpoint DIR), nothing saved")
        raise Interrupted(signum, f"stopped by signal {signum} after batch "
                                  f"{self.state.global_batches}; {where}")

    def result(self, *, setup_s: float, decisions: list[Decision]) -> RunResult:
        state, stats, mem = self.state, self.stepper.stats, self.memory.read()
        if state.first_loss is None:
            raise MeasurementError("no batch was trained: the dataset is empty or smaller than "
                                   "one batch with drop_last=True")
        wall, samples = sum(state.epoch_s), self.source.samples_per_epoch * len(state.epoch_s)
        return RunResult(
            recipe=self.recipe.name, config=self.recipe.to_dict(),
            decisions=[asdict(d) for d in [*self.recipe.reasons, *decisions]],
            device=str(self.device), epochs=len(state.epoch_s), batches_per_epoch=len(self.source),
            samples_per_epoch=self.source.samples_per_epoch, setup_s=setup_s, wall_s=wall,
            epoch_s=state.epoch_s, samples_per_s=samples / wall if wall > 0 else 0.0,
            epoch_loss=state.epoch_loss, first_loss=float(state.first_loss.item()),  # sync: once
            data_wait_s=state.data_wait_s, data_wait_fraction=min(state.data_wait_s / wall, 1.0),
            peak_mem_bytes=mem.peak_bytes, peak_mem_kind=mem.kind,
            eval_s=state.eval_s if state.evals else None, evals=state.evals,
            **metric_fields(self.options.metric, state.evals[-1]["metric"] if state.evals else None,
                            self.options.target),
            time_to_target_s=state.time_to_target_s,
            compile_s=stats.compile_s, recompiles=stats.recompiles,
            compile_fallback=stats.compile_fallback, optimizer_steps=stats.optimizer_steps,
            optimizer_impl=optimizer_kind(self.optimizer),
            skipped_steps=int(stats.skipped_steps.item()),  # sync: once
            resumed_from=state.resumed_from)

