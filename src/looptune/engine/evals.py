"""Evaluation points scored after training: the weights are kept, not evaluated, mid-run.

Evaluating during training (``eval_every``) runs the whole test set through the model: off the
clock, but it evicts the training step's weights, optimizer state and data from the CPU caches,
and the next steps, on the clock, pay to bring them back. With frequent evaluation points (a
time-to-accuracy measurement wants many) that penalty is part of every measured interval. For a
small model the engine therefore keeps a copy of its weights and buffers at each point (off the
clock, a few hundred KB) and scores all of them after the last step, in order: the same metric
at the same points, the training undisturbed. Larger models (over ``MAX_BYTES``) are evaluated
in place, as before. Checkpoints score what is pending first.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["MAX_BYTES", "DeferredEvals"]

MAX_BYTES = 4 * 2**20  # weights + buffers of a model whose evaluation points are kept


class DeferredEvals:
    """The evaluation points of one run, kept until :meth:`score`."""

    def __init__(self, module: torch.nn.Module) -> None:
        size = sum(t.numel() * t.element_size() for t in module.state_dict().values()
                   if isinstance(t, torch.Tensor))
        self.enabled = size <= MAX_BYTES
        self.pending: list[tuple[dict[str, Any], dict[str, torch.Tensor]]] = []

    def keep(self, module: torch.nn.Module, entry: dict[str, Any]) -> None:
        weights = {k: v.detach().clone() for k, v in module.state_dict().items()}
        self.pending.append((entry, weights))

    def score(self, module: torch.nn.Module, evaluate: Callable[[torch.nn.Module], float]
              ) -> list[tuple[dict[str, Any], float, float]]:
        """(entry, metric, seconds) per kept point, in order; evaluated on a copy of ``module``
        loaded with each point's weights (the trained module is left as it is)."""
        if not self.pending:
            return []
        scratch = copy.deepcopy(module)
        out = []
        for entry, weights in self.pending:
            scratch.load_state_dict(weights)
            t0 = time.perf_counter()
            value = evaluate(scratch)
            out.append((entry, value, time.perf_counter() - t0))
        self.pending.clear()
        return out
