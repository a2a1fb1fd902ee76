"""Inside the data wait: the links of the input chain, measured in an unmodified DataLoader.

While a ``with InputChainProbes():`` block is active:

* **fetch** and **collate**: torch's own dataset fetchers (``_MapDatasetFetcher`` and
  ``_IterableDatasetFetcher``, which every DataLoader uses, in its workers and in the main
  process) are wrapped: each batch's time in the dataset (``__getitem__``/``__getitems__``/
  ``__next__``) and in ``collate_fn``, wall and on-CPU (the fetching thread's CPU clock). The
  dataset and the collate function are not touched: the wrapper sits around torch's fetcher,
  and the fetcher's ``collate_fn`` attribute (torch's object, not the user's) is timed.
* **the fetching thread's kernel accounting** around each fetch, from ``/proc/thread-self``
  (descriptors opened once per process, read with ``pread``: ~6 us a batch; around one fetch in
  SAMPLE_EVERY while fetches are fast, scaled by the fetch time sampled): ``schedstat``'s time
  runnable but waiting for a CPU, and ``io``'s ``read_bytes`` (bytes the storage device
  delivered) and ``rchar`` (bytes read, page cache included); the rest of a fetch's wall time,
  neither on a CPU nor waiting for one, is blocked (storage, a lock, a sleep). And the worker
  process's CPU clock beyond its fetching thread: its other threads' work (the queue's feeder
  thread pickling batches for the main process).
* **transfer** on the main process: CPU time receiving and unpickling batches
  (``Connection.recv_bytes`` + ``ForkingPickler.loads``: the DataLoader's result queue, and the
  descriptors of tensors in shared memory), and in the pin-memory step
  (``torch.utils.data._utils.pin_memory.pin_memory``). CPU, not wall time: a receive also waits
  for the worker (a worker busy in Python holds its GIL for up to 5 ms before its thread that
  hands over a tensor's descriptor runs), and that wait is the worker's work, not the transfer's.

Every link is work per batch (seconds a thread ran, or was blocked in the dataset), wherever it
ran: workers run in parallel, so a link's share of the chain is its share of the work, not of the
wait; the largest is the cause.

Workers write their figures into a table of shared memory made before they fork (the table and
the wrapped fetchers reach them through ``fork``); a worker started another way (``spawn``,
``forkserver``) or before the block began (persistent workers of an earlier ``iter()``) is not
seen, and :meth:`InputChainProbes.window` says so. ``/proc`` is Linux's: elsewhere the split
that needs it (storage, the wait for a CPU) is reported as missing, with the reason.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from looptune.measure.records import ChainTotals

__all__ = ["FIELDS", "InputChainProbes", "proc_available"]

FIELDS = ("pid", "batches", "fetch_s", "fetch_cpu_s", "fetch_runq_s", "read_bytes", "rchar",
          "collate_s", "collate_cpu_s", "other_cpu_s", "first_other_cpu_s", "sampled_fetch_s")
(_BATCHES, _FETCH, _FETCH_CPU, _RUNQ, _READ, _RCHAR, _COLLATE, _COLLATE_CPU, _OTHER,
 _OTHER_FIRST, _SAMPLED) = range(1, len(FIELDS))
SLOTS = 256  # processes that can fetch during one diagnose (workers of every loader, the main)
# /proc is read around every fetch that took at least SAMPLE_ALL_S last time, else around one in
# SAMPLE_EVERY (two reads cost ~6 us: a fast in-memory fetch of ~300 us would pay 2%); the
# sampled waits and bytes are scaled by the fetch time they cover
SAMPLE_ALL_S = 0.0005
SAMPLE_EVERY = 16
# each process sums its figures in a plain list; a worker copies it to the shared table after
# each fetch (one slice write), the main process when it reads the table
_SCHEDSTAT = "/proc/thread-self/schedstat"
_IO = "/proc/thread-self/io"


def proc_available() -> bool:
    """Linux's per-thread accounting is readable here (not on macOS or Windows)."""
    return os.path.exists(_SCHEDSTAT) and os.path.exists(_IO)


class _Thread:
    """This thread's kernel accounting through descriptors opened once (``pread``: ~2 us)."""

    def __init__(self) -> None:
        try:
            self.sched = os.open(_SCHEDSTAT, os.O_RDONLY)
            self.io = os.open(_IO, os.O_RDONLY)
        except OSError:
            self.sched = self.io = -1

    def close(self) -> None:
        for fd in (self.sched, self.io):
            if fd >= 0:
                os.close(fd)
        self.sched = self.io = -1

    def read(self) -> tuple[float, float, float]:
        """(seconds runnable but waiting for a CPU, read_bytes, rchar); zeros without /proc."""
        if self.sched < 0:
            return 0.0, 0.0, 0.0
        try:
            wait_ns = int(os.pread(self.sched, 64, 0).split(b" ", 2)[1])
            io = os.pread(self.io, 256, 0)  # "rchar: N\nwchar: N\nsyscr: ...\nread_bytes: N\n..."
            at = io.index(b"read_bytes: ") + 12
            return (wait_ns / 1e9, float(io[at:io.index(b"\n", at)]),
                    float(io[7:io.index(b"\n")]))
        except (OSError, ValueError, IndexError):
            return 0.0, 0.0, 0.0


