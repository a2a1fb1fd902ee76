"""Write a map-style dataset into the packed format (see :mod:`looptune.data.pack.format`).

Everything is written into a temp folder beside OUT (``.OUT.tmp-XXXX``), fsynced, and renamed to
OUT only when complete: an interrupted or failed pack leaves no partial OUT and no temp folder.
"""

from __future__ import annotations

import hashlib
import numbers
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from looptune._io import fsync_dir, atomic_write_text
from looptune.data.pack.format import (
    HEADER_NAME,
    FieldSpec,
    ShardSpec,
    StructureKind,
    build_header,
    header_to_text,
    le_dtype_str,
    shard_file_name,
)
from looptune.errors import ConfigError, DataError

__all__ = ["DEFAULT_SHARD_BYTES", "pack"]

DEFAULT_SHARD_BYTES = 256 * 2**20  # 256 MiB: large enough for few files, small enough to copy/verify
Progress = Callable[[int, int], None]


def pack(dataset: Any, out: str | os.PathLike, *, shard_bytes: int = DEFAULT_SHARD_BYTES,
         overwrite: bool = False, progress: Progress | None = None) -> Path:
    """Read every sample of a map-style ``dataset`` and write it as a packed folder ``out``.

    A sample is a tensor, numpy array or python number (bool/int/float), or a tuple, list or dict
    (string keys) of them; each field keeps the shape and dtype of sample 0.

    Args:
        dataset: anything with ``len()`` and ``dataset[i]``.
        out: the folder to create.
        shard_bytes: the most bytes per shard file (a shard always holds at least one sample).
        overwrite: replace an existing packed folder; the old one stays intact until the new one
            is complete.
        progress: called as ``progress(samples_done, num_samples)`` after each shard.

    Returns:
        ``Path(out)``.

    Raises:
        ConfigError: bad ``shard_bytes``, OUT exists (without ``overwrite``), no ``len()``.
        DataError: a sample of an unsupported type, or whose shape/dtype differs from sample 0.

    An empty dataset gives a valid packed folder with 0 samples and no fields (kind ``"empty"``).

    Example:
        >>> pack([(torch.zeros(3), 1)] * 10, "train.pack")  # doctest: +SKIP
    """
    out = Path(out)
    n = _check_args(dataset, out, shard_bytes, overwrite)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        os.chmod(tmp, 0o755)  # mkdtemp makes 0700; a dataset folder is meant to be read
        _write_all(dataset, n, tmp, shard_bytes, progress)
        fsync_dir(tmp)
        _move_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _check_args(dataset: Any, out: Path, shard_bytes: Any, overwrite: bool) -> int:
    problems = []
    if isinstance(shard_bytes, bool) or not isinstance(shard_bytes, int) or shard_bytes < 1:
        problems.append(f"shard_bytes={shard_bytes!r} is invalid: must be an int >= 1. "
                        f"Use e.g. {DEFAULT_SHARD_BYTES} (256 MiB).")
    if not out.parent.is_dir():
        problems.append(f"out={str(out)!r}: the folder {str(out.parent)!r} does not exist. "
                        f"Create it first (mkdir -p {out.parent}).")
    if out.exists() or out.is_symlink():
        problems.extend(_existing_problem(out, overwrite))
    try:
        n = len(dataset)
    except TypeError:
        problems.append(f"dataset of type {type(dataset).__name__} has no len(): pack needs a "
                        "map-style dataset (len() and dataset[i]). Wrap an iterable in a list.")
        n = 0
    if problems:
        raise ConfigError(problems)
    return n


def _existing_problem(out: Path, overwrite: bool) -> list[str]:
    if not overwrite:
        return [(f"out={str(out)!r} already exists. Pass overwrite=True (--overwrite) to replace "
                 "it, or choose another path.")]
    if not out.is_dir() or out.is_symlink():
        return [(f"out={str(out)!r} exists and is not a folder; overwrite only replaces a packed "
                 "dataset folder. Remove it yourself or choose another path.")]
    if any(out.iterdir()) and not (out / HEADER_NAME).is_file():
        return [(f"out={str(out)!r} is a non-empty folder that is not a packed dataset (no "
                 f"{HEADER_NAME}); overwrite will not delete it. Remove it yourself or choose "
                 "another path.")]
    return []


