"""IDX format: round trips for every dtype and rank, and every corruption named in the error."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from looptune.data.idx import DTYPES, read_idx, read_idx_bytes, write_idx
from looptune.errors import DataError

SRC = Path(__file__).resolve().parents[2] / "src"
NATIVE_DTYPES = [d.newbyteorder("=") for d in DTYPES.values()]


def header(code: int, dims: tuple[int, ...]) -> bytes:
    return bytes([0, 0, code, len(dims)]) + b"".join(d.to_bytes(4, "big") for d in dims)


def put(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("compress", [False, True], ids=["raw", "gzip"])
@pytest.mark.parametrize("rank", [1, 2, 3])
@pytest.mark.parametrize("dtype", NATIVE_DTYPES, ids=lambda d: d.name)
def test_round_trip(tmp_path: Path, dtype: np.dtype, rank: int, compress: bool) -> None:
    shape = (5, 4, 3)[:rank]
    array = np.random.default_rng(0).integers(-100, 100, shape).astype(dtype)
    if dtype.kind == "f":
        array += 0.25  # exercise the fraction bits too
    path = write_idx(tmp_path / "x-idx", array, compress=compress)
    back = read_idx(path)
    assert back.dtype == dtype and back.dtype.isnative
    assert back.shape == shape
    np.testing.assert_array_equal(back, array)
    assert back.flags.writeable
    assert (path.read_bytes()[:2] == b"\x1f\x8b") == compress
    assert list(tmp_path.iterdir()) == [path]  # the atomic write leaves no temp file


def test_bytes_are_big_endian(tmp_path: Path) -> None:
    path = write_idx(tmp_path / "x", np.array([1, 256], dtype=np.int32))
    assert path.read_bytes() == header(0x0C, (2,)) + b"\x00\x00\x00\x01\x00\x00\x01\x00"


def test_gzip_detected_by_magic_not_name(tmp_path: Path) -> None:
    array = np.arange(6, dtype=np.uint8).reshape(2, 3)
    gz_named_raw = write_idx(tmp_path / "a.gz", array)
    raw_named_gz = write_idx(tmp_path / "b-idx", array, compress=True)
    np.testing.assert_array_equal(read_idx(gz_named_raw), array)
    np.testing.assert_array_equal(read_idx(raw_named_gz), array)
    assert read_idx_bytes(raw_named_gz) == gz_named_raw.read_bytes()


def test_check_gets_decompressed_bytes(tmp_path: Path) -> None:
    path = write_idx(tmp_path / "x.gz", np.zeros(3, np.uint8), compress=True)
    seen: list[bytes] = []
    read_idx(path, check=seen.append)
    assert seen == [header(0x08, (3,)) + b"\x00" * 3]


def test_empty_dimension_reads_as_empty_array(tmp_path: Path) -> None:
    path = write_idx(tmp_path / "x", np.zeros((0, 28), np.uint8))
    assert read_idx(path).shape == (0, 28)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"\x1f\x00\x08\x01" + b"\x00\x00\x00\x01" + b"\x07", ["bad magic", "1f 00", "expected 00 00"]),
        (header(0x0A, (1,)) + b"\x00", ["unknown IDX type code 0x0A", "0x08 (uint8)", "0x0E (float64)"]),
        (bytes([0, 0, 0x08, 0]), ["rank 0", "rank >= 1"]),
        (b"\x00\x00", ["truncated header", "at least 4 bytes", "holds 2"]),
        (header(0x08, (60000, 28, 28))[:10],
         ["truncated header", "rank 3 needs 16 header bytes", "holds 10"]),
        (header(0x08, (60000, 28, 28)) + bytes(1000),
         ["truncated", "header promises 47040000 data bytes (60000x28x28 uint8)", "the file holds 1000"]),
        (header(0x0C, (2, 3)) + bytes(25),
         ["trailing bytes", "promises 24 data bytes (2x3 int32)", "the file holds 25"]),
    ],
    ids=["bad-magic", "unknown-type", "rank-0", "short-header", "truncated-dims", "truncated", "trailing"],
)
def test_corrupt_header_or_payload(tmp_path: Path, data: bytes, expected: list[str]) -> None:
    path = put(tmp_path / "train-images-idx3-ubyte", data)
    with pytest.raises(DataError) as info:
        read_idx(path)
    message = str(info.value)
    assert str(path) in message
    for part in expected:
        assert part in message
    assert "re-download or re-create" in message


def test_truncated_payload_in_gzip_says_decompressed(tmp_path: Path) -> None:
    data = gzip.compress(header(0x08, (10, 28, 28)) + bytes(100))
    path = put(tmp_path / "t10k-images-idx3-ubyte.gz", data)
    with pytest.raises(DataError, match=r"promises 7840 data bytes .* decompressed file holds 100"):
        read_idx(path)


@pytest.mark.parametrize("damage", ["truncated", "bad-crc", "bad-header"])
def test_corrupt_gzip_is_a_data_error(tmp_path: Path, damage: str) -> None:
    good = gzip.compress(header(0x08, (1000,)) + bytes(range(256)) * 4)
    if damage == "truncated":
        data = good[: len(good) // 2]
    elif damage == "bad-crc":
        data = good[:-8] + bytes(4) + good[-4:]  # the trailer is CRC32 then size
    else:
        data = good[:2] + b"\x63" + good[3:]  # compression method must be 8 (deflate)
    path = put(tmp_path / "labels.gz", data)
    with pytest.raises(DataError) as info:
        read_idx(path)
    assert str(path) in str(info.value) and "corrupt gzip stream" in str(info.value)
    with pytest.raises(DataError, match="corrupt gzip stream"):
        read_idx_bytes(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"nope-idx1-ubyte: no such file"):
        read_idx(tmp_path / "nope-idx1-ubyte")


def test_folder_is_not_readable_as_a_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="cannot read the file"):
        read_idx(tmp_path)


@pytest.mark.parametrize(
    ("array", "expected"),
    [
        (np.zeros(3, np.int64), "dtype int64 has no IDX type code; allowed: uint8, int8"),
        (np.zeros(3, np.bool_), "dtype bool has no IDX type code"),
        (np.float32(1.0), "rank 0 cannot be written"),
    ],
    ids=["int64", "bool", "scalar"],
)
def test_write_rejects_what_idx_cannot_hold(tmp_path: Path, array: np.ndarray, expected: str) -> None:
    with pytest.raises(DataError, match=expected):
        write_idx(tmp_path / "x", array)
    assert list(tmp_path.iterdir()) == []


def test_write_replaces_existing_file(tmp_path: Path) -> None:
    path = write_idx(tmp_path / "x", np.zeros(3, np.uint8))
    write_idx(path, np.ones(2, np.uint8))
    np.testing.assert_array_equal(read_idx(path), np.ones(2, np.uint8))


def test_errors_survive_python_O(tmp_path: Path) -> None:
    path = put(tmp_path / "train-labels-idx1-ubyte", header(0x08, (60000,)) + bytes(10))
    # a bare package stub skips looptune/__init__.py, whose torch import would cost seconds
    script = (
        "import sys, types\n"
        "sys.modules['looptune'] = pkg = types.ModuleType('looptune')\n"
        "pkg.__path__ = [sys.argv[2]]\n"
        "from looptune.data.idx import read_idx\n"
        "from looptune.errors import DataError\n"
        "assert False, 'asserts must be stripped under -O'\n"
        "try:\n"
        "    read_idx(sys.argv[1])\n"
        "except DataError as exc:\n"
        "    print('DataError:', exc)\n"
        "    sys.exit(0)\n"
        "sys.exit('no DataError raised')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    command = [sys.executable, "-O", "-c", script, str(path), str(SRC / "looptune")]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "DataError:" in done.stdout and "header promises 60000 data bytes" in done.stdout
