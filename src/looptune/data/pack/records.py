"""Encoded samples in the shard formats people use: TFRecord and WebDataset tar shards.

Where :func:`looptune.data.pack.pack` stores decoded arrays, these keep each sample's encoded
bytes (a JPEG file, bytes in = bytes out) and its label, many samples to a shard file, so a pass
over the data is a few large sequential reads instead of a small file opened per sample: the fix
for a slow disk or a network file system that the tutorials name ("try TFRecord"). The decode
stays per sample (:class:`looptune.data.jpeg.DecodeResize` or the user's transform).

* ``tfrecord``: ``shard-NNNNN.tfrecord``, one ``tf.train.Example`` a sample (``image``: bytes,
  ``label``: int64, ``key``: its file's path in the folder) in TFRecord framing (length, masked
  CRC-32C of the length, data, masked CRC-32C of the data), written by the ``tfrecord`` package,
  with its index beside it (``shard-NNNNN.tfrecord.idx``: offset and length of each record, the
  format of ``tfrecord.tools.tfrecord2idx``), so TensorFlow, ``tfrecord`` and DALI read it too.
* ``webdataset``: ``shard-NNNNN.tar`` written by ``webdataset.TarWriter``, one sample a key
  (``00000012.jpg`` + ``00000012.cls``), as ``webdataset.WebDataset`` reads it; its index
  (``shard-NNNNN.tar.idx``: offset and length of each sample's members) gives random access.

``records.json`` (written last: it marks a complete folder) records the format, the count, the
classes and each shard's and index's bytes and SHA-256. Opening checks every shard's size and
index (a truncated or missing shard is named before any read), and every read checks what the
format can: a TFRecord record's two CRCs, a tar member's header checksum, name and size.
``verify_records`` checks every SHA-256 (a changed byte inside a tar member's data is found there:
tar has no checksum over data).

:class:`RecordDataset` reads any sample by index (map-style: the user's own DataLoader, shuffle
and workers); :class:`RecordStream` reads the shards in order as an ``IterableDataset``, each
worker (and each rank) a contiguous share, shuffled through a buffer: how TFRecord and WebDataset
are meant to be read.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import struct
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from looptune._io import atomic_write_text
from looptune.data.pack.format import file_sha256
from looptune.errors import ConfigError, DataError

__all__ = ["RECORD_FORMATS", "RECORDS_NAME", "RecordDataset", "RecordStream", "is_records",
           "open_records", "pack_records", "records_missing", "verify_records"]

RECORD_FORMATS = ("tfrecord", "webdataset")
RECORDS_NAME = "records.json"
SCHEMA = 1
DEFAULT_SHARD_BYTES = 64 << 20  # several shards for a few GB: the stream splits over workers
_SUFFIX = {"tfrecord": ".tfrecord", "webdataset": ".tar"}
_PACKAGE = {"tfrecord": "tfrecord", "webdataset": "webdataset"}
_MAGIC = ((b"\xff\xd8\xff", "jpg"), (b"\x89PNG\r\n\x1a\n", "png"))

Transform = Callable[..., Any]  # (bytes, name) -> the sample's input


def records_missing(format: str) -> str | None:
    """Why ``format`` cannot be written or read here, or None."""
    if format not in RECORD_FORMATS:
        return f"format={format!r} is not a record format (allowed: {', '.join(RECORD_FORMATS)})"
    need = ["tfrecord", "crc32c"] if format == "tfrecord" else ["webdataset"]
    if any(importlib.util.find_spec(m) is None for m in need):
        return (f"format {format!r} needs the {_PACKAGE[format]} package: pip install "
                f"'looptune[{format}]'")
    return None


def is_records(folder: str | os.PathLike) -> bool:
    return (Path(folder) / RECORDS_NAME).is_file()


# ---- writing ------------------------------------------------------------------------------

def pack_records(source: Any, out: str | os.PathLike, *, format: str,
                 shard_bytes: int = DEFAULT_SHARD_BYTES, overwrite: bool = False,
                 progress: Callable[[int, int], None] | None = None) -> Path:
    """Write every sample's encoded bytes and label into ``format`` shards under ``out``.

    Args:
        source: an image folder's :class:`~looptune.data.image_folder.Samples` (each file's bytes
            as they are on disk), or a map-style dataset of ``(bytes, int label)`` pairs.
        format: ``"tfrecord"`` or ``"webdataset"``.
        shard_bytes: the most bytes of samples per shard (a shard holds at least one sample).
        overwrite: replace an existing records folder; the old one stays until the new one is
            complete.
        progress: ``progress(done, total)`` after each shard.

    Raises:
        ConfigError: every bad argument at once (and a missing package), before anything is read.
        DataError: a sample that is not ``(bytes, int)``; the disk filled up (OUT untouched).
    """
    from looptune.data.image_folder import Samples
    from looptune.data.pack.writer import _existing_problem, write_folder

    out = Path(out)
    problems = []
    if format not in RECORD_FORMATS:
        problems.append(f"format={format!r} is invalid: allowed {', '.join(RECORD_FORMATS)}.")
    elif missing := records_missing(format):
        problems.append(missing)
    if isinstance(shard_bytes, bool) or not isinstance(shard_bytes, int) or shard_bytes < 1:
        problems.append(f"shard_bytes={shard_bytes!r} is invalid: must be an int >= 1, e.g. "
                        f"{DEFAULT_SHARD_BYTES} (64 MiB).")
    if not out.parent.is_dir():
        problems.append(f"out={str(out)!r}: the folder {str(out.parent)!r} does not exist. "
                        f"Create it first (mkdir -p {out.parent}).")
    if out.exists() or out.is_symlink():
        problems += _existing_problem(out, overwrite, marker=RECORDS_NAME)
    if not isinstance(source, Samples) and not hasattr(source, "__getitem__"):
        problems.append(f"source of type {type(source).__name__} is neither an image folder's "
                        "Samples nor a map-style dataset of (bytes, label) pairs")
    if problems:
        raise ConfigError(problems)

    def fill(tmp: Path) -> None:
        shards = _write(source, tmp, format, shard_bytes, progress)
        classes = list(source.classes) if isinstance(source, Samples) else None
        meta = {"kind": "looptune-records", "schema": SCHEMA, "format": format,
                "num_samples": sum(s["count"] for s in shards), "classes": classes,
                "source": str(source.root) if isinstance(source, Samples) else None,
                "shards": shards}
        atomic_write_text(tmp / RECORDS_NAME, json.dumps(meta, indent=1) + "\n")  # last

    return write_folder(out, fill)


def _items(source: Any) -> Iterator[tuple[str, bytes, int]]:
    from looptune.data.image_folder import Samples

    if isinstance(source, Samples):
        for path, label in zip(source.paths, source.labels):
            yield str(path.relative_to(source.root)), path.read_bytes(), int(label)
        return
    for i in range(len(source)):
        sample = source[i]
        if (not isinstance(sample, (tuple, list)) or len(sample) != 2
                or not isinstance(sample[0], (bytes, bytearray, memoryview))
                or isinstance(sample[1], bool) or not isinstance(sample[1], (int, np.integer))):
            raise DataError(f"sample {i}: {type(sample).__name__} is not a (bytes, int label) pair; "
                            "a record format stores encoded bytes. Return (encoded_bytes, label) "
                            "from the dataset, or pack decoded arrays with format memmap/lmdb.")
        yield str(i), bytes(sample[0]), int(sample[1])


def _ext(data: bytes) -> str:
    return next((ext for magic, ext in _MAGIC if data.startswith(magic)), "bin")


def _write(source: Any, tmp: Path, format: str, shard_bytes: int,
           progress: Callable[[int, int], None] | None) -> list[dict]:
    n = len(source)
    shards: list[dict] = []
    writer = None
    spans: list[tuple[int, int]] = []
    size = 0

    def close() -> None:
        name = f"shard-{len(shards):05d}{_SUFFIX[format]}"
        writer.finish()
        idx = tmp / (name + ".idx")
        atomic_write_text(idx, "".join(f"{o} {n_}\n" for o, n_ in spans))
        path = tmp / name
        os.chmod(path, 0o644)
        shards.append({"file": name, "index": idx.name, "count": len(spans),
                       "bytes": path.stat().st_size, "sha256": file_sha256(path),
                       "index_sha256": file_sha256(idx)})
        if progress is not None:
            progress(sum(s["count"] for s in shards), n)

    for i, (key, data, label) in enumerate(_items(source)):
        if writer is not None and size + len(data) > shard_bytes:
            close()
            writer, spans, size = None, [], 0
        if writer is None:
            writer = _Writer(tmp / f"shard-{len(shards):05d}{_SUFFIX[format]}", format)
        spans.append(writer.write(i, key, data, label))
        size += len(data)
    if writer is not None:
        close()
    return shards


class _Writer:
    """One shard being written; ``write`` returns the sample's (offset, length) in the file."""

    def __init__(self, path: Path, format: str) -> None:
        self.format = format
        if format == "tfrecord":
            from tfrecord import TFRecordWriter

            self.tf = TFRecordWriter(str(path))
            self.file = self.tf.file  # its offsets give the index
        else:
            import webdataset as wds

            self.file = open(path, "wb")
            self.tar = wds.TarWriter(self.file, encoder=False, mtime=0, user="looptune",
                                     group="looptune", mode=0o644)

    def write(self, i: int, key: str, data: bytes, label: int) -> tuple[int, int]:
        if self.format == "tfrecord":
            start = self.file.tell()
            self.tf.write({"image": (data, "byte"), "label": (label, "int"),
                           "key": (key.encode("utf-8"), "byte")})
            return start, self.file.tell() - start
        start = self.tar.tarstream.offset
        self.tar.write({"__key__": f"{i:08d}", "cls": str(label).encode("ascii"), _ext(data): data})
        return start, self.tar.tarstream.offset - start

    def finish(self) -> None:
        if self.format == "webdataset":
            self.tar.tarstream.close()  # writes the end-of-archive blocks; the file stays ours
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()


