"""Whole-step CUDA graph capture: forward, backward and optimizer step replayed as one launch.

A batch-64 MLP step is ~30 tiny kernels whose launch cost exceeds their run time; replaying a
captured graph pays one launch. Capture follows PyTorch's "whole network capture" recipe:
warm up on a side stream, capture with static input/output tensors, replay with new data copied
into the static inputs. Requirements, checked by ``recipe``/``resolve`` before any work: a CUDA
device, accumulate=1, no GradScaler (its inf check syncs the host), and a capturable optimizer
whose lr is a device tensor (so schedules update it in place).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch

from looptune.engine.precision import autocast

__all__ = ["GraphedStep"]

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
_WARMUP_ITERS = 3  # side-stream iterations before capture, as the CUDA graphs docs advise


class GraphedStep:
    """``step(x, y) -> loss``: copies x, y into static buffers and replays the captured step.

    Batches of another shape than the captured one (the epoch's last, partial batch) run eagerly
    on the same parameters, gradients and optimizer state, so training is the same.
    The returned loss tensor is overwritten by the next replay: read or accumulate it first.
    """

    def __init__(self, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 loss_fn: LossFn, example: tuple[torch.Tensor, torch.Tensor],
                 precision: str, attention=contextlib.nullcontext) -> None:
        self.model, self.optimizer, self.loss_fn = model, optimizer, loss_fn
        self._autocast = lambda: autocast(example[0].device, precision, cache=False)
        self._attention = attention  # a context factory pinning the SDPA kernel (or a no-op)
        self.static_x, self.static_y = example[0].clone(), example[1].clone()
        saved = _snapshot(model, optimizer)  # warm-up updates must not count as training
        self._warm_up()
        self.graph = torch.cuda.CUDAGraph()
        optimizer.zero_grad(set_to_none=True)  # grads get allocated from the graph's pool
        with torch.cuda.graph(self.graph):
            self.static_loss = self._forward_backward(self.static_x, self.static_y)
            optimizer.step()
        _restore(model, optimizer, saved)

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if x.shape != self.static_x.shape or y.shape != self.static_y.shape:
            return self._eager(x, y)
        self.static_x.copy_(x, non_blocking=True)
        self.static_y.copy_(y, non_blocking=True)
        self.graph.replay()
        return self.static_loss

    def _forward_backward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with self._autocast(), self._attention():
            loss = self.loss_fn(self.model(x), y)
        loss.backward()
        return loss.detach()

    def _warm_up(self) -> None:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(_WARMUP_ITERS):
                self.optimizer.zero_grad(set_to_none=True)
                self._forward_backward(self.static_x, self.static_y)
                self.optimizer.step()
        torch.cuda.current_stream().wait_stream(side)

    def _eager(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        # keep the static .grad tensors the graph writes into: zero them in place, don't free them
        self.optimizer.zero_grad(set_to_none=False)
        loss = self._forward_backward(x, y)
        self.optimizer.step()
        return loss


def _snapshot(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(live tensor, copy) for every parameter, buffer and optimizer-state tensor."""
    live = [*model.parameters(), *model.buffers()]
    for state in optimizer.state.values():
        live += [v for v in state.values() if isinstance(v, torch.Tensor)]
    live += [g["lr"] for g in optimizer.param_groups if isinstance(g["lr"], torch.Tensor)]
    return [(t, t.detach().clone()) for t in live]


@torch.no_grad()
def _restore(model: torch.nn.Module, optimizer: torch.optim.Optimizer, saved) -> None:
    """Copy the snapshot back *in place*: the graph holds these tensors' addresses."""
    for live, copy in saved:
        live.copy_(copy)
    # optimizer state created during warm-up (it was empty before): reset it in place
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor) and not any(value is t for t, _ in saved):
                value.zero_()
