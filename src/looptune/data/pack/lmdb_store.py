"""The ``lmdb`` storage of a packed dataset: write shards, read samples (needs the ``lmdb`` package).

Each shard is one LMDB environment file (``subdir=False``, no lock file: a packed dataset is
written once by one process and only read afterwards). Records are encoded by
:func:`looptune.data.pack.format.encode_record`; keys by :func:`~looptune.data.pack.format.record_key`
(big-endian, so ``append=True`` writes in key order without B-tree splits).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from looptune.data.pack.format import (
    ALL_FIELDS,
    FieldSpec,
    Header,
    ShardSpec,
    decode_record,
    encode_record,
    file_sha256,
    record_key,
)
from looptune.data.pack.samples import Fields, merge_shapes
from looptune.errors import ConfigError, DataError

__all__ = ["LmdbStore", "shard_file", "write_shards"]

_PAGE = 4096


def _lmdb():
    try:
        import lmdb
    except ImportError as err:
        raise ConfigError(f"this packed dataset uses storage 'lmdb', which needs the lmdb package "
                          f"({err}). Install it: pip install 'looptune[lmdb]'.") from None
    return lmdb


def shard_file(k: int) -> str:
    return f"shard-{k:05d}.lmdb"


def write_shards(stream: Iterator[Fields], n: int, tmp: Path, specs: list[FieldSpec],
                 shard_bytes: int, progress: Callable[[int, int], None] | None,
                 ) -> tuple[list[FieldSpec], list[ShardSpec]]:
    """Write every sample of ``stream`` into LMDB shards of about ``shard_bytes`` of records.

    Returns the field specs (dimensions that varied become None) and the shard specs.
    """
    shards: list[ShardSpec] = []
    records: list[bytes] = []
    first = size = 0
    for i, arrays in enumerate(stream):
        specs = merge_shapes(specs, arrays)
        rec = encode_record([a for _, a in arrays], specs)
        if records and size + len(rec) > shard_bytes:
            shards.append(_write_shard(tmp, len(shards), first, records))
            first, records, size = i, [], 0
            if progress is not None:
                progress(first, n)
        records.append(rec)
        size += len(rec)
    if records:
        shards.append(_write_shard(tmp, len(shards), first, records))
    if progress is not None:
        progress(n, n)
    return specs, shards


def _write_shard(tmp: Path, k: int, first: int, records: list[bytes]) -> ShardSpec:
    lmdb = _lmdb()
    path = tmp / shard_file(k)
    # every record: its bytes rounded up to pages (overflow pages), plus B-tree overhead; doubled
    need = sum(len(r) + 64 for r in records) + _PAGE * (len(records) // 16 + 2)
    map_size = 2 * need + (1 << 20)
    env = lmdb.open(str(path), subdir=False, map_size=map_size, lock=False, readahead=False,
                    meminit=False, max_dbs=0, sync=True)
    try:
        with env.begin(write=True) as txn:
            for j, rec in enumerate(records):
                txn.put(record_key(first + j), rec, append=True)
        env.sync(True)
    except lmdb.MapFullError:  # the estimate above is generous; say so instead of a bare error
        raise DataError(f"LMDB shard {path.name}: map size {map_size} bytes was too small for "
                        f"{len(records)} records. Report this as a looptune bug; pack with a "
                        "smaller --shard-bytes meanwhile.") from None
    except lmdb.Error as err:
        code = getattr(err, "errno", None) or (28 if "No space" in str(err) else None)
        if code:
            raise OSError(code, f"LMDB shard {path.name}: {err}") from None
        raise
    finally:
        env.close()
    os.chmod(path, 0o644)
    return ShardSpec(field=ALL_FIELDS, file=path.name, first=first, count=len(records), bytes=path.stat().st_size,
                     sha256=file_sha256(path))




class LmdbStore:
    """Reads samples of an ``lmdb`` packed dataset; environments are opened lazily per process."""

    def __init__(self, folder: Path, header: Header) -> None:
        self.folder, self.header = folder, header
        self._firsts = np.array([s.first for s in header.shards], dtype=np.int64)
        self._envs: dict[str, object] = {}
        self._pid = os.getpid()
        _lmdb()  # fail on open, not on the first read, when lmdb is missing

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_envs"] = {}  # an LMDB env must not cross processes: each one opens its own
        return state

    def release(self) -> None:
        """Close every environment (reopened on the next read): nothing keeps the files mapped."""
        for env in self._envs.values():
            env.close()
        self._envs = {}

    def _env(self, shard: ShardSpec):
        if os.getpid() != self._pid:  # forked after opening: LMDB forbids reusing the parent's env
            self._envs, self._pid = {}, os.getpid()
        env = self._envs.get(shard.file)
        if env is None:
            env = _lmdb().open(str(self.folder / shard.file), subdir=False, readonly=True,
                               lock=False, readahead=False, max_readers=1024)
            self._envs[shard.file] = env
        return env

    def read(self, indices: np.ndarray) -> Iterator[tuple[int, list[np.ndarray]]]:
        """``(position, arrays)`` for each index (already in range), grouped by shard."""
        which = np.searchsorted(self._firsts, indices, side="right") - 1
        for k in np.unique(which):
            shard = self.header.shards[int(k)]
            positions = np.flatnonzero(which == k)
            with self._env(shard).begin(buffers=True) as txn:
                for pos in positions:
                    buf = txn.get(record_key(int(indices[pos])))
                    if buf is None:
                        raise DataError(f"shard {shard.file!r} has no record for sample "
                                        f"{int(indices[pos])}: it is corrupt. Run `looptune pack "
                                        "--verify` and re-pack.")
                    # copy out of the transaction's memory before it ends
                    yield int(pos), [a.copy() for a in decode_record(buf, self.header.fields)]
