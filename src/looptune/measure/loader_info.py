"""What diagnose records about each DataLoader the script iterates: its settings, the bytes of
one batch, the batches per pass, and whether its per-sample transform is random."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader

from looptune.measure.records import LoaderInfo

__all__ = ["batches_per_pass", "loader_info", "loader_parts"]


def batches_per_pass(loader: Any) -> int:
    """Batches one pass over ``loader`` yields; 1 for a stream (an IterableDataset has no len:
    DataLoader.__len__ raises TypeError for it)."""
    try:
        return len(loader)
    except TypeError:
        return 1


def loader_info(loader: DataLoader) -> LoaderInfo:
    workers = loader.num_workers
    batch_bytes, random = _first_sample(loader)
    return LoaderInfo(batch_size=_batch_size(loader), num_workers=workers,
                      pin_memory=bool(loader.pin_memory),
                      prefetch_factor=loader.prefetch_factor if workers > 0 else None,
                      persistent_workers=bool(loader.persistent_workers),
                      dataset=type(_user_dataset(loader)).__name__, batch_bytes=batch_bytes,
                      random_per_sample=random, samples=_samples(loader.dataset))


def _samples(dataset: Any) -> int | None:
    try:
        return len(dataset)
    except TypeError:  # a stream (IterableDataset) has no length
        return None


def loader_parts(loader: DataLoader) -> dict[str, Any]:
    """What a one-worker copy of ``loader`` needs (recorded when the script iterates it; not the
    loader itself, whose persistent workers must not outlive the script)."""
    return {"dataset": loader.dataset, "batch_size": loader.batch_size,
            "num_workers": loader.num_workers,
            "batch_sampler": loader.batch_sampler, "sampler": loader.sampler,
            "drop_last": loader.drop_last, "collate_fn": loader.collate_fn,
            "worker_init_fn": loader.worker_init_fn,
            "multiprocessing_context": loader.multiprocessing_context}


def _user_dataset(loader: DataLoader) -> object:
    """The loader's dataset, seen through looptune's own sample-tracing wrapper."""
    ds = loader.dataset  # data.faults.Traced names what it wraps (measure sits below data)
    return getattr(ds, "traced_dataset", ds)


def _batch_size(loader: DataLoader) -> int | None:
    """The loader's batch size, also when a wrapper batches through its own batch_sampler
    (Accelerate's DataLoaderShard has batch_size None and a BatchSamplerShard that knows it)."""
    if loader.batch_size is not None:
        return loader.batch_size
    size = getattr(getattr(loader, "batch_sampler", None), "batch_size", None)
    return size if isinstance(size, int) and not isinstance(size, bool) else None


def _first_sample(loader: DataLoader) -> tuple[int | None, bool | None]:
    """Bytes of one batch, estimated from one sample x batch size (no batch is drawn twice), and
    whether ``dataset[0]`` read twice differs: a random per-sample transform (augmentation).

    The RNG states are restored afterwards: a random augmentation in ``__getitem__`` must not
    shift the script's random stream (the probes must not change its results).
    """
    from looptune._rng import rng_state, set_rng_state

    saved = rng_state()
    try:
        sample = loader.dataset[0]
        again = loader.dataset[0]  # the RNG has moved on: a random transform draws anew
    except Exception:  # iterable datasets, or __getitem__ that needs more: unknown
        return None, None
    finally:
        set_rng_state(saved)
    size = _tensor_bytes(sample)
    batch = _batch_size(loader)
    batch_bytes = None if size == 0 or batch is None else size * batch
    return batch_bytes, _differs(sample, again)


def _differs(a: Any, b: Any) -> bool | None:
    """Whether two samples' tensors differ (None when they hold no tensor to compare)."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape != b.shape or not torch.equal(a, b)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        found = [_differs(x, y) for x, y in zip(a, b)]
    elif isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys():
        found = [_differs(a[k], b[k]) for k in a]
    else:
        return None
    known = [f for f in found if f is not None]
    return any(known) if known else None


def _tensor_bytes(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(o) for o in obj)
    if isinstance(obj, dict):
        return sum(_tensor_bytes(o) for o in obj.values())
    return 0
