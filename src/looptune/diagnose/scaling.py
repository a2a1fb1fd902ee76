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

__all__ = ["UNKNOWN_DIM", "ModelCapture", "batch_dimension", "math_sdpa", "measure_scaling", "replay_modules",
           "replay_plan", "replay_problem", "time_model_in_step", "with_in_step"]

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
    # its output carried a gradient (grad mode on, a tensor that requires grad): a forward of the
    # training step, not a torch.no_grad() prediction or evaluation beside it
    trains: bool = True
    grad: bool = True  # grad mode was on for the call
    # the script's autocast around the call, (device type, dtype), replayed the same; None: off
    autocast: tuple[str, torch.dtype] | None = None


def _autocast_now() -> tuple[str, torch.dtype] | None:
    for device_type in ("cuda", "cpu"):
        if torch.is_autocast_enabled(device_type):
            return device_type, torch.get_autocast_dtype(device_type)
    return None


def _needs_grad(out: Any) -> bool:
    if isinstance(out, torch.Tensor):
        return out.requires_grad
    if isinstance(out, dict):
        return any(_needs_grad(v) for v in out.values())
    if isinstance(out, (list, tuple)):
        return any(_needs_grad(v) for v in out)
    return False


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
            entry = None
            if capture._depth == 0:
                entry = _Call(module, args, kwargs, trains=False, grad=torch.is_grad_enabled(),
                              autocast=_autocast_now())
                capture.calls.append(entry)
            capture._depth += 1
            try:
                out = original(module, *args, **kwargs)
            finally:
                capture._depth -= 1
            if entry is not None:
                entry.trains = torch.is_grad_enabled() and _needs_grad(out)
            return out

        torch.nn.Module.__call__ = __call__
        return self

    def __exit__(self, *exc: object) -> None:
        if self._original is not None:
            torch.nn.Module.__call__ = self._original
            self._original = None


def _first_tensor(call: _Call) -> torch.Tensor | None:
    for value in (*call.args, *call.kwargs.values()):
        if isinstance(value, torch.Tensor) and value.ndim >= 1:
            return value
        if isinstance(value, (list, tuple)):  # a batch passed as one tuple
            inner = next((v for v in value if isinstance(v, torch.Tensor) and v.ndim >= 1), None)
            if inner is not None:
                return inner
    return None


def _batch_of(call: _Call, dim: int = 0) -> int | None:
    """The size of dimension ``dim`` of the call's first tensor input (its batch), if any."""
    x = _first_tensor(call)
    return int(x.shape[dim]) if x is not None and x.ndim > dim else None


UNKNOWN_DIM = "the batch dimension cannot be told"
_SEQUENCE = (torch.nn.RNNBase, torch.nn.Transformer, torch.nn.TransformerEncoderLayer,
             torch.nn.TransformerDecoderLayer, torch.nn.MultiheadAttention)


def batch_dimension(call: _Call, loader_batch: int | None = None) -> tuple[int | None, str]:
    """Which dimension of the call's input is the batch, and the evidence that decided it (issue
    32: a time-major LSTM's ``[bptt, batch]`` input was scaled along its sequence). In order: the
    dimension equal to the training DataLoader's batch size; a sequence layer's ``batch_first``
    (False: time-major, dimension 1); else the leading dimension, by convention. None when the
    evidence cannot place it (a time-major model fed a 1-D input): nothing is promised from it."""
    x = _first_tensor(call)
    if x is None:
        return None, "no tensor input"
    layers = [m for m in call.module.modules() if isinstance(m, _SEQUENCE)]
    time_major = [m for m in layers if not getattr(m, "batch_first", False)]
    named = type(time_major[0]).__name__ if time_major else ""
    if loader_batch:
        dims = [d for d in range(x.ndim) if x.shape[d] == loader_batch]
        if dims:
            dim = 1 if time_major and 1 in dims else dims[0]
            return dim, f"dimension {dim}: the DataLoader's batch_size {loader_batch}"
    if time_major and x.ndim >= 4:  # images ([B, C, H, W]): the model reshapes them before
        return 0, (f"dimension 0: the leading dimension of a {x.ndim}-D input (its time-major "
                   f"{named} sees it reshaped)")
    if time_major and len(time_major) == len(layers):
        if x.ndim < 2:
            return None, (f"its {named} is time-major (batch_first=False) but its input is 1-D "
                          f"{tuple(x.shape)}: {UNKNOWN_DIM}")
        return 1, f"dimension 1: its {named} has batch_first=False (time-major input)"
    if time_major:  # time-major and batch-first layers in one model: no rule tells
        return None, (f"its sequence layers disagree on batch_first ({named} is time-major): "
                      f"{UNKNOWN_DIM}")
    return 0, "dimension 0: the leading dimension (no other evidence)"


@dataclass
class _Part:
    """One module the step trains, as the replay runs it."""

    call: _Call  # its first training call in the step (inputs replayed)
    calls: int  # its training calls per step (accumulation, closures, a GAN's D on real + fake)
    dim: int
    batch: int
    evidence: str


