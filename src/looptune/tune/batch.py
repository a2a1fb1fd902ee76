"""Throughput-optimal batch size: time the training step at growing batch sizes, pick the knee.

Trials run on a deep copy of the model with a private ``SGD(lr=0)`` and every global RNG restored
afterwards: the caller's model, optimizer and random streams are untouched. A trial builds one batch
(the first B samples, cycled), moves it to the device once, runs ``warmup`` untimed steps and times
``repeats`` x ``steps`` steps; samples/s is the median over the repeats. Peak memory: on CUDA the
allocator's peak against the GPU's memory; on CPU (whose RSS cannot be attributed to one batch size)
one step's tensor bytes, with ``memory_limit_bytes`` as the capacity (a step over it is an OOM).
"""
from __future__ import annotations

import copy
import gc
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from looptune._rng import rng_state, set_rng_state
from looptune.engine.device import resolve_device
from looptune.errors import ConfigError, MeasurementError
from looptune.measure.memory import PeakMemory
from looptune.measure.timing import Stopwatch
from looptune.recipe import Decision
from looptune._format import format_bytes
from looptune.tune import _batch_checks

__all__ = ["BatchSizeResult", "pick_knee", "tune_batch_size"]

# batch norm cannot train on one sample ("Expected more than 1 value per channel"): start at 2
_BatchNorm = nn.modules.batchnorm._BatchNorm
MAX_BATCH = 8192  # the automatic sweep never goes above this many samples per step
_MEM_KIND = {"cuda": "cuda_max_allocated", "cpu": "cpu_tensor_estimate"}  # what peak_mem_bytes is


@dataclass(frozen=True)
class BatchSizeResult:
    """What the batch-size search decided and what it measured."""
    decisions: list[Decision]  # "batch_size", plus "accumulate" when keep_effective was given
    recommended: dict  # {"batch_size": 256} (+ {"accumulate": 4}), ready for a recipe override
    trials: list[dict]  # in the order tried: batch_size, samples_per_s, step_ms, peak_mem_bytes,
    #                     peak_mem_kind, status ("ok" | "oom" | "over_memory"), reason, phase

    def to_dict(self) -> dict[str, Any]:  # "kind" tells looptune report what it is
        return {"kind": "tune-batch-size", "recommended": self.recommended, "trials": self.trials,
                "decisions": [vars(d) for d in self.decisions]}


@dataclass(frozen=True, kw_only=True)
class _TrialBench:  # everything one trial needs; built once per search
    model: nn.Module  # the private deep copy, in train mode
    optimizer: torch.optim.Optimizer  # private SGD(lr=0): the step runs, the weights stay
    loss_fn: Callable[..., torch.Tensor]
    dataset: Any
    device: torch.device
    steps: int
    warmup: int
    repeats: int
    memory_limit: int | None  # bytes; None = no limit (CPU default)
    max_fraction: float


