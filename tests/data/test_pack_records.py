"""TFRecord and WebDataset shards: bytes in = bytes out, labels kept, read by index and streamed,
read back by the formats' own packages, and every fault named (tampered, truncated, a path that
leaves the folder, a missing package)."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from looptune.data import image_folder
from looptune.data.pack import records
from looptune.data.pack.records import (
    RECORDS_NAME,
    RecordDataset,
    RecordStream,
    open_records,
    pack_records,
    verify_records,
)
from looptune.errors import ConfigError, DataError

pytest.importorskip("tfrecord")
pytest.importorskip("webdataset")

FORMATS = ["tfrecord", "webdataset"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> image_folder.Samples:
    """40 real JPEGs (and 2 PNGs) of varied sizes in 3 class folders."""
    root = tmp_path_factory.mktemp("imgs")
    rng = np.random.default_rng(0)
    for i in range(42):
        cls = root / f"c{i % 3}"
        cls.mkdir(exist_ok=True)
        w, h = int(rng.integers(20, 60)), int(rng.integers(20, 60))
        img = Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8))
        img.save(cls / (f"{i:03d}.png" if i >= 40 else f"{i:03d}.jpg"), quality=90)
    return image_folder.scan(root)


def _pack(folder, tmp_path, fmt, **kw) -> Path:
    return pack_records(folder, tmp_path / f"r-{fmt}", format=fmt, **kw)


@pytest.mark.parametrize("fmt", FORMATS)
def test_bytes_in_are_bytes_out_with_labels_by_index_and_streamed(folder, tmp_path, fmt):
    out = _pack(folder, tmp_path, fmt, shard_bytes=20_000)
    meta = json.loads((out / RECORDS_NAME).read_text())
    assert meta["num_samples"] == 42 and meta["classes"] == ["c0", "c1", "c2"]
    assert len(meta["shards"]) > 3  # several shards: the split across shards is exercised
    ds = RecordDataset(out)
    for i in range(len(ds)):
        data, label = ds[i]
        assert data == folder.paths[i].read_bytes() and label == folder.labels[i]
    assert ds[-1][0] == folder.paths[-1].read_bytes()
    with pytest.raises(IndexError):
        ds[42]
    streamed = list(RecordStream(out, shuffle_buffer=8))
    want = sorted((p.read_bytes(), y) for p, y in zip(folder.paths, folder.labels))
    assert sorted(streamed) == want  # each sample exactly once
    assert verify_records(out) == []


def test_a_dataset_of_encoded_bytes_packs_too_and_a_wrong_sample_is_named(tmp_path):
    blobs = [(bytes([i]) * (i + 1), i % 4) for i in range(10)]
    out = pack_records(blobs, tmp_path / "b", format="tfrecord")
    assert [RecordDataset(out)[i] for i in range(10)] == blobs
    with pytest.raises(DataError, match=r"sample 1: .*not a \(bytes, int label\) pair"):
        pack_records([(b"x", 0), (torch.zeros(2), 1)], tmp_path / "c", format="webdataset")
    assert not (tmp_path / "c").exists() and not list(tmp_path.glob(".c.tmp-*"))


@pytest.mark.parametrize("fmt", FORMATS)
def test_workers_and_ranks_share_the_stream_exactly_once_and_epochs_differ(folder, tmp_path, fmt):
    out = _pack(folder, tmp_path, fmt, shard_bytes=20_000)
    labels_of = {p.read_bytes(): y for p, y in zip(folder.paths, folder.labels)}
    seen = []
    for rank in range(2):
        stream = RecordStream(out, shuffle_buffer=4, rank=rank, world=2)
        loader = DataLoader(stream, batch_size=None, num_workers=2)
        seen += [data for data, label in loader if labels_of[data] == label]
    assert sorted(seen) == sorted(labels_of)  # 2 ranks x 2 workers: each sample once, labels kept
    stream = RecordStream(out, shuffle_buffer=16, seed=3)
    orders = []
    for epoch in (0, 1, 0):
        stream.set_epoch(epoch)
        orders.append([d for d, _ in stream])
    assert orders[0] == orders[2] != orders[1]  # seeded by (seed, epoch)


def test_the_formats_own_readers_read_our_shards(folder, tmp_path):
    import webdataset as wds
    from tfrecord.reader import tfrecord_loader

    tf = _pack(folder, tmp_path, "tfrecord", shard_bytes=20_000)
    got = []
    for s in open_records(tf)["shards"]:
        # tfrecord's own index loader cannot read a one-line index (a 1-D array): not ours to fix
        index = str(tf / s["index"]) if s["count"] > 1 else None
        got += [(bytes(ex["image"]), int(ex["label"][0]))  # shard=(0, 1): in order, by the index
                for ex in tfrecord_loader(str(tf / s["file"]), index,
                                          {"image": "byte", "label": "int"}, shard=(0, 1))]
    assert got == [(p.read_bytes(), y) for p, y in zip(folder.paths, folder.labels)]
    web = _pack(folder, tmp_path, "webdataset", shard_bytes=20_000)
    urls = [str(web / s["file"]) for s in open_records(web)["shards"]]
    got = [(s.get("jpg", s.get("png")), int(s["cls"])) for s in wds.WebDataset(urls, shardshuffle=False)]
    assert got == [(p.read_bytes(), y) for p, y in zip(folder.paths, folder.labels)]


def test_decoded_through_decode_resize_like_the_folder(folder, tmp_path):
    from looptune.data.jpeg import DecodeResize, ResizedFolder

    out = _pack(folder, tmp_path, "webdataset")
    ds, original = RecordDataset(out, DecodeResize(16)), ResizedFolder(folder, 16)
    for i in (0, 17, 41):
        assert torch.equal(ds[i][0], original[i][0]) and ds[i][1] == original[i][1]


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_tampered_tfrecord_fails_its_crc_on_read_and_verify_names_the_shard(folder, tmp_path):
    out = _pack(folder, tmp_path, "tfrecord", shard_bytes=20_000)
    meta = open_records(out)
    offset, length = meta["_spans"][0][1]
    _flip(out / meta["shards"][0]["file"], int(offset + length - 10))  # inside sample 1's image
    ds = RecordDataset(out)
    assert ds[0][0] == folder.paths[0].read_bytes()  # the others still read
    with pytest.raises(DataError, match=r"shard-00000.tfrecord, sample 1: .*CRC"):
        ds[1]
    with pytest.raises(DataError, match="CRC"):
        list(RecordStream(out))
    assert any(p.startswith("shard-00000.tfrecord: SHA-256") for p in verify_records(out))


def test_a_tampered_tar_header_fails_on_read_and_data_is_found_by_verify(folder, tmp_path):
    out = _pack(folder, tmp_path, "webdataset", shard_bytes=20_000)
    meta = open_records(out)
    shard = out / meta["shards"][0]["file"]
    offset, _ = meta["_spans"][0][1]
    _flip(shard, int(offset) + 2)  # sample 1's first member name
    with pytest.raises(DataError, match=r"shard-00000.tar, sample 1: a tar header is corrupt"):
        RecordDataset(out)[1]
    _flip(shard, int(offset) + 2)  # restored
    _flip(shard, int(offset) + 512 * 3 + 100)  # inside sample 1's image data: tar cannot tell
    assert RecordDataset(out)[1][0] != folder.paths[1].read_bytes()
    assert verify_records(out) == [p for p in verify_records(out) if "shard-00000.tar:" in p] != []


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_truncated_or_missing_shard_is_named_at_open(folder, tmp_path, fmt):
    out = _pack(folder, tmp_path, fmt, shard_bytes=20_000)
    shard = out / open_records(out)["shards"][1]["file"]
    shard.write_bytes(shard.read_bytes()[:-700])
    with pytest.raises(DataError, match=rf"{shard.name} has \d+ bytes, records.json says \d+"):
        RecordDataset(out)
    shard.unlink()
    with pytest.raises(DataError, match=rf"{shard.name} is missing"):
        RecordStream(out)


@pytest.mark.parametrize("name", ["../outside.tar", "/etc/passwd", "..", "a/b.tar"])
def test_a_shard_name_that_leaves_the_folder_is_refused(folder, tmp_path, name):
    out = _pack(folder, tmp_path, "webdataset")
    (tmp_path / "outside.tar").write_bytes(b"x")
    meta = json.loads((out / RECORDS_NAME).read_text())
    meta["shards"][0]["file"] = name
    (out / RECORDS_NAME).write_text(json.dumps(meta))
    with pytest.raises(DataError, match="not a file name inside the folder"):
        open_records(out)


def test_a_tar_member_named_outside_its_sample_is_refused(tmp_path):
    import tarfile

    out = pack_records([(b"\xff\xd8\xffabc", 1)], tmp_path / "w", format="webdataset")
    shard = out / "shard-00000.tar"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in (("00000000.cls", b"1"), ("../../evil.jpg", b"\xff\xd8\xffabc")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    fake = buf.getvalue()
    span = open_records(out)["_spans"][0][0]
    shard.write_bytes(fake[:int(span[1])].ljust(shard.stat().st_size, b"\0"))
    with pytest.raises(DataError, match=r"members .*evil.* are not 00000000.cls and one image"):
        RecordDataset(out)[0]


def test_bad_arguments_and_a_missing_package_are_refused_before_reading(folder, tmp_path, monkeypatch):
    with pytest.raises(ConfigError) as err:
        pack_records(folder, tmp_path / "no" / "x", format="parquet", shard_bytes=0)
    text = str(err.value)
    assert "format='parquet' is invalid" in text and "shard_bytes=0" in text and "mkdir -p" in text
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "mine.txt").write_text("keep")
    with pytest.raises(ConfigError, match="already exists"):
        pack_records(folder, tmp_path / "taken", format="tfrecord")
    with pytest.raises(ConfigError, match="not a packed dataset"):
        pack_records(folder, tmp_path / "taken", format="tfrecord", overwrite=True)
    assert (tmp_path / "taken" / "mine.txt").read_text() == "keep"
    real = records.importlib.util.find_spec
    monkeypatch.setattr(records.importlib.util, "find_spec",
                        lambda name, *a: None if name == "webdataset" else real(name, *a))
    with pytest.raises(ConfigError, match=r"pip install 'looptune\[webdataset\]'"):
        pack_records(folder, tmp_path / "w", format="webdataset")


def test_overwrite_replaces_a_records_folder(folder, tmp_path):
    out = _pack(folder, tmp_path, "tfrecord")
    pack_records([(b"abc", 2)], out, format="webdataset", overwrite=True)
    assert open_records(out)["format"] == "webdataset" and RecordDataset(out)[0] == (b"abc", 2)
    assert not list(tmp_path.glob(".r-tfrecord.*"))


def test_bench_records_times_the_folder_and_both_reads(folder, tmp_path):
    from looptune.data.jpeg import ResizedFolder
    from looptune.data.pack.throughput import bench_records

    out = _pack(folder, tmp_path, "tfrecord", shard_bytes=20_000)
    result = bench_records(out, ResizedFolder(folder, 16), size=16, batch_size=4, batches=3,
                           repeats=1, warmup=1, cold=True)
    names = [r.name for r in result.rates]
    assert names == ["original", "tfrecord, random access", "tfrecord, streamed", "original (cold)",
                     "tfrecord, random access (cold)", "tfrecord, streamed (cold)"]
    assert all(r.samples == 12 and r.bytes_per_batch == 4 * 3 * 16 * 16 + 4 * 8
               for r in result.rates)
    with pytest.raises(ConfigError, match="not the same data"):
        bench_records(out, list(range(5)), size=16)
    assert os.path.basename(result.packed) == "r-tfrecord"


def test_a_full_disk_leaves_no_folder_and_keeps_the_old_one(folder, tmp_path, monkeypatch):
    import errno

    old = _pack(folder, tmp_path, "tfrecord")
    before = (old / RECORDS_NAME).read_text()

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(records, "_write", full)
    with pytest.raises(DataError, match=r"disk holding .* is full .*nothing was changed"):
        pack_records(folder, old, format="webdataset", overwrite=True)
    assert (old / RECORDS_NAME).read_text() == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
