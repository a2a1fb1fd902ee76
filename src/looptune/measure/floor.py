"""The floor of a training step on this machine: what its arithmetic and its unavoidable memory
traffic cost when each piece runs alone, as fast as this machine runs it.

Two parts, both measured where the code runs (never a datasheet peak):

* **arithmetic**: every FLOP-counted op of one forward + backward (matmuls, convolutions,
  attention: the ops ``torch.utils.flop_counter`` knows) is recorded with its real arguments
  while the step runs once, then each distinct op (same function, shapes, strides, dtypes) is
  timed alone in a tight loop, fastest of a few rounds. Their sum is the time the step's FLOPs
  take at the rate this machine reaches *at those shapes* (a batch-64 GEMM runs far below a
  large one's rate; a floor from the large one's rate would be unreachable).
* **unavoidable memory traffic**: the optimizer update reads and writes every parameter, its
  gradient and its state once (Adam: read p, g, m, v; write p, m, v = 7 x 4 bytes per fp32
  parameter), and the step reads its input batch once. Those bytes are timed as the simplest
  streaming kernel (``torch.add(a, b, out=c)``) over buffers of the same total size, so the
  cache level the update works in is the one measured.

Everything else a real step does (elementwise ops, the loss, autograd bookkeeping, dispatch,
Python) is counted as distance from the floor, not as part of it.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map
from torch.utils.flop_counter import flop_registry

__all__ = ["Floor", "OpTime", "measure_floor", "update_bytes"]

ROUND_S = 0.02  # each timing round runs an op at least this long
ROUNDS = 5  # rounds per op; the fastest is kept (the floor is what the machine *can* do)
# optimizer -> state tensors per parameter (what the update reads and writes besides p and g)
STATE_TENSORS = {"adam": 2, "adamw": 2, "sgd": 1}


@dataclass(frozen=True, kw_only=True)
class OpTime:
    """One distinct FLOP-counted op of the step, timed alone."""

    op: str  # aten name, e.g. "aten.addmm.default"
    shapes: str  # its tensor arguments' shapes, e.g. "[128] [64, 784] [784, 128]"
    calls: int  # how often one step calls it
    flops: float  # per call
    seconds: float  # per call, alone (fastest round, at its fastest thread count and dtype)
    threads: int = 1  # the intra-op thread count that ran it fastest
    dtype: str = ""  # the dtype that ran it fastest: as recorded, or float32 for a bf16/fp16 op

    @property
    def gflops(self) -> float:
        return self.flops / self.seconds / 1e9 if self.seconds > 0 else 0.0


@dataclass(frozen=True, kw_only=True)
class Floor:
    """The measured floor of one training step at ``batch_size`` (seconds per step)."""

    batch_size: int
    threads: tuple[int, ...]  # intra-op thread counts each op was timed with (fastest kept)
    flops: float  # forward + backward FLOPs per step (FlopCounterMode's rules)
    arithmetic_s: float  # sum over the step's FLOP-counted ops of their time alone
    memory_bytes: int  # the update's and the input's unavoidable bytes per step
    stream_bytes_per_s: float  # measured rate of a streaming kernel at that working-set size
    ops: list[OpTime] = field(default_factory=list)

    @property
    def memory_s(self) -> float:
        return self.memory_bytes / self.stream_bytes_per_s if self.stream_bytes_per_s else 0.0

    @property
    def step_s(self) -> float:
        return self.arithmetic_s + self.memory_s

    @property
    def gflops(self) -> float:
        """The rate the step's own FLOP-counted ops reach alone."""
        return self.flops / self.arithmetic_s / 1e9 if self.arithmetic_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"batch_size": self.batch_size, "threads": list(self.threads), "flops": self.flops,
                "arithmetic_s": self.arithmetic_s, "memory_bytes": self.memory_bytes,
                "stream_bytes_per_s": self.stream_bytes_per_s, "memory_s": self.memory_s,
                "step_s": self.step_s, "gflops": self.gflops,
                "ops": [{"op": o.op, "shapes": o.shapes, "calls": o.calls, "flops": o.flops,
                         "seconds": o.seconds, "threads": o.threads, "dtype": o.dtype,
                         "gflops": o.gflops}
                        for o in self.ops]}


