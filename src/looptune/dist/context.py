"""Which rank this process is, and the process group around it.

A process is distributed when the launcher set ``WORLD_SIZE`` (``torchrun``, or ``looptune ...
--nproc N``, which runs torch's own elastic agent). :func:`init` then creates the default process
group: ``gloo`` on CPU, ``nccl`` on CUDA (one device per rank: ``cuda:LOCAL_RANK``), with an
explicit timeout, so a rank that dies or hangs makes the others fail in bounded time instead of
waiting forever.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from looptune.errors import ConfigError

__all__ = ["DEFAULT_TIMEOUT_S", "DistContext", "current", "env_world_size", "init", "rank_device",
           "shutdown", "timeout_problem"]

DEFAULT_TIMEOUT_S = 300.0  # a collective waiting longer than this fails the job (a rank hung/died)


@dataclass(frozen=True, kw_only=True)
class DistContext:
    """One rank's place in the job; ``world_size == 1`` is a plain single process."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str | None = None  # "gloo" | "nccl"; None when not launched distributed
    timeout_s: float | None = None
    owns_group: bool = False  # looptune created the process group (so it may destroy it)

    @property
    def enabled(self) -> bool:
        """Whether this process joined a process group (a launcher started it, any world size:
        ``torchrun --nproc_per_node 1`` runs the DDP/NCCL path on one GPU)."""
        return self.backend is not None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def all_mean(self, values: list[float]) -> list[float]:
        """Each value averaged over the ranks (unchanged in a single process)."""
        return [v / self.world_size for v in self.all_sum(values)]

    def all_sum(self, values: list[float]) -> list[float]:
        return self._all_reduce(values, "SUM")

    def all_max(self, values: list[float]) -> list[float]:
        return self._all_reduce(values, "MAX")

    def _all_reduce(self, values: list[float], op: str) -> list[float]:
        if not self.enabled:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64, device=_collective_device(self))
        dist.all_reduce(t, op=getattr(dist.ReduceOp, op))  # sync: a collective waits for all ranks
        return t.tolist()

    def gather(self, obj: Any) -> list[Any]:
        """``obj`` of every rank, in rank order, on every rank (``[obj]`` in a single process)."""
        if not self.enabled:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)  # sync: a collective waits for every rank
        return out

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def to_dict(self) -> dict[str, Any]:
        return {"world_size": self.world_size, "backend": self.backend, "rank": self.rank,
                "timeout_s": self.timeout_s}


_CURRENT = DistContext()


def current() -> DistContext:
    """This process's context (set by :func:`init`; single process before that)."""
    return _CURRENT


def env_world_size() -> int:
    """``WORLD_SIZE`` as the launcher set it (1 when not launched distributed)."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        raise ConfigError(f"WORLD_SIZE={os.environ['WORLD_SIZE']!r} is not an integer: launch with "
                          "torchrun --nproc_per_node N, or unset it.") from None


def init(device: torch.device, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> DistContext:
    """Join the process group the launcher prepared (a no-op context when not launched so).

    Launched means ``RANK`` is set (torchrun, ``--nproc``), whatever ``WORLD_SIZE`` is; a plain
    ``python ...`` is one process with no group.

    Args:
        device: the training device type decides the backend; for CUDA the rank's device is
            ``cuda:LOCAL_RANK`` (returned via :func:`rank_device`).
        timeout_s: how long any collective may wait for the other ranks.

    Raises:
        ConfigError: a bad timeout, missing launcher variables, or more ranks on this node than
            CUDA devices.
    """
    global _CURRENT
    world = env_world_size()
    if world <= 1 and "RANK" not in os.environ:
        _CURRENT = DistContext()
        return _CURRENT
    problem = timeout_problem(timeout_s)
    if problem:
        raise ConfigError(problem)
    missing = [k for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
               if k not in os.environ]
    if missing:
        given = ", ".join(f"{k}={os.environ[k]}" for k in ("RANK", "WORLD_SIZE") if k in os.environ)
        raise ConfigError(f"a distributed launch was detected ({given}) but {', '.join(missing)} "
                          "is not set: start the job with torchrun (or looptune ... --nproc N), "
                          "which sets them all, or unset RANK/WORLD_SIZE for one process.")
    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    backend = "nccl" if device.type == "cuda" else "gloo"
    kwargs: dict[str, Any] = {}
    if backend == "nccl":
        count = torch.cuda.device_count()
        if local >= count:
            raise ConfigError(f"LOCAL_RANK={local} but this node has {count} CUDA device(s): "
                              f"launch at most {count} processes per node (--nproc_per_node).")
        torch.cuda.set_device(local)
        kwargs["device_id"] = torch.device("cuda", local)
    owns = not dist.is_initialized()
    if owns:
        dist.init_process_group(backend=backend, timeout=_dt.timedelta(seconds=timeout_s),
                                **kwargs)
    else:  # the caller's group (its backend and timeout) is used as it is, and left up
        backend, timeout_s = dist.get_backend(), None
    _CURRENT = DistContext(rank=rank, world_size=world, local_rank=local, backend=backend,
                           timeout_s=None if timeout_s is None else float(timeout_s),
                           owns_group=owns)
    return _CURRENT


MAX_TIMEOUT_S = 7 * 24 * 3600.0  # gloo/NCCL take a millisecond count: bound it to something sane


def timeout_problem(timeout_s: object, flag: str = "timeout_s") -> str | None:
    """Why ``timeout_s`` is not a usable process-group timeout, or None."""
    ok = (isinstance(timeout_s, (int, float)) and not isinstance(timeout_s, bool)
          and math.isfinite(timeout_s) and 0 < timeout_s <= MAX_TIMEOUT_S)
    if ok:
        return None
    return (f"{flag}={timeout_s!r} is invalid: must be a finite number of seconds in "
            f"(0, {MAX_TIMEOUT_S:g}], e.g. 300.")


def rank_device(device: torch.device, ctx: DistContext) -> torch.device:
    """The device this rank trains on: ``cuda:LOCAL_RANK`` for CUDA jobs, else ``device``."""
    if ctx.enabled and device.type == "cuda":
        return torch.device("cuda", ctx.local_rank)
    return device


def shutdown(*, ok: bool = True) -> None:
    """Leave the process group looptune created (idempotent; a caller's group stays up).

    ``ok``: the run finished normally on this rank, so every rank reaches this point: a barrier
    first, so no rank closes its connections while another still completes its last collective.
    After an error (``ok=False``) the other ranks may be inside a collective: no barrier (it would
    wait the whole timeout and replace the real error with a timeout).
    """
    global _CURRENT
    if dist.is_available() and dist.is_initialized() and _CURRENT.owns_group:
        if ok:
            dist.barrier()
        dist.destroy_process_group()
    _CURRENT = DistContext()


def _collective_device(ctx: DistContext) -> torch.device:
    return torch.device("cuda", ctx.local_rank) if ctx.backend == "nccl" else torch.device("cpu")
