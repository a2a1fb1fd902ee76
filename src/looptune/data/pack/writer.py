"""Write a map-style dataset into the packed format (see :mod:`looptune.data.pack.format`).

Everything is written into a temp folder beside OUT (``.OUT.tmp-XXXX``), fsynced, and renamed to
OUT only when complete: an interrupted or failed pack leaves no partial OUT and no temp folder.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from looptune._io import atomic_write_text, fsync_dir
from looptune.data.pack.format import (
    HEADER_NAME,
    STORAGES,
    FieldSpec,
    ShardSpec,
    Storage,
    build_header,
    header_to_text,
    shard_file_name,
)
from looptune.data.pack.samples import (
    Fields,
    check_same,
    flatten,
    iter_samples,
    specs_of,
)
from looptune.errors import ConfigError, DataError

__all__ = ["DEFAULT_SHARD_BYTES", "lmdb_missing", "pack"]

DEFAULT_SHARD_BYTES = 256 * 2**20  # 256 MiB: large enough for few files, small enough to copy/verify
Progress = Callable[[int, int], None]


def pack(dataset: Any, out: str | os.PathLike, *, format: Storage = "memmap",
         shard_bytes: int = DEFAULT_SHARD_BYTES, workers: int = 0, overwrite: bool = False,
         progress: Progress | None = None) -> Path:
    """Read every sample of a map-style ``dataset`` and write it as a packed folder ``out``.

    A sample is a tensor, numpy array or python number (bool/int/float), or a tuple, list or dict
    (string keys) of them; each field keeps the dtype of sample 0, and its shape with
    ``format="memmap"`` (``"lmdb"`` allows shapes that vary between samples).

    Args:
        dataset: anything with ``len()`` and ``dataset[i]``.
        out: the folder to create.
        format: ``"memmap"`` (fixed shapes; vectorized batch reads) or ``"lmdb"`` (variable
            shapes; needs ``pip install 'looptune[lmdb]'``).
        shard_bytes: the most bytes per shard file (a shard always holds at least one sample).
        workers: processes reading ``dataset[i]`` in parallel (0: this process); order is kept.
        overwrite: replace an existing packed folder; the old one stays intact until the new one
            is complete.
        progress: called as ``progress(samples_done, num_samples)`` after each shard.

    Returns:
        ``Path(out)``.

    Raises:
        ConfigError: bad ``format``/``shard_bytes``/``workers``, OUT exists (without
            ``overwrite``), no ``len()``, ``lmdb`` not installed.
        DataError: a sample of an unsupported type, or whose structure/dtype (or shape, for
            memmap) differs from sample 0; the disk filled up (OUT untouched).

    An empty dataset gives a valid packed folder with 0 samples and no fields (kind ``"empty"``).

    Example:
        >>> pack([(torch.zeros(3), 1)] * 10, "train.pack")  # doctest: +SKIP
    """
    out = Path(out)
    n = _check_args(dataset, out, format, shard_bytes, workers, overwrite)
    return write_folder(out, lambda tmp: _write_all(dataset, n, tmp, format, shard_bytes,
                                                    workers, progress))


def write_folder(out: Path, fill: Callable[[Path], None]) -> Path:
    """``fill(tmp)`` writes a dataset folder's files into a temporary folder beside ``out``,
    which is fsynced and renamed to ``out`` (an old ``out`` kept until then, and put back if the
    rename fails). Anything that goes wrong removes the temporary folder; a full disk is a
    DataError saying that ``out`` was not changed."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        os.chmod(tmp, 0o755)  # mkdtemp makes 0700; a dataset folder is meant to be read
        try:
            fill(tmp)
            fsync_dir(tmp)
        except OSError as err:
            if err.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            raise DataError(f"the disk holding {str(out.parent)!r} is full ({err.strerror}) while "
                            f"packing into {str(out)!r}: nothing was changed at that path (the "
                            "temporary folder was removed). Free space, or pack to another "
                            "folder.") from err
        _move_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _check_args(dataset: Any, out: Path, format: Any, shard_bytes: Any, workers: Any,
                overwrite: bool) -> int:
    problems = []
    if format not in STORAGES:
        problems.append(f"format={format!r} is invalid: allowed {', '.join(STORAGES)}. Use memmap "
                        "for fixed-shape samples, lmdb when shapes vary.")
    elif format == "lmdb" and (missing := lmdb_missing()):
        problems.append(missing)
    if isinstance(shard_bytes, bool) or not isinstance(shard_bytes, int) or shard_bytes < 1:
        problems.append(f"shard_bytes={shard_bytes!r} is invalid: must be an int >= 1. "
                        f"Use e.g. {DEFAULT_SHARD_BYTES} (256 MiB).")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        problems.append(f"workers={workers!r} is invalid: must be an int >= 0 (0 reads in this "
                        "process). Use e.g. the number of CPU cores.")
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