def tune_batch_size(
    model: nn.Module,
    dataset: Any,
    *,
    loss_fn: Callable[..., torch.Tensor] = torch.nn.functional.cross_entropy,
    device: str = "auto",
    candidates: Sequence[int] | None = None,
    max_memory_fraction: float = 0.9,
    keep_effective: int | None = None,
    steps: int = 10,
    warmup: int = 3,
    repeats: int = 3,
    threshold: float = 0.05,
    memory_limit_bytes: int | None = None,
    budget_s: float | None = None,
) -> BatchSizeResult:
    """Find the smallest batch size within ``threshold`` of the best measured training throughput.

    Args:
        model, dataset: the model (deep-copied, never modified); ``dataset[i]`` -> (input, target).
        loss_fn, device: ``loss_fn(model(inputs), targets)`` -> loss; "auto" | "cpu" | "cuda".
        candidates: sizes to measure instead of the sweep (powers of two from 1 up to
            min(len(dataset), 8192, keep_effective) while they gain > threshold, then 0.75x and
            1.5x the knee).
        max_memory_fraction: eligible sizes peak within this fraction of the memory limit.
        keep_effective: hold this effective batch: recommend ``accumulate = ceil(E / batch)``.
        steps, warmup, repeats: timed steps per repeat, untimed steps first, repeats (median).
        threshold: the knee is the smallest size within this fraction of the best samples/s.
        memory_limit_bytes: cap on a trial's peak; default: the GPU's memory on CUDA, none on CPU.
        budget_s: stop trying new sizes after this many seconds (the first size always runs).

    Returns:
        A :class:`BatchSizeResult`.

    Raises:
        ConfigError: every invalid argument, before anything runs.
        MeasurementError: no size ran within the memory limit.

    Example:
        >>> result = tune_batch_size(model, TensorDataset(x, y), keep_effective=512)
        >>> result.recommended
        {'batch_size': 128, 'accumulate': 4}
    """
    problems = _batch_checks.problems(model, dataset, loss_fn, device, candidates, max_memory_fraction,
                         keep_effective, steps, warmup, repeats, threshold, memory_limit_bytes,
                         budget_s)
    if problems:
        raise ConfigError(problems)
    dev = resolve_device(device)
    if dev.type == "cuda":
        torch.cuda.init()  # so rng_state() captures (and we restore) the CUDA generators too
    saved_rng = rng_state()
    try:
        private, optimizer = _private_copy(model, dev)
        run = _TrialBench(model=private, optimizer=optimizer, loss_fn=loss_fn, dataset=dataset,
                          device=dev, steps=steps, warmup=warmup, repeats=repeats,
                          memory_limit=_memory_limit(dev, memory_limit_bytes),
                          max_fraction=max_memory_fraction)
        trials, ended = _search(run, candidates, threshold, keep_effective, budget_s)
    finally:
        set_rng_state(saved_rng)
    return _result(trials, ended, run, threshold, keep_effective)


# ------------------------------------------------------------------------------------ the pick

def pick_knee(trials: list[dict], threshold: float = 0.05, memory_limit: int | None = None,
              max_fraction: float = 0.9) -> Decision:
    """The smallest eligible batch size whose samples/s is within ``threshold`` of the best.

    Eligible: status "ok" and, when both are known, peak memory <= ``max_fraction * memory_limit``.
    Pure: works on recorded trials. Raises MeasurementError when no trial is eligible.

    Example:
        >>> pick_knee([{"batch_size": 8, "samples_per_s": 96.0, "status": "ok"},
        ...            {"batch_size": 16, "samples_per_s": 100.0, "status": "ok"}]).value
        8
    """
    eligible = [t for t in trials if _eligible(t, memory_limit, max_fraction)]
    if not eligible:
        tried = ", ".join(f"{t['batch_size']} ({t.get('status')}: {t.get('reason')})"
                          for t in trials) or "none"
        limit = "none" if memory_limit is None else f"{max_fraction:.0%} of {memory_limit} bytes"
        raise MeasurementError(f"no batch size ran within the memory limit ({limit}); tried "
                               f"{tried}. Use a smaller model or input, raise memory_limit_bytes"
                               " / max_memory_fraction, or pass smaller candidates.")
    best = max(eligible, key=lambda t: t["samples_per_s"])
    floor = (1.0 - threshold) * best["samples_per_s"]
    knee = min((t for t in eligible if t["samples_per_s"] >= floor), key=lambda t: t["batch_size"])
    reason = _knee_reason(knee, best, threshold, trials, eligible)
    return Decision("batch_size", knee["batch_size"], reason=reason, evidence=trials)


def _eligible(trial: dict, memory_limit: int | None, max_fraction: float) -> bool:
    peak = trial.get("peak_mem_bytes")
    fits = memory_limit is None or peak is None or peak <= max_fraction * memory_limit
    return trial.get("status") == "ok" and trial.get("samples_per_s") is not None and fits


