"""The ``prefetch`` loader strategy: a background thread readies the next batches during the step.

The batches and their order are exactly those of the ``tensorized`` and ``device`` strategies
(:func:`~looptune.data.order.epoch_permutation`, last partial batch kept unless ``drop_last``):
only *when* and *where* each batch is prepared changes.

* CPU: the producer thread gathers the next ``depth`` uint8 batches (``index_select`` releases the
  GIL, so the gather runs while the training thread computes the step).
* CUDA: the producer gathers into a ring of ``depth + 1`` host buffers (pinned when
  ``cfg.pin_memory``), copies each batch to the device on a side ``torch.cuda.Stream`` and records
  an event; the training thread makes its current stream wait on that event (no host sync) and
  marks the device tensors with ``record_stream`` so the caching allocator cannot reuse them early.
* Other devices (mps, xpu, ...): no side-stream support here, so the thread gathers on the host and
  the copy runs in the training thread when the batch is handed over.

Every path crosses the bus with uint8 (4x fewer bytes than float32); normalization runs on the
training device in :meth:`PrefetchSource.to_device`.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from looptune.data.batches import BatchedData, ImageData, prepare_batch
from looptune.data.order import (batch_indices, epoch_batches, rank_num_batches,
                                 rank_samples_per_epoch)
from looptune.errors import ConfigError
from looptune.recipe import LoaderConfig

__all__ = ["PrefetchSource", "DEFAULT_DEPTH", "THREAD_NAME"]

Batch = tuple[torch.Tensor, torch.Tensor]

DEFAULT_DEPTH = 2  # batches kept ready when cfg.prefetch_factor is None (as torch's DataLoader)
THREAD_NAME = "looptune-prefetch"  # producer threads' name: visible in py-spy, profilers, tests
_POLL_S = 0.05  # blocked puts/gets re-check the stop flag this often: bounds shutdown latency
_JOIN_TIMEOUT_S = 5.0  # longest wait for a producer to finish its current batch when stopped


@dataclass(frozen=True)
class _Staged:
    """A batch the producer finished: already on the device, ``copied`` set on the CUDA path."""

    x: torch.Tensor
    y: torch.Tensor
    copied: Any = None  # torch.cuda.Event recorded on the side stream after the H2D copies


@dataclass(frozen=True)
class _Failure:
    """An exception raised in the producer thread, carried to the training thread."""

    exc: BaseException
    batch: int  # index in the epoch of the batch being prepared


_DONE = object()  # end-of-epoch marker put after the last batch


class PrefetchSource:
    """The ``prefetch`` strategy: a daemon thread prepares the next ``depth`` batches.

    ``epoch(e)`` yields batches *already on the training device* (uint8 images, int64 labels);
    :meth:`to_device` then only normalizes. Batches and order are bit-identical to the
    ``tensorized`` and ``device`` strategies for the same seed.

    Args:
        cfg: resolved loader settings: ``batch_size``, ``drop_last``, ``prefetch_factor`` (queue
            depth, ``None`` = 2), ``pin_memory`` and ``non_blocking`` (CUDA path only; pinned
            memory on other devices is silently unused: the resolve step records why).
        data: the training images (uint8, N x H x W, in host memory) and labels.
        device: the training device.
        seed: shuffle seed; epoch ``e`` uses ``epoch_permutation(len(data), seed=seed, epoch=e)``.

    Raises:
        ConfigError: ``prefetch_factor`` is not an integer >= 1, or ``device`` is CUDA but this
            torch build has no usable CUDA.

    Example:
        >>> source = PrefetchSource(cfg, data, device=torch.device("cpu"), seed=0)
        >>> for x, y in source.epoch(0):
        ...     x, y = source.to_device(x, y)
    """

    def __init__(self, cfg: LoaderConfig, data: ImageData | BatchedData, *,
                 device: torch.device, seed: int, rank: int = 0, world: int = 1) -> None:
        self.depth = _check_depth(cfg.prefetch_factor)
        self.cfg, self.seed, self.mean, self.std = cfg, seed, data.mean, data.std
        self.augment = getattr(data, "augment", None)
        self.rank, self.world = rank, world
        self.device = _resolve_device(torch.device(device))
        self.data = data  # stays in host memory (tensors, or a packed dataset read per batch)
        self.n = len(data)
        self.samples_per_epoch = rank_samples_per_epoch(self.n, cfg, world)
        self._active: _Producer | None = None

    def __len__(self) -> int:
        return rank_num_batches(self.n, self.cfg.batch_size, self.cfg.drop_last,
                                        self.world)

    def epoch(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        """The batches of ``epoch`` from batch ``start``, already on the training device.

        Shuts down the producer of an earlier, unfinished ``epoch()`` iterator first; that
        iterator then raises ``RuntimeError`` if resumed. The thread starts at the first
        ``next()``; breaking out of the loop, ``close()`` or garbage collection of the iterator
        stop it.

        Args:
            epoch: epoch number; selects the shuffle order.
            start: first batch to produce (a resumed epoch skips what it already trained).

        Returns:
            An iterator of ``(x_uint8, y)`` batches on ``self.device``.

        Raises:
            Exception: whatever the producer thread raised, re-raised here with its traceback.
        """
        self.close()  # a live earlier iterator would keep a thread and device batches alive
        return self._iterate(epoch, start)

    def batch_indices(self, epoch: int, i: int) -> torch.Tensor:
        """The dataset indices in batch ``i`` of ``epoch``."""
        return batch_indices(self.n, self.cfg.batch_size, seed=self.seed, epoch=epoch, i=i,
                                     drop_last=self.cfg.drop_last, rank=self.rank,
                                     world=self.world)

    def to_device(self, x: torch.Tensor, y: torch.Tensor) -> Batch:
        """Normalize a batch from :meth:`epoch` (already on the device) to float32.

        Args:
            x: uint8 images yielded by :meth:`epoch`.
            y: labels yielded by :meth:`epoch`.

        Returns:
            ``(normalized float32 images, labels)``.
        """
        return prepare_batch(x, self.mean, self.std, self.augment), y

    def close(self) -> None:
        """Stop the active producer thread, if any (idempotent)."""
        if self._active is not None:
            self._active.close()
            self._active = None

    def _iterate(self, epoch: int, start: int) -> Iterator[Batch]:
        producer = self._start(epoch, start)
        try:
            while (staged := producer.get()) is not _DONE:
                yield self._hand_over(staged)
        finally:  # normal end, break, close() or garbage collection: stop the thread now
            producer.close()
            if self._active is producer:
                self._active = None

    def _start(self, epoch: int, start: int) -> _Producer:
        self.close()  # another iterator may have started since epoch() returned this one
        batches = epoch_batches(self.n, self.cfg.batch_size, seed=self.seed, epoch=epoch,
                                        drop_last=self.cfg.drop_last, rank=self.rank,
                                        world=self.world)[start:]
        stage = self._stager()
        self._active = _Producer(lambda i: stage(i, batches[i]), len(batches), self.depth,
                                 context=stage.context, epoch=epoch, first=start)
        return self._active

    def _stager(self) -> _HostStager | _CudaStager:
        if _side_stream_path(self.device):
            pin = self.cfg.pin_memory  # pageable when off: correct, only the copy is slower
            return _CudaStager(self.data, slots=self.depth + 1, device=self.device,
                               batch_size=self.cfg.batch_size, pin=pin,
                               non_blocking=self.cfg.non_blocking)
        return _HostStager(self.data)

    def _hand_over(self, staged: _Staged) -> Batch:
        """Make a staged batch safe to use on the training thread's current stream."""
        if staged.copied is not None:
            stream = torch.cuda.current_stream(self.device)
            stream.wait_event(staged.copied)  # no host sync: later kernels on `stream` wait
            # allocated on the side stream: without this, freeing them lets the allocator hand the
            # memory to the side stream while the step's kernels may still read it
            staged.x.record_stream(stream)
            staged.y.record_stream(stream)
            return staged.x, staged.y
        if staged.x.device.type != self.device.type:  # other devices: copy in this thread
            return staged.x.to(self.device), staged.y.to(self.device)
        return staged.x, staged.y