def _unwrapped(call: _Call) -> _Call:
    inner = getattr(call.module, "module", None)  # DistributedDataParallel / DataParallel
    if isinstance(inner, torch.nn.Module) and type(call.module).__name__ in _WRAPPERS:
        return dataclasses.replace(call, module=inner)  # a replay must not all-reduce its grads
    return call


def _params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def replay_plan(calls: list[_Call], loader_batch: int | None = None
                ) -> tuple[list[_Part], str | None]:
    """Every module whose forward reached a backward in the step (its output carried a
    gradient; a torch.no_grad() prediction beside the step does not), with its calls per step
    and its batch dimension; the largest first. Or why none can be replayed."""
    if not calls:
        return [], "no nn.Module was called in the step (a functional model)"
    trained = [_unwrapped(c) for c in calls if c.trains]
    if not trained:
        names = ", ".join(dict.fromkeys(type(c.module).__name__ for c in calls))
        if any(c.grad and _params(c.module) == 0 for c in calls):
            return [], f"the modules called in the step ({names}) have no trainable parameters"
        return [], (f"no module called in the step ({names}) returned an output with a gradient "
                    "(torch.no_grad() calls only)")
    groups: dict[int, list[_Call]] = {}
    for c in trained:
        groups.setdefault(id(c.module), []).append(c)
    with_params = [g for g in groups.values() if _params(g[0].module) > 0]
    if not with_params:
        name = type(trained[0].module).__name__
        return [], f"the modules called in the step ({name}, ...) have no trainable parameters"
    with_params.sort(key=lambda g: -_params(g[0].module))  # stable: ties keep the call order
    parts = []
    for group in with_params:
        call, name = group[0], type(group[0].module).__name__
        if name == "OptimizedModule":
            # at another batch size it would recompile (tens of seconds); its eager module scales
            # differently (measured: a 2.57x promise from an eager replay, 1.16x rerun compiled)
            return [], ("the model is torch.compile'd: replaying it at another batch size would "
                        "recompile it, and its eager module does not scale as the compiled one")
        dim, evidence = batch_dimension(call, loader_batch)
        if dim is None:
            return [], f"{name}: {evidence}"
        batch = _batch_of(call, dim)
        if batch is None:
            return [], f"{name} was called without a tensor input whose first dimension is a batch"
        parts.append(_Part(call=call, calls=len(group), dim=dim, batch=batch, evidence=evidence))
    return parts, None


def replay_problem(calls: list[_Call]) -> tuple[_Call | None, str | None]:
    """The main call to replay (the trained module with the most parameters), or why none can
    be (see :func:`replay_plan`)."""
    parts, problem = replay_plan(calls)
    return (parts[0].call if parts else None), problem


def replay_modules(calls: list[_Call]) -> list[torch.nn.Module]:
    """The modules the replay will run (none when it cannot): the probes time their forwards +
    backward inside the script's own steps, for the replay's share of them."""
    parts, _ = replay_plan(calls)
    return [p.call.module for p in parts]


def time_model_in_step(schedule: Any, probes: Any) -> None:
    """On a CPU, once the FLOP-counted step captured the model, time its forward + backward in
    each later step: the replay's share of the step, measured in the step's own seconds (on CUDA
    the host clock sees launches; the replay's synchronized time is used there)."""
    if schedule.device.type == "cpu":
        schedule.on_captured = lambda calls: probes.time_model(replay_modules(calls))


def with_in_step(scaling: BatchScaling | None, measured: list[Any],
             device: torch.device) -> BatchScaling | None:
    """The scaling with the model's median in-step forward + backward (CPU, every measured step
    timed), else as it is."""
    if scaling is None or device.type != "cpu" or not measured:
        return scaling
    spans = [s.model_s for s in measured]
    if any(t is None for t in spans) or not all(spans):
        return scaling
    in_step = statistics.median(spans)
    return dataclasses.replace(scaling, in_step_s=in_step)


def _grow(value: Any, batch: int, factor: int, dim: int = 0) -> Any:
    """``value`` with every tensor whose dimension ``dim`` is ``batch`` repeated ``factor`` times
    along it (an LSTM's hidden state ``[layers, batch, hidden]`` too); every tensor detached from
    the script's graph (a second module's input is the first one's output)."""
    if isinstance(value, torch.Tensor):
        if value.ndim > dim and value.shape[dim] == batch and factor > 1:
            reps = [1] * value.ndim
            reps[dim] = factor
            return value.detach().repeat(*reps)
        return value.detach() if value.requires_grad else value
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_grow(v, batch, factor, dim) for v in value)
    if isinstance(value, tuple):  # a namedtuple
        return type(value)(*(_grow(v, batch, factor, dim) for v in value))
    if isinstance(value, dict):
        return {k: _grow(v, batch, factor, dim) for k, v in value.items()}
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


