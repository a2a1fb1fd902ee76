"""How long a rank of a distributed job is blocked in collectives, per optimizer step.

In a synchronized job (DDP) every rank's step takes as long as the slowest rank's: a fast rank
finishes its backward and then blocks in the gradient all-reduce until the straggler's gradients
arrive. Step times are therefore equal on every rank and cannot name the straggler; the time each
rank spends blocked in collectives (waiting for the others, plus the transfer) can. Its own work
per step is the step minus that time.

Measured on the CPU (gloo), where the host blocks for the collective, from:

* DDP's gradient all-reduce: each DDP model gets a communication hook (torch's own API) that
  does what DDP's reducer does without one (gradients times 1/world size, then a sum: the same
  gradients, bit for bit) and stamps when each bucket was launched and when its all-reduce
  completed. The step's time is the last completion minus the last launch: after its own
  backward, how long the rank was blocked. A hook the script registers is wrapped the same way.
* blocking collectives the script calls (``dist.all_reduce(t)``, ``dist.barrier()``, ...) and
  DDP's buffer broadcast: their whole call time (``async_op=True`` calls return at once: skipped).

On CUDA (NCCL) the wait happens on the device, not on the host clock: not measured (None), and a
DDP model with a C++ built-in hook (``_register_builtin_comm_hook``) cannot be wrapped: None too.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from looptune.dist.context import env_world_size
from looptune.errors import ConfigError

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self needs Python 3.11

__all__ = ["RankWaits", "launched_rank"]

# blocking (async_op=False) collectives a training script calls directly
_COLLECTIVES = ("all_reduce", "broadcast", "barrier", "reduce", "all_gather", "all_gather_object",
                "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast_object_list",
                "gather", "scatter", "all_to_all", "all_to_all_single")


def launched_rank() -> tuple[int | None, int]:
    """(RANK, WORLD_SIZE) as a launcher (torchrun, ``--nproc``) set them; (None, 1) otherwise."""
    world = env_world_size()
    value = os.environ.get("RANK")
    if value is None:
        return None, world
    try:
        rank = int(value)
    except ValueError:
        rank = -1
    if not 0 <= rank < max(world, 1):
        raise ConfigError(f"RANK={value!r} is invalid with WORLD_SIZE={world}: must be an integer "
                          f"in 0..{max(world, 1) - 1}. Launch with torchrun (or looptune diagnose "
                          "--nproc N), which sets both, or unset RANK.")
    return rank, world


def _ddp_allreduce(group: Any, bucket: Any) -> Any:
    """What DDP's reducer does without a hook, bit for bit: gradients times 1/world size (a
    multiply, not torch's ``allreduce_hook``'s divide, which rounds differently), then a sum."""
    import torch.distributed as dist

    group = group if group is not None else dist.group.WORLD
    tensor = bucket.buffer().mul_(1.0 / group.size())
    return dist.all_reduce(tensor, group=group, async_op=True).get_future().then(
        lambda done: done.value()[0])


def _timed_hook(waits: RankWaits, inner: Callable, state: object) -> Callable:
    """The communication hook registered on a DDP model: runs ``inner(state, bucket)`` and stamps
    the bucket's launch and completion.

    Registered once per model; a hook the script registers later replaces ``inner`` and ``state``
    (DDP accepts a single registration), so the script's own hook runs, timed.
    """

    # unannotated: DDP checks a hook's annotations and accepts only its own types
    def looptune_timed_hook(_state, bucket):
        t0 = time.perf_counter()
        future = looptune_timed_hook.inner(looptune_timed_hook.state, bucket)
        return future.then(lambda done: waits._bucket_done(t0, done))

    looptune_timed_hook.inner, looptune_timed_hook.state = inner, state
    return looptune_timed_hook


class RankWaits:
    """Per-step time blocked on other ranks; ``per_step[i]`` belongs to the i-th optimizer step.

    Use as a context manager around the script; call :meth:`end_step` at every step boundary.
    ``per_step`` is None when the waits could not be measured (see the module docstring).
    """

    def __init__(self, *, enabled: bool) -> None:
        self.enabled = enabled
        self.unmeasurable: str | None = None  # why the waits are unknown, if they are
        self._steps: list[float] = []
        self._launches: list[float] = []  # this step's bucket launch times
        self._completions: list[float] = []
        self._blocking = 0.0  # this step's time inside blocking collectives
        self._thread = threading.main_thread().ident
        self._register: Callable | None = None  # DDP.register_comm_hook itself
        self._restore: list[Callable[[], None]] = []

    @property
    def per_step(self) -> list[float] | None:
        return None if not self.enabled or self.unmeasurable else list(self._steps)

    def restart(self) -> None:
        """Drop the steps closed so far (the probes count steps from the start again)."""
        self._steps = []
        self._launches, self._completions, self._blocking = [], [], 0.0

    def end_step(self) -> None:
        """Close the current step: its wait is appended to ``per_step``."""
        after_backward = 0.0
        if self._launches and self._completions:
            after_backward = max(0.0, max(self._completions) - max(self._launches))
        self._steps.append(after_backward + self._blocking)
        self._launches, self._completions, self._blocking = [], [], 0.0

    # -- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> Self:
        if not self.enabled:
            return self
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        self._patch(DDP, "__init__", self._on_ddp_init)
        self._patch(DDP, "register_comm_hook", self._on_register)
        self._patch(DDP, "_register_builtin_comm_hook", self._on_builtin)
        self._patch(DDP, "_distributed_broadcast_coalesced", self._blocking_call)
        for name in _COLLECTIVES:
            if hasattr(dist, name):
                self._patch(dist, name, self._blocking_call)
        return self

    def __exit__(self, *exc: object) -> None:
        while self._restore:
            self._restore.pop()()

    def _patch(self, owner: Any, name: str, make: Callable[[Callable], Callable]) -> None:
        original = getattr(owner, name)
        setattr(owner, name, make(original))
        self._restore.append(lambda: setattr(owner, name, original))

    # -- DDP -------------------------------------------------------------------------------
    def _on_ddp_init(self, original: Callable) -> Callable:
        waits = self

        def __init__(ddp, *args, **kwargs):
            original(ddp, *args, **kwargs)
            if getattr(ddp, "device_type", "cpu") != "cpu":
                waits.unmeasurable = "a DDP model on CUDA: NCCL waits happen on the device"
                return
            # registered at the first forward, so a hook the script registers before that is
            # wrapped instead (DDP takes one registration; it must come before the backward)
            handle = ddp.register_forward_pre_hook(lambda module, inputs: waits._first_forward(
                module, handle))

        return __init__

    def _first_forward(self, ddp: Any, handle: Any) -> None:
        handle.remove()
        if (getattr(ddp, "_looptune_timed", None) is not None or getattr(ddp, "_comm_hooks", None)
                or getattr(ddp, "_looptune_builtin", False)):
            return  # the script registered its own hook: wrapped already, or built in
        timed = _timed_hook(self, _ddp_allreduce, ddp.process_group)
        ddp._looptune_timed = timed
        self._register(ddp, None, timed)

    def _on_register(self, original: Callable) -> Callable:
        waits, self._register = self, original

        def register_comm_hook(ddp, state, hook):
            timed = getattr(ddp, "_looptune_timed", None)
            if timed is not None:  # ours is registered already: run the script's hook inside it
                timed.inner, timed.state = hook, state
                return None
            timed = _timed_hook(waits, hook, state)
            ddp._looptune_timed = timed
            return original(ddp, None, timed)

        return register_comm_hook

    def _on_builtin(self, original: Callable) -> Callable:
        waits = self

        def _register_builtin_comm_hook(ddp, comm_hook_type):
            ddp._looptune_builtin = True
            waits.unmeasurable = f"a C++ built-in DDP hook ({comm_hook_type}) cannot be timed"
            return original(ddp, comm_hook_type)

        return _register_builtin_comm_hook

    def _bucket_done(self, t0: float, done: Any) -> Any:
        # runs on the backend's thread when the bucket's all-reduce completed; list appends are
        # atomic, and DDP waits for every bucket before backward() returns, so before end_step
        self._launches.append(t0)
        self._completions.append(time.perf_counter())
        return done.value()

    # -- blocking collectives --------------------------------------------------------------
    def _blocking_call(self, original: Callable) -> Callable:
        waits = self

        def call(*args, **kwargs):
            if threading.get_ident() != waits._thread:
                return original(*args, **kwargs)
            t0 = time.perf_counter()
            out = original(*args, **kwargs)
            if out is None:  # async_op=True returns a Work handle at once: nothing waited yet
                # sync: a blocking collective returns once every rank has joined it
                waits._blocking += time.perf_counter() - t0
            return out

        call.__name__ = getattr(original, "__name__", "collective")
        return call
