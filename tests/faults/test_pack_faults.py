"""Fault case 11: a packed dataset that was tampered with, or whose header lies, is refused, and
nothing outside its folder is ever opened (checked with an audit hook on every ``open``)."""

from __future__ import annotations

import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from looptune.cli.main import main as cli_main
from looptune.data.pack import open_packed, pack, verify_packed
from looptune.errors import DataError

_OPENED: list[str] | None = None  # set while a test watches; the hook cannot be removed


def _audit(event: str, args: tuple) -> None:
    if _OPENED is not None and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        _OPENED.append(os.fsdecode(args[0]))


sys.addaudithook(_audit)


@contextmanager
def opened_files():
    """Every path passed to ``open`` (Python's, numpy's memmap included) inside the block."""
    global _OPENED
    _OPENED = seen = []
    try:
        yield seen
    finally:
        _OPENED = None


def _packed(tmp_path: Path, n: int = 12) -> Path:
    g = torch.Generator().manual_seed(0)
    data = [(torch.randn(4, generator=g), torch.tensor(i % 3)) for i in range(n)]
    return pack(data, tmp_path / "p", shard_bytes=16 * 4)  # 4 samples of 16 bytes per shard


def _edit_header(folder: Path, edit) -> None:
    raw = json.loads((folder / "header.json").read_text())
    edit(raw)
    (folder / "header.json").write_text(json.dumps(raw))


def _outside(tmp_path: Path, folder: Path, seen: list[str]) -> list[str]:
    root = folder.resolve()
    return [p for p in seen if Path(p).resolve().is_relative_to(tmp_path.resolve())
            and not Path(p).resolve().is_relative_to(root)]


def test_tampered_shard_of_the_same_size_is_refused_by_verify(tmp_path, capsys):
    out = _packed(tmp_path)
    shard = open_packed(out).header.shards[1]
    data = bytearray((out / shard.file).read_bytes())
    data[3] ^= 0x01  # one bit: same size, so only the hash can tell
    (out / shard.file).write_bytes(bytes(data))
    with pytest.raises(DataError) as err:
        open_packed(out, verify=True)
    msg = str(err.value)
    assert shard.file in msg and shard.sha256 in msg and "corrupt" in msg and "Re-pack" in msg
    (problem,) = verify_packed(out)
    assert shard.file in problem
    assert cli_main(["pack", "--verify", str(out)]) == 2  # a DataError: exit 2, message on stderr
    printed = capsys.readouterr()
    assert shard.file in printed.out + printed.err


@pytest.mark.parametrize("field, value, expect", [
    ("count", 5, "does not continue"),        # 5 samples claimed in a 4-sample shard
    ("bytes", 16 * 40, "does not continue"),  # bytes past the end of the file
    ("first", 100, "does not continue"),      # first sample outside the dataset
    ("count", -4, "does not continue"),
])
def test_header_field_pointing_outside_its_shard_is_refused(tmp_path, field, value, expect):
    out = _packed(tmp_path)

    def edit(raw):
        raw["shards"][0][field] = value
    _edit_header(out, edit)
    with opened_files() as seen, pytest.raises(DataError, match=expect) as err:
        open_packed(out)
    assert "header.json" in str(err.value) and "Re-pack" in str(err.value)
    assert not [p for p in seen if p.endswith(".bin")]  # refused before any shard was opened


def test_header_claiming_more_samples_than_the_shards_hold_is_refused(tmp_path):
    out = _packed(tmp_path)
    _edit_header(out, lambda raw: raw.update(num_samples=1000))
    with pytest.raises(DataError, match="cover 12 of 1000 samples"):
        open_packed(out)


def test_consistent_header_but_file_smaller_is_refused(tmp_path):
    out = _packed(tmp_path)

    def edit(raw):  # consistent with itself (4 more samples in each field's last shard)
        for name in ("0", "1"):
            last = [s for s in raw["shards"] if s["field"] == name][-1]
            last["bytes"] += last["bytes"]
            last["count"] += last["count"]
        raw["num_samples"] = 16
    _edit_header(out, edit)
    with pytest.raises(DataError, match=r"has 64 bytes, expected 128 \(truncated or corrupt\)"):
        open_packed(out)


@pytest.mark.parametrize("name", ["../secret.bin", "..", "/etc/passwd", "sub/../../secret.bin",
                                  "..\\secret.bin", ".hidden", "header.json"])
def test_shard_name_with_a_path_is_refused_and_nothing_outside_is_opened(tmp_path, name):
    out = _packed(tmp_path)
    (tmp_path / "secret.bin").write_bytes(b"\0" * 64)

    def edit(raw):
        raw["shards"][0]["file"] = name
    _edit_header(out, edit)
    with opened_files() as seen:
        with pytest.raises(DataError, match="not a plain file name"):
            open_packed(out)
        with pytest.raises(DataError):
            verify_packed(out)
    assert _outside(tmp_path, out, seen) == []
    assert not any(p.endswith("passwd") for p in seen)


def test_shard_that_is_a_link_outside_the_folder_is_refused_unread(tmp_path):
    out = _packed(tmp_path)
    shard = open_packed(out).header.shards[0]
    secret = tmp_path / "secret.bin"
    secret.write_bytes((out / shard.file).read_bytes())  # same size: only the place gives it away
    (out / shard.file).unlink()
    (out / shard.file).symlink_to(secret)
    with opened_files() as seen:
        with pytest.raises(DataError, match="outside the folder"):
            open_packed(out)
        (problem, ) = verify_packed(out)
    assert "outside the folder" in problem and shard.file in problem
    assert _outside(tmp_path, out, seen) == []


def test_two_shards_naming_one_file_are_refused(tmp_path):
    out = _packed(tmp_path)

    def edit(raw):
        raw["shards"][1]["file"] = raw["shards"][0]["file"]
    _edit_header(out, edit)
    with pytest.raises(DataError, match="two shards name the same file"):
        open_packed(out)


@pytest.mark.parametrize("version", [2, 0, "1", None, 1.5])
def test_unknown_version_is_refused_before_reading_shards(tmp_path, version):
    out = _packed(tmp_path)
    _edit_header(out, lambda raw: raw.update(version=version))
    with opened_files() as seen, pytest.raises(DataError, match="version") as err:
        open_packed(out)
    assert repr(version) in str(err.value) or str(version) in str(err.value)
    assert not [p for p in seen if p.endswith(".bin")]


def test_an_intact_pack_still_opens_with_verify(tmp_path):
    out = _packed(tmp_path)
    with opened_files() as seen:
        ds = open_packed(out, verify=True)
        batch = ds.get_batch([0, 5, 11])
    assert len(ds) == 12 and batch[0].shape == (3, 4)
    assert _outside(tmp_path, out, seen) == []