def _check_depth(prefetch_factor: int | None) -> int:
    depth = DEFAULT_DEPTH if prefetch_factor is None else prefetch_factor
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise ConfigError(f"prefetch_factor={prefetch_factor!r} is invalid for "
                          "strategy='prefetch': must be an integer >= 1 (batches kept ready) or "
                          f"None (= {DEFAULT_DEPTH}). Use e.g. prefetch_factor=2.")
    return depth


def _resolve_device(device: torch.device) -> torch.device:
    """Pin ``cuda`` to an index now: the current device is per thread, the producer has its own."""
    if device.type != "cuda":
        return device
    if not torch.cuda.is_available():
        raise ConfigError(f"device={str(device)!r} but torch {torch.__version__} has no usable "
                          "CUDA: strategy='prefetch' cannot stage batches there. Use device='cpu' "
                          "or install a CUDA build of torch.")
    return device if device.index is not None else torch.device("cuda", torch.cuda.current_device())


def _side_stream_path(device: torch.device) -> bool:
    """Whether batches go through pinned buffers and a side CUDA stream (tests patch this)."""
    return device.type == "cuda"


def _gather(data: ImageData | BatchedData, index: torch.Tensor,
            out: Batch | None = None) -> Batch:
    """Rows ``index`` of inputs and targets; into the leading rows of ``out`` buffers when given."""
    return data.gather(index, out)


