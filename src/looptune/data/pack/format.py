"""The packed-dataset format: folder layout, header schema and version. The only module that knows it.

A packed dataset is a folder holding ``header.json`` (UTF-8 JSON, written last: no header, no
dataset) and shard files in one of two storages:

``memmap`` (fixed shapes; vectorized reads)::

    FIELD-00000.bin      shard 0 of field FIELD: raw C-order array of ``count x shape``
    FIELD-00001.bin      ...

Shard ``k`` of every field holds the same samples ``[first, first + count)``, so one index maps to
one shard for all fields.

``lmdb`` (variable shapes allowed; needs the ``lmdb`` package)::

    shard-00000.lmdb     one LMDB environment file (``subdir=False``) holding samples
                         ``[first, first + count)``: key = the sample index as 8 big-endian bytes,
                         value = :func:`encode_record` of the sample (every field: its shape as
                         ``ndim`` little-endian int64, then its bytes)

Every value in every file is stored **little-endian** (dtype strings always carry ``<`` or ``|``),
whatever the machine that wrote it.

Header (version 1)::

    {"format": "looptune-pack", "version": 1, "looptune_version": "0.1.0",
     "storage": "memmap" | "lmdb", "num_samples": 1000,
     "structure": {"kind": "tuple" | "list" | "dict" | "single" | "empty", "fields": [names]},
     "fields": [{"name": "0", "dtype": "<f4", "shape": [28, 28]}, ...],
     "shards": [{"field": "0", "file": "0-00000.bin", "first": 0, "count": 500,
                 "bytes": 1568000, "sha256": "..."}, ...]}

``structure.kind`` says how a sample is rebuilt: ``tuple``/``list`` in field order (field names
``"0"``, ``"1"``, ...), ``dict`` with the field names as keys, ``single`` one bare value (field
``"0"``), ``empty`` a dataset of 0 samples (no fields: nothing was seen to describe).

A field's ``shape`` holds ``null`` for a dimension that varies between samples (``lmdb`` only; the
number of dimensions never varies). An ``lmdb`` shard names ``"field": "*"`` (it holds every field)
and its ``bytes`` is the file size.

Example:
    >>> header = build_header(num_samples=2, kind="single",
    ...                       fields=[FieldSpec("0", "<f4", (3,))], shards=[])
    >>> parse_header(header_to_text(header), "x").num_samples
    2
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from looptune._version import __version__
from looptune.errors import DataError

__all__ = [
    "ALL_FIELDS",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "HEADER_NAME",
    "STORAGES",
    "FieldSpec",
    "Header",
    "ShardSpec",
    "Storage",
    "StructureKind",
    "build_header",
    "decode_record",
    "encode_record",
    "file_sha256",
    "header_to_text",
    "le_dtype_str",
    "parse_header",
    "read_header",
    "record_key",
    "shard_file_name",
]

FORMAT_NAME = "looptune-pack"
FORMAT_VERSION = 1
HEADER_NAME = "header.json"
StructureKind = Literal["tuple", "list", "dict", "single", "empty"]
_KINDS = ("tuple", "list", "dict", "single", "empty")
Storage = Literal["memmap", "lmdb"]
STORAGES: tuple[str, ...] = ("memmap", "lmdb")
ALL_FIELDS = "*"  # ShardSpec.field of an lmdb shard: it holds every field
# format version -> the newest looptune release known to read it (for the "use looptune X" fix)
_READERS = {1: "0.1.x"}
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")


@dataclass(frozen=True)
class FieldSpec:
    name: str  # "0", "1", ... for tuples/lists/single; the key for dicts
    dtype: str  # numpy dtype string, explicit little-endian: "<f4", "|u1", "|b1"
    shape: tuple[int | None, ...]  # per-sample shape; () for scalars; None: varies (lmdb only)

    @property
    def fixed(self) -> bool:
        return None not in self.shape

    @property
    def sample_bytes(self) -> int:
        """Bytes of one sample of this field (fixed shapes only)."""
        if not self.fixed:
            raise ValueError(f"field {self.name!r} has a variable shape {self.shape}")
        return int(np.dtype(self.dtype).itemsize * math.prod(self.shape))  # type: ignore[arg-type]


@dataclass(frozen=True, kw_only=True)
class ShardSpec:
    field: str  # FieldSpec.name this file belongs to
    file: str  # file name inside the folder
    first: int  # index of its first sample
    count: int  # number of samples, >= 1
    bytes: int  # file size; == count * sample_bytes
    sha256: str  # hex digest of the whole file


@dataclass(frozen=True, kw_only=True)
class Header:
    version: int
    num_samples: int
    kind: StructureKind
    fields: tuple[FieldSpec, ...]
    shards: tuple[ShardSpec, ...]
    storage: Storage = "memmap"
    looptune_version: str = "?"
    extra: dict = field(default_factory=dict)

    def shards_of(self, name: str) -> list[ShardSpec]:
        return [s for s in self.shards if s.field == name]


def le_dtype_str(dtype: np.dtype) -> str:
    """The little-endian dtype string stored in the header ("<f4", "|u1")."""
    return np.dtype(dtype).newbyteorder("<").str


def shard_file_name(index: int, name: str, shard: int) -> str:
    """``NAME-00000.bin``; a field name unsafe in a file name becomes ``field~INDEX`` (never clashes:
    ``~`` is not allowed in safe names)."""
    stem = name if _SAFE_NAME.match(name) else f"field~{index}"
    return f"{stem}-{shard:05d}.bin"


def file_sha256(path: Path) -> str:
    """The hex SHA-256 of a shard file, as the header records it (read in 4 MiB chunks)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def record_key(index: int) -> bytes:
    """The LMDB key of sample ``index``: 8 big-endian bytes, so keys sort in index order."""
    return int(index).to_bytes(8, "big")


