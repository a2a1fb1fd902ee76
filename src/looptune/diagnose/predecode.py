"""``--verify`` of the pre-decode remedy: the script's dataset read once into tensors, batches
gathered by index, the script itself unchanged.

In the rerun every DataLoader over a map-style dataset is built over :class:`PreDecoded`
instead: when the DataLoader is constructed (before the first step, so off the measured steps)
every sample is read once through the script's own ``__getitem__`` and stacked into one input
and one target tensor (:func:`looptune.data.user.tensorize`); each batch is then one
``index_select`` per tensor (``__getitems__``), with no per-sample Python and no collate. A
dataset is read once per rerun, also when the script builds a DataLoader every epoch.

Refused, with the reason kept for the report (the rerun then runs the script as it is):
an IterableDataset (nothing to index), a custom ``collate_fn`` (it may do more than stack),
samples that are not ``(input, target)`` pairs of fixed shape, and a dataset that would take
more than ``BUDGET_S`` to read or ``MAX_BYTES`` to hold (estimated from its first samples).
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch.utils.data import Dataset, IterableDataset
from torch.utils.data._utils.collate import default_collate

from looptune.data.loaders import ImageData
from looptune.data.user import tensorize
from looptune.errors import ConfigError

__all__ = ["BUDGET_S", "MAX_BYTES", "PREDECODE", "PreDecoded", "gather_seconds", "predecoded",
           "refused"]

PREDECODE = "looptune_predecode"  # the override key --verify passes for this remedy
BUDGET_S = 20.0  # the most reading the whole dataset once may take (estimated first)
MAX_BYTES = 4 * 2**30  # the most the decoded dataset may hold
_PROBE = 16  # samples read to estimate the time and bytes of all of them

refused: list[str] = []  # why a dataset was not pre-decoded in the current rerun
_cache: dict[int, tuple[Any, PreDecoded]] = {}  # id(dataset) -> (dataset, its pre-decoded copy)


class PreDecoded(Dataset):
    """A dataset's samples as two tensors; ``__getitems__`` gathers a whole batch by index."""

    def __init__(self, data: ImageData, source: str) -> None:
        self.data, self.source = data, source

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.data.images[i], self.data.labels[i]

    def __getitems__(self, indices: list[int]) -> list[torch.Tensor]:
        return list(self.data.gather(torch.as_tensor(indices, dtype=torch.long)))


def gathered(batch: Any) -> Any:
    """The collate function over :class:`PreDecoded`: its batches are already gathered."""
    return batch


def reset() -> None:
    """Before a rerun: no reasons, no copies."""
    refused.clear()
    _cache.clear()


def release() -> None:
    """After a rerun: the pre-decoded copies (up to MAX_BYTES) go; the reasons stay."""
    _cache.clear()


def predecoded(named: dict[str, Any]) -> dict[str, Any]:
    """DataLoader keyword arguments with the dataset pre-decoded; unchanged (and the reason in
    :data:`refused`) when it cannot be."""
    ds = named.get("dataset")
    name = type(ds).__name__
    if id(ds) in _cache and _cache[id(ds)][0] is ds:
        pre = _cache[id(ds)][1]
    else:
        problem = _problem(ds, named)
        if problem:
            refused.append(f"{name}: {problem}")
            return named
        try:
            pre = PreDecoded(tensorize(ds), name)
        except ConfigError as err:
            refused.append(f"{name}: {err}")
            return named
        _cache[id(ds)] = (ds, pre)
    return {**named, "dataset": pre, "collate_fn": gathered}


def _problem(ds: Any, named: dict[str, Any]) -> str | None:
    if isinstance(ds, IterableDataset) or not (hasattr(ds, "__len__")
                                               and hasattr(ds, "__getitem__")):
        return "a stream (IterableDataset) has no index to gather by"
    if named.get("collate_fn") not in (None, default_collate):
        return "it has its own collate_fn, which may do more than stack samples"
    n = len(ds)
    if n == 0:
        return "it is empty"
    k = min(n, _PROBE)
    t0 = time.perf_counter()
    sample_bytes = sum(_bytes(ds[i]) for i in range(k)) / k
    seconds = (time.perf_counter() - t0) / k * n
    if seconds > BUDGET_S:
        return (f"reading its {n} samples once would take ~{seconds:.0f} s (more than "
                f"{BUDGET_S:.0f} s for a rerun)")
    if sample_bytes * n > MAX_BYTES:
        return (f"its {n} samples would hold ~{sample_bytes * n / 2**30:.1f} GiB decoded (more "
                f"than {MAX_BYTES / 2**30:.0f} GiB)")
    return None


def _bytes(sample: Any) -> int:
    if isinstance(sample, torch.Tensor):
        return sample.numel() * sample.element_size()
    if isinstance(sample, dict):
        return sum(_bytes(v) for v in sample.values())
    if isinstance(sample, (tuple, list)):
        return sum(_bytes(v) for v in sample)
    nbytes = getattr(sample, "nbytes", None)  # numpy arrays
    return int(nbytes) if isinstance(nbytes, int) else 8


GATHER_BYTES = 256 * 2**20  # the most the gather measurement allocates


def gather_seconds(*, batch_bytes: int | None, batch_size: int | None, samples: int | None,
                   rounds: int = 30) -> float | None:
    """Seconds per batch a shuffled DataLoader over a :class:`PreDecoded` dataset like the
    script's takes: rows of ``batch_bytes / batch_size`` bytes, ``samples`` of them (at most
    GATHER_BYTES), the median of ``rounds`` batches; what the pre-decode remedy leaves of the
    data wait (the sampler's indices, the gather, the DataLoader's own per-batch work)."""
    from torch.utils.data import DataLoader

    if not (batch_bytes and batch_size and batch_size > 0):
        return None
    row = max(1, -(-batch_bytes // (4 * batch_size)))  # float32 elements per sample
    n = max(4 * batch_size, min(samples or 0, GATHER_BYTES // (4 * row)))
    data = ImageData(images=torch.zeros(n, row), labels=torch.zeros(n, dtype=torch.long))
    loader = DataLoader(PreDecoded(data, "synthetic"), batch_size=batch_size, shuffle=True,
                        collate_fn=gathered, generator=torch.Generator().manual_seed(0))
    times: list[float] = []
    while len(times) < rounds:
        batches = iter(loader)
        next(batches)  # the first batch of an epoch: the sampler's permutation
        for _ in range(min(rounds - len(times), len(loader) - 1)):
            t0 = time.perf_counter()
            next(batches)
            times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]
