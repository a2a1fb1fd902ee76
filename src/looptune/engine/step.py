"""The training step, built once per run from the recipe."""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["StepFn", "build_step"]

StepFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def build_step(*, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> StepFn:
    """Return ``step(x, y) -> loss``: zero_grad, forward, backward, optimizer step.

    The returned loss is detached and still on the device: reading it is the caller's choice of
    sync point.
    """

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)  # None grads: no memset kernel per parameter
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        return loss.detach()

    return step
