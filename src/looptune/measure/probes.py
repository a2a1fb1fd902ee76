"""Low-overhead probes that time each training step of code looptune did not write.

Installed for the duration of a ``with StepProbes(...)`` block and removed after (every patched
attribute restored), they record, per optimizer step (from the end of one ``optimizer.step()``
to the end of the next):

* data wait: time inside ``next()`` on any DataLoader iterator (and the settings of each loader);
* host-to-device copies: time, bytes, pinned or pageable (``Tensor.to``/``.cuda`` to a GPU);
* host syncs: ``.item()``, ``.tolist()``, ``.cpu()``, ``.numpy()`` and printing tensors that live
  on an accelerator (a CPU tensor has nothing to wait for);
* step boundaries: a global optimizer step post-hook (torch's own hook API, no patching); a
  script that built no torch.optim optimizer (weights updated by hand, a third-party optimizer)
  gets its boundaries from its updates of the parameters (in-place ops on a parameter's storage
  after a backward: one per update, also with accumulation) or, until one is seen, from its
  ``loss.backward()`` / ``torch.autograd.backward`` calls (``signal`` says which). When the
  first update shows that the backward calls were micro-batches or parts of a step, the steps
  counted so far are dropped and counting starts again from that update (``on_restart`` runs,
  so warm-up, the FLOP-counted step and the measured steps are whole steps);
* the model's own forward + backward inside each step, once :meth:`StepProbes.time_model` names
  the module (after the FLOP-counted step): from its first forward with grad enabled to the end
  of the next backward, summed per step (one forward pre-hook on that module, ~1-2 us a call);
* the step's own parts (``StepSample.parts_s``), each timed exclusively (a part nested in another,
  e.g. the optimizer step inside ``GradScaler.step`` or a closure's backward inside
  ``optimizer.step(closure)``, is charged to itself, not to both): ``forward`` (the timed module's
  first forward to the start of the backward: the loss included), ``backward``
  (``torch.autograd.backward``), ``optimizer`` (``Optimizer.step``, through torch's global step
  hooks; or, with no torch.optim optimizer, the in-place updates of the parameters),
  ``zero_grad`` (``Optimizer.zero_grad``, ``Module.zero_grad``), ``clip_grad``
  (``torch.nn.utils.clip_grad_norm_`` / ``clip_grad_value_``), ``grad_scaler``
  (``GradScaler.unscale_/step/update``) and ``lr_scheduler`` (``LRScheduler.step``); data waits,
  copies and syncs inside a part are theirs, not the part's;
* the loss of each step: the scalar each backward started from (the mean over a step's backward
  calls), kept on its device and read after the run (:meth:`StepProbes.losses`), for the loss
  parity of ``--verify``;
* a deadline for the first boundary (``first_step_timeout_s``): past it, with none seen, the
  script is stopped (``gave_up`` says what was seen) instead of running to its end.

Each probe costs a ``perf_counter`` pair and a Python call (~1 us), far below a step's time.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from looptune.errors import StopScript  # raised here; defined with the others
from torch.optim.optimizer import (
    register_optimizer_step_post_hook, register_optimizer_step_pre_hook)
from torch.utils.data import DataLoader
from torch.utils.data.dataloader import _BaseDataLoaderIter

from looptune.measure.records import LoaderInfo, StepSample
from looptune.measure.loader_probes import LoaderProbes
from looptune.measure.part_probes import PartProbes
from looptune.measure.probe_hooks import (
    framework_of_stack, leaf_storages, targets_cuda, weak_ref)

__all__ = ["PART_NAMES", "StepProbes", "StopScript"]

_SYNC_METHODS = ("item", "tolist", "cpu", "numpy", "__repr__", "__format__")
# in-place ops a hand-written update applies to a parameter (p.data.add_, p -= lr * p.grad, ...)
_UPDATE_METHODS = ("add_", "sub_", "mul_", "copy_", "addcdiv_", "addcmul_", "lerp_", "__iadd__",
                   "__isub__")

# the step's own parts, in the order a step runs them (StepSample.parts_s)
# references to the held optimizer when the script has none left: ``self.optimizer``, the local
# name in ``_step_hook`` and ``sys.getrefcount``'s own argument
_HELD_BY_US = 3
PART_NAMES = ("forward", "backward", "optimizer", "zero_grad", "clip_grad", "grad_scaler",
              "lr_scheduler")
# timed exclusively too, so that a part does not include them: they are phases of their own
_PHASE_PARTS = ("data_wait", "host_to_device", "sync")


def _frame_depth(frame: Any) -> int:
    n = 0
    while frame is not None:
        n, frame = n + 1, frame.f_back
    return n


class StepProbes(PartProbes, LoaderProbes):
    """Per-step phase probes. ``on_step(n)`` runs after the n-th optimizer step (1-based)."""

    def __init__(self, *, on_step: Callable[[int], None] | None = None,
                 on_restart: Callable[[], None] | None = None,
                 first_step_timeout_s: float | None = None) -> None:
        self.on_step, self.on_restart = on_step, on_restart
        self.first_step_timeout_s = first_step_timeout_s
        # what marks a step: "optimizer.step" | "parameter update" | "backward"
        self.signal: str | None = None
        self._params: set[int] | None = None  # storages of the parameters the backward reached
        self._pending = False  # a backward since the last boundary (an update may follow)
        self.backwards = 0  # backward calls by the training thread
        self.optimizers_built = 0  # torch.optim optimizers constructed while the probes were on
        self.gave_up: str | None = None  # why the script was stopped before any step boundary
        self.paused = False  # looptune's own work inside the block (the replay): not the script's
        self._t_begin = time.perf_counter()
        self.samples: list[StepSample] = []
        self.loaders: dict[int, LoaderInfo] = {}
        self.batches: dict[int, int] = {}  # batches drawn per loader: the training loader leads
        # per loader: what a one-worker copy of it needs (diagnose/worker_read.py), not the loader
        self.loader_parts: dict[int, dict[str, Any]] = {}
        self.steps = 0
        self.boundaries = 0  # step boundaries seen, also those dropped by a restart
        self.drawn = 0  # batches drawn from any DataLoader by the training thread
        # the thread that trains and the optimizer whose step ends a step: waits on other threads
        # (a prefetcher) and a second optimizer (a GAN's) must not split or inflate the step; once
        # that optimizer is gone (the script built a new one), the next one to step takes over
        self._thread = threading.main_thread().ident
        self._optimizer: Callable[[], Any] | None = None  # a weak reference
        self._restore: list[Callable[[], None]] = []
        self._in_sync = self._in_data = False
        self._model_hook: Any = None  # the forward pre-hook on the timed module, if any
        self._model_t0: float | None = None  # its forward started, its backward not yet ended
        # the parts open now, innermost last: time goes to the innermost (exclusive timing)
        self._open: list[str] = []
        # the stack depths of the optimizer steps running now (a subclass's step inside its base's)
        self._steps_open: list[int] = []
        self._t_mark = time.perf_counter()
        self.optimizer: Any = None  # the optimizer whose step ends a step (held for the replay)
        self.zero_grad_kept = False  # zero_grad(set_to_none=False) was called: grads zeroed
        # the training framework whose code called the first optimizer step (its own precision
        # switch is the remedy's), from the call stack once: "transformers", "accelerate", ...
        self.framework: str | None = None
        self._framework_seen = False
        self._losses: list[Any] = []  # per step: the losses its backward calls started from
        self._step_losses: list[Any] = []
        self._reset(time.perf_counter())

    # -- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> StepProbes:
        self._reset(time.perf_counter())
        self._t_begin = time.perf_counter()
        handle = register_optimizer_step_post_hook(self._step_hook)
        self._restore.append(handle.remove)
        handle = register_optimizer_step_pre_hook(self._step_pre_hook)
        self._restore.append(handle.remove)
        self._patch_parts()
        self._patch(torch.optim.Optimizer, "__init__", self._counted_init)
        self._patch(torch.autograd, "backward", self._backward_probe)
        self._patch(_BaseDataLoaderIter, "__next__", self._timed_next)
        self._patch(DataLoader, "__iter__", self._recorded_iter)
        for name in _SYNC_METHODS:
            self._patch(torch.Tensor, name, self._sync_probe(name))
        if torch.cuda.is_available():  # host-to-device copies only exist with a GPU
            self._patch(torch.Tensor, "to", self._h2d_probe("to"))
            self._patch(torch.Tensor, "cuda", self._h2d_probe("cuda"))
        return self

    def __exit__(self, *exc: object) -> None:
        self.untime_model()
        while self._restore:
            self._restore.pop()()

    def _patch(self, owner: type, name: str, make: Callable[[Callable], Callable]) -> None:
        had_own = name in owner.__dict__
        original = owner.__dict__.get(name) if had_own else getattr(owner, name)
        setattr(owner, name, make(getattr(owner, name)))

        def restore() -> None:
            if had_own:
                setattr(owner, name, original)
            else:
                delattr(owner, name)  # the method lives on a base class (e.g. TensorBase)

        self._restore.append(restore)

    def _reset(self, now: float) -> None:
        self._t_last, self._wait, self._h2d, self._h2d_bytes = now, 0.0, 0.0, 0
        self._pageable, self._sync, self._syncs = 0, 0.0, 0
        self._model, self._model_t0 = 0.0, None
        self._parts: dict[str, float] = {}
        self._t_mark = now

    def _ours(self) -> bool:
        return not self.paused and threading.get_ident() == self._thread

    # -- step boundary ---------------------------------------------------------------------
    def _step_pre_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._ours():
            self._enter("optimizer")
            depth = _frame_depth(sys._getframe(1))
            # a live outer step is lower on the stack: deeper ones were left by an exception
            while self._steps_open and self._steps_open[-1] >= depth:
                self._steps_open.pop()
            self._steps_open.append(depth)

    def _step_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._ours():
            self._leave("optimizer")
            if self._steps_open:
                self._steps_open.pop()
            if self._steps_open:
                return  # a subclass's step calling its hooked base class's step: one step
        if self.signal in ("backward", "parameter update") or self.paused:
            return  # the script's boundaries are its own (no torch.optim optimizer at the start)
        self.signal = "optimizer.step"
        owner = None if self._optimizer is None else self._optimizer()
        if owner is None:  # the first optimizer, or the one before was deleted
            self._optimizer, self._thread = weak_ref(optimizer), threading.get_ident()
        elif owner is not optimizer:
            if sys.getrefcount(owner) > _HELD_BY_US:
                return  # another optimizer in the same iteration: the first one marks the step
            # the script dropped the first one (only ``self.optimizer`` holds it): this one takes over
            self._optimizer, self._thread = weak_ref(optimizer), threading.get_ident()
        self.optimizer = optimizer
        if not self._framework_seen:
            self._framework_seen = True
            self.framework = framework_of_stack(sys._getframe(1))
        self._boundary()

    def _boundary(self) -> None:
        now = time.perf_counter()
        self._charge(now)
        if "forward" in self._open:  # a forward with no backward in this step (an eval pass)
            self._leave("forward")
        parts = {k: v for k, v in self._parts.items() if k not in _PHASE_PARTS}
        if self._model_hook is not None:
            parts.setdefault("forward", 0.0)  # timed: a step without a forward took 0 in it
        self.samples.append(StepSample(
            step_s=now - self._t_last, data_wait_s=self._wait, h2d_s=self._h2d,
            h2d_bytes=self._h2d_bytes, h2d_pageable_bytes=self._pageable, sync_s=self._sync,
            syncs=self._syncs, model_s=self._model if self._model_hook is not None else None,
            parts_s=parts))
        self._losses.append(self._step_losses)
        self._step_losses = []
        self.steps += 1
        self.boundaries += 1
        if self.on_step is not None:
            self.on_step(self.steps)  # may raise StopScript; may take time (not counted)
        self._reset(time.perf_counter())

    def _counted_init(self, original: Callable) -> Callable:
        probes = self

        def __init__(optimizer, *args, **kwargs):
            probes.optimizers_built += 1
            return original(optimizer, *args, **kwargs)

        return __init__

    def _backward_probe(self, original: Callable) -> Callable:
        probes = self

        def backward(*args, **kwargs):
            ours = threading.get_ident() == probes._thread and not probes.paused
            tensors = args[0] if args else kwargs.get("tensors")
            if ours and probes._params is None and probes.optimizers_built == 0:
                probes._params = leaf_storages(tensors)
                for name in _UPDATE_METHODS:  # only now: a torch.optim script never pays for them
                    probes._patch(torch.Tensor, name, probes._update_probe(name))
            if ours:
                probes._leave("forward")
                probes._record_loss(tensors)
                probes._enter("backward")
            try:
                out = original(*args, **kwargs)
            finally:
                if ours:
                    probes._leave("backward")
            if ours:
                if probes._model_t0 is not None:  # the timed model's forward ... this backward
                    probes._model += time.perf_counter() - probes._model_t0
                    probes._model_t0 = None
                probes._after_backward()
            return out

        return backward

    def _record_loss(self, tensors: Any) -> None:
        """Keep the scalar this backward starts from (a loss); a CPU one as a float now, a GPU
        one as a tensor read after the run (reading it now would wait for the device)."""
        if (isinstance(tensors, torch.Tensor) and tensors.numel() == 1
                and tensors.is_floating_point()):
            loss = tensors.detach()
            self._step_losses.append(float(loss) if loss.device.type == "cpu" else loss)

    def losses(self) -> list[float | None]:
        """Per step (as ``samples``): the mean loss of its backward calls; None where the step
        had none (or not a finite scalar). Reads GPU losses: call after the run."""
        out = []
        for step in self._losses:
            values = [float(v) for v in step]
            out.append(sum(values) / len(values) if values and all(
                v == v and abs(v) != float("inf") for v in values) else None)
        return out

    def _after_backward(self) -> None:
        self.backwards += 1
        if self.signal is None and self.optimizers_built == 0:
            self.signal = "backward"  # no torch.optim optimizer: updates by hand or elsewhere
        if self.signal == "backward":
            self._boundary()
        else:
            self._check_deadline()
        self._pending = True

    def _update_probe(self, name: str) -> Callable[[Callable], Callable]:
        probes = self

        def make(original: Callable) -> Callable:
            def probe(tensor, *args, **kwargs):
                update = (probes._params and not probes.paused
                          and probes.signal in ("backward", "parameter update")
                          and threading.get_ident() == probes._thread
                          and tensor.untyped_storage().data_ptr() in probes._params)
                if not update:
                    return original(tensor, *args, **kwargs)
                probes._enter("optimizer")  # a hand-written update: its in-place ops on params
                try:
                    out = original(tensor, *args, **kwargs)
                finally:
                    probes._leave("optimizer")
                if probes._pending:
                    probes._pending = False  # the first op of this update ends the step
                    if probes.signal == "backward":  # the steps so far were backward calls
                        probes.signal = "parameter update"
                        probes._restart()
                    else:
                        probes._boundary()
                return out

            probe.__name__ = name
            return probe

        return make

    def _restart(self) -> None:
        """Drop the steps counted on backward calls: this first update starts the first step
        (a backward-to-update step would hold 1 of k micro-batches, or part of a step)."""
        self.samples.clear()
        self._losses.clear()
        self._step_losses = []
        self.steps = 0
        self.boundaries += 1
        self.untime_model()  # the module is captured again in the new FLOP-counted step
        if self.on_restart is not None:
            self.on_restart()  # may take time (not counted)
        self._reset(time.perf_counter())

    def _check_deadline(self) -> None:
        """No step boundary yet, past the deadline: stop the script, saying what was seen."""
        limit = self.first_step_timeout_s
        if self.boundaries or limit is None or self.gave_up is not None:
            return
        elapsed = time.perf_counter() - self._t_begin
        if elapsed >= limit:
            self.gave_up = (f"no step boundary within {limit:g} s: in {elapsed:.1f} s the script "
                            f"drew {self.drawn} batch(es) from {len(self.loaders)} DataLoader(s), "
                            f"made {self.backwards} backward call(s) and built "
                            f"{self.optimizers_built} torch.optim optimizer(s), none of which "
                            "stepped")
            raise StopScript

    # -- probes ----------------------------------------------------------------------------
    def _sync_probe(self, name: str) -> Callable[[Callable], Callable]:
        probes = self

        def make(original: Callable) -> Callable:
            def probe(tensor, *args, **kwargs):
                # a CPU tensor has nothing to wait for; nested calls (__repr__ -> .tolist()) and
                # reads inside the data loader (already data wait) are not counted again
                if (probes._in_sync or probes._in_data or tensor.device.type == "cpu"
                        or threading.get_ident() != probes._thread):
                    return original(tensor, *args, **kwargs)
                probes._in_sync = True
                probes._enter("sync")
                t0 = time.perf_counter()
                try:
                    return original(tensor, *args, **kwargs)
                finally:
                    probes._leave("sync")
                    probes._in_sync = False
                    probes._sync += time.perf_counter() - t0
                    probes._syncs += 1

            probe.__name__ = name
            return probe

        return make

    def _h2d_probe(self, name: str) -> Callable[[Callable], Callable]:
        probes = self

        def make(original: Callable) -> Callable:
            def probe(tensor, *args, **kwargs):
                if (probes._in_data or tensor.device.type != "cpu"  # in next(): data wait
                        or threading.get_ident() != probes._thread
                        or not targets_cuda(name, args, kwargs)):
                    return original(tensor, *args, **kwargs)
                probes._enter("host_to_device")
                t0 = time.perf_counter()
                try:
                    out = original(tensor, *args, **kwargs)
                finally:
                    probes._leave("host_to_device")
                probes._h2d += time.perf_counter() - t0
                nbytes = tensor.numel() * tensor.element_size()
                probes._h2d_bytes += nbytes
                if not tensor.is_pinned():
                    probes._pageable += nbytes
                return out

            probe.__name__ = name
            return probe

        return make