def encode_record(arrays: list[np.ndarray], fields: tuple[FieldSpec, ...] | list[FieldSpec]) -> bytes:
    """One sample as LMDB value bytes: per field, its shape (little-endian int64s), then its data
    (C order, little-endian)."""
    parts = []
    for a, f in zip(arrays, fields):
        parts.append(np.asarray(a.shape, dtype="<i8").tobytes())
        parts.append(np.ascontiguousarray(a, dtype=f.dtype).tobytes())
    return b"".join(parts)


def decode_record(buf: bytes | memoryview, fields: tuple[FieldSpec, ...]) -> list[np.ndarray]:
    """Inverse of :func:`encode_record`: one read-only array per field (views into ``buf``)."""
    out, pos = [], 0
    for f in fields:
        ndim = len(f.shape)
        shape = tuple(int(d) for d in np.frombuffer(buf, dtype="<i8", count=ndim, offset=pos))
        pos += 8 * ndim
        dt = np.dtype(f.dtype)
        count = math.prod(shape)
        out.append(np.frombuffer(buf, dtype=dt, count=count, offset=pos).reshape(shape))
        pos += count * dt.itemsize
    if pos != len(buf):
        raise DataError(f"a packed record has {len(buf)} bytes, its fields describe {pos}: the "
                        "shard is corrupt. Run `looptune pack --verify` and re-pack.")
    return out


def build_header(*, num_samples: int, kind: StructureKind, fields: list[FieldSpec],
                 shards: list[ShardSpec], storage: Storage = "memmap") -> dict[str, Any]:

    return {
        "format": FORMAT_NAME, "version": FORMAT_VERSION, "looptune_version": __version__,
        "storage": storage, "num_samples": num_samples,
        "structure": {"kind": kind, "fields": [f.name for f in fields]},
        "fields": [{"name": f.name, "dtype": f.dtype, "shape": list(f.shape)} for f in fields],
        "shards": [vars(s).copy() for s in shards],
    }


def header_to_text(header: dict[str, Any]) -> str:
    return json.dumps(header, indent=1) + "\n"


def read_header(folder: str | Path) -> Header:
    """Read and validate ``folder/header.json``. Raises DataError naming the problem and the fix."""
    folder = Path(folder)
    path = folder / HEADER_NAME
    if not folder.is_dir():
        raise DataError(f"packed dataset {str(folder)!r} does not exist or is not a folder. "
                        "Create it with looptune.pack(dataset, out) (or `looptune pack`).")
    if not path.is_file():
        raise DataError(f"packed dataset {str(folder)!r} has no {HEADER_NAME}: the folder is not a "
                        "packed dataset or its packing never finished. Re-pack it with "
                        "looptune.pack(dataset, out, overwrite=True).")
    return parse_header(path.read_text(encoding="utf-8"), str(folder))