class _HostStager:
    """CPU (and non-CUDA) path: the producer thread only gathers, into fresh host tensors."""

    def __init__(self, data: ImageData | BatchedData) -> None:
        self.data = data

    def __call__(self, i: int, index: torch.Tensor) -> _Staged:
        # fresh tensors, not a ring: the training loop may keep a yielded batch indefinitely
        return _Staged(*_gather(self.data, index))

    def context(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()


class _CudaStager:
    """CUDA path: gather into a ring of host buffers, copy on a side stream, record an event."""

    def __init__(self, data: ImageData | BatchedData, *, slots: int,
                 device: torch.device, batch_size: int, pin: bool, non_blocking: bool) -> None:
        self.data, self.device = data, device
        self.non_blocking = non_blocking
        self.stream = torch.cuda.Stream(device=device)
        # allocated once per epoch, not per batch: page-locking is costly (and the host caching
        # allocator reuses freed pinned blocks across epochs, after their in-flight copies)
        x_shape, x_dtype, y_shape, y_dtype = data.layout()
        self.ring = [(torch.empty((batch_size, *x_shape), dtype=x_dtype, pin_memory=pin),
                      torch.empty((batch_size, *y_shape), dtype=y_dtype, pin_memory=pin))
                     for _ in range(slots)]
        self.copied: list[Any] = [None] * slots  # per slot: event after its latest H2D copy

    def context(self) -> contextlib.AbstractContextManager:
        """Entered by the producer thread: device and stream are per-thread CUDA state."""
        stack = contextlib.ExitStack()
        stack.enter_context(torch.cuda.device(self.device))
        stack.enter_context(torch.cuda.stream(self.stream))
        return stack

    def __call__(self, i: int, index: torch.Tensor) -> _Staged:
        slot = i % len(self.ring)
        if self.copied[slot] is not None:
            # sync: the producer thread (not the training thread) waits until the slot's previous
            # copy has read the buffer; with depth + 1 slots it has almost always finished
            self.copied[slot].synchronize()
        x_host, y_host = _gather(self.data, index, out=self.ring[slot])
        # on self.stream (entered by the thread). sync: with non_blocking=False each copy waits
        # for the side stream, but in the producer thread only; the training thread never blocks
        # copy=True: a yielded batch must never alias the ring (a no-op on CUDA, which always
        # copies across devices; it keeps the invariant when tests fake the device)
        x = x_host.to(self.device, non_blocking=self.non_blocking, copy=True)
        y = y_host.to(self.device, non_blocking=self.non_blocking, copy=True)
        copied = torch.cuda.Event()
        copied.record(self.stream)
        self.copied[slot] = copied
        return _Staged(x, y, copied)


class _Producer:
    """One epoch's daemon thread filling a bounded queue; stops promptly when asked."""

    def __init__(self, prepare: Callable[[int], _Staged], count: int, depth: int, *,
                 context: Callable[[], contextlib.AbstractContextManager], epoch: int,
                 first: int = 0) -> None:
        self.queue: queue.Queue = queue.Queue(maxsize=depth)  # bounded: at most depth batches ahead
        self.stop = threading.Event()
        self.epoch, self.first = epoch, first  # first: the epoch's batch index of item 0
        self.thread = threading.Thread(target=self._run, args=(prepare, count, context),
                                       name=THREAD_NAME, daemon=True)  # never blocks exit
        self.thread.start()

    def _run(self, prepare: Callable[[int], _Staged], count: int, context) -> None:
        i = 0
        try:
            with context():
                for i in range(count):
                    if not self._put(prepare(i)):
                        return
            self._put(_DONE)
        except BaseException as exc:  # noqa: BLE001 - handed to the training thread, not hidden
            self._put(_Failure(exc, self.first + i))  # the batch's index in the epoch

    def _put(self, item: object) -> bool:
        """Put, re-checking the stop flag while the queue is full; False once stopped."""
        while not self.stop.is_set():
            try:
                self.queue.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def get(self) -> Any:
        """The next item: a :class:`_Staged` batch or ``_DONE``; re-raises producer exceptions.

        Raises:
            RuntimeError: this producer was stopped (superseded) or its thread died silently.
        """
        while True:
            if self.stop.is_set():
                raise RuntimeError(
                    f"the batch iterator of epoch {self.epoch} was shut down (a newer epoch() call "
                    "on the same PrefetchSource, or close()) and then asked for its next batch. "
                    "Finish or close one epoch's iterator before starting the next.")
            try:
                item = self.queue.get(timeout=_POLL_S)
            except queue.Empty:
                if self.thread.is_alive() or not self.queue.empty():
                    continue
                raise RuntimeError(f"the {THREAD_NAME} thread of epoch {self.epoch} ended "
                                   "without a result; this is a bug in looptune.") from None
            return self._unwrap(item)

    def _unwrap(self, item: object) -> Any:
        if not isinstance(item, _Failure):
            return item
        note = (f"raised in the {THREAD_NAME} producer thread while preparing batch {item.batch} "
                f"of epoch {self.epoch}")
        if hasattr(item.exc, "add_note"):  # Python >= 3.11
            item.exc.add_note(note)
        raise item.exc  # same type, and its traceback still holds the producer's frames

    def close(self) -> None:
        """Stop the thread and drop its queued batches (idempotent; never joins itself)."""
        self.stop.set()
        self._drain()  # frees a producer blocked on a full queue, and device memory
        if self.thread is not threading.current_thread():
            self.thread.join(_JOIN_TIMEOUT_S)
            if self.thread.is_alive():
                warnings.warn(f"{THREAD_NAME} thread of epoch {self.epoch} did not stop within "
                              f"{_JOIN_TIMEOUT_S:.0f} s (stuck preparing a batch); it is a daemon "
                              "and exits with the process.", RuntimeWarning, stacklevel=2)
        self._drain()  # a put that was in flight during the first drain

    def _drain(self) -> None:
        with contextlib.suppress(queue.Empty):
            while True:
                self.queue.get_nowait()
