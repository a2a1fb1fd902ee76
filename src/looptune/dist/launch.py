"""Launch N ranks of a looptune command on this machine with torch's elastic agent (what
``torchrun --standalone --nproc_per_node N`` runs), and turn a failed rank into one clear error.

The agent gives every worker ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``MASTER_ADDR``/``MASTER_PORT``,
watches them, and when one exits non-zero stops all the others (SIGTERM, then SIGKILL after
``shutdown_timeout_s``): no orphan processes. ``python -m looptune`` records uncaught exceptions
with ``torch.distributed.elastic.multiprocessing.errors.record``, so the error names the rank and
its exception, or its exit code / signal.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Sequence

from looptune.errors import ConfigError
from looptune.errors import LaunchFailed  # raised here; defined with the others

__all__ = ["LaunchFailed", "launch", "nproc_problem", "threads_per_rank"]


def nproc_problem(nproc: object, flag: str = "--nproc") -> str | None:
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        return (f"{flag} {nproc!r} is invalid: must be an integer >= 1 (processes on this "
                "machine; one per GPU on CUDA).")
    return None


def launch(args: Sequence[str], *, nproc: int, shutdown_timeout_s: int = 5,
           monitor_interval_s: float = 0.1) -> None:
    """Run ``python -m looptune ARGS`` as ``nproc`` ranks and wait for all of them.

    Raises:
        ConfigError: bad ``nproc``.
        LaunchFailed: a rank failed (the others were stopped); names the ranks and reasons.
    """
    problem = nproc_problem(nproc)
    if problem:
        raise ConfigError(problem)
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc,
                          run_id=f"looptune-{uuid.uuid4().hex[:12]}", rdzv_backend="c10d",
                          rdzv_endpoint="localhost:0", max_restarts=0,
                          monitor_interval=monitor_interval_s, start_method="spawn",
                          shutdown_timeout=shutdown_timeout_s)
    saved = os.environ.get("OMP_NUM_THREADS")
    if saved is None:  # as torchrun does, but sharing the cores out instead of 1 thread each
        os.environ["OMP_NUM_THREADS"] = str(threads_per_rank(nproc))
    try:
        elastic_launch(config, sys.executable)("-m", "looptune", *args)
    except ChildFailedError as err:
        reasons = {rank: _reason(f) for rank, f in sorted(err.failures.items())}
        first_rank, first = err.get_first_failure()
        lines = [f"rank {rank}: {text}" for rank, text in reasons.items()]
        raise LaunchFailed(f"rank {first_rank} failed first ({_reason(first)}); the job was "
                           f"stopped. Every failed rank: {'; '.join(lines)}", reasons) from None
    finally:
        if saved is None:
            os.environ.pop("OMP_NUM_THREADS", None)


def threads_per_rank(nproc: int) -> int:
    """CPU threads each rank may use: this machine's cores shared out (at least 1), so N ranks do
    not oversubscribe the cores (OMP_NUM_THREADS, unless the user set it)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // nproc)


def _reason(failure) -> str:
    """One line: the recorded exception, else the signal or exit code."""
    code = failure.exitcode
    how = (f"killed by signal {failure.signal_name()}" if code is not None and code < 0
           else f"exit code {code}")
    message = failure.message
    if isinstance(message, dict):  # torch's record() writes {"message": "...", "extraInfo": ...}
        message = message.get("message", "")
    message = message if isinstance(message, str) else ""
    if message and not message.startswith("To enable traceback") and "Signal" not in message:
        text = " ".join(message.split())  # a multi-line error on one line
        return f"{how}: {text[:400]}{'...' if len(text) > 400 else ''}"
    return f"{how} (pid {failure.pid})"