def _move_into_place(tmp: Path, out: Path) -> None:
    if not (out.exists() or out.is_symlink()):
        os.rename(tmp, out)
        fsync_dir(out.parent)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
    os.rename(out, old)  # POSIX: renaming a folder over an empty folder replaces it
    try:
        os.rename(tmp, out)
    except BaseException:
        os.rename(old, out)  # put the old dataset back: nothing lost
        raise
    fsync_dir(out.parent)
    shutil.rmtree(old, ignore_errors=True)


# ---------------------------------------------------------------- samples -> fields

def _flatten(sample: Any, index: int) -> tuple[StructureKind, list[tuple[str, np.ndarray]]]:
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


def _specs(kind: StructureKind, arrays: list[tuple[str, np.ndarray]]) -> list[FieldSpec]:
    return [FieldSpec(name, le_dtype_str(a.dtype), tuple(a.shape)) for name, a in arrays]


def _check_same(index: int, kind0: str, specs: list[FieldSpec], kind: str,
                arrays: list[tuple[str, np.ndarray]]) -> None:
    names = [s.name for s in specs]
    if kind != kind0 or [n for n, _ in arrays] != names:
        raise DataError(f"sample {index}: structure {kind} with fields {[n for n, _ in arrays]} "
                        f"differs from sample 0 ({kind0} with fields {names}). Every sample must "
                        "have the same structure.")
    for spec, (name, a) in zip(specs, arrays):
        if tuple(a.shape) != spec.shape or le_dtype_str(a.dtype) != spec.dtype:
            raise DataError(f"sample {index}, field {name!r}: shape {tuple(a.shape)} dtype "
                            f"{le_dtype_str(a.dtype)}, expected shape {spec.shape} dtype "
                            f"{spec.dtype} (as sample 0). Pad/crop or cast in the dataset, or "
                            "pack variable-sized fields separately.")


# ---------------------------------------------------------------- writing

def _write_all(dataset: Any, n: int, tmp: Path, shard_bytes: int,
               progress: Progress | None) -> None:
    if n == 0:
        header = build_header(num_samples=0, kind="empty", fields=[], shards=[])
        atomic_write_text(tmp / HEADER_NAME, header_to_text(header))
        return
    kind, arrays = _flatten(dataset[0], 0)
    specs = _specs(kind, arrays)
    per_shard = max(1, shard_bytes // max(1, max(s.sample_bytes for s in specs)))
    shards: list[ShardSpec] = []
    for k, first in enumerate(range(0, n, per_shard)):
        count = min(per_shard, n - first)
        bufs = [np.empty((count, *s.shape), dtype=s.dtype) for s in specs]
        for j in range(count):
            i = first + j
            kind_i, arrays_i = (kind, arrays) if i == 0 else _flatten(dataset[i], i)
            _check_same(i, kind, specs, kind_i, arrays_i)
            for buf, (_, a) in zip(bufs, arrays_i):
                buf[j] = a
        for fi, (spec, buf) in enumerate(zip(specs, bufs)):
            name = shard_file_name(fi, spec.name, k)
            digest = _write_shard(tmp / name, buf.tobytes(order="C"))
            shards.append(ShardSpec(spec.name, name, first, count, buf.nbytes, digest))
        if progress is not None:
            progress(first + count, n)
    header = build_header(num_samples=n, kind=kind, fields=specs, shards=shards)
    atomic_write_text(tmp / HEADER_NAME, header_to_text(header))  # last: marks the folder complete


def _write_shard(path: Path, data: bytes) -> str:
    """Write and fsync one shard file; returns its SHA-256 hex digest."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(path, 0o644)
    return hashlib.sha256(data).hexdigest()
