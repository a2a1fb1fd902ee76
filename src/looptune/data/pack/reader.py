"""Read a packed dataset folder (see :mod:`looptune.data.pack.format`) as a map-style Dataset."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from looptune.data.pack.format import Header, ShardSpec, file_sha256, read_header
from looptune.errors import DataError

__all__ = ["PackedDataset", "open_packed", "verify_packed"]


def open_packed(path: str | os.PathLike, *, verify: bool = False) -> PackedDataset:
    """Open a packed folder written by :func:`looptune.data.pack.pack`.

    Checks the header and every shard's size and place (cheap: a shard must be a file inside the
    folder, a link pointing elsewhere is refused). ``verify=True`` also recomputes every shard's
    SHA-256 before returning (reads every byte once: use it on data that came from elsewhere);
    :func:`verify_packed` does the same and lists the problems instead of raising.

    Raises:
        DataError: missing/corrupt header, unsupported format version, missing, wrong-size or
            (with ``verify``) tampered shard, or a shard outside the folder.

    Example:
        >>> ds = open_packed("train.pack")  # doctest: +SKIP
        >>> x, y = ds[0]; xb, yb = ds.get_batch([0, 5, 7])  # doctest: +SKIP
    """
    if verify:
        problems = verify_packed(path)
        if problems:
            raise DataError(f"packed dataset {str(path)!r} failed verification: "
                            + "; ".join(problems))
    return PackedDataset(path)


class PackedDataset(Dataset):
    """Map-style dataset over a packed folder.

    ``ds[i]`` rebuilds the original structure (tuple, list, dict or a single value) with CPU torch
    tensors; python numbers come back as 0-d tensors (bool -> torch.bool, int -> torch.int64,
    float -> torch.float64). ``get_batch(indices)`` returns the same structure with a leading batch
    dimension, read with one vectorized memmap gather per shard.

    Shard memmaps are opened lazily and never pickled: a copy sent to a DataLoader worker reopens
    them there.

    ``ds[[i, j, ...]]`` (a list, array or 1-d tensor) is ``get_batch``: with
    ``DataLoader(ds, sampler=BatchSampler(...), batch_size=None)`` each worker reads whole batches
    with vectorized memmap gathers instead of collating single samples.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.header: Header = read_header(self.path)
        problems = [p for s in self.header.shards if (p := _size_problem(self.path, s))]
        if problems:
            raise DataError(f"packed dataset {str(self.path)!r} is damaged: " + "; ".join(problems)
                            + ". Re-pack it (looptune.pack(..., overwrite=True)).")
        self._shards = {f.name: self.header.shards_of(f.name) for f in self.header.fields}
        self._firsts = {name: np.array([s.first for s in shards], dtype=np.int64)
                        for name, shards in self._shards.items()}
        self._maps: dict[str, np.ndarray] = {}
        self._lmdb = None
        if self.header.storage == "lmdb":
            from looptune.data.pack.lmdb_store import (
                LmdbStore,  # only lmdb datasets need lmdb
            )

            self._lmdb = LmdbStore(self.path, self.header)

    @property
    def storage(self) -> str:
        """``"memmap"`` or ``"lmdb"``."""
        return self.header.storage

    def __len__(self) -> int:
        return self.header.num_samples

    def release(self) -> None:
        """Unmap the shards (memmaps, LMDB environments; reopened on the next read). A mapped
        page stays in the page cache whatever is asked of the kernel: release first, then drop
        the files (a cold read)."""
        import gc

        self._maps = {}
        if self._lmdb is not None:
            self._lmdb.release()
        gc.collect()  # the memmaps' last references: their mappings go now

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_maps"] = {}  # memmaps hold file handles: each process opens its own
        return state

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, (list, tuple, np.ndarray, torch.Tensor)) and np.ndim(index) > 0:
            return self.get_batch(index)  # a BatchSampler's index list: one vectorized read
        i = self._check_index(index)
        if self._lmdb is not None:
            ((_, arrays),) = self._lmdb.read(np.array([i], dtype=np.int64))
            return self._rebuild([torch.from_numpy(_to_native(a)) for a in arrays])
        values = []
        for f in self.header.fields:
            shards = self._shards[f.name]
            k = 0 if len(shards) == 1 else int(np.searchsorted(self._firsts[f.name], i, "right") - 1)
            row = self._map(shards[k], f.dtype, f.shape)[i - shards[k].first]
            values.append(torch.from_numpy(np.array(row, dtype=_native(f.dtype))))
        return self._rebuild(values)

    def get_batch(self, indices: Sequence[int] | np.ndarray | torch.Tensor) -> Any:
        """The samples at ``indices`` stacked along a new first dimension (same structure as ds[i]).

        memmap: one vectorized gather per field and shard (``np.take`` on the memmap). lmdb: one
        read transaction per shard; a field whose shape varies comes back as a list of tensors.
        """
        idx = np.asarray(indices.cpu() if isinstance(indices, torch.Tensor) else indices)
        idx = idx.astype(np.int64).reshape(-1) if idx.size else np.zeros(0, dtype=np.int64)
        n = len(self)
        if idx.size and (idx.min() < -n or idx.max() >= n):
            bad = idx[(idx < -n) | (idx >= n)][0]
            raise IndexError(f"index {int(bad)} is out of range for a packed dataset of {n} samples")
        idx = np.where(idx < 0, idx + n, idx)
        if self._lmdb is not None:
            return self._rebuild(self._lmdb_batch(idx))
        values = []
        for f in self.header.fields:
            out = np.empty((idx.size, *f.shape), dtype=_native(f.dtype))
            shards = self._shards[f.name]
            if len(shards) == 1:  # the common case: one gather straight into the batch
                np.take(self._map(shards[0], f.dtype, f.shape), idx, axis=0, out=out)
            else:
                which = np.searchsorted(self._firsts[f.name], idx, side="right") - 1
                for k in np.unique(which):
                    shard = shards[int(k)]
                    mask = which == k
                    out[mask] = self._map(shard, f.dtype, f.shape)[idx[mask] - shard.first]
            values.append(torch.from_numpy(out))
        return self._rebuild(values)

    def _lmdb_batch(self, idx: np.ndarray) -> list[Any]:
        fields = self.header.fields
        outs: list[Any] = [np.empty((idx.size, *f.shape), dtype=_native(f.dtype)) if f.fixed
                           else [None] * idx.size for f in fields]
        for pos, arrays in self._lmdb.read(idx):  # type: ignore[union-attr]
            for out, a in zip(outs, arrays):
                out[pos] = a if isinstance(out, np.ndarray) else torch.from_numpy(_to_native(a))
        return [torch.from_numpy(o) if isinstance(o, np.ndarray) else o for o in outs]

    def _check_index(self, index: Any) -> int:
        n = len(self)
        i = int(index)
        if not -n <= i < n:
            raise IndexError(f"index {index} is out of range for a packed dataset of {n} samples")
        return i + n if i < 0 else i

    def _map(self, shard: ShardSpec, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
        m = self._maps.get(shard.file)
        if m is None:
            if shard.bytes == 0:  # mmap cannot map an empty file; zero-size samples need no bytes
                m = np.empty((shard.count, *shape), dtype=dtype)
            else:
                m = np.memmap(self.path / shard.file, dtype=dtype, mode="r",
                              shape=(shard.count, *shape))
            self._maps[shard.file] = m
        return m

    def _rebuild(self, values: list[torch.Tensor]) -> Any:
        kind = self.header.kind
        if kind == "single":
            return values[0]
        if kind == "dict":
            return {f.name: v for f, v in zip(self.header.fields, values)}
        return tuple(values) if kind == "tuple" else list(values)

    def __repr__(self) -> str:
        fields = ", ".join(f"{f.name}:{f.dtype}{list(f.shape)}" for f in self.header.fields)
        return (f"PackedDataset({str(self.path)!r}, {self.storage}, {len(self)} samples, "
                f"{self.header.kind}: {fields})")


def verify_packed(path: str | os.PathLike) -> list[str]:
    """Recompute every shard's size and SHA-256; return the problems found (empty: all good).

    Raises:
        DataError: the header itself is missing or unreadable (nothing can be checked).
    """
    folder = Path(path)
    header = read_header(folder)
    problems = []
    for s in header.shards:
        problem = _size_problem(folder, s)
        if problem is None:
            actual = file_sha256(folder / s.file)
            if actual != s.sha256:
                problem = (f"shard {s.file!r} is corrupt: sha256 {actual}, expected {s.sha256}. "
                           "Re-pack the dataset.")
        if problem:
            problems.append(problem)
    return problems


def _size_problem(folder: Path, s: ShardSpec) -> str | None:
    p = folder / s.file
    if p.is_symlink() and p.resolve().parent != folder.resolve():
        return (f"shard {s.file!r} is a link to {str(p.resolve())!r}, outside the folder (refused: "
                "a packed dataset reads only its own files)")
    if not p.is_file():
        return f"shard {s.file!r} is missing"
    size = p.stat().st_size
    if size != s.bytes:
        return f"shard {s.file!r} has {size} bytes, expected {s.bytes} (truncated or corrupt)"
    return None




def _native(dtype: str) -> np.dtype:
    return np.dtype(dtype).newbyteorder("=")  # torch needs native byte order


def _to_native(a: np.ndarray) -> np.ndarray:
    return a.astype(_native(a.dtype.str), copy=False)