def _knee_reason(knee: dict, best: dict, threshold: float, trials: list[dict],
                 eligible: list[dict]) -> str:
    head = f"{knee['batch_size']}: {knee['samples_per_s']:,.0f} samples/s"
    if knee is best:
        reason = f"{head}, the best measured"
    else:
        reason = (f"{head}, within {threshold:.0%} of the best ({best['batch_size']}: "
                  f"{best['samples_per_s']:,.0f}){_memory_phrase(knee, best)}")
    excluded = [t for t in trials if t not in eligible]
    if excluded:
        reason += "; excluded: " + ", ".join(f"{t['batch_size']} ({t.get('status')})"
                                             for t in excluded)
    return reason


def _memory_phrase(knee: dict, best: dict) -> str:
    small, big = knee.get("peak_mem_bytes"), best.get("peak_mem_bytes")
    if not small or not big:
        return ""
    ratio = small / big
    if abs(ratio - 0.5) < 0.05:
        return " at half the memory"
    return f" at {ratio:.0%} of its memory ({format_bytes(small)} vs {format_bytes(big)})"


# ---------------------------------------------------------------------------------- the search

def _search(run: _TrialBench, candidates: Sequence[int] | None, threshold: float,
            keep_effective: int | None, budget_s: float | None) -> tuple[list[dict], dict]:
    """Run the trials; returns them and why the search ended ({"search_ended", "detail"})."""
    deadline = None if budget_s is None else time.perf_counter() + budget_s
    trials: list[dict] = []
    if candidates is not None:
        ended = _sweep(run, sorted(set(candidates)), trials, None, deadline, "candidates")
        return trials, ended or {"search_ended": "candidates", "detail": "measured every candidate"}
    first = 2 if any(isinstance(m, _BatchNorm) for m in run.model.modules()) else 1
    cap = max(first, min(MAX_BATCH, len(run.dataset), keep_effective or MAX_BATCH))
    sizes = [2 ** k for k in range(first.bit_length() - 1, cap.bit_length()) if 2 ** k <= cap]
    ended = _sweep(run, sizes, trials, threshold, deadline, "sweep") or {
        "search_ended": "cap", "detail": f"reached the largest size allowed, {cap} (min of "
        f"{MAX_BATCH}, len(dataset)={len(run.dataset)}, keep_effective={keep_effective})"}
    refine = _refine_sizes(trials, threshold, run, cap, first)
    return trials, _sweep(run, refine, trials, None, deadline, "refine") or ended


def _sweep(run: _TrialBench, sizes: list[int], trials: list[dict], threshold: float | None,
           deadline: float | None, phase: str) -> dict | None:
    """Measure ``sizes`` in order until one fails, the budget ends or (with a threshold) a size
    gains no more than ``threshold`` over the best so far. Returns why it stopped early, or None."""
    for size in sizes:
        if trials and deadline is not None and time.perf_counter() >= deadline:
            return {"search_ended": "budget", "detail": f"budget_s spent after {len(trials)} "
                    f"sizes; {size} and the rest of this {phase} were not tried"}
        best = max((t["samples_per_s"] for t in trials if t["status"] == "ok"), default=None)
        trial = {**_run_trial(run, size), "phase": phase}
        trials.append(trial)
        if trial["status"] != "ok":
            return {"search_ended": trial["status"], "detail": f"{size}: {trial['reason']}"}
        gain = None if best is None else trial["samples_per_s"] / best - 1
        if threshold is not None and gain is not None and gain <= threshold:
            return {"search_ended": "plateau", "detail": f"{size} gained <= {threshold:.0%} "
                    f"over the best so far ({best:,.0f} samples/s)"}
    return None