def measure_scaling(calls: list[_Call], device: torch.device, *, factor: int = FACTOR,
                    loader_batch: int | None = None) -> BatchScaling:
    """Replay the step's trained modules at their batch and at ``factor`` x it; see the module
    docstring. One module: its calls per step scale its replay (``calls_per_step``); several (a
    GAN's generator and discriminator, an encoder and a decoder): one replay runs each as often
    as the step called it, and stands for the whole step's model work."""
    parts, problem = replay_plan(calls, loader_batch)
    if not parts:
        return BatchScaling(batch=None, factor=factor, note=problem,
                            batch_dim=None if problem and UNKNOWN_DIM in problem else 0)
    main = parts[0]
    batch, many = main.batch, len(parts) > 1
    labels = _labels(parts)
    name = " + ".join(labels) if many else type(main.call.module).__name__
    try:
        replays: dict[Any, list] = {batch: [], batch * factor: [], "bf16": []}
        for part in parts:
            model = copy.deepcopy(part.call.module)  # the script's model and grads stay untouched
            model.train(part.call.module.training)
            small = (_grow(part.call.args, part.batch, 1, part.dim),
                     _grow(part.call.kwargs, part.batch, 1, part.dim))
            large = (_grow(part.call.args, part.batch, factor, part.dim),
                     _grow(part.call.kwargs, part.batch, factor, part.dim))
            times = part.calls if many else 1
            mode = part.call.autocast  # the script's own autocast, as it ran the step
            replays[batch].append((_replayer(model, *small, device, autocast=mode), times))
            replays[batch * factor].append((_replayer(model, *large, device, autocast=mode), times))
            replays["bf16"].append((_replayer(model, *small, device, bf16=True), times))
        run = {key: (fns[0][0] if len(fns) == 1 and fns[0][1] == 1 else _together(fns))
               for key, fns in replays.items()}
        # warm-up: first-call allocations, oneDNN primitive creation; each one's time decides how
        # often it is timed again (a CPU without native bf16 may take 100x longer under bf16)
        warm = {key: _time_once(fn, device) for key, fn in run.items()}
        times_s: dict[Any, list[float]] = {key: [] for key in run}
        pair = [(key, run[key]) for key in (batch, batch * factor)]
        for i in range(_rounds(warm[batch] + warm[batch * factor])):
            # ABBA order: a drift of the machine's speed hits both sizes alike
            for key, fn in (pair if i % 2 == 0 else pair[::-1]):
                times_s[key].append(_time(fn, device))
        for _ in range(_rounds(warm["bf16"]) if warm["bf16"] < BUDGET_S else 0):
            times_s["bf16"].append(_time(run["bf16"], device))
        times_s["bf16"] = times_s["bf16"] or [warm["bf16"]]  # too slow to repeat: its one call
        # several modules: each one alone at the step's batch, as often as the step called it
        # (a GAN's generator and discriminator shown apart)
        alone = {label: _together([fn]) for label, fn in zip(labels, replays[batch])} if many else {}
        module_s = {label: min(_time(fn, device) for _ in range(_rounds(_time_once(fn, device))))
                    for label, fn in alone.items()}
    except (RuntimeError, TypeError, ValueError) as err:  # OOM, a shape the model refuses, ...
        first = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
        return BatchScaling(batch=batch, factor=factor, module=name,
                            note=f"replaying {name} failed ({type(err).__name__}: {first})")
    # the fastest round of each: this kind of VM drifts between speeds for seconds at a time, and
    # a slow phase only ever adds time
    return BatchScaling(batch=batch, factor=factor, module=name,
                        calls_per_step=1 if many else main.calls,
                        small_s=min(times_s[batch]), large_s=min(times_s[batch * factor]),
                        bf16_s=min(times_s["bf16"]), beside_busy_s=_beside_busy(run[batch], device),
                        batch_dim=main.dim, batch_evidence=main.evidence, modules=len(parts),
                        module_s=module_s)


def _labels(parts: list[Any]) -> list[str]:
    """Each replayed module's label: its class (``3x`` its calls per step); two of one class
    (an encoder and a decoder built from one class) are told apart by their order."""
    names = [type(p.call.module).__name__ for p in parts]
    seen: dict[str, int] = {}
    out = []
    for p, n in zip(parts, names):
        seen[n] = seen.get(n, 0) + 1
        own = n if names.count(n) == 1 else f"{n} #{seen[n]}"
        out.append(f"{p.calls}x {own}" if p.calls > 1 else own)
    return out


def _together(fns: list[tuple[Any, int]]):
    """One replay of several modules: each run as many times as the step called it."""
    def once() -> None:
        for fn, times in fns:
            for _ in range(times):
                fn()
    return once


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
              bf16: bool = False, autocast: tuple[str, torch.dtype] | None = None):
    """Forward + backward of the model at these inputs: under bf16 autocast (the remedy), else
    under the script's own autocast when it ran one (``autocast``)."""
    kind, dtype = (device.type, torch.bfloat16) if bf16 or autocast is None else autocast

    def once() -> None:
        for p in model.parameters():
            p.grad = None
        with torch.autocast(kind, dtype=dtype, enabled=bf16 or autocast is not None), \
                math_sdpa(bf16):
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
