"""A DataLoader that says which sample broke it, and which worker.

torch reports a dataset exception as "Caught ValueError in DataLoader worker process 1", a
killed worker as "DataLoader worker (pid 4242) is killed by signal" and a hung one as
"DataLoader timed out after 30 seconds": none names the sample. :class:`Traced` wraps the
dataset the engine's DataLoader reads: each worker writes the index it is reading into a small
shared-memory table before calling the user's ``__getitem__`` (and clears it after), and turns an
exception into a :class:`SampleError` naming the index and the worker. :func:`guarded` wraps the
epoch's iterator and turns those failures into one :class:`~looptune.errors.DataError` with the
sample, the worker, what happened and the fix. The table costs two int64 stores per item.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import Dataset, get_worker_info

from looptune.errors import DataError
from looptune.errors import SampleError  # raised here; defined with the others

__all__ = ["WORKER_GONE", "SampleError", "Traced", "batch_nbytes", "guarded", "shm_problem",
           "traced", "worker_failure"]

# what reading a batch from a worker that died raises before torch names the dead worker
WORKER_GONE = (RuntimeError, EOFError, ConnectionError)
SHM = "/dev/shm"  # where DataLoader workers hand batches to the training process (Linux)


def _describe(index: Any) -> str:
    if isinstance(index, torch.Tensor) and index.ndim > 0:  # a whole batch read at once
        shown = index[:8].tolist()
        return f"the batch of samples {shown}{' ...' if len(index) > 8 else ''}"
    return f"sample {int(index) if isinstance(index, torch.Tensor) else index}"


def _first(index: Any) -> int:
    if isinstance(index, torch.Tensor):
        return int(index.reshape(-1)[0]) if index.numel() else -1
    return int(index) if isinstance(index, int) else -1


class Traced(Dataset):
    """``dataset`` with the index each worker is reading in shared memory (``slots[worker] =
    (index, pid)``, ``-1`` when idle) and exceptions re-raised as :class:`SampleError`."""

    def __init__(self, dataset: Any, num_workers: int) -> None:
        self.dataset = dataset
        self.slots = torch.full((max(num_workers, 1), 2), -1, dtype=torch.int64).share_memory_()
        self._view = None  # a numpy view of the slots per process: ~100 ns stores, not ~2 us

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_view": None}

    @property
    def traced_dataset(self) -> Any:
        """The user's dataset (what ``measure.loader_info`` describes, seen through the wrapper)."""
        return self.dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: Any) -> Any:
        return self._read(index, self.dataset.__getitem__, _first(index), _describe(index))

    def _read(self, index: Any, read: Any, first: int, what: str) -> Any:
        if self._view is None:
            self._view = self.slots.numpy()
        info = get_worker_info()
        row = info.id if info is not None else 0
        self._view[row, 0], self._view[row, 1] = first, os.getpid()
        try:
            item = read(index)
        except Exception as err:
            where = f"worker {info.id}, pid {os.getpid()}" if info else "the training process"
            raise SampleError(f"{what} ({where}): {type(err).__name__}: {err}") from err
        self._view[row, 0] = -1
        return item


class _TracedBatched(Traced):
    """A dataset with ``__getitems__`` (the DataLoader reads a batch's samples in one call)."""

    def __getitems__(self, indices: list[Any]) -> Any:
        shown = list(indices[:8])
        what = f"the batch of samples {shown}{' ...' if len(indices) > 8 else ''}"
        return self._read(indices, self.dataset.__getitems__,
                          _first(indices[0]) if len(indices) else -1, what)


def traced(dataset: Any, num_workers: int) -> Traced:
    """``dataset`` wrapped in :class:`Traced`, keeping its batched ``__getitems__`` if it has one."""
    return (_TracedBatched if hasattr(dataset, "__getitems__") else Traced)(dataset, num_workers)


_PID = re.compile(r"pid\(?s?\)? ?(\d+)")


def _in_flight(traced: Traced, pids: set[int]) -> str:
    rows = [(w, int(i), int(p)) for w, (i, p) in enumerate(traced.slots.tolist()) if i >= 0]
    if pids:
        rows = [r for r in rows if r[2] in pids] or rows
    return "; ".join(f"worker {w} (pid {p}) was reading sample {i}" for w, i, p in rows)


