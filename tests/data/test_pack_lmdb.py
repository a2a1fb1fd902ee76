"""Tests for the lmdb storage of packed datasets (skipped, with the reason, without ``lmdb``)."""

from __future__ import annotations

import builtins
import errno
import json
import pickle

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from looptune.data.pack import lmdb_store, open_packed, pack, verify_packed, writer
from looptune.errors import ConfigError, DataError

lmdb = pytest.importorskip("lmdb", reason="the lmdb extra is not installed (pip install lmdb)")


def _ds(n=30):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(2, 3, generator=g), torch.tensor(i % 5)) for i in range(n)]


def test_round_trip_tuple_dict_single_and_every_dtype(tmp_path):
    ds = _ds(30)
    back = open_packed(pack(ds, tmp_path / "t", format="lmdb"))
    assert back.storage == "lmdb" and len(back) == 30
    for i in (0, 7, 29, -1):
        x, y = back[i]
        assert torch.equal(x, ds[i][0]) and torch.equal(y, ds[i][1])
    dicts = [{"img": np.full((2, 2), i, dtype=np.uint16), "w": 0.25 * i, "ok": i % 2 == 0}
             for i in range(5)]
    back = open_packed(pack(dicts, tmp_path / "d", format="lmdb"))
    assert back[3]["img"].dtype == torch.uint16
    assert int(back[3]["img"][0, 0]) == 3 and float(back[3]["w"]) == 0.75 and not bool(back[3]["ok"])
    for dtype in (np.int8, np.float16, np.complex64, np.bool_, np.int64):
        arrs = [np.ones(3, dtype=dtype)] * 2
        got = open_packed(pack(arrs, tmp_path / f"s{np.dtype(dtype).name}", format="lmdb"))[1]
        assert np.array_equal(got.numpy(), arrs[1]) and got.numpy().dtype == np.dtype(dtype)


def test_variable_shapes_are_kept_and_marked_in_the_header(tmp_path):
    ds = [(torch.arange(i + 1, dtype=torch.float32).reshape(1, i + 1), i) for i in range(6)]
    out = pack(ds, tmp_path / "v", format="lmdb", shard_bytes=64)
    header = json.loads((out / "header.json").read_text())
    assert header["storage"] == "lmdb"
    assert header["fields"][0]["shape"] == [1, None]  # dim 0 fixed, dim 1 varies
    assert len(header["shards"]) > 1  # several shards at 64 bytes each
    back = open_packed(out)
    for i in range(6):
        assert torch.equal(back[i][0], ds[i][0])
    xs, ys = back.get_batch([5, 0, 3])
    assert isinstance(xs, list) and [x.shape[1] for x in xs] == [6, 1, 4]
    assert ys.tolist() == [5, 0, 3]  # fixed-shape fields still stack


def test_number_of_dimensions_may_not_vary(tmp_path):
    with pytest.raises(DataError, match=r"sample 1, field '0': 2 dimensions.*expected 1"):
        pack([torch.zeros(3), torch.zeros(2, 2)], tmp_path / "p", format="lmdb")
    assert list(tmp_path.iterdir()) == []


def test_get_batch_across_shards_equals_getitem(tmp_path):
    back = open_packed(pack(_ds(40), tmp_path / "p", format="lmdb", shard_bytes=500))
    assert len(back.header.shards) > 2
    idx = [39, 0, 17, 17, -1, 5]
    xb, yb = back.get_batch(idx)
    assert torch.equal(xb, torch.stack([back[i][0] for i in idx]))
    assert torch.equal(yb, torch.stack([back[i][1] for i in idx]))
    with pytest.raises(IndexError, match="40 samples"):
        back.get_batch([40])


def test_pickle_and_dataloader_workers(tmp_path):
    back = open_packed(pack(_ds(40), tmp_path / "p", format="lmdb", shard_bytes=400))
    back[3]
    assert back._lmdb._envs
    assert pickle.loads(pickle.dumps(back))._lmdb._envs == {}
    ref = list(DataLoader(back, batch_size=8))
    sampler = torch.utils.data.BatchSampler(range(40), batch_size=8, drop_last=False)
    got = list(DataLoader(back, sampler=sampler, batch_size=None, num_workers=2))
    for (a, b), (c, d) in zip(ref, got):
        assert torch.equal(a, c) and torch.equal(b, d)


def test_verify_detects_a_flipped_byte_and_truncation(tmp_path):
    out = pack(_ds(20), tmp_path / "p", format="lmdb")
    assert verify_packed(out) == []
    shard = out / "shard-00000.lmdb"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    (problem,) = verify_packed(out)
    assert "shard-00000.lmdb" in problem and "expected" in problem
    shard.write_bytes(bytes(data[:-4096]))
    with pytest.raises(DataError, match=r"shard-00000.lmdb.*bytes, expected"):
        open_packed(out)


def test_empty_dataset(tmp_path):
    back = open_packed(pack([], tmp_path / "e", format="lmdb"))
    assert len(back) == 0 and back.storage == "lmdb"


def test_disk_full_keeps_the_old_dataset(tmp_path, monkeypatch):
    out = pack(_ds(3), tmp_path / "p", format="lmdb")

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(lmdb_store, "_write_shard", full)
    with pytest.raises(DataError, match="is full"):
        pack(_ds(10), out, format="lmdb", overwrite=True)
    assert len(open_packed(out)) == 3 and verify_packed(out) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p"]


def test_missing_lmdb_package_is_a_clear_error_before_any_work(tmp_path, monkeypatch):
    real_import = builtins.__import__

    def no_lmdb(name, *args, **kwargs):
        if name == "lmdb":
            raise ImportError("No module named 'lmdb'")
        return real_import(name, *args, **kwargs)

    out = pack(_ds(2), tmp_path / "ok", format="lmdb")
    monkeypatch.setattr(builtins, "__import__", no_lmdb)
    assert "looptune[lmdb]" in writer.lmdb_missing()
    with pytest.raises(ConfigError, match=r"pip install 'looptune\[lmdb\]'"):
        pack(_ds(2), tmp_path / "p", format="lmdb")
    assert not (tmp_path / "p").exists()
    with pytest.raises(ConfigError, match="storage 'lmdb'.*looptune\\[lmdb\\]"):
        open_packed(out)


def test_release_closes_the_environments_and_reads_reopen_them(tmp_path):
    from looptune.data.pack import open_packed, pack

    ds = [torch.arange(i + 1, dtype=torch.int64) for i in range(20)]
    packed = open_packed(pack(ds, tmp_path / "l", format="lmdb"))
    before = packed[7]
    assert packed._lmdb._envs
    packed.release()
    assert packed._lmdb._envs == {} and torch.equal(torch.as_tensor(packed[7]), torch.as_tensor(before))
