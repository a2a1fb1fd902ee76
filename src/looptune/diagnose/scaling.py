"""How the step's own work scales with the batch: the model replayed at batch B and k x B.

A step whose time per sample stays the same at a larger batch is compute, whatever its GFLOP/s
(small-channel convolutions on a CPU run far below a large GEMM's rate and still scale linearly);
a step whose time barely grows with the batch is per-step overhead (dispatch, tiny ops, the
optimizer's per-parameter loop), and a larger batch really pays. Rather than compare the step with
one big matmul, diagnose measures this directly:

* during the one FLOP-counted step (already outside the measurement), :class:`ModelCapture`
  records the outermost ``nn.Module`` calls of the training thread and their inputs;
* after the script stopped, :func:`measure_scaling` replays the largest of those modules (the
  model; a loss module has no parameters) on a private copy: forward + backward at the captured
  batch B and at k x B (inputs whose leading dimension is B repeated k times), interleaved, the
  fastest of several rounds. The optimizer, the loss and the script's own Python stay per-step
  costs in the verdict's model of the step;
* the same replay at batch B under bf16 autocast measures what bf16 does to this model's forward
  and backward (the casts included), for the bf16 remedy's bound;
* on a CPU with 2+ cores, the replay at batch B once more beside one busy process (a forked
  pure-Python loop, as a DataLoader worker decoding samples): what a worker's core costs the
  step's own threads, for the workers remedy's bound. (OpenMP threads that lose a core do not
  just run at half speed: they wait at each barrier for a descheduled peer.)
"""

from __future__ import annotations

import copy
import dataclasses
import statistics
import threading
import time
from dataclasses import dataclass
from typing import Any

import torch

from looptune.measure.records import BatchScaling

__all__ = ["ModelCapture", "math_sdpa", "measure_scaling", "replay_module", "replay_problem",
           "time_model_in_step", "with_in_step"]

FACTOR = 4  # the larger batch: the batch-size remedy proposes the same factor
MIN_TIME_S = 0.05  # each timed replay runs at least this long (several calls when they are short)
ROUNDS = 5  # interleaved rounds (B, kB; every other one in reverse order); the fastest of each
BUDGET_S = 3.0  # about the most the replay may take


_WRAPPERS = ("DistributedDataParallel", "DataParallel")


@dataclass
class _Call:
    module: torch.nn.Module
    args: tuple
    kwargs: dict


class ModelCapture:
    """Records the outermost module calls of the training thread while active (one step)."""

    def __init__(self) -> None:
        self.calls: list[_Call] = []
        self._depth = 0
        self._thread = threading.get_ident()
        self._original: Any = None

    def __enter__(self) -> ModelCapture:
        self._thread = threading.get_ident()
        original = self._original = torch.nn.Module.__call__
        capture = self

        def __call__(module, *args, **kwargs):
            if threading.get_ident() != capture._thread:
                return original(module, *args, **kwargs)
            if capture._depth == 0:
                capture.calls.append(_Call(module, args, kwargs))
            capture._depth += 1
            try:
                return original(module, *args, **kwargs)
            finally:
                capture._depth -= 1

        torch.nn.Module.__call__ = __call__
        return self

    def __exit__(self, *exc: object) -> None:
        if self._original is not None:
            torch.nn.Module.__call__ = self._original
            self._original = None


def _batch_of(call: _Call) -> int | None:
    """The leading dimension of the call's first tensor input (its batch), if any."""
    for value in (*call.args, *call.kwargs.values()):
        if isinstance(value, torch.Tensor) and value.ndim >= 1:
            return int(value.shape[0])
    return None