def _stop_workers(batches: Iterator[Any], loader: Any) -> None:
    """Shut the failed iterator's workers down now (a hung one is terminated), not when the
    exception's traceback, which references the iterator, is freed; persistent ones too."""
    shutdown = getattr(batches, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()
    if getattr(loader, "_iterator", None) is batches:
        loader._iterator = None  # persistent_workers: the next epoch starts fresh ones


def guarded(loader: Any, batches: Iterator[Any]) -> Iterator[Any]:
    """Yield ``loader``'s batches from its iterator ``batches``; a dataset exception ends the
    epoch with a DataError naming the sample and the worker, the workers stopped first."""
    try:
        yield from batches
    except SampleError as err:
        _stop_workers(batches, loader)
        raise _sample_error(err) from err


def worker_failure(err: BaseException, loader: Any, batches: Iterator[Any] | None
                   ) -> DataError | None:
    """``err`` as a DataError naming the dead or hung worker and the sample it was reading, its
    workers stopped; None when ``err`` is not a worker failure. torch raises a dead worker's
    RuntimeError from its SIGCHLD handler, wherever the training process is at that moment (in
    the step, not only in ``next()``), or the pipe breaks first (EOFError, ConnectionError): the
    training loop asks here for any of :data:`WORKER_GONE`."""
    try:
        return _name_failure(err, loader, batches)
    except RuntimeError as late:  # torch's SIGCHLD handler raised while this one was being named
        if "DataLoader worker" not in str(late):
            raise
        return _name_failure(late, loader, batches)


def _name_failure(err: BaseException, loader: Any, batches: Iterator[Any] | None
                  ) -> DataError | None:
    traced = loader.dataset if isinstance(loader.dataset, Traced) else None
    named = None
    if isinstance(err, RuntimeError):
        named = _worker_error(err, traced)
    elif isinstance(err, WORKER_GONE) and traced is not None:
        # the batch's shared memory came from a worker that died first: the pipe gives EOF
        # before torch's SIGCHLD handler raises its RuntimeError
        dead = _dead_workers(getattr(batches, "_workers", []))
        if dead:
            codes = ", ".join(f"pid {w.pid} exit code {w.exitcode}" for w in dead)
            named = _worker_error(RuntimeError(
                f"DataLoader worker ({codes}) died ({type(err).__name__} reading its batch)"), traced)
    if named is not None and batches is not None:
        _stop_workers(batches, loader)
    return named


def _dead_workers(workers: list[Any], wait_s: float = 3.0) -> list[Any]:
    """The workers that exited with an error. A worker's pipe breaks while the kernel tears the
    process down, a moment before it can be reaped: wait up to ``wait_s`` for one to be."""
    deadline = time.monotonic() + wait_s
    while True:
        dead = [w for w in workers if w.exitcode not in (None, 0)]
        if dead or not workers or time.monotonic() >= deadline:
            return dead
        time.sleep(0.01)


def _sample_error(err: SampleError) -> DataError:
    """The user's exception, from the SampleError (in a worker: inside torch's "Caught ..." text)."""
    text = str(err).strip().splitlines()
    detail = next((ln.split("SampleError: ", 1)[1] for ln in reversed(text)
                   if "SampleError: " in ln), text[-1] if text else "")
    return DataError(f"the dataset's __getitem__ failed on {detail}. Fix the dataset code for "
                     "that sample (or skip bad samples in __getitem__); run with num_workers=0 "
                     "to debug it in one process.")


def _worker_error(err: RuntimeError, traced: Traced | None) -> DataError | None:
    """A dead or timed-out worker, named with the sample it was reading; None: another error."""
    text = str(err)
    if traced is None or ("DataLoader worker" not in text and "timed out" not in text):
        return None
    pids = {int(p) for p in _PID.findall(text)}
    seen = _in_flight(traced, pids) or "no worker was inside __getitem__"
    hung = "timed out" in text
    fix = ("a sample that takes longer than the loader timeout (an endless loop, a stuck read): "
           "fix it, or raise timeout_s" if hung else
           "the worker process was killed (out of memory? a crash in native code? a SIGKILL?): "
           "check `dmesg` and the sample, or use fewer workers")
    return DataError(f"DataLoader {'timed out' if hung else 'worker died'}: {seen}. Seen: "
                     f"{text.strip().splitlines()[0]} Likely cause: {fix}.")


def _shm_free_bytes(path: str = SHM) -> int | None:
    try:
        st = os.statvfs(path)
    except (OSError, AttributeError):  # no /dev/shm (macOS, Windows): nothing to check
        return None
    return st.f_bavail * st.f_frsize


def batch_nbytes(item: Any, number: int = 8) -> int:
    """Bytes of the tensors in a sample or batch (nested tuples, lists, dicts); a Python number
    counts ``number`` bytes (8: it becomes a 0-d int64/float64 tensor in a collated batch)."""
    if isinstance(item, torch.Tensor):
        return item.numel() * item.element_size()
    if isinstance(item, dict):
        return sum(batch_nbytes(v, number) for v in item.values())
    if isinstance(item, (list, tuple)):
        return sum(batch_nbytes(v, number) for v in item)
    return number


def shm_problem(loader: Any, *, batch_size: int, num_workers: int,
                prefetch_factor: int | None) -> str | None:
    """Why ``loader``'s workers cannot fit their in-flight batches in /dev/shm (or None): the
    bytes of one batch (one item's tensors x the batch size) x workers x prefetch_factor against
    the free space, checked before training (a full /dev/shm kills a worker with SIGBUS)."""
    if num_workers < 1:
        return None
    free = _shm_free_bytes()
    if free is None:
        return None
    try:
        first = loader.dataset[next(iter(loader.sampler))] if loader.batch_size is None else (
            loader.dataset[0])
    except Exception:  # the epoch will raise it with the sample named; nothing to estimate here
        return None
    per_batch = batch_nbytes(first) * (1 if loader.batch_size is None else batch_size)
    prefetch = prefetch_factor or 2
    need = per_batch * num_workers * prefetch
    if need <= free:
        return None
    mib = 1 << 20
    fit = max(free // max(per_batch * prefetch, 1), 0)
    return (f"{num_workers} DataLoader workers x prefetch_factor {prefetch} x {per_batch / mib:.1f}"
            f" MiB per batch = {need / mib:.0f} MiB in flight, but {SHM} has {free / mib:.0f} MiB "
            f"free: a worker would die with a bus error mid-epoch. Use num_workers <= {fit}, a "
            "smaller prefetch_factor or batch_size, or a larger /dev/shm (docker run "
            "--shm-size=2g). torch.multiprocessing.set_sharing_strategy('file_system') changes "
            "how batches are handed over (files instead of descriptors), not where: they still "
            "live in /dev/shm, so it does not help here.")