# ---- reading ------------------------------------------------------------------------------

def _safe_name(name: Any, folder: Path, what: str) -> str:
    if (not isinstance(name, str) or not name or name in (".", "..") or "/" in name
            or "\\" in name or "\x00" in name):
        raise DataError(f"{folder / RECORDS_NAME}: {what} {name!r} is not a file name inside the "
                        "folder (a path that leaves it is refused). The folder was altered: "
                        "write it again with looptune pack.")
    return name


def open_records(folder: str | os.PathLike) -> dict:
    """The checked ``records.json`` of ``folder``, with each shard's index loaded.

    Raises:
        DataError: no or malformed ``records.json``, a shard name that leaves the folder, a
            missing or truncated shard or index (named), a package the format needs missing.
    """
    folder = Path(folder)
    path = folder / RECORDS_NAME
    if not path.is_file():
        raise DataError(f"{folder}: no {RECORDS_NAME}, so not a complete records folder. Write it "
                        "with: looptune pack --images DIR --format tfrecord|webdataset OUT.")
    try:
        meta = json.loads(path.read_text())
        fmt, shards = meta["format"], meta["shards"]
        if meta.get("kind") != "looptune-records" or fmt not in RECORD_FORMATS:
            raise ValueError(f"kind {meta.get('kind')!r}, format {fmt!r}")
        if meta.get("schema") != SCHEMA:
            raise ValueError(f"schema {meta.get('schema')!r}, this looptune reads {SCHEMA}")
    except (ValueError, KeyError, TypeError) as err:
        raise DataError(f"{path} is malformed ({err}). Write the folder again with "
                        "looptune pack --overwrite.") from None
    if missing := records_missing(fmt):
        raise ConfigError(f"{folder}: {missing}")
    spans = []
    for s in shards:
        shard = folder / _safe_name(s.get("file"), folder, "shard")
        index = folder / _safe_name(s.get("index"), folder, "index")
        for p, want in ((shard, s.get("bytes")), (index, None)):
            if not p.is_file():
                raise DataError(f"{p} is missing. Write the folder again with looptune pack "
                                "--overwrite.")
            if want is not None and p.stat().st_size != want:
                raise DataError(f"{p} has {p.stat().st_size} bytes, {RECORDS_NAME} says {want}: "
                                "it is truncated or was changed. Write the folder again.")
        table = np.loadtxt(index, dtype=np.int64, ndmin=2).reshape(-1, 2)
        if len(table) != s.get("count") or (len(table) and table[-1].sum() > s["bytes"]):
            raise DataError(f"{index}: {len(table)} entries for a shard of {s.get('count')} "
                            "samples, or past its end: the index was changed. Write it again.")
        spans.append(table)
    meta["_folder"], meta["_spans"] = folder, spans
    return meta


