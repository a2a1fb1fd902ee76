"""What a training run carries between steps, and how it is saved, resumed and interrupted.

Kept apart from ``loop.py`` so the loop reads top to bottom; everything here is bookkeeping.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from looptune._io import folder_writable_problem
from looptune._rng import rng_state, set_rng_state
from looptune.errors import CheckpointWriteError, Interrupted, NonFiniteLoss  # raised here; defined with the others
from looptune.measure.metric import ACCURACY, MetricSpec

__all__ = [
    "CheckpointWriteError",
    "Interrupted",
    "NonFiniteLoss",
    "RunOptions",
    "RunState",
    "cpu_threads",
    "first_bad",
    "nonfinite_loss",
    "resume_problems",
    "stop_signals",
]


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """How long to train and what to record: settings of the run, not of the recipe."""

    epochs: int  # passes over the training data
    seed: int = 0  # initial weights (set by the caller) and every epoch's shuffle order
    eval_every: int | None = None  # evaluate every N batches as well as at each epoch's end
    target: float | None = None  # record the training time when evaluation reaches it
    metric: MetricSpec = ACCURACY  # what evaluation returns and which direction is better
    checkpoint_dir: Path | None = None  # where checkpoints go (None: no checkpoints)
    checkpoint_every: int | None = None  # optimizer steps between checkpoints
    resume: bool = False  # continue from the newest valid checkpoint in checkpoint_dir
    nonfinite_check_every: int = 100  # batches between NaN/inf checks when the loss stays on device

    def problems(self) -> list[str]:
        """Every invalid option, with the received value, what is allowed and the fix."""
        out = []
        if not _pos_int(self.epochs):
            out.append(f"epochs={self.epochs!r} is invalid: must be an integer >= 1, e.g. --epochs 5.")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**63:
            out.append(f"seed={self.seed!r} is invalid: must be an integer in [0, 2**63), "
                       "what torch.manual_seed accepts; e.g. --seed 0.")
        for name in ("eval_every", "checkpoint_every", "nonfinite_check_every"):
            value = getattr(self, name)
            if value is not None and not _pos_int(value):
                out.append(f"{name}={value!r} is invalid: must be an integer >= 1 (steps).")
        problem = None if self.target is None else self.metric.target_problem(self.target)
        if problem:
            out.append(problem)
        if self.checkpoint_dir is None and (self.checkpoint_every or self.resume):
            out.append("checkpoint_every/resume need a checkpoint folder: pass --checkpoint DIR.")
        if self.checkpoint_dir is not None and Path(self.checkpoint_dir).is_file():
            out.append(f"checkpoint folder {str(self.checkpoint_dir)!r} is a file: give a folder.")
        elif self.checkpoint_dir is not None:  # a read-only folder: refused before training
            out += [p for p in [folder_writable_problem(self.checkpoint_dir, "--checkpoint")] if p]
        return out

    @property
    def evaluates(self) -> bool:
        return self.eval_every is not None or self.target is not None


def _pos_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


@dataclass(kw_only=True)
class RunState:
    """Progress of a run; everything needed to resume it exactly."""

    epoch: int = 0  # current epoch
    position: int = 0  # batches of the current epoch already trained
    global_batches: int = 0  # batches trained in the whole run
    train_s: float = 0.0  # training time so far (evaluation excluded; compilation included)
    epoch_partial_s: float = 0.0  # training time of the current epoch up to the last pause
    data_wait_s: float = 0.0
    epoch_s: list[float] = field(default_factory=list)
    epoch_loss: list[float] = field(default_factory=list)
    loss_host: float = 0.0  # this epoch's summed loss, when read per step
    losses: torch.Tensor | None = None  # this epoch's per-batch losses, when kept on the device
    first_loss: torch.Tensor | None = None
    evals: list[dict[str, Any]] = field(default_factory=list)
    eval_s: float = 0.0
    time_to_target_s: float | None = None
    resumed_from: str | None = None
    stop_signal: int | None = None  # set by the signal handler; checked after each step

    def to_checkpoint(self, *, model, optimizer, scheduler, scaler, recipe: dict) -> dict:
        return {
            "model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "scheduler": None if scheduler is None else scheduler.state_dict(),
            "scaler": None if scaler is None else scaler.state_dict(), "rng": rng_state(),
            "recipe": recipe, "epoch": self.epoch, "position": self.position,
            "global_batches": self.global_batches, "train_s": self.train_s,
            "epoch_partial_s": self.epoch_partial_s,
            "data_wait_s": self.data_wait_s, "epoch_s": list(self.epoch_s),
            "epoch_loss": list(self.epoch_loss), "loss_host": self.loss_host,
            "losses": None if self.losses is None else self.losses.detach().cpu(),
            "first_loss": None if self.first_loss is None else self.first_loss.detach().cpu(),
            "evals": list(self.evals), "eval_s": self.eval_s,
            "time_to_target_s": self.time_to_target_s,
        }

    def restore(self, saved: dict, *, model, optimizer, scheduler, scaler, device) -> None:
        """Load a checkpoint that :func:`resume_problems` found compatible."""
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        if scheduler is not None and saved["scheduler"] is not None:
            scheduler.load_state_dict(saved["scheduler"])
        if scaler is not None and saved["scaler"] is not None:
            scaler.load_state_dict(saved["scaler"])
        set_rng_state(saved["rng"])
        for name in ("epoch", "position", "global_batches", "train_s", "epoch_partial_s",
                     "data_wait_s", "epoch_s",
                     "epoch_loss", "loss_host", "evals", "eval_s", "time_to_target_s"):
            setattr(self, name, saved[name])
        self.losses = None if saved["losses"] is None else saved["losses"].to(device)
        self.first_loss = None if saved["first_loss"] is None else saved["first_loss"].to(device)


# Recipe fields a checkpoint's position, optimizer state or schedule state depend on: resuming
# with another value would index the epoch wrongly or load state into the wrong object.
_RESUME_FIXED = (("loader", "batch_size"), ("loader", "drop_last"), ("step", "accumulate"),
                 ("optim", "name"), ("schedule", "name"))


def resume_problems(saved: dict, *, recipe: dict,
                    model: torch.nn.Module) -> tuple[list[str], list[str]]:
    """(problems, changes) of resuming ``saved`` under ``recipe`` with ``model``: problems refuse
    the resume (another batch size, optimizer, schedule, accumulation or model shape), changes
    are other recipe fields that differ and are taken from the new recipe (lr, precision...)."""
    problems, changes, old = [], [], saved.get("recipe") or {}
    fix = ("Resume with the recipe the checkpoint was written by, or train from scratch in a "
           "new --checkpoint folder.")
    for part, name in _RESUME_FIXED:
        was, now = (old.get(part) or {}).get(name), recipe[part][name]
        if part in old and was != now:
            problems.append(f"{part}.{name} is {now!r} but the checkpoint was written with "
                            f"{was!r}. {fix}")
    state = model.state_dict()
    theirs = saved.get("model") or {}
    missing, extra = sorted(set(state) - set(theirs)), sorted(set(theirs) - set(state))
    shapes = [f"{k}: {tuple(theirs[k].shape)} in the checkpoint, {tuple(v.shape)} in the model"
              for k, v in state.items() if k in theirs and hasattr(theirs[k], "shape")
              and tuple(theirs[k].shape) != tuple(v.shape)]
    if missing or extra or shapes:
        detail = "; ".join(shapes[:3] + [f"missing {missing[:3]}"] * bool(missing)
                           + [f"unexpected {extra[:3]}"] * bool(extra))
        problems.append(f"the model does not match the checkpoint's ({detail}). Build the model "
                        "the checkpoint was trained with, or train from scratch in a new "
                        "--checkpoint folder.")
    for part in ("loader", "step", "optim", "schedule"):
        for name, now in recipe.get(part, {}).items():
            was = (old.get(part) or {}).get(name, now)
            if (part, name) not in _RESUME_FIXED and was != now:
                changes.append(f"{part}.{name} {was!r} -> {now!r}")
    return problems, changes


@contextlib.contextmanager
def stop_signals(state: RunState):
    """SIGINT/SIGTERM set ``state.stop_signal``; the loop stops after the current step."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be installed from the main thread
        return

    def handler(signum, frame):
        state.stop_signal = signum

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@contextlib.contextmanager
def cpu_threads(n: int | None):
    """Run with ``n`` torch intra-op threads (None: leave torch's setting), then restore the
    count from before (also when the run changed it: ``thread_policy='adaptive'``)."""
    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


def first_bad(losses: torch.Tensor) -> int:
    """Index of the first non-finite loss in ``losses``."""
    return int(torch.nonzero(~torch.isfinite(losses))[0, 0].item())  # sync: only on failure


def nonfinite_loss(epoch: int, bad: int, run_batch: int,
                   samples: torch.Tensor | None) -> NonFiniteLoss:
    """The error for a loss that became non-finite at batch ``bad`` of ``epoch``, naming the
    batch's samples (``samples``: their dataset indices, None when unknown)."""
    shown = "unknown" if samples is None else _short(samples.tolist())
    return NonFiniteLoss(f"the loss became non-finite at epoch {epoch}, batch {bad} of the "
                         f"epoch (batch {run_batch} of the run, 0-based); the batch held "
                         f"samples {shown}. Lower the learning rate, use precision='fp32', or "
                         "check those samples for NaN/inf values.")


def _short(items: list[int], limit: int = 64) -> str:
    head = ", ".join(map(str, items[:limit]))
    return f"[{head}{', ...' if len(items) > limit else ''}] ({len(items)} samples)"
