"""The training step, built once per run from the recipe's ``StepConfig``.

A :class:`Stepper` takes one micro-batch per call and steps the optimizer (and the LR schedule)
every ``accumulate`` micro-batches. Precision (autocast, GradScaler), compilation and CUDA-graph
capture are decided here, once; the loop only calls ``stepper(x, y, boundary=...)``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from looptune.dist import ddp
from looptune import fastpath
from looptune.engine import graphs
from looptune.engine.precision import autocast  # re-exported: benchmarks enter it from here
from looptune.errors import MeasurementError
from looptune.recipe import CUDA_ONLY_ATTENTION, Decision, StepConfig

__all__ = ["StepStats", "Stepper", "attention_kernel", "autocast", "direct_backward"]

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(kw_only=True)
class StepStats:
    """What the step measured about itself (all host-side counters, no syncs)."""

    optimizer_steps: int = 0
    compile_s: float = 0.0  # host time of the steps that compiled a graph (excluded from training)
    compile_events: int = 0  # steps during which torch.compile produced a new graph
    compile_fallback: str | None = None  # why torch.compile was abandoned for eager, if it was
    skipped_steps: torch.Tensor | None = None  # fp16: optimizer steps skipped for inf/nan grads
    notes: list[str] = field(default_factory=list)

    @property
    def recompiles(self) -> int:
        return max(self.compile_events - 1, 0)


_SDPA_BACKENDS = {"math": "MATH", "flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
                  "cudnn": "CUDNN_ATTENTION"}


def attention_kernel(choice: str, device: torch.device, stats: StepStats | None = None):
    """A factory of contexts that pin ``F.scaled_dot_product_attention`` to one kernel
    (``torch.nn.attention.sdpa_kernel``); "auto" leaves PyTorch's own choice. A CUDA-only kernel
    asked for on another device falls back to "auto", with the reason in ``stats.notes``."""
    if choice == "auto":
        return contextlib.nullcontext
    if choice in CUDA_ONLY_ATTENTION and device.type != "cuda":
        if stats is not None:
            stats.notes.append(f"attention={choice!r} is a CUDA kernel; on {device.type} "
                               "PyTorch picked the attention kernel itself")
        return contextlib.nullcontext
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = getattr(SDPBackend, _SDPA_BACKENDS[choice])
    return lambda: sdpa_kernel(backend)


class Stepper:
    """``stepper(x, y, boundary=False) -> loss``: forward, backward, and every ``accumulate``
    micro-batches (or at ``boundary``, the epoch's last batch) an optimizer + schedule step.

    The returned loss is the micro-batch's unscaled mean loss, detached, still on the device.
    """

    def __init__(self, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 scheduler: torch.optim.lr_scheduler.LRScheduler | None, loss_fn: LossFn,
                 cfg: StepConfig, device: torch.device) -> None:
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.loss_fn, self.cfg, self.device = loss_fn, cfg, device
        self.stats = StepStats()
        self.scaler = torch.amp.GradScaler(device.type) if cfg.precision == "fp16" else None
        self._consecutive = torch.zeros((), dtype=torch.int64, device=device)
        self.stats.skipped_steps = torch.zeros((), dtype=torch.int64, device=device)
        self._micro = 0
        self._forward_loss = _compiled(model, loss_fn, cfg.compile, self.stats)
        self._attention = attention_kernel(cfg.attention, device, self.stats)
        self._graph: graphs.GraphedStep | None = None
        self._backward = direct_backward() if (device.type == "cpu" and cfg.compile == "off"
                                               ) else torch.Tensor.backward
        self._fast: fastpath.FastStep | None = None  # set by prepare()
        self._seed = torch.ones((), device=device) / cfg.accumulate  # d(loss / k) / d(loss)

    def prepare(self, batch_size: int, input_dtype: torch.dtype) -> list[Decision]:
        """Set up the fast step ``cfg.backward`` names (``looptune.fastpath``) for batches of
        ``batch_size`` arriving in ``input_dtype``, off the clock; the decisions say what runs
        and why, or why autograd runs instead."""
        self._fast, decisions = fastpath.build(model=self.model, loss_fn=self.loss_fn,
                                               cfg=self.cfg, batch_size=batch_size,
                                               input_dtype=input_dtype)
        return decisions

    @property
    def idle_call(self) -> Callable[[], object] | None:
        """A forward+backward that changes nothing a run keeps (a fast step on a zero batch:
        only its gradient buffers, which the next step overwrites), for timing at setup; None
        for an autograd step."""
        return self._fast.idle_call if self._fast is not None else None

    def __call__(self, x: torch.Tensor, y: torch.Tensor, *, boundary: bool = False) -> torch.Tensor:
        if self.cfg.channels_last and isinstance(x, torch.Tensor) and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        if self.cfg.cuda_graphs:
            return self._graphed(x, y)
        if self.cfg.compile != "off" and self.stats.compile_fallback is None:
            return self._timed_compile(x, y, boundary)
        return self._micro_step(x, y, boundary)

    def _micro_step(self, x: torch.Tensor, y: torch.Tensor, boundary: bool) -> torch.Tensor:
        k = self.cfg.accumulate
        steps_now = self._micro + 1 == k or boundary
        if self._fast is not None:  # a workload's own step (looptune.fastpath), no autograd
            loss = self._fast(x, y, self._seed, first=self._micro == 0)
            self._micro += 1
            if steps_now:
                self._optimizer_step()
            return loss
        # DDP: a micro-step that does not step keeps its gradients local (no all-reduce)
        with ddp.no_sync(self.model, skip=not steps_now):
            with autocast(self.device, self.cfg.precision), self._attention():
                loss = self._forward_loss(x, y)
            scaled = loss / k if k > 1 else loss  # mean over the effective batch, not the sum
            self._backward(self.scaler.scale(scaled) if self.scaler else scaled)
        self._micro += 1
        if self._micro == k or boundary:
            self._optimizer_step()
        return loss.detach()

    def _optimizer_step(self) -> None:
        if self.scaler is None:
            self.optimizer.step()
        else:
            self._scaled_step()
        if self._fast is None:  # a fast step sets every .grad anew at the next step
            self.optimizer.zero_grad(set_to_none=True)  # None grads: no memset per parameter
        if self.scheduler is not None:
            self.scheduler.step()
        self._micro = 0
        self.stats.optimizer_steps += 1

    def _scaled_step(self) -> None:
        scaler = self.scaler
        before = _scale_of(scaler).clone()
        scaler.step(self.optimizer)  # skips the update when the grads hold inf/nan
        scaler.update()
        skipped = (_scale_of(scaler) < before).to(torch.int64)  # the scale backs off on a skip
        self.stats.skipped_steps += skipped
        self._consecutive.mul_(skipped).add_(skipped)  # reset to 0 on a good step, else +1
        if self.stats.optimizer_steps % self.cfg.max_consecutive_skips == 0:
            self.check_skips()

    def check_skips(self) -> None:
        """Stop the run after ``max_consecutive_skips`` overflow-skipped steps in a row."""
        if self.scaler is None:
            return
        run = int(self._consecutive.item())  # sync: once every max_consecutive_skips steps
        if run >= self.cfg.max_consecutive_skips:
            raise MeasurementError(
                f"fp16: {run} optimizer steps in a row were skipped for inf/nan gradients (up to "
                f"optimizer step {self.stats.optimizer_steps}, loss scale now "
                f"{self.scaler.get_scale():g}). The model overflows in fp16: use precision='bf16' "
                "or 'fp32', or lower the learning rate.")

    def _timed_compile(self, x: torch.Tensor, y: torch.Tensor, boundary: bool) -> torch.Tensor:
        graphs_before = _graph_count()
        t0 = time.perf_counter()
        try:
            loss = self._micro_step(x, y, boundary)
        except Exception as err:  # compilation failed: fall back to eager, say why
            if not _is_compile_error(err):
                raise
            self._fall_back_to_eager(err)
            return self._micro_step(x, y, boundary)
        if _graph_count() != graphs_before:  # this call compiled: its time is compile time
            self.stats.compile_s += time.perf_counter() - t0
            self.stats.compile_events += 1
        return loss

    def _fall_back_to_eager(self, err: Exception) -> None:
        self.stats.compile_fallback = (f"torch.compile(mode={self.cfg.compile!r}) failed, ran "
                                       f"eagerly instead: {type(err).__name__}: {err}"[:500])
        self._forward_loss = _eager(self.model, self.loss_fn)
        if self._fast is not None:
            self._fast.use_eager()
        self.optimizer.zero_grad(set_to_none=True)  # drop anything the failed step accumulated
        self._micro = 0

    def _graphed(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self._graph is None:
            self._graph = graphs.GraphedStep(model=self.model, optimizer=self.optimizer,
                                             loss_fn=self.loss_fn, example=(x, y),
                                             precision=self.cfg.precision,
                                             attention=self._attention)
        loss = self._graph(x, y)
        if self.scheduler is not None:
            self.scheduler.step()  # updates the lr tensor in place: the graph reads it on replay
        self.stats.optimizer_steps += 1
        return loss


def direct_backward() -> Callable[[torch.Tensor], None]:
    """``loss.backward()`` for a one-element loss, calling autograd's C++ engine directly.

    ``Tensor.backward`` goes through ``torch.autograd.backward``: argument checks, a new
    ``ones_like`` gradient, a logging-level lookup and a copy of the contextvars context stashed
    for the engine's device threads and compiled autograd. For a CPU step that runs eagerly
    (backward in the calling thread, nothing compiled) none of it is needed, and it costs more
    than some of the backward's kernels (batch-64 MNIST MLP, 2-core CPU: ~60-90 us of a ~550 us
    forward+backward). The engine call is the one ``torch.autograd.backward`` ends in, with the
    same arguments; the gradients are bit for bit the same (tested). Anything else (a loss of
    several elements, a torch without this entry point) takes ``Tensor.backward``.
    """
    engine = getattr(getattr(torch.autograd, "variable", None), "Variable", None)
    run = getattr(getattr(engine, "_execution_engine", None), "run_backward", None)
    if run is None:
        return torch.Tensor.backward
    ones: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}

    def backward(loss: torch.Tensor) -> None:
        if loss.numel() != 1 or loss.dim() != 0:
            return loss.backward()  # torch's own checks and messages
        key = (loss.dtype, loss.device)
        one = ones.get(key)
        if one is None:
            one = ones[key] = torch.ones((), dtype=loss.dtype, device=loss.device)
        run((loss,), (one,), False, False, (), allow_unreachable=True, accumulate_grad=True)
        return None

    return backward


def _scale_of(scaler: torch.amp.GradScaler) -> torch.Tensor:
    scale = getattr(scaler, "_scale", None)  # the live scale tensor: comparing it needs no sync
    if isinstance(scale, torch.Tensor):
        return scale
    return torch.tensor(scaler.get_scale())  # sync: fallback if torch changes GradScaler's internals


def _eager(model: torch.nn.Module, loss_fn: LossFn) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    return lambda x, y: loss_fn(model(x), y)


def _compiled(model: torch.nn.Module, loss_fn: LossFn, mode: str, stats: StepStats):
    """The forward and loss as one callable, compiled unless ``mode`` is "off".

    The loss is compiled with the model (one graph, as nanoGPT's model returns its loss): a
    compiled model whose bf16 logits leave the graph before an eager cross-entropy ran slower
    than eager on a CPU, while the whole forward+loss ran 1.2x faster (benchmarks/char_lm.py
    probes). A DDP-wrapped model is compiled alone, so dynamo's DDP graph splitting applies.
    """
    if mode == "off":
        return _eager(model, loss_fn)
    options = {"mode": None if mode == "default" else mode}
    try:
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            return _eager(torch.compile(model, **options), loss_fn)
        return torch.compile(_eager(model, loss_fn), **options)
    except Exception as err:  # e.g. an unsupported Python version raises at torch.compile()
        stats.compile_fallback = f"torch.compile unavailable, ran eagerly: {type(err).__name__}: {err}"
        return _eager(model, loss_fn)


def _graph_count() -> int:
    from torch._dynamo.utils import counters  # dynamo's own tally of compiled graphs

    return int(counters["stats"]["unique_graphs"])


def _is_compile_error(err: Exception) -> bool:
    module = type(err).__module__
    return module.startswith(("torch._dynamo", "torch._inductor")) or "compile" in str(err).lower()
