"""Samples -> fields: what a packable sample is, and reading a dataset's samples in order.

A sample is a tensor, numpy array or python number (bool/int/float), or a tuple, list or dict
(string keys) of them. Each field keeps the dtype of sample 0; its shape too, unless the storage
allows variable shapes (``lmdb``), where only the number of dimensions must stay the same.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from looptune.data.pack.format import FieldSpec, StructureKind, le_dtype_str
from looptune.errors import DataError

__all__ = ["Fields", "check_same", "flatten", "iter_samples", "merge_shapes", "specs_of"]

Fields = list[tuple[str, np.ndarray]]  # (field name, value) in field order


def flatten(sample: Any, index: int) -> tuple[StructureKind, Fields]:
    """A sample as its structure kind and one array per field; DataError names a bad field."""
    if isinstance(sample, dict):
        for k in sample:
            if not isinstance(k, str):
                raise DataError(f"sample {index}: dict key {k!r} is a {type(k).__name__}; packed "
                                "dicts need string keys. Convert the keys with str().")
        return "dict", [(k, _to_array(v, k, index)) for k, v in sample.items()]
    if isinstance(sample, (tuple, list)):
        kind: StructureKind = "tuple" if isinstance(sample, tuple) else "list"
        return kind, [(str(i), _to_array(v, str(i), index)) for i, v in enumerate(sample)]
    return "single", [("0", _to_array(sample, "0", index))]


def _to_array(value: Any, name: str, index: int) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        try:
            arr = value.resolve_conj().resolve_neg().numpy()
        except TypeError:  # e.g. bfloat16 has no numpy dtype
            raise DataError(f"sample {index}, field {name!r}: tensor dtype {value.dtype} cannot be "
                            "packed (numpy has no such dtype). Convert it first, e.g. "
                            ".to(torch.float32).") from None
    elif isinstance(value, (np.ndarray, np.generic)):
        arr = np.asarray(value)
    elif isinstance(value, (bool, numbers.Integral)) and not isinstance(value, np.generic):
        arr = np.asarray(value, dtype=np.bool_ if isinstance(value, bool) else np.int64)
    elif isinstance(value, numbers.Real):
        arr = np.asarray(value, dtype=np.float64)
    else:
        raise DataError(f"sample {index}, field {name!r}: type {type(value).__name__} cannot be "
                        "packed. Allowed: torch tensors, numpy arrays, bool/int/float, and tuples, "
                        "lists or dicts of them (not nested). Convert it in the dataset.")
    if arr.dtype.kind not in "biufc":
        raise DataError(f"sample {index}, field {name!r}: dtype {arr.dtype} cannot be packed; "
                        "allowed: bool, integer, float, complex. Convert it in the dataset.")
    return arr


def specs_of(arrays: Fields) -> list[FieldSpec]:
    """The field specs sample 0 implies (its shapes and little-endian dtypes)."""
    return [FieldSpec(name, le_dtype_str(a.dtype), tuple(a.shape)) for name, a in arrays]


def check_same(index: int, kind0: str, specs: list[FieldSpec], kind: str, arrays: Fields, *,
               variable_shapes: bool) -> None:
    """Raise DataError unless sample ``index`` has sample 0's structure, dtypes and shapes (only
    its number of dimensions with ``variable_shapes``)."""
    names = [s.name for s in specs]
    if kind != kind0 or [n for n, _ in arrays] != names:
        raise DataError(f"sample {index}: structure {kind} with fields {[n for n, _ in arrays]} "
                        f"differs from sample 0 ({kind0} with fields {names}). Every sample must "
                        "have the same structure.")
    for spec, (name, a) in zip(specs, arrays):
        dtype = le_dtype_str(a.dtype)
        if dtype != spec.dtype:
            raise DataError(f"sample {index}, field {name!r}: dtype {dtype}, expected dtype "
                            f"{spec.dtype} (as sample 0). Cast it in the dataset.")
        if variable_shapes and a.ndim != len(spec.shape):
            raise DataError(f"sample {index}, field {name!r}: {a.ndim} dimensions {tuple(a.shape)}, "
                            f"expected {len(spec.shape)} (as sample 0). With format='lmdb' sizes "
                            "may vary but the number of dimensions may not: reshape in the dataset.")
        if not variable_shapes and tuple(a.shape) != spec.shape:
            raise DataError(f"sample {index}, field {name!r}: shape {tuple(a.shape)} dtype "
                            f"{dtype}, expected shape {spec.shape} dtype {spec.dtype} (as sample "
                            "0). Pad/crop in the dataset, or pack with format='lmdb', which "
                            "allows variable shapes.")


def merge_shapes(specs: list[FieldSpec], arrays: Fields) -> list[FieldSpec]:
    """Specs whose dimensions that differ from ``arrays`` become None (variable)."""
    out = []
    for s, (_, a) in zip(specs, arrays):
        shape = tuple(None if d != e else d for d, e in zip(s.shape, a.shape))
        out.append(s if shape == s.shape else FieldSpec(s.name, s.dtype, shape))
    return out


def iter_samples(dataset: Any, n: int, workers: int) -> Iterator[tuple[int, Any]]:
    """``(i, dataset[i])`` for i in 0..n-1, in order; read by ``workers`` processes when > 0.

    With workers, a torch DataLoader (sequential sampler, order kept) runs ``dataset[i]`` in
    worker processes, so a slow per-sample decode runs in parallel while this process writes.
    """
    if workers == 0:
        for i in range(n):
            yield i, dataset[i]
        return
    from torch.utils.data import DataLoader

    chunk = 64  # samples per worker task: amortizes the inter-process hand-over
    loader = DataLoader(_Indexed(dataset), batch_size=chunk, num_workers=workers,
                        collate_fn=_as_list, prefetch_factor=4)
    it = iter(loader)
    try:
        for items in it:
            yield from items
    finally:  # a failure (here or in a worker) must not leave the workers running until gc
        shutdown = getattr(it, "_shutdown_workers", None)  # torch's own clean stop
        if shutdown is not None:
            shutdown()


class _Indexed:
    """``ds[i] -> (i, sample)``: keeps the index beside the sample through the workers."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> tuple[int, Any]:
        return i, _numpy_tree(self.dataset[i])


def _numpy_tree(value: Any) -> Any:
    """Tensors as numpy arrays: they cross the worker pipe pickled in one piece, where torch would
    give every small tensor its own shared-memory segment (~10x slower for small samples)."""
    if isinstance(value, torch.Tensor) and value.dtype != torch.bfloat16:
        return value.detach().cpu().resolve_conj().resolve_neg().numpy()
    if isinstance(value, dict):
        return {k: _numpy_tree(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        items = [_numpy_tree(v) for v in value]
        return items if isinstance(value, list) else tuple(items)  # namedtuples pack as tuples
    return value


def _as_list(items: list) -> list:
    return items
