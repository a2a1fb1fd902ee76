"""How fast one DataLoader worker delivers the script's batches: measured, not assumed.

The workers remedy divides the time one worker needs per batch by the worker count. That time is
not the main process's data wait: a worker also pickles each batch into shared memory, the main
process unpickles it, and on a VM the worker's vCPU may run slower than the main process's (seen
on a 2-core VM: 9.2-10.1 ms per batch from one worker against 6.5-9.4 ms in the main process, so
a bound built on the main process's read promised 1.09-1.43x and the rerun measured 0.71-1.21x).

So after the script stopped, inside its environment (cwd, sys.path), the training loader's own
dataset, batch sampler and collate function are read by a one-worker DataLoader while the main
process only takes the batches: the seconds per batch in steady state (after the worker's
start-up and first batch), and the main process's cost to take a batch the worker already has
ready (the part of the worker path the step itself pays). The global random generators are
restored afterwards; the worker is shut down before this returns.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from looptune.measure.records import WorkerRead

__all__ = ["BUDGET_S", "measure_worker_read"]

BUDGET_S = 1.0  # seconds of steady-state reading (a slow dataset gets fewer batches)
MIN_BATCHES, MAX_BATCHES = 3, 200
RECEIVES = 5  # batches taken after letting the worker fill its queue
START_TIMEOUT_S = 60.0  # a worker that delivers nothing in this long: not measured


def _one_worker(parts: dict[str, Any], timeout_s: float) -> DataLoader:
    return _copy(parts, {"num_workers": 1, "prefetch_factor": 2, "timeout": timeout_s,
                         "worker_init_fn": parts["worker_init_fn"],
                         "multiprocessing_context": parts["multiprocessing_context"]})


def _copy(parts: dict[str, Any], settings: dict[str, Any]) -> DataLoader:
    common = {"collate_fn": parts["collate_fn"], **settings}
    ds = parts["dataset"]
    if isinstance(ds, IterableDataset):
        return DataLoader(ds, batch_size=parts["batch_size"], drop_last=parts["drop_last"],
                          **common)
    if parts["batch_sampler"] is not None:
        return DataLoader(ds, batch_sampler=parts["batch_sampler"], **common)
    return DataLoader(ds, batch_size=None, sampler=parts["sampler"], **common)


def measure_worker_read(parts: dict[str, Any] | None, *, budget_s: float = BUDGET_S,
                        start_timeout_s: float = START_TIMEOUT_S,
                        in_process: bool = False) -> WorkerRead:
    """Time one worker reading the loader described by ``parts``
    (:func:`looptune.measure.loader_info.loader_parts`); ``in_process``: also the main process
    reading it alone (``main_s``; for a script that used workers, where no data wait shows it)."""
    if parts is None:
        return WorkerRead(note="no DataLoader was iterated")
    from looptune._rng import rng_state, set_rng_state

    state = rng_state()  # the sampler's shuffle draws from the global generator ...
    own = _generators(parts)  # ... or from the script's own, which a watched block reuses
    saved = [g.get_state() for g in own]
    it = None
    try:
        it = iter(_one_worker(parts, start_timeout_s))
        t0 = time.perf_counter()
        next(it)  # the worker's start-up, its first batch
        start = time.perf_counter() - t0
        n, t0 = 0, time.perf_counter()
        while n < MAX_BATCHES and (n < MIN_BATCHES or time.perf_counter() - t0 < budget_s):
            next(it)
            n += 1
        batch_s = (time.perf_counter() - t0) / n
        received = []
        for _ in range(RECEIVES):  # the worker fills its queue (2 batches) while this sleeps
            time.sleep(min(2.5 * batch_s, 0.5))
            t1 = time.perf_counter()
            next(it)
            received.append(time.perf_counter() - t1)
        it._shutdown_workers()
        it = None
        main = _in_process(parts, budget_s / 2) if in_process else None
        return WorkerRead(batch_s=batch_s, receive_s=statistics.median(received), batches=n,
                          start_s=start, main_s=main)
    except StopIteration:
        return WorkerRead(note="the loader has too few batches to time one worker "
                               f"(at least {MIN_BATCHES + RECEIVES + 1} needed)")
    except Exception as err:  # noqa: BLE001 - a dataset that can't be read by a worker: say so
        first = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
        return WorkerRead(note=f"reading it with one worker failed ({type(err).__name__}: {first})")
    finally:
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()
        set_rng_state(state)
        for g, g_state in zip(own, saved):
            g.set_state(g_state)


def _in_process(parts: dict[str, Any], budget_s: float) -> float | None:
    """Seconds per batch the main process needs to read the loader itself (num_workers=0);
    None when it cannot (a dataset that needs its worker_init_fn, too few batches)."""
    try:
        batches = iter(_copy(parts, {"num_workers": 0}))
        next(batches)  # first-call costs (file handles, caches)
        n, t0 = 0, time.perf_counter()
        while n < MIN_BATCHES or (n < MAX_BATCHES and time.perf_counter() - t0 < budget_s):
            next(batches)
            n += 1
    except Exception:  # noqa: BLE001 - then only the worker counts are measured
        return None
    return (time.perf_counter() - t0) / n


def _generators(parts: dict[str, Any]) -> list[torch.Generator]:
    """The torch.Generators the loader's samplers draw from (not the global one)."""
    samplers = [parts["sampler"], getattr(parts["batch_sampler"], "sampler", None)]
    out: list[torch.Generator] = []
    for sampler in samplers:
        g = getattr(sampler, "generator", None)
        if isinstance(g, torch.Generator) and all(g is not h for h in out):
            out.append(g)
    return out
