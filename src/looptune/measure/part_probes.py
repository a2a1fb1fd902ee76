"""What the step probes time inside a step: its own parts (forward, backward, optimizer,
zero_grad, clip_grad, grad_scaler, lr_scheduler), each exclusively (a part nested in another is
charged to itself, not to both), and the model's own forward + backward once
:meth:`PartProbes.time_model` names it. A mixin of :class:`looptune.measure.probes.StepProbes`,
whose state (the open parts, the per-step sums, the restore list, the training thread) these
methods read and write, as :class:`looptune.measure.loader_probes.LoaderProbes` does for the
DataLoaders.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from looptune.measure.probe_hooks import ForwardStart

__all__ = ["PartProbes"]


class PartProbes:
    """The step's parts and the timed model (patched in by ``StepProbes.__enter__``)."""

    # -- the step's parts, timed exclusively ---------------------------------------------------
    def _charge(self, now: float) -> None:
        if self._open:
            top = self._open[-1]
            self._parts[top] = self._parts.get(top, 0.0) + now - self._t_mark
        self._t_mark = now

    def _enter(self, part: str) -> None:
        self._charge(time.perf_counter())
        self._open.append(part)

    def _leave(self, part: str) -> None:
        """Close the innermost open ``part`` (a part left open by an exception is closed by the
        next leave of an outer one)."""
        if part in self._open:
            self._charge(time.perf_counter())
            del self._open[len(self._open) - 1 - self._open[::-1].index(part):]

    def _timed_part(self, part: str, original: Callable) -> Callable:
        probes = self

        def timed(*args, **kwargs):
            if not probes._ours():
                return original(*args, **kwargs)
            probes._enter(part)
            try:
                return original(*args, **kwargs)
            finally:
                probes._leave(part)

        timed.__name__ = getattr(original, "__name__", part)
        timed.__wrapped__ = original
        return timed

    def _patch_parts(self) -> None:
        from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau

        for owner in (torch.optim.Optimizer, torch.nn.Module):
            self._patch(owner, "zero_grad", self._zero_grad_probe)
        for name in ("clip_grad_norm_", "clip_grad_value_"):
            self._patch_function(torch.nn.utils, name, "clip_grad")
        for name in ("unscale_", "step", "update"):
            self._patch(torch.amp.GradScaler, name, lambda f: self._timed_part("grad_scaler", f))
        for owner in (LRScheduler, ReduceLROnPlateau):
            if "step" in owner.__dict__:
                self._patch(owner, "step", lambda f: self._timed_part("lr_scheduler", f))

    def _patch_function(self, module: Any, name: str, part: str) -> None:
        original = getattr(module, name, None)
        if original is None:
            return
        setattr(module, name, self._timed_part(part, original))
        self._restore.append(lambda: setattr(module, name, original))

    def _zero_grad_probe(self, original: Callable) -> Callable:
        probes, timed = self, self._timed_part("zero_grad", original)

        def zero_grad(owner, *args, **kwargs):
            keep = args[0] if args else kwargs.get("set_to_none", True)
            if not keep and probes._ours():
                probes.zero_grad_kept = True  # the grads are zeroed in place, not dropped
            return timed(owner, *args, **kwargs)

        return zero_grad

    # -- the model's forward + backward inside the step --------------------------------------
    def time_model(self, modules: torch.nn.Module | list[torch.nn.Module] | None) -> None:
        """Time the forwards of ``modules`` to the end of the backward after them, in every
        following step (``StepSample.model_s``); None or none stops timing."""
        self.untime_model()
        modules = [modules] if isinstance(modules, torch.nn.Module) else list(modules or [])
        if not modules:
            return
        self._model_hook = [m.register_forward_pre_hook(ForwardStart(self)) for m in modules]
        self._model, self._model_t0 = 0.0, None

    def forward_started(self) -> None:
        """The timed model's forward began (its pre-hook, ``probe_hooks.ForwardStart``, calls)."""
        if (self._model_t0 is None and not self.paused and torch.is_grad_enabled()
                and threading.get_ident() == self._thread):
            self._model_t0 = time.perf_counter()
            if "forward" not in self._open:
                self._enter("forward")  # until the backward starts: the loss is the forward's

    def untime_model(self) -> None:
        for hook in self._model_hook or []:
            hook.remove()
        self._model_hook = None