def parse_header(text: str, where: str) -> Header:
    """Parse header JSON text; ``where`` names the dataset in error messages."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as err:
        raise DataError(f"{where}: {HEADER_NAME} is not valid JSON ({err}). It is corrupt: "
                        "re-pack the dataset.") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT_NAME:
        got = raw.get("format") if isinstance(raw, dict) else type(raw).__name__
        raise DataError(f"{where}: {HEADER_NAME} has format={got!r}, expected {FORMAT_NAME!r}. "
                        "This is not a looptune packed dataset: re-pack it with looptune.pack.")
    _check_version(raw.get("version"), raw.get("looptune_version", "?"), where)
    try:
        return _header_from_raw(raw, where)
    except (KeyError, TypeError, ValueError) as err:
        raise DataError(f"{where}: {HEADER_NAME} is malformed ({type(err).__name__}: {err}). "
                        "Re-pack the dataset.") from None


def _check_version(version: Any, writer: str, where: str) -> None:
    if version == FORMAT_VERSION:
        return
    if isinstance(version, int) and version > FORMAT_VERSION:
        raise DataError(
            f"{where}: packed format version {version} (written by looptune {writer}) is newer "
            f"than this looptune reads (version {FORMAT_VERSION}). Upgrade looptune "
            f"(pip install -U looptune), or re-pack the data with this looptune.")
    reader = _READERS.get(version, writer) if isinstance(version, int) else writer
    raise DataError(
        f"{where}: packed format version {version!r} is not supported: this looptune reads "
        f"version {FORMAT_VERSION} only. Re-pack with this looptune, or use looptune {reader} "
        f"(which wrote/reads version {version!r}).")


def _header_from_raw(raw: dict[str, Any], where: str) -> Header:
    kind = raw["structure"]["kind"]
    if kind not in _KINDS:
        raise ValueError(f"structure.kind={kind!r} is not one of {_KINDS}")
    storage = raw.get("storage", "memmap")
    if storage not in STORAGES:
        raise ValueError(f"storage={storage!r} is not one of {STORAGES}")
    fields = tuple(FieldSpec(str(f["name"]), str(f["dtype"]),
                             tuple(None if d is None else int(d) for d in f["shape"]))
                   for f in raw["fields"])
    for f in fields:
        dt = np.dtype(f.dtype)
        if (f.dtype[0] not in "<|" or dt.kind not in "biufc"
                or any(d is not None and d < 0 for d in f.shape)
                or (storage == "memmap" and not f.fixed)):
            raise ValueError(f"field {f.name!r}: dtype {f.dtype!r} / shape {f.shape} not allowed")
    shards = tuple(ShardSpec(field=str(s["field"]), file=str(s["file"]), first=int(s["first"]), count=int(s["count"]),
                             bytes=int(s["bytes"]), sha256=str(s["sha256"])) for s in raw["shards"])
    header = Header(version=int(raw["version"]), num_samples=int(raw["num_samples"]), kind=kind,
                    fields=fields, shards=shards, storage=storage,
                    looptune_version=str(raw.get("looptune_version")))
    _check_layout(header)
    return header


def _check_layout(h: Header) -> None:
    names = [f.name for f in h.fields]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate field names {names}")
    if (h.kind == "empty") != (not h.fields) or (h.kind == "single" and len(h.fields) != 1):
        raise ValueError(f"structure.kind={h.kind!r} does not fit {len(h.fields)} fields")
    if h.kind == "empty" and h.num_samples:
        raise ValueError("structure.kind='empty' with num_samples > 0")
    for s in h.shards:
        if ("/" in s.file or "\\" in s.file or s.file.startswith(".") or "\x00" in s.file
                or s.file == HEADER_NAME):
            raise ValueError(f"shard file name {s.file!r} is not a plain file name inside the "
                             "folder (no '/', '\\', leading '.' or '..')")
    files = [s.file for s in h.shards]
    if len(set(files)) != len(files):
        twice = sorted({f for f in files if files.count(f) > 1})
        raise ValueError(f"two shards name the same file {twice}")
    if h.storage == "lmdb":
        if any(s.field != ALL_FIELDS for s in h.shards):
            raise ValueError(f"an lmdb shard must name field {ALL_FIELDS!r}")
        _check_cover(h.shards, h.num_samples, "lmdb shards", None)
        return
    if {s.field for s in h.shards} - set(names):
        raise ValueError("a shard names an unknown field")
    for f in h.fields:
        _check_cover(h.shards_of(f.name), h.num_samples, f"field {f.name!r}", f.sample_bytes)


def _check_cover(shards: Any, num_samples: int, what: str, sample_bytes: int | None) -> None:
    nxt = 0
    for s in shards:
        if s.first != nxt or s.count < 1 or (sample_bytes is not None
                                            and s.bytes != s.count * sample_bytes):
            raise ValueError(f"shard {s.file!r} does not continue {what} at sample {nxt}"
                             + ("" if sample_bytes is None else
                                f" with {sample_bytes} bytes per sample"))
        nxt += s.count
    if nxt != num_samples:
        raise ValueError(f"{what} cover {nxt} of {num_samples} samples")
