"""Measure the gain of a packed dataset: samples/s of the original dataset against the packed one,
through the same DataLoader settings (batch size, workers, shuffled order), in one run.

Three ways are timed, interleaved, median over repeats:

* ``original``: ``DataLoader(original, batch_size=B, shuffle, num_workers=K)``, the user's way;
* ``packed, per sample``: the same DataLoader over the packed dataset (``ds[i]`` then collate);
* ``packed, whole batches``: ``DataLoader(packed, sampler=BatchSampler(...), batch_size=None)``:
  each worker reads a whole batch with one ``get_batch`` call (vectorized memmap reads).

The first ``warmup`` batches of every pass (worker start-up, first page faults) are not timed.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler

from looptune.data.faults import batch_nbytes
from looptune.errors import ConfigError

__all__ = ["LoadRate", "PackBench", "bench_pack", "bench_records"]


@dataclass(frozen=True, kw_only=True)
class LoadRate:
    name: str  # "original", "packed, per sample", "packed, whole batches"
    how: str  # the loader, in words
    samples: int  # samples timed per pass
    seconds: list[float]  # one per repeat
    bytes_per_batch: float  # mean bytes of the tensors of one batch
    samples_per_batch: int

    @property
    def median_s(self) -> float:
        return statistics.median(self.seconds)

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.median_s

    @property
    def bytes_per_s(self) -> float:
        return self.bytes_per_batch * (self.samples / self.samples_per_batch) / self.median_s


@dataclass(frozen=True, kw_only=True)
class PackBench:
    packed: str
    storage: str
    batch_size: int
    workers: int
    batches: int
    repeats: int
    rates: list[LoadRate]
    provenance: dict[str, Any] = field(default_factory=dict)

    def speedup(self, name: str) -> float | None:
        """``name``'s samples/s over the original's (None without an original)."""
        base = next((r for r in self.rates if r.name == "original"), None)
        rate = next(r for r in self.rates if r.name == name)
        return None if base is None else rate.samples_per_s / base.samples_per_s

    def to_dict(self) -> dict[str, Any]:
        rows = []
        for r in self.rates:
            rows.append({**asdict(r), "median_s": r.median_s, "samples_per_s": r.samples_per_s,
                         "bytes_per_s": r.bytes_per_s, "speedup": self.speedup(r.name)})
        return {"kind": "pack-bench", "schema": 1, "packed": self.packed, "storage": self.storage,
                "batch_size": self.batch_size, "workers": self.workers, "batches": self.batches,
                "repeats": self.repeats, "rates": rows, "provenance": self.provenance}


def bench_pack(packed: Any, original: Any = None, *, batch_size: int = 256, workers: int = 0,
               batches: int = 50, repeats: int = 3, warmup: int = 2, seed: int = 0,
               cold: bool = False) -> PackBench:
    """Time reading ``batches`` shuffled batches from ``original`` and from ``packed``.

    Args:
        packed: a path to a packed folder, or an opened ``PackedDataset``.
        original: the dataset it was packed from (None: time the packed dataset only).
        batch_size, workers: the loader settings every way uses.
        batches: batches timed per pass (fewer if the dataset is smaller).
        repeats: passes per way, interleaved; the median is reported.
        warmup: untimed batches at the start of every pass.
        cold: also time every way with its files dropped from the page cache before each pass
            (``posix_fadvise(DONTNEED)``: the original's ``files()``, the packed shards), as
            "NAME (cold)": reads from storage, as when the data is larger than the page cache.

    Raises:
        ConfigError: every bad argument at once, before anything is read.
    """
    from looptune.data.pack.reader import PackedDataset, open_packed
    from looptune.measure.provenance import provenance

    _check(batch_size, workers, batches, repeats, warmup)
    ds = packed if isinstance(packed, PackedDataset) else open_packed(packed)
    ways = _original_way(original, len(ds), "the packed one")
    ways.append(("packed, per sample", "the same DataLoader over the packed dataset", ds, False))
    ways.append(("packed, whole batches",
                 "DataLoader(packed, sampler=BatchSampler(...), batch_size=None): get_batch",
                 ds, True))
    steps = min(batches, len(ds) // batch_size - warmup)
    if steps < 1:
        raise ConfigError(f"the packed dataset has {len(ds)} samples: too few for {warmup} untimed "
                          f"+ 1 timed batch of batch_size={batch_size}. Use a batch size <= "
                          f"{max(1, len(ds) // (warmup + 1))}.")
    rates = _measure(ways, original, steps, batch_size, workers, repeats, warmup, seed, cold)
    return PackBench(packed=str(ds.path), storage=ds.storage, batch_size=batch_size, workers=workers, batches=steps, repeats=repeats, rates=rates,
                     provenance=provenance(torch.device("cpu")))


def bench_records(folder: Any, original: Any = None, *, size: int, batch_size: int = 256,
                  workers: int = 0, batches: int = 50, repeats: int = 3, warmup: int = 2,
                  seed: int = 0, cold: bool = False, shuffle_buffer: int = 1000) -> PackBench:
    """:func:`bench_pack` for a TFRecord or WebDataset folder (:mod:`looptune.data.pack.records`):
    every way decodes each sample's bytes and resizes it to ``size`` (the original's per-sample
    work, from the shards' bytes instead of one file each), read two ways: by index through the
    same shuffled DataLoader as the original (``FORMAT, random access``), and streamed (``FORMAT,
    streamed``: shards read in order, each worker a contiguous share, a ``shuffle_buffer`` of
    samples), as the formats are meant to be read."""
    from looptune.data.jpeg import DecodeResize
    from looptune.data.pack.records import RecordDataset, RecordStream
    from looptune.measure.provenance import provenance

    _check(batch_size, workers, batches, repeats, warmup)
    decode = DecodeResize(size)
    ds = RecordDataset(folder, decode)
    stream = RecordStream(folder, decode, shuffle_buffer=shuffle_buffer, seed=seed)
    ways = _original_way(original, len(ds), str(folder))
    ways.append((f"{ds.format}, random access", "the same DataLoader: one record read by index "
                 "(pread) a sample", ds, False))
    ways.append((f"{ds.format}, streamed", f"DataLoader(IterableDataset): shards read in order, "
                 f"a contiguous share a worker, shuffle buffer {shuffle_buffer}", stream, False))
    shares = max(1, workers)  # the stream's: each worker makes whole batches of its own share
    steps = min(batches, shares * (len(ds) // shares // batch_size) - warmup)
    if steps < 1:
        raise ConfigError(f"{folder} has {len(ds)} samples: too few for {warmup} untimed + 1 timed "
                          f"batch of batch_size={batch_size} from each of {max(1, workers)} "
                          "stream share(s). Use a smaller batch size.")
    rates = _measure(ways, original, steps, batch_size, workers, repeats, warmup, seed, cold)
    return PackBench(packed=str(ds.path), storage=ds.format, batch_size=batch_size,
                     workers=workers, batches=steps, repeats=repeats, rates=rates,
                     provenance=provenance(torch.device("cpu")))


def _original_way(original: Any, n: int, packed: str) -> list:
    """The ``original`` way to time (none without one), once it has the packed data's ``n``
    samples: a different count is another dataset, refused before anything is timed."""
    if original is None:
        return []
    if len(original) != n:
        raise ConfigError(f"the original dataset has {len(original)} samples, {packed} {n}: "
                          "they are not the same data. Pack it again (looptune pack "
                          "--overwrite) or pass the dataset it was packed from.")
    return [("original", "DataLoader(dataset, shuffle) + default collate", original, False)]


def _measure(ways: list, original: Any, steps: int, batch_size: int, workers: int, repeats: int,
             warmup: int, seed: int, cold: bool) -> list[LoadRate]:
    if cold:
        if original is not None and not callable(getattr(original, "files", None)):
            raise ConfigError("cold=True needs the original dataset's files() (the paths it "
                              "reads, to drop from the page cache); this one has none")
        ways += [(f"{name} (cold)", f"{how}; page cache dropped first", data, batched)
                 for name, how, data, batched in ways]
    seconds: dict[str, list[float]] = {name: [] for name, *_ in ways}
    sizes: dict[str, float] = {}
    for rep in range(repeats):
        for name, _, data, batched in ways:
            if name.endswith(" (cold)"):
                _drop(data)
            loader = _loader(data, batch_size, workers, batched, seed + rep)
            s, nbytes = _time(loader, steps, warmup)
            del loader
            seconds[name].append(s)
            sizes[name] = nbytes
    return [LoadRate(name=name, how=how, samples=steps * batch_size, seconds=seconds[name],
                     bytes_per_batch=sizes[name], samples_per_batch=batch_size)
            for name, how, *_ in ways]


def _drop(data: Any) -> None:
    """Drop a way's files from the page cache: a packed dataset's shards, else its files()."""
    from looptune._io import drop_page_cache

    path = getattr(data, "path", None)
    if path is not None:
        data.release()  # mapped pages cannot be dropped: unmap the shards first
    files = (sorted(p for p in path.rglob("*") if p.is_file()) if path is not None
             else data.files())
    drop_page_cache(files)


def _check(batch_size: Any, workers: Any, batches: Any, repeats: Any, warmup: Any) -> None:
    problems = []
    for name, value, low in (("batch_size", batch_size, 1), ("workers", workers, 0),
                             ("batches", batches, 1), ("repeats", repeats, 1),
                             ("warmup", warmup, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            problems.append(f"{name}={value!r} is invalid: must be an int >= {low}.")
    if problems:
        raise ConfigError(problems)


def _loader(data: Any, batch_size: int, workers: int, batched: bool, seed: int) -> DataLoader:
    gen = torch.Generator().manual_seed(seed)
    extra = {"persistent_workers": False, "prefetch_factor": 2} if workers else {}
    if isinstance(data, IterableDataset):  # a stream shuffles itself, by (seed, epoch)
        data.set_epoch(seed)
        return DataLoader(data, batch_size=batch_size, drop_last=True, num_workers=workers,
                          **extra)
    if batched:
        sampler = BatchSampler(RandomSampler(data, generator=gen), batch_size, drop_last=True)
        return DataLoader(data, sampler=sampler, batch_size=None, num_workers=workers, **extra)
    return DataLoader(data, batch_size=batch_size, sampler=RandomSampler(data, generator=gen),
                      drop_last=True, num_workers=workers, **extra)


def _time(loader: DataLoader, steps: int, warmup: int) -> tuple[float, float]:
    it = iter(loader)
    for _ in range(warmup):
        next(it, None)
    nbytes = 0
    t0 = time.perf_counter()
    for _ in range(steps):
        batch = next(it)
        nbytes += _nbytes(batch)
    elapsed = time.perf_counter() - t0
    del it  # shuts the workers down before the next way starts
    return elapsed, nbytes / steps


def _nbytes(batch: Any) -> int:
    return batch_nbytes(batch, number=0)  # bytes read: a Python number carries none