def _refine_sizes(trials: list[dict], threshold: float, run: _TrialBench, cap: int,
                  first: int = 1) -> list[int]:
    """0.75x and 1.5x the sweep's knee (between its neighbours), none below ``first``."""
    if not any(_eligible(t, run.memory_limit, run.max_fraction) for t in trials):
        return []
    knee = pick_knee(trials, threshold, run.memory_limit, run.max_fraction).value
    failed = min((t["batch_size"] for t in trials if t["status"] != "ok"), default=math.inf)
    tried = {t["batch_size"] for t in trials}
    points = {knee * 3 // 4, knee * 3 // 2}
    return sorted(p for p in points if first <= p <= cap and p < failed and p not in tried)


# ---------------------------------------------------------------------------------- one trial

def _run_trial(run: _TrialBench, size: int) -> dict:
    """Measure one batch size; an out-of-memory error becomes a trial with status "oom"."""
    try:
        return _measure_trial(run, size)
    except torch.OutOfMemoryError as err:
        message = str(err).strip().splitlines()[0] if str(err).strip() else "out of memory"
    # after the except block: the traceback, and the frames holding the batch, are gone
    run.optimizer.zero_grad(set_to_none=True)
    gc.collect()
    if run.device.type == "cuda":
        torch.cuda.empty_cache()
    return _trial(run, size, "oom", f"out of memory: {message}")


def _measure_trial(run: _TrialBench, size: int) -> dict:
    run.optimizer.zero_grad(set_to_none=True)  # every trial's peak includes allocating the grads
    memory = PeakMemory(run.device) if run.device.type == "cuda" else None
    if memory is not None:
        memory.start()
    inputs, targets = _allocate(run.dataset, size, run.device)
    peak = None if memory is not None else _cpu_peak_estimate(run, inputs, targets)
    for _ in range(run.warmup):
        _train_step(run, inputs, targets)
    seconds = [_time_steps(run, inputs, targets) for _ in range(run.repeats)]
    if memory is not None:
        peak = memory.read().peak_bytes
    return _timed_trial(run, size, seconds, peak)


def _allocate(dataset: Any, size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch of ``size`` samples: the first ones, cycled when the dataset is smaller."""
    count = min(size, len(dataset))
    samples = [dataset[i] for i in range(count)]
    inputs = torch.stack([torch.as_tensor(s[0]) for s in samples])
    targets = torch.stack([torch.as_tensor(s[1]) for s in samples])
    if count < size:
        index = torch.arange(size) % count
        inputs, targets = inputs[index], targets[index]
    return inputs.to(device), targets.to(device)


def _train_step(run: _TrialBench, inputs: torch.Tensor, targets: torch.Tensor) -> None:
    run.optimizer.zero_grad(set_to_none=True)
    with torch.enable_grad():
        loss = run.loss_fn(run.model(inputs), targets)
        loss.backward()
    run.optimizer.step()  # no .item(): the step never syncs the host; the Stopwatch does


def _time_steps(run: _TrialBench, inputs: torch.Tensor, targets: torch.Tensor) -> float:
    """Seconds for ``run.steps`` training steps, the device synchronized at both ends."""
    watch = Stopwatch(run.device)
    watch.start()
    for _ in range(run.steps):
        _train_step(run, inputs, targets)
    return watch.stop()


def _cpu_peak_estimate(run: _TrialBench, inputs: torch.Tensor, targets: torch.Tensor) -> int:
    """Bytes of one untimed step's tensors (params, grads, batch, saved activations).

    Raises torch.OutOfMemoryError above ``memory_limit_bytes``: on CPU the limit plays the
    allocator's capacity.
    """
    # keyed by address, so views and re-saved tensors count once; the tensor is held so its
    # address is not reused by a later allocation of the step (the count would vary run to run)
    storages: dict[int, tuple[int, torch.Tensor]] = {}

    def keep(tensor: torch.Tensor | None) -> torch.Tensor | None:
        if tensor is not None and tensor.layout == torch.strided:  # sparse: no plain storage
            storage = tensor.untyped_storage()
            storages[storage.data_ptr()] = (storage.nbytes(), tensor)
        return tensor

    for tensor in (*run.model.parameters(), inputs, targets):
        keep(tensor)
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda tensor: tensor):
        _train_step(run, inputs, targets)
    for param in run.model.parameters():
        keep(param.grad)
    estimate = sum(nbytes for nbytes, _ in storages.values())
    if run.memory_limit is not None and estimate > run.memory_limit:
        raise torch.OutOfMemoryError(
            f"the step's tensors are estimated at {format_bytes(estimate)}, over "
            f"memory_limit_bytes={run.memory_limit} ({format_bytes(run.memory_limit)})")
    return estimate


def _timed_trial(run: _TrialBench, size: int, seconds: list[float], peak: int | None) -> dict:
    median = statistics.median(seconds)
    if median <= 0:
        raise MeasurementError(f"batch_size={size}: {run.steps} steps took {median} s; the clock "
                               "cannot resolve them. Raise steps.")
    rate = statistics.median(size * run.steps / s for s in seconds)
    timing = (f"{rate:,.0f} samples/s, {1000 * median / run.steps:.2f} ms/step (median of "
              f"{run.repeats} x {run.steps} steps after {run.warmup} warm-up)")
    limit = run.memory_limit
    if limit is not None and peak is not None and peak > run.max_fraction * limit:
        return _trial(run, size, "over_memory", f"{timing}; peak {format_bytes(peak)} > "
                      f"{run.max_fraction:.0%} of {format_bytes(limit)}", rate, median, peak)
    return _trial(run, size, "ok", timing, rate, median, peak)


def _trial(run: _TrialBench, size: int, status: str, reason: str, rate: float | None = None,
           median_s: float | None = None, peak: int | None = None) -> dict:
    step_ms = None if median_s is None else 1000 * median_s / run.steps
    return {"batch_size": size, "samples_per_s": rate, "step_ms": step_ms, "peak_mem_bytes": peak,
            "peak_mem_kind": _MEM_KIND[run.device.type], "status": status, "reason": reason}


# ------------------------------------------------------------------------------ set-up, result

def _private_copy(model: nn.Module, device: torch.device) -> tuple[nn.Module, torch.optim.SGD]:
    try:
        private = copy.deepcopy(model)
    except (TypeError, RuntimeError, copy.Error) as err:
        raise ConfigError(f"model={type(model).__name__} could not be deep-copied ({err}); the "
                          "search trains a copy so your weights stay untouched. Pass a plain "
                          "nn.Module (not a compiled or hooked wrapper).") from err
    private = private.to(device).train()
    return private, torch.optim.SGD(private.parameters(), lr=0.0)


def _memory_limit(device: torch.device, given: int | None) -> int | None:
    if device.type != "cuda":
        return given
    total = torch.cuda.get_device_properties(device).total_memory
    return total if given is None else min(total, given)


def _result(trials: list[dict], ended: dict, run: _TrialBench, threshold: float,
            keep_effective: int | None) -> BatchSizeResult:
    knee = pick_knee(trials, threshold, run.memory_limit, run.max_fraction)
    reason = knee.reason
    if ended["search_ended"] == "budget":
        reason += f"; the search stopped early: {ended['detail']}"
    elif ended["search_ended"] == "cap" and knee.value == max(t["batch_size"] for t in trials):
        reason += f"; larger sizes were not tried: {ended['detail']}"
    evidence = {"trials": trials, **ended, "memory_limit_bytes": run.memory_limit,
                "max_memory_fraction": run.max_fraction, "device": str(run.device),
                "peak_mem_kind": _MEM_KIND[run.device.type]}
    decisions = [replace(knee, reason=reason, evidence=evidence)]
    recommended = {"batch_size": knee.value}
    if keep_effective is not None:
        decisions.append(_accumulate_decision(knee.value, keep_effective))
        recommended["accumulate"] = decisions[-1].value
    return BatchSizeResult(decisions=decisions, recommended=recommended, trials=trials)


def _accumulate_decision(batch: int, effective: int) -> Decision:
    accumulate = math.ceil(effective / batch)
    got = accumulate * batch
    plural = "es" if accumulate > 1 else ""
    reason = f"keep_effective={effective}: {accumulate} micro-batch{plural} of {batch} = "
    reason += f"effective batch {got}"
    if got != effective:
        reason += f" ({got - effective} more than asked: {effective} is not a multiple of {batch})"
    return Decision("accumulate", accumulate, reason=reason,
                    evidence={"batch_size": batch, "keep_effective": effective, "effective": got})