def verify_records(folder: str | os.PathLike) -> list[str]:
    """Every shard's and index's SHA-256 against ``records.json``: the problems (empty: all good)."""
    meta = open_records(folder)
    problems = []
    for s in meta["shards"]:
        for name, want in ((s["file"], s["sha256"]), (s["index"], s["index_sha256"])):
            got = file_sha256(meta["_folder"] / name)
            if got != want:
                problems.append(f"{name}: SHA-256 {got[:16]}... differs from the recorded "
                                f"{want[:16]}...")
    return problems


class _Shards:
    """Shared by both readers: the folder's shards, the global index, per-process file handles."""

    def __init__(self, folder: str | os.PathLike, transform: Transform | None) -> None:
        meta = open_records(folder)
        self.path, self.format = meta["_folder"], meta["format"]
        self.classes = meta["classes"]
        self.storage = self.format
        self.files_ = [s["file"] for s in meta["shards"]]
        self._spans = meta["_spans"]
        counts = [len(t) for t in self._spans]
        self._firsts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.transform = transform
        self._fds: dict[int, int] = {}
        self._pid = os.getpid()

    def __len__(self) -> int:
        return int(self._firsts[-1])

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_fds"] = {}  # each process opens its own
        return state

    def files(self) -> list[Path]:
        return [self.path / f for f in self.files_]

    def release(self) -> None:
        """Close every shard file (reopened on the next read)."""
        for fd in self._fds.values():
            os.close(fd)
        self._fds = {}

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def _fd(self, k: int) -> int:
        if os.getpid() != self._pid:  # forked: the parent's descriptors share one file offset
            self._fds, self._pid = {}, os.getpid()
        fd = self._fds.get(k)
        if fd is None:
            fd = self._fds[k] = os.open(self.path / self.files_[k], os.O_RDONLY)
        return fd

    def _locate(self, i: int) -> tuple[int, int]:
        k = int(np.searchsorted(self._firsts, i, side="right") - 1)
        return k, i - int(self._firsts[k])

    def _sample(self, k: int, j: int, buf: bytes) -> tuple[Any, int]:
        where = f"{self.files_[k]}, sample {j}"
        if len(buf) != int(self._spans[k][j, 1]):
            raise DataError(f"{self.path / self.files_[k]}: sample {j} is cut short (the file is "
                            "truncated). Run looptune pack --verify and write the folder again.")
        parse = _parse_tfrecord if self.format == "tfrecord" else _parse_tar
        data, label = parse(buf, where, int(self._firsts[k]) + j)
        if self.transform is not None:
            data = self.transform(data, str(self.path / where))
        return data, label


