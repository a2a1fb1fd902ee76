"""The IDX file format (MNIST's): read, validate and write. The only module that knows its bytes.

Layout, every integer big-endian::

    bytes 0-1    0x00 0x00 (the magic)
    byte  2      element type code, one of :data:`DTYPES`
    byte  3      rank (number of dimensions), >= 1
    4 * rank     the dimensions, uint32 each
    the rest     prod(dims) elements of that type, big-endian, C order

A file may be gzip-compressed. That is detected from its first two bytes (0x1f 0x8b), never from
its name: hand-copied files and torchvision's ``raw/`` folder get the suffix wrong.

Example:
    >>> path = write_idx("labels-idx1-ubyte.gz", np.arange(10, dtype=np.uint8), compress=True)
    >>> read_idx(path)
    array([0, 1, 2, 3, 4, 5, 6, 7, 8, 9], dtype=uint8)
"""

from __future__ import annotations

import gzip
import os
import zlib
from pathlib import Path
from typing import Callable, Union

import numpy as np

from looptune._io import atomic_write_bytes
from looptune.errors import DataError

__all__ = ["DTYPES", "read_idx", "read_idx_bytes", "write_idx"]

PathLike = Union[str, "os.PathLike[str]"]

# type code -> element dtype as stored (big-endian), as the format defines them
DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_GZIP_MAGIC = b"\x1f\x8b"
_MAX_DIM = 0xFFFFFFFF  # dimensions are stored as uint32
_FIX = "re-download or re-create the file"


def read_idx(path: PathLike, *, check: Callable[[bytes], None] | None = None) -> np.ndarray:
    """Read an IDX file (raw or gzip-compressed) into a native-endian, writable array.

    Args:
        path: the file; gzip is detected from its magic bytes, not from its name.
        check: optional callable given the decompressed bytes after their layout was validated,
            so a caller can hash the content without reading the file twice (it raises to reject).

    Returns:
        An array with the file's shape and dtype (uint8, int8, int16, int32, float32, float64).

    Raises:
        DataError: the file is missing or unreadable, the gzip stream is corrupt, or the header
            or payload size is invalid. The message names the file, expected and actual values.
    """
    data, gzipped = _load(Path(path))
    holder = "the decompressed file" if gzipped else "the file"
    array = _parse(data, source=str(path), holder=holder)  # layout errors say more than a hash
    if check is not None:
        check(data)
    return array


def read_idx_bytes(path: PathLike, *, validate: bool = False) -> bytes:
    """Return the IDX bytes of ``path``, decompressed if it is gzip (for hashing a file).

    Args:
        validate: also check the header and the payload size (a truncated file then says
            "header promises N bytes, the file holds M" rather than only failing its hash).

    Raises:
        DataError: the file is missing or unreadable, its gzip stream is corrupt, or (with
            ``validate``) its layout is invalid.
    """
    data, gzipped = _load(Path(path))
    if validate:
        _layout(data, source=str(path), holder="the decompressed file" if gzipped else "the file")
    return data


def write_idx(path: PathLike, array: np.ndarray, *, compress: bool = False) -> Path:
    """Write ``array`` as an IDX file, atomically (temp file in the same folder, fsync, rename).

    Args:
        path: destination; its name does not decide compression, ``compress`` does.
        array: rank 1..255, dtype uint8, int8, int16, int32, float32 or float64.
        compress: gzip the whole file (what MNIST mirrors serve as ``NAME.gz``).

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        DataError: the dtype has no IDX type code, the rank is 0, or a dimension exceeds uint32.
    """
    path = Path(path)
    arr = np.asarray(array)
    code = _type_code(arr.dtype, path)
    _check_writable_shape(arr.shape, path)
    header = bytes([0, 0, code, arr.ndim]) + np.asarray(arr.shape, dtype=">u4").tobytes()
    payload = header + np.ascontiguousarray(arr, dtype=DTYPES[code]).tobytes()
    if compress:
        # mtime=0 keeps the bytes reproducible, so identical arrays give identical files
        payload = gzip.compress(payload, compresslevel=6, mtime=0)
    _atomic_write(path, payload)
    return path