class _Recorder(TorchDispatchMode):
    """Records every FLOP-counted op (with detached copies of its arguments) and its FLOPs."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[tuple, list] = {}  # signature -> [func, args, kwargs, calls, flops]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        packet = func._overloadpacket
        if packet in flop_registry:
            key = (str(func), _signature(args), _signature(kwargs))
            entry = self.calls.get(key)
            if entry is None:
                flops = flop_registry[packet](*args, **kwargs, out_val=out)
                copy = (lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t)
                self.calls[key] = [func, tree_map(copy, args), tree_map(copy, kwargs), 1, flops]
            else:
                entry[3] += 1
        return out


def _signature(tree: Any) -> str:
    def one(t: Any) -> Any:
        if isinstance(t, torch.Tensor):
            return (tuple(t.shape), tuple(t.stride()), str(t.dtype))
        return t

    return repr(tree_map(one, tree))


def _variants(args: Any, kwargs: Any) -> dict[str, tuple[Any, Any]]:
    """The op's arguments as recorded and, for an op in bf16/fp16, in float32 too: a step under
    autocast may run any op in float32 (more precise, and on a CPU a small matmul is often faster
    that way), so its floor is the faster of the two."""
    found: set[torch.dtype] = set()
    tree_map(lambda t: found.add(t.dtype) if isinstance(t, torch.Tensor) else None, (args, kwargs))
    low = found & {torch.bfloat16, torch.float16}
    recorded = (min(low, key=str) if low else
                next((d for d in sorted(found, key=str) if d.is_floating_point), torch.float32))
    out = {str(recorded).removeprefix("torch."): (args, kwargs)}
    if low:
        up = (lambda t: t.float() if isinstance(t, torch.Tensor) and t.dtype in low else t)
        out["float32"] = (tree_map(up, args), tree_map(up, kwargs))
    return out


def _shapes(args: Any) -> str:
    found: list[str] = []
    tree_map(lambda t: found.append(str(list(t.shape))) if isinstance(t, torch.Tensor) else None,
             args)
    return " ".join(found)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # sync: the timed kernels must have finished


def time_alone(fn: Callable[[], Any], device: torch.device, *, round_s: float = ROUND_S,
               rounds: int = ROUNDS) -> float:
    """Seconds per call of ``fn``, fastest of ``rounds`` rounds of at least ``round_s`` each."""
    for _ in range(3):  # warm-up: allocator, oneDNN primitive caches, lazy init
        fn()
    _sync(device)
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < round_s / 4 or n < 2:  # calibrate the calls per round
        fn()
        n += 1
    _sync(device)
    per_round = max(2, int(n * round_s / max(time.perf_counter() - t0, 1e-9)))
    best = math.inf
    for _ in range(rounds):
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(per_round):
            fn()
        _sync(device)
        best = min(best, (time.perf_counter() - t0) / per_round)
    return best


def update_bytes(params: list[torch.Tensor], optimizer: str) -> int:
    """Bytes one optimizer update must read and write at least: each parameter, its gradient and
    its state read once, the parameter and its state written once."""
    states = STATE_TENSORS.get(optimizer, 0)
    per_element = sum(p.element_size() for p in params[:1]) or 4
    elements = sum(p.numel() for p in params)
    return elements * per_element * (2 + states + 1 + states)  # read p, g, state; write p, state


def stream_rate(total_bytes: int, device: torch.device, dtype: torch.dtype = torch.float32
                ) -> float:
    """Bytes per second of ``c = a + b`` over three buffers holding ``total_bytes`` in all."""
    size = torch.tensor([], dtype=dtype).element_size()
    n = max(1024, -(-total_bytes // (3 * size)))
    a, b, c = (torch.rand(n, device=device, dtype=dtype) for _ in range(3))
    seconds = time_alone(lambda: torch.add(a, b, out=c), device)
    return 3 * n * size / seconds


def measure_floor(model: torch.nn.Module, loss_fn: Callable[..., torch.Tensor],
                  x: torch.Tensor, y: torch.Tensor, *, optimizer: str = "adam",
                  input_bytes: int | None = None, threads: tuple[int, ...] | None = None,
                  context: Callable[[], Any] | None = None) -> Floor:
    """The floor of one step of ``model`` on the batch ``(x, y)``: see the module docstring.

    Args:
        model: the model, on its training device (its parameters' gradients are left as None).
        loss_fn: ``loss_fn(model(x), y) -> scalar``.
        x, y: one batch, on the model's device.
        optimizer: "adam", "adamw" or "sgd" (momentum): how many state tensors the update moves.
        input_bytes: the batch's bytes as stored (e.g. uint8 pixels), read once per step;
            default: ``x``'s bytes.
        threads: CPU intra-op thread counts to time each op and the stream with; each keeps its
            fastest (small GEMMs often run faster on one core than split over several). Default:
            1 and torch's current count.
        context: a factory of the context the step's forward runs in (autocast, an attention
            kernel): the ops are recorded, and so timed, in the dtypes and kernels it picks.
    """
    device = x.device
    counts = tuple(sorted(set(threads or (1, torch.get_num_threads()))))
    if device.type != "cpu":
        counts = (torch.get_num_threads(),)  # the device's kernels do not use host threads
    params = [p for p in model.parameters() if p.requires_grad]
    recorder = _Recorder()
    with recorder:
        with context() if context is not None else contextlib.nullcontext():
            loss = loss_fn(model(x), y)
        loss.backward()
    for p in params:
        p.grad = None
    stored = x.numel() * x.element_size() if input_bytes is None else input_bytes
    memory = update_bytes(params, optimizer) + stored + y.numel() * y.element_size()
    best: dict[tuple, tuple[float, int, str]] = {}
    rate = 0.0
    before = torch.get_num_threads()
    try:
        for n in counts:
            torch.set_num_threads(n)
            for key, (func, args, kwargs, _, _) in recorder.calls.items():
                for dtype, (a, k) in _variants(args, kwargs).items():
                    seconds = time_alone(lambda f=func, a=a, k=k: f(*a, **k), device)
                    if key not in best or seconds < best[key][0]:
                        best[key] = (seconds, n, dtype)
            rate = max(rate, stream_rate(memory, device))
    finally:
        torch.set_num_threads(before)
    ops = [OpTime(op=str(func), shapes=_shapes(args), calls=calls, flops=float(flops),
                  seconds=best[key][0], threads=best[key][1], dtype=best[key][2])
           for key, (func, args, kwargs, calls, flops) in recorder.calls.items()]
    ops.sort(key=lambda o: -o.seconds * o.calls)
    return Floor(batch_size=int(x.shape[0]), threads=counts,
                 flops=sum(o.flops * o.calls for o in ops),
                 arithmetic_s=sum(o.seconds * o.calls for o in ops), memory_bytes=memory,
                 stream_bytes_per_s=rate, ops=ops)