def _existing_problem(out: Path, overwrite: bool, marker: str = HEADER_NAME) -> list[str]:
    if not overwrite:
        return [(f"out={str(out)!r} already exists. Pass overwrite=True (--overwrite) to replace "
                 "it, or choose another path.")]
    if not out.is_dir() or out.is_symlink():
        return [(f"out={str(out)!r} exists and is not a folder; overwrite only replaces a packed "
                 "dataset folder. Remove it yourself or choose another path.")]
    if any(out.iterdir()) and not (out / marker).is_file():
        return [(f"out={str(out)!r} is a non-empty folder that is not a packed dataset (no "
                 f"{marker}); overwrite will not delete it. Remove it yourself or choose "
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


# ---------------------------------------------------------------- writing

def _write_all(dataset: Any, n: int, tmp: Path, storage: Storage, shard_bytes: int,
               workers: int, progress: Progress | None) -> None:
    if n == 0:
        header = build_header(num_samples=0, kind="empty", fields=[], shards=[], storage=storage)
        atomic_write_text(tmp / HEADER_NAME, header_to_text(header))
        return
    samples = iter_samples(dataset, n, workers)
    _, sample0 = next(samples)
    kind, arrays = flatten(sample0, 0)
    specs = specs_of(arrays)
    variable = storage == "lmdb"

    def checked() -> Iterator[Fields]:
        yield arrays
        for i, sample in samples:
            kind_i, arrays_i = flatten(sample, i)
            check_same(i, kind, specs, kind_i, arrays_i, variable_shapes=variable)
            yield arrays_i

    if storage == "lmdb":
        from looptune.data.pack import lmdb_store

        specs, shards = lmdb_store.write_shards(checked(), n, tmp, specs, shard_bytes, progress)
    else:
        shards = _write_memmap_shards(checked(), n, tmp, specs, shard_bytes, progress)
    header = build_header(num_samples=n, kind=kind, fields=specs, shards=shards, storage=storage)
    atomic_write_text(tmp / HEADER_NAME, header_to_text(header))  # last: marks the folder complete


def _write_memmap_shards(stream: Iterator[Fields], n: int, tmp: Path, specs: list[FieldSpec],
                         shard_bytes: int, progress: Progress | None) -> list[ShardSpec]:
    per_shard = max(1, shard_bytes // max(1, max(s.sample_bytes for s in specs)))
    shards: list[ShardSpec] = []
    for k, first in enumerate(range(0, n, per_shard)):
        count = min(per_shard, n - first)
        bufs = [np.empty((count, *s.shape), dtype=s.dtype) for s in specs]
        for j, arrays in zip(range(count), stream):
            for buf, (_, a) in zip(bufs, arrays):
                buf[j] = a
        for fi, (spec, buf) in enumerate(zip(specs, bufs)):
            name = shard_file_name(fi, spec.name, k)
            digest = _write_shard(tmp / name, buf.tobytes(order="C"))
            shards.append(ShardSpec(field=spec.name, file=name, first=first, count=count, bytes=buf.nbytes, sha256=digest))
        if progress is not None:
            progress(first + count, n)
    return shards


def _write_shard(path: Path, data: bytes) -> str:
    """Write and fsync one shard file; returns its SHA-256 hex digest."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(path, 0o644)
    return hashlib.sha256(data).hexdigest()


def lmdb_missing() -> str | None:
    """Why format='lmdb' cannot be used here (the package is missing), or None."""
    try:
        import lmdb  # noqa: F401
    except ImportError as err:
        return (f"format='lmdb' needs the lmdb package, which is not importable here ({err}). "
                "Install it with: pip install 'looptune[lmdb]' (or pip install lmdb), or use "
                "format='memmap'.")
    return None