def _params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def replay_problem(calls: list[_Call]) -> tuple[_Call | None, str | None]:
    """The call to replay (the module with the most trainable parameters), or why none can be."""
    if not calls:
        return None, "no nn.Module was called in the step (a functional model)"
    call = max(calls, key=lambda c: _params(c.module))  # ties: the first, usually the model
    inner = getattr(call.module, "module", None)  # DistributedDataParallel / DataParallel
    if isinstance(inner, torch.nn.Module) and type(call.module).__name__ in _WRAPPERS:
        call = _Call(inner, call.args, call.kwargs)  # a replay must not all-reduce its grads
    name = type(call.module).__name__
    if _params(call.module) == 0:
        return None, f"the modules called in the step ({name}, ...) have no trainable parameters"
    if type(call.module).__name__ == "OptimizedModule":
        # at another batch size it would recompile (tens of seconds); its eager module scales
        # differently (measured: a 2.57x promise from an eager replay, 1.16x rerun compiled)
        return None, ("the model is torch.compile'd: replaying it at another batch size would "
                      "recompile it, and its eager module does not scale as the compiled one")
    if _batch_of(call) is None:
        return None, f"{name} was called without a tensor input whose first dimension is a batch"
    return call, None


def replay_module(calls: list[_Call]) -> torch.nn.Module | None:
    """The module the replay will run (None when it cannot): the probes time its forward +
    backward inside the script's own steps, for the replay's share of them."""
    call, _ = replay_problem(calls)
    return None if call is None else call.module


def time_model_in_step(schedule: Any, probes: Any) -> None:
    """On a CPU, once the FLOP-counted step captured the model, time its forward + backward in
    each later step: the replay's share of the step, measured in the step's own seconds (on CUDA
    the host clock sees launches; the replay's synchronized time is used there)."""
    if schedule.device.type == "cpu":
        schedule.on_captured = lambda calls: probes.time_model(replay_module(calls))


def with_in_step(scaling: BatchScaling | None, measured: list[Any],
             device: torch.device) -> BatchScaling | None:
    """The scaling with the model's median in-step forward + backward (CPU, every measured step
    timed), else as it is."""
    if scaling is None or device.type != "cpu" or not measured:
        return scaling
    spans = [s.model_s for s in measured]
    if any(t is None for t in spans) or not all(spans):
        return scaling
    return dataclasses.replace(scaling, in_step_s=statistics.median(spans))


def _grow(value: Any, batch: int, factor: int) -> Any:
    if isinstance(value, torch.Tensor) and value.ndim >= 1 and value.shape[0] == batch:
        return value.detach().repeat(factor, *([1] * (value.ndim - 1)))
    if isinstance(value, (list, tuple)):
        return type(value)(_grow(v, batch, factor) for v in value)
    if isinstance(value, dict):
        return {k: _grow(v, batch, factor) for k, v in value.items()}
    return value


def _scalar(out: Any) -> torch.Tensor | None:
    """What to call backward on: a ``loss`` the model returned (Hugging Face style), else the sum
    of its first floating-point output."""
    loss = out.get("loss") if isinstance(out, dict) else getattr(out, "loss", None)
    if isinstance(loss, torch.Tensor) and loss.requires_grad:
        return loss.float().sum()
    if isinstance(out, torch.Tensor):
        return out.float().sum() if out.requires_grad and out.is_floating_point() else None
    values = out.values() if isinstance(out, dict) else out if isinstance(out, (list, tuple)) else ()
    for v in values:
        found = _scalar(v)
        if found is not None:
            return found
    return None