class InputChainProbes:
    """Installs the input-chain probes for the ``with`` block; :meth:`snapshot` reads the
    running totals (at the window's start and end; :meth:`totals` subtracts)."""

    def __init__(self) -> None:
        self._table = multiprocessing.RawArray("d", SLOTS * len(FIELDS))
        self._lock = multiprocessing.Lock()  # claims a slot; inherited by forked workers
        self._slot_pid = -1
        self._slot = -1
        self._thread: _Thread | None = None
        self._proc = proc_available()
        self._main_pid = os.getpid()
        self.receive_s = 0.0
        self.receives = 0
        self.pin_s = 0.0
        self.pins = 0
        self._restore: list[Callable[[], None]] = []
        self._local = threading.local()

    # -- install ---------------------------------------------------------------------------
    def __enter__(self) -> InputChainProbes:
        from multiprocessing.connection import _ConnectionBase
        from multiprocessing.reduction import ForkingPickler

        from torch.utils.data._utils import fetch, pin_memory

        for cls in (fetch._MapDatasetFetcher, fetch._IterableDatasetFetcher):
            self._wrap(cls, "fetch", self._timed_fetch)
        self._wrap(_ConnectionBase, "recv_bytes", self._receive_cpu(counted=False))
        self._wrap(ForkingPickler, "loads", self._receive_cpu(counted=True), static=True)
        self._wrap(pin_memory, "pin_memory", self._timed_pin)
        return self

    def __exit__(self, *exc: object) -> None:
        while self._restore:
            self._restore.pop()()
        if self._thread is not None and self._slot_pid == os.getpid():
            self._thread.close()
            self._thread, self._slot_pid = None, -1

    def _wrap(self, owner: Any, name: str, make: Callable[[Callable], Callable],
              static: bool = False) -> None:
        original = owner.__dict__[name]
        plain = original.__func__ if isinstance(original, staticmethod) else original
        wrapped = make(plain)
        setattr(owner, name, staticmethod(wrapped) if static else wrapped)
        self._restore.append(lambda: setattr(owner, name, original))

    # -- the worker side (and the main process with num_workers=0) ---------------------------
    def _claim(self) -> int:
        pid = os.getpid()
        if self._slot_pid == pid:
            return self._slot
        n = len(FIELDS)
        with self._lock:
            for slot in range(SLOTS):
                if self._table[slot * n] == 0:
                    self._table[slot * n] = pid
                    break
            else:
                slot = -1  # full: this process is not seen
        self._slot_pid, self._slot, self._thread = pid, slot, _Thread()
        self._fetches, self._last_fetch_s = 0, 0.0
        self._acc = [0.0] * len(FIELDS)  # this process's running sums (pid first)
        self._acc[0] = pid
        self._acc[_OTHER_FIRST] = time.process_time() - time.thread_time()
        return slot

    def _flush(self) -> None:
        """Copy this process's sums into its row of the shared table."""
        if self._slot >= 0 and self._slot_pid == os.getpid():
            n = len(FIELDS)
            self._table[self._slot * n:(self._slot + 1) * n] = self._acc

    def _timed_fetch(self, original: Callable) -> Callable:
        chain = self

        def fetch(fetcher, index):
            slot = chain._claim()
            if slot < 0:
                return original(fetcher, index)
            collate = fetcher.collate_fn
            if not isinstance(collate, _TimedCollate):
                fetcher.collate_fn = collate = _TimedCollate(collate)
            collate.wall = collate.cpu = 0.0
            thread = chain._thread
            chain._fetches += 1
            sample = (chain._last_fetch_s >= SAMPLE_ALL_S
                      or chain._fetches % SAMPLE_EVERY == 1)
            q0, r0, c0 = thread.read() if sample else (0.0, 0.0, 0.0)
            t0, cpu0 = time.perf_counter(), time.thread_time()
            batch = original(fetcher, index)  # StopIteration (an ended iterable) passes through
            wall, cpu = time.perf_counter() - t0, time.thread_time() - cpu0
            q1, r1, c1 = thread.read() if sample else (0.0, 0.0, 0.0)
            fetch_s = wall - collate.wall
            chain._last_fetch_s = fetch_s
            acc = chain._acc
            acc[_BATCHES] += 1
            acc[_FETCH] += fetch_s
            acc[_FETCH_CPU] += cpu - collate.cpu
            acc[_COLLATE] += collate.wall
            acc[_COLLATE_CPU] += collate.cpu
            if sample:
                acc[_RUNQ] += q1 - q0
                acc[_READ] += r1 - r0
                acc[_RCHAR] += c1 - c0
                acc[_SAMPLED] += fetch_s
            if chain._slot_pid != chain._main_pid:  # a worker: its other threads (the feeder)
                acc[_OTHER] = time.process_time() - time.thread_time()
                chain._flush()  # now: a worker may exit after any batch
            return batch

        return fetch

    # -- the main process's side -----------------------------------------------------------
    def _in_main(self) -> bool:
        return os.getpid() == self._main_pid and not getattr(self._local, "busy", False)

    def _receive_cpu(self, counted: bool) -> Callable[[Callable], Callable]:
        """A wrapper adding the main process's CPU in ``original`` to ``receive_s`` (and one to
        ``receives`` when ``counted``: one unpickle per batch). CPU: waiting for a worker (its
        GIL, its feeder thread) is not transfer work; the copies and the syscalls are."""
        chain = self

        def make(original: Callable) -> Callable:
            def timed(first, *args, **kwargs):
                if not chain._in_main():
                    return original(first, *args, **kwargs)
                t0 = time.thread_time()
                try:
                    return original(first, *args, **kwargs)
                finally:
                    chain.receive_s += time.thread_time() - t0
                    chain.receives += counted

            timed.__name__ = original.__name__
            return timed

        return make

    def _timed_pin(self, original: Callable) -> Callable:
        chain = self

        def pin_memory(data, *args, **kwargs):
            if not chain._in_main():
                return original(data, *args, **kwargs)
            chain._local.busy = True  # nested pin_memory calls (one per field) count once
            t0 = time.thread_time()
            try:
                return original(data, *args, **kwargs)
            finally:
                chain._local.busy = False
                chain.pin_s += time.thread_time() - t0
                chain.pins += 1

        return pin_memory

    # -- reading ---------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """The running totals per process (by pid), the main process's transfer figures and
        its threads' kernel accounting (every thread: the step's intra-op threads too)."""
        self._flush()  # the main process's own fetches (num_workers=0), up to now
        n = len(FIELDS)
        rows = {}
        for slot in range(SLOTS):
            row = self._table[slot * n:(slot + 1) * n]
            if row[0]:
                rows[int(row[0])] = dict(zip(FIELDS, row))
        return {"rows": rows, "receive_s": self.receive_s, "receives": self.receives,
                "pin_s": self.pin_s, "pins": self.pins,
                "threads": _thread_schedstat() if self._proc else {}}

    def totals(self, start: dict[str, Any], end: dict[str, Any]) -> ChainTotals:
        """What happened between two snapshots, summed over the processes that fetched (a
        process that started in between counts from its first batch)."""
        keys = ("batches", "fetch_s", "fetch_cpu_s", "fetch_runq_s", "read_bytes", "rchar",
                "collate_s", "collate_cpu_s", "sampled_fetch_s")
        sums = dict.fromkeys(keys, 0.0)
        workers, main_batches, other = 0, 0, 0.0
        for pid, row in end["rows"].items():
            before = start["rows"].get(pid)
            delta = {k: row[k] - (before[k] if before else 0.0) for k in keys}
            if delta["batches"] <= 0:
                continue
            # the sampled fetches' waits and bytes, scaled to all of this process's fetch time
            scale = (delta["fetch_s"] / delta["sampled_fetch_s"]
                     if delta["sampled_fetch_s"] > 0 else 0.0)
            for key in ("fetch_runq_s", "read_bytes", "rchar"):
                delta[key] *= scale
            for key in keys:
                sums[key] += delta[key]
            if pid == self._main_pid:
                main_batches += int(delta["batches"])
            else:  # the main process's other threads are the training step's, not the chain's
                workers += 1
                other += row["other_cpu_s"] - (before["other_cpu_s"] if before
                                               else row["first_other_cpu_s"])
        common = set(start["threads"]) & set(end["threads"])  # threads alive at both reads
        return ChainTotals(
            batches=int(sums["batches"]), workers=workers, main_batches=main_batches,
            fetch_s=sums["fetch_s"], fetch_cpu_s=sums["fetch_cpu_s"],
            fetch_runq_s=sums["fetch_runq_s"], read_bytes=sums["read_bytes"],
            rchar=sums["rchar"], collate_s=sums["collate_s"],
            collate_cpu_s=sums["collate_cpu_s"], other_cpu_s=max(0.0, other),
            receive_s=end["receive_s"] - start["receive_s"],
            receives=end["receives"] - start["receives"], pin_s=end["pin_s"] - start["pin_s"],
            pins=end["pins"] - start["pins"],
            main_run_s=sum(end["threads"][t][0] - start["threads"][t][0] for t in common),
            main_runq_s=sum(end["threads"][t][1] - start["threads"][t][1] for t in common),
            proc=self._proc)


def _thread_schedstat() -> dict[str, tuple[float, float]]:
    """Per thread of this process: (seconds on a CPU, seconds waiting for one)."""
    out = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                run, wait = f.read().split()[:2]
            out[tid] = (int(run) / 1e9, int(wait) / 1e9)
        except (OSError, ValueError):
            continue  # a thread that ended meanwhile
    return out


class _TimedCollate:
    """torch's fetcher's ``collate_fn``, timed (wall and the thread's CPU) per batch."""

    def __init__(self, fn: Callable) -> None:
        self.fn = fn
        self.wall = 0.0
        self.cpu = 0.0

    def __call__(self, data):
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return self.fn(data)
        finally:
            self.wall += time.perf_counter() - t0
            self.cpu += time.thread_time() - c0