class RecordDataset(_Shards, Dataset):
    """Map-style: ``ds[i] -> (transform(bytes), label)`` (bytes when ``transform`` is None)."""

    def __init__(self, folder: str | os.PathLike, transform: Transform | None = None) -> None:
        super().__init__(folder, transform)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"index {i} is out of range for {n} samples")
        k, j = self._locate(i % n)
        offset, length = (int(v) for v in self._spans[k][j])
        return self._sample(k, j, os.pread(self._fd(k), length, offset))


class RecordStream(_Shards, IterableDataset):
    """The shards read in order, as the formats are meant to be read: each DataLoader worker (and
    each rank, with ``rank``/``world``) reads one contiguous share of the samples sequentially,
    through a shuffle buffer of ``shuffle_buffer`` samples seeded by ``(seed, epoch)``."""

    def __init__(self, folder: str | os.PathLike, transform: Transform | None = None, *,
                 shuffle_buffer: int = 1000, seed: int = 0, rank: int = 0, world: int = 1) -> None:
        if isinstance(shuffle_buffer, bool) or not isinstance(shuffle_buffer, int) or shuffle_buffer < 1:
            raise ConfigError(f"shuffle_buffer={shuffle_buffer!r}: must be an int >= 1 "
                              "(1: no shuffling; e.g. 1000)")
        if not (isinstance(world, int) and isinstance(rank, int) and 0 <= rank < world):
            raise ConfigError(f"rank={rank!r}, world={world!r}: need 0 <= rank < world")
        super().__init__(folder, transform)
        self.shuffle_buffer, self.seed, self.epoch = shuffle_buffer, seed, 0
        self.rank, self.world = rank, world

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _share(self) -> tuple[int, int, int]:
        info = get_worker_info()
        w, k = (0, 1) if info is None else (info.id, info.num_workers)
        part, parts = self.rank * k + w, self.world * k
        n = len(self)
        return part, n * part // parts, n * (part + 1) // parts

    def __iter__(self) -> Iterator[tuple[Any, int]]:
        part, lo, hi = self._share()
        rng = random.Random(hash((self.seed, self.epoch, part)))
        # the buffer holds records as read (bytes): each is checked and decoded as it leaves, so
        # a timed batch pays its own decodes, not ones done while the buffer filled
        buffer: list[tuple[int, int, bytes]] = []
        for record in self._read(lo, hi):
            if len(buffer) < self.shuffle_buffer:
                buffer.append(record)
                continue
            pick = rng.randrange(len(buffer))
            out, buffer[pick] = buffer[pick], record
            yield self._sample(*out)
        rng.shuffle(buffer)
        for record in buffer:
            yield self._sample(*record)

    def _read(self, lo: int, hi: int) -> Iterator[tuple[int, int, bytes]]:
        i = lo
        while i < hi:
            k, j = self._locate(i)
            stop = min(hi - int(self._firsts[k]), len(self._spans[k]))
            with open(self.path / self.files_[k], "rb", buffering=1 << 20) as f:
                f.seek(int(self._spans[k][j, 0]))
                for jj in range(j, stop):
                    offset, length = (int(v) for v in self._spans[k][jj])
                    if f.tell() != offset:
                        f.seek(offset)
                    yield k, jj, f.read(length)
            i = int(self._firsts[k]) + stop