def measure_scaling(calls: list[_Call], device: torch.device, *,
                    factor: int = FACTOR) -> BatchScaling:
    """Replay the step's model at its batch and at ``factor`` x it; see the module docstring."""
    call, problem = replay_problem(calls)
    if call is None:
        return BatchScaling(batch=None, factor=factor, note=problem)
    batch = _batch_of(call)
    calls_per_step = sum(1 for c in calls if c.module is call.module
                         or getattr(c.module, "module", None) is call.module)
    name = type(call.module).__name__
    try:
        model = copy.deepcopy(call.module)  # the script's model and its grads stay untouched
        model.train(call.module.training)
        small = (call.args, call.kwargs)
        large = (_grow(call.args, batch, factor), _grow(call.kwargs, batch, factor))
        run = {b: _replayer(model, *inputs, device) for b, inputs in
               ((batch, small), (batch * factor, large))}
        run["bf16"] = _replayer(model, *small, device, bf16=True)  # the bf16 remedy, measured
        # warm-up: first-call allocations, oneDNN primitive creation; each one's time decides how
        # often it is timed again (a CPU without native bf16 may take 100x longer under bf16)
        warm = {key: _time_once(fn, device) for key, fn in run.items()}
        times: dict[Any, list[float]] = {key: [] for key in run}
        pair = [(key, run[key]) for key in (batch, batch * factor)]
        for i in range(_rounds(warm[batch] + warm[batch * factor])):
            # ABBA order: a drift of the machine's speed hits both sizes alike
            for key, fn in (pair if i % 2 == 0 else pair[::-1]):
                times[key].append(_time(fn, device))
        for _ in range(_rounds(warm["bf16"]) if warm["bf16"] < BUDGET_S else 0):
            times["bf16"].append(_time(run["bf16"], device))
        times["bf16"] = times["bf16"] or [warm["bf16"]]  # too slow to repeat: its one call
    except (RuntimeError, TypeError, ValueError) as err:  # OOM, a shape the model refuses, ...
        first = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
        return BatchScaling(batch=batch, factor=factor, module=name,
                            note=f"replaying {name} failed ({type(err).__name__}: {first})")
    # the fastest round of each: this kind of VM drifts between speeds for seconds at a time, and
    # a slow phase only ever adds time
    return BatchScaling(batch=batch, factor=factor, module=name, calls_per_step=calls_per_step,
                        small_s=min(times[batch]), large_s=min(times[batch * factor]),
                        bf16_s=min(times["bf16"]), beside_busy_s=_beside_busy(run[batch], device))


BUSY_S = 0.3  # the replay beside a busy process: at least this long, the mean kept


def _beside_busy(fn, device: torch.device) -> float | None:
    """Mean seconds per replay at batch B while one forked process spins beside it, over at
    least BUSY_S: a thread that loses its core stalls the others for whole scheduler ticks,
    now and then, and a training run pays the mean, stalls included (seen on a 2-vCPU VM: the
    median of 50 ms windows ranged 1.3-72 ms for a 0.6 ms replay). None on CUDA (the GPU does
    the arithmetic), with one core, or without os.fork."""
    import os

    from looptune.diagnose.env import busy_processes

    if device.type != "cpu" or (os.cpu_count() or 1) < 2 or not hasattr(os, "fork"):
        return None
    with busy_processes(1, seconds=BUDGET_S + BUSY_S + 1.0):
        fn()  # the first call after the fork: the other process takes its core now
        n, t0 = 0, time.perf_counter()
        while n < 3 or time.perf_counter() - t0 < BUSY_S:
            fn()
            n += 1
        return (time.perf_counter() - t0) / n


def _replayer(model: torch.nn.Module, args: tuple, kwargs: dict, device: torch.device,
              bf16: bool = False):
    def once() -> None:
        for p in model.parameters():
            p.grad = None
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16), math_sdpa(bf16):
            out = model(*args, **kwargs)
        loss = _scalar(out)
        if loss is None:
            raise TypeError("the model's output has no floating-point tensor that needs a grad")
        loss.backward()
    return once


def math_sdpa(on: bool):
    """bf16 as the remedy applies it: scaled_dot_product_attention pinned to its math kernel (the
    CPU flash kernel's bf16 backward is slow); no effect on a model without attention."""
    import contextlib

    if not on:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(SDPBackend.MATH)


def _rounds(warm_s: float) -> int:
    """How many timed rounds fit BUDGET_S, from the warm-up call's seconds (1 to ROUNDS)."""
    return max(1, min(ROUNDS, int(BUDGET_S / max(warm_s, MIN_TIME_S))))


def _time_once(fn, device: torch.device) -> float:
    t0 = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def _time(fn, device: torch.device) -> float:
    """Seconds per call: repeated until MIN_TIME_S have passed."""
    n, t0 = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # sync: the replay's kernels must finish
        elapsed = time.perf_counter() - t0
        if elapsed >= MIN_TIME_S:
            return elapsed / n