def _load(path: Path) -> tuple[bytes, bool]:
    """Read the whole file at once (one syscall-sized read beats streaming for 47 MB)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"{path}: no such file; check the path or {_FIX}") from None
    except OSError as exc:
        raise DataError(
            f"{path}: cannot read the file ({exc}); check the path and permissions"
        ) from exc
    if raw[:2] != _GZIP_MAGIC:
        return raw, False
    try:
        return gzip.decompress(raw), True
    except (OSError, EOFError, zlib.error) as exc:  # BadGzipFile is an OSError (bad CRC, bad header)
        raise DataError(
            f"{path}: corrupt gzip stream ({type(exc).__name__}: {exc}); "
            f"the file is damaged or was cut short: {_FIX}"
        ) from exc


def _parse(data: bytes, *, source: str, holder: str) -> np.ndarray:
    dtype, dims, count, offset = _layout(data, source=source, holder=holder)
    flat = np.frombuffer(data, dtype=dtype, count=count, offset=offset)
    # astype copies: native byte order for fast arithmetic, and writable (frombuffer is read-only)
    return flat.astype(dtype.newbyteorder("="), copy=True).reshape(dims)


def _layout(data: bytes, *, source: str, holder: str) -> tuple[np.dtype, tuple[int, ...], int, int]:
    """Validate header and payload size; return (dtype, dims, element count, payload offset)."""
    dtype, dims = _parse_header(data, source=source, holder=holder)
    offset = 4 + 4 * len(dims)
    count = int(np.prod(dims, dtype=object))  # python ints: no overflow on a corrupt header
    expected, actual = count * dtype.itemsize, len(data) - offset
    if actual != expected:
        what = "truncated" if actual < expected else "trailing bytes"
        described = "x".join(map(str, dims)) + " " + dtype.name
        raise DataError(
            f"{source}: {what}: header promises {expected} data bytes ({described}) "
            f"but {holder} holds {actual}; {_FIX}"
        )
    return dtype, dims, count, offset


def _parse_header(data: bytes, *, source: str, holder: str) -> tuple[np.dtype, tuple[int, ...]]:
    _check_magic(data, source=source, holder=holder)
    code, rank = data[2], data[3]
    if code not in DTYPES:
        allowed = ", ".join(f"0x{c:02X} ({d.name})" for c, d in DTYPES.items())
        raise DataError(f"{source}: unknown IDX type code 0x{code:02X}; allowed: {allowed}; {_FIX}")
    if rank < 1:
        raise DataError(f"{source}: rank 0 in the header; an IDX file needs rank >= 1; {_FIX}")
    if len(data) < 4 + 4 * rank:
        raise DataError(
            f"{source}: truncated header: rank {rank} needs {4 + 4 * rank} header bytes "
            f"but {holder} holds {len(data)}; {_FIX}"
        )
    dims = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=rank, offset=4))
    return DTYPES[code], dims


def _check_magic(data: bytes, *, source: str, holder: str) -> None:
    if len(data) < 4:
        raise DataError(
            f"{source}: truncated header: an IDX header needs at least 4 bytes "
            f"but {holder} holds {len(data)}; {_FIX}"
        )
    if data[:2] != b"\x00\x00":
        raise DataError(
            f"{source}: bad magic: the first two bytes are {data[:2].hex(' ')}, expected 00 00; "
            f"this is not an IDX file: check the path or {_FIX}"
        )


def _type_code(dtype: np.dtype, path: Path) -> int:
    for code, stored in DTYPES.items():
        if dtype.kind == stored.kind and dtype.itemsize == stored.itemsize:
            return code
    allowed = ", ".join(d.name for d in DTYPES.values())
    raise DataError(
        f"{path}: dtype {dtype} has no IDX type code; allowed: {allowed}. "
        f"Convert first, e.g. array.astype(np.int32)"
    )


def _check_writable_shape(shape: tuple[int, ...], path: Path) -> None:
    if not 1 <= len(shape) <= 255:  # the rank is one byte
        raise DataError(
            f"{path}: rank {len(shape)} cannot be written; IDX needs rank 1..255. Reshape the array first"
        )
    if max(shape) > _MAX_DIM:
        raise DataError(
            f"{path}: dimension {max(shape)} exceeds the IDX limit {_MAX_DIM}; split the array"
        )


def _atomic_write(path: Path, payload: bytes) -> None:
    atomic_write_bytes(path, payload)  # temp file beside it, fsync, rename, fsync the folder
