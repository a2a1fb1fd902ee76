"""Workload-specific fast paths, beside the general engine.

The engine's step runs any model with autograd. A fast path is a step written out for one family
of models (today: chains of Linear/ReLU layers under cross-entropy, the reference MNIST MLP), in
Python (``mlp.py``) or as one C++ call (``mlp_step.cpp`` via ``native.py``). Beside the step:
the direct optimizer (``direct.py``: Adam/AdamW's update without per-step planning) and the
adaptive thread governor (``threads.py``), which the engine's optimizer factory and loop call.

The Stepper (``engine/step.py``) knows only :class:`FastStep` and :func:`build`: a new fast path
is a new module and one entry in :data:`BUILDERS` (plus its name in ``recipe.Backward``), not
new branches in the engine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from looptune.fastpath import mlp
from looptune.recipe import Decision, StepConfig

__all__ = ["BUILDERS", "FastStep", "build"]


class FastStep(Protocol):
    """A forward + loss + backward the Stepper calls instead of autograd.

    ``step(x, y, seed, first=...) -> loss``: ``seed`` is d(scaled loss)/d(loss) (1/accumulate);
    at a ``first`` micro-step it sets every parameter's ``.grad`` anew (so the Stepper skips
    ``zero_grad``), otherwise it adds to them, as autograd accumulates. The loss is the
    micro-batch's mean loss, detached, on the device.
    """

    #: a call that changes nothing a run keeps (for timing at setup), or None
    idle_call: Callable[[], object] | None

    def __call__(self, x: torch.Tensor, y: torch.Tensor, seed: torch.Tensor,
                 first: bool) -> torch.Tensor: ...

    def use_eager(self) -> None:
        """torch.compile failed: run the eager form from now on."""


Builder = Callable[..., tuple[FastStep | None, list[Decision]]]
# step.backward -> the module that builds it: build(*, model, loss_fn, cfg, batch_size, input_dtype)
BUILDERS: dict[str, Builder] = {"mlp": mlp.build, "mlp-cpp": mlp.build}


def build(*, model: torch.nn.Module, loss_fn, cfg: StepConfig, batch_size: int,
          input_dtype: torch.dtype) -> tuple[FastStep | None, list[Decision]]:
    """The fast step ``cfg.backward`` names, set up for batches of ``batch_size`` in
    ``input_dtype`` (off the clock), and the decisions saying what runs and why; ``(None, [])``
    for ``backward='autograd'``, ``(None, [why])`` when the fast path does not fit the model."""
    builder = BUILDERS.get(cfg.backward)
    if builder is None:
        return None, []
    return builder(model=model, loss_fn=loss_fn, cfg=cfg, batch_size=batch_size,
                   input_dtype=input_dtype)