# ---- the two formats' framing -------------------------------------------------------------

def _parse_tfrecord(buf: bytes, where: str, index: int) -> tuple[bytes, int]:
    from tfrecord import TFRecordWriter, example_pb2

    if len(buf) < 16:
        raise DataError(f"{where}: {len(buf)} bytes cannot be a TFRecord record")
    crc = TFRecordWriter.masked_crc  # the framing's masked CRC-32C, as the writer computes it
    (length,) = struct.unpack_from("<Q", buf, 0)
    if crc(buf[:8]) != buf[8:12] or length != len(buf) - 16:
        raise DataError(f"{where}: the record's length field fails its CRC (or disagrees with the "
                        "index): the shard is corrupt. Run looptune pack --verify; write it again.")
    data = buf[12:12 + length]
    if crc(data) != buf[12 + length:16 + length]:
        raise DataError(f"{where}: the record's data fails its CRC-32C: the shard is corrupt. Run "
                        "looptune pack --verify and write the folder again.")
    try:
        feature = example_pb2.Example.FromString(data).features.feature
        return bytes(feature["image"].bytes_list.value[0]), int(feature["label"].int64_list.value[0])
    except Exception as err:  # noqa: BLE001 - protobuf raises its own DecodeError, IndexError...
        raise DataError(f"{where}: not a looptune Example (image, label): {err}") from None


def _parse_tar(buf: bytes, where: str, index: int) -> tuple[bytes, int]:
    members: dict[str, bytes] = {}
    pax: dict[str, str] = {}
    pos = 0
    while pos + 512 <= len(buf):
        try:
            info = tarfile.TarInfo.frombuf(buf[pos:pos + 512], "utf-8", "surrogateescape")
        except tarfile.HeaderError as err:
            raise DataError(f"{where}: a tar header is corrupt ({err}). Run looptune pack --verify "
                            "and write the folder again.") from None
        start = pos + 512
        name, size = pax.pop("path", info.name), int(pax.pop("size", info.size))
        if start + size > len(buf):
            raise DataError(f"{where}: member {name!r} runs past the sample's end: corrupt")
        if info.type in (tarfile.XHDTYPE, tarfile.XGLTYPE):  # a pax header: applies to the next
            pax = _pax(buf[start:start + size])
        else:
            members[name] = buf[start:start + size]
        pos = start + -(-size // 512) * 512
    key = f"{index:08d}"
    cls = members.pop(f"{key}.cls", None)
    image = [v for name, v in members.items() if name.startswith(f"{key}.")]
    if cls is None or len(image) != 1 or len(members) != 1:
        raise DataError(f"{where}: members {sorted(members)} are not {key}.cls and one image "
                        f"member named {key}.<ext>: the shard was changed. Write it again.")
    try:
        return image[0], int(cls.decode("ascii"))
    except ValueError:
        raise DataError(f"{where}: label {cls[:20]!r} is not an integer") from None


def _pax(data: bytes) -> dict[str, str]:
    """The ``key=value`` records of a pax extended header (``"LEN key=value\\n"`` each)."""
    out = {}
    for line in data.decode("utf-8", "replace").split("\n"):
        _, _, kv = line.partition(" ")
        key, sep, value = kv.partition("=")
        if sep:
            out[key] = value
    return out
