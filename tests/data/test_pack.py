"""Tests for looptune.data.pack: round trips, sharding, integrity, atomicity, error messages."""

from __future__ import annotations

import errno
import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from looptune.data.pack import (
    FORMAT_VERSION,
    PackedDataset,
    open_packed,
    pack,
    verify_packed,
    writer,
)
from looptune.data.pack import format as fmt
from looptune.errors import ConfigError, DataError


def _tmp_leftovers(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if ".tmp-" in p.name or ".old-" in p.name]


def _assert_same(a, b) -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b)
        for k in a:
            _assert_same(a[k], b[k])
    elif isinstance(a, (tuple, list)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same(x, y)
    else:
        expected = torch.as_tensor(np.asarray(a)) if not isinstance(a, torch.Tensor) else a
        assert isinstance(b, torch.Tensor)
        assert b.dtype == expected.dtype and b.shape == expected.shape
        assert torch.equal(b, expected)


def _tuple_ds(n=10):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(2, 3, generator=g), torch.tensor(i % 7)) for i in range(n)]


# ------------------------------------------------------------------ round trips

@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.int32, np.int64, np.float16,
                                   np.float32, np.float64, np.bool_, np.complex64, np.uint16])
def test_round_trip_every_numpy_dtype(tmp_path, dtype):
    rng = np.random.default_rng(0)
    ds = [(rng.random((3, 2)) * 100).astype(dtype) for _ in range(5)]
    out = pack(ds, tmp_path / "p")
    header = json.loads((out / "header.json").read_text())
    assert header["fields"][0]["dtype"][0] in "<|"  # explicit byte order
    back = open_packed(out)
    assert len(back) == 5
    for i, x in enumerate(ds):
        _assert_same(torch.from_numpy(x), back[i])


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int16, torch.int64, torch.float32,
                                   torch.float64, torch.bool, torch.float16])
def test_round_trip_torch_dtypes_in_tuple(tmp_path, dtype):
    ds = [(torch.arange(6).reshape(2, 3).to(dtype), torch.tensor(i)) for i in range(4)]
    back = open_packed(pack(ds, tmp_path / "p"))
    for i in range(4):
        _assert_same(ds[i], back[i])


def test_round_trip_dict_list_and_single(tmp_path):
    dicts = [{"image": torch.full((2, 2), i, dtype=torch.uint8), "label": i, "w": 0.5 * i}
             for i in range(6)]
    back = open_packed(pack(dicts, tmp_path / "d"))
    for i in range(6):
        _assert_same({"image": dicts[i]["image"], "label": torch.tensor(i, dtype=torch.int64),
                      "w": torch.tensor(0.5 * i, dtype=torch.float64)}, back[i])
    lists = [[np.float32(i), True] for i in range(3)]
    back = open_packed(pack(lists, tmp_path / "l"))
    assert isinstance(back[1], list)
    _assert_same([torch.tensor(1.0), torch.tensor(True)], back[1])
    singles = [torch.randn(4) for _ in range(3)]
    back = open_packed(pack(singles, tmp_path / "s"))
    for i in range(3):
        _assert_same(singles[i], back[i])


def test_python_numbers_come_back_as_0d_tensors(tmp_path):
    back = open_packed(pack([(3, 2.5, False)], tmp_path / "p"))
    x, y, z = back[0]
    assert (x.shape, x.dtype, int(x)) == ((), torch.int64, 3)
    assert (y.dtype, float(y)) == (torch.float64, 2.5)
    assert (z.dtype, bool(z)) == (torch.bool, False)


def test_unsafe_dict_key_gets_safe_file_name(tmp_path):
    ds = [{"a/b": torch.tensor(i), "field~1": torch.tensor(-i)} for i in range(3)]
    out = pack(ds, tmp_path / "p")
    assert all("/" not in p.name for p in out.iterdir())
    back = open_packed(out)
    assert int(back[2]["a/b"]) == 2 and int(back[2]["field~1"]) == -2


def test_empty_dataset_is_a_valid_packed_dataset(tmp_path):
    out = pack([], tmp_path / "e")
    back = open_packed(out)
    assert len(back) == 0 and back.header.kind == "empty"
    assert verify_packed(out) == []
    with pytest.raises(IndexError):
        back[0]


def test_one_sample(tmp_path):
    ds = _tuple_ds(1)
    back = open_packed(pack(ds, tmp_path / "p"))
    assert len(back) == 1
    _assert_same(ds[0], back[0])
    _assert_same(ds[0], back[-1])
    with pytest.raises(IndexError, match="out of range"):
        back[1]


# ------------------------------------------------------------------ shards

def test_shard_boundary_exact(tmp_path):
    ds = [torch.full((4,), i, dtype=torch.float32) for i in range(12)]  # 16 bytes per sample
    out = pack(ds, tmp_path / "p", shard_bytes=3 * 16)
    shards = open_packed(out).header.shards
    assert [(s.first, s.count, s.bytes) for s in shards] == [(0, 3, 48), (3, 3, 48), (6, 3, 48),
                                                             (9, 3, 48)]
    assert all((out / s.file).stat().st_size <= 48 for s in shards)
    back = open_packed(out)
    for i in range(12):
        _assert_same(ds[i], back[i])


def test_shard_smaller_than_a_sample_holds_one_sample(tmp_path):
    out = pack(_tuple_ds(5), tmp_path / "p", shard_bytes=1)
    shards = open_packed(out).header.shards
    assert len(shards) == 10 and all(s.count == 1 for s in shards)


def test_progress_is_called(tmp_path):
    calls = []
    pack(_tuple_ds(10), tmp_path / "p", shard_bytes=24 * 4, progress=lambda d, n: calls.append((d, n)))
    assert calls == [(4, 10), (8, 10), (10, 10)]


def test_get_batch_equals_stacking_getitem(tmp_path):
    ds = [{"x": torch.randn(3), "y": i} for i in range(20)]
    back = open_packed(pack(ds, tmp_path / "p", shard_bytes=12 * 3))
    idx = [19, 0, 5, 5, 7, -1, 12]
    batch = back.get_batch(idx)
    for k in ("x", "y"):
        assert torch.equal(batch[k], torch.stack([back[i][k] for i in idx]))
    assert torch.equal(back.get_batch(torch.tensor(idx))["x"], batch["x"])
    assert back.get_batch([])["x"].shape == (0, 3)
    with pytest.raises(IndexError, match="20 samples"):
        back.get_batch([3, 20])


def test_pickle_drops_memmaps_and_reopens(tmp_path):
    back = open_packed(pack(_tuple_ds(6), tmp_path / "p", shard_bytes=30))
    before = back[4]
    assert back._maps
    copy = pickle.loads(pickle.dumps(back))
    assert copy._maps == {}
    _assert_same(before, copy[4])


def test_dataloader_with_workers_yields_identical_batches(tmp_path):
    back = open_packed(pack(_tuple_ds(40), tmp_path / "p", shard_bytes=24 * 7))
    ref = list(DataLoader(back, batch_size=8, num_workers=0))
    got = list(DataLoader(back, batch_size=8, num_workers=2))
    assert len(ref) == len(got) == 5
    for (a, b), (c, d) in zip(ref, got):
        assert torch.equal(a, c) and torch.equal(b, d)
    sampler = torch.utils.data.BatchSampler(range(40), batch_size=8, drop_last=False)
    batched = list(DataLoader(back, sampler=sampler, batch_size=None, num_workers=2))
    assert len(batched) == 5
    for (a, b), (c, d) in zip(ref, batched):  # ds[list] == get_batch, read in the workers
        assert torch.equal(a, c) and torch.equal(b, d)


# ------------------------------------------------------------------ header / integrity

def _rewrite_header(out: Path, **changes) -> None:
    h = json.loads((out / "header.json").read_text())
    h.update(changes)
    (out / "header.json").write_text(json.dumps(h))


def test_newer_version_is_refused_with_both_versions_and_fix(tmp_path):
    out = pack(_tuple_ds(2), tmp_path / "p")
    _rewrite_header(out, version=FORMAT_VERSION + 1, looptune_version="9.9.9")
    with pytest.raises(DataError) as err:
        open_packed(out)
    msg = str(err.value)
    assert f"version {FORMAT_VERSION + 1}" in msg and f"version {FORMAT_VERSION}" in msg
    assert "9.9.9" in msg and "re-pack" in msg.lower() and "upgrade" in msg.lower()


def test_older_version_is_refused_with_fix(tmp_path):
    out = pack(_tuple_ds(2), tmp_path / "p")
    _rewrite_header(out, version=0, looptune_version="0.0.1")
    with pytest.raises(DataError, match=r"version 0.*Re-pack with this looptune, or use looptune 0\.0\.1"):
        open_packed(out)


def test_missing_header_names_the_fix(tmp_path):
    out = pack(_tuple_ds(2), tmp_path / "p")
    (out / "header.json").unlink()
    with pytest.raises(DataError, match="no header.json.*Re-pack"):
        open_packed(out)
    with pytest.raises(DataError, match="no header.json"):
        verify_packed(out)
    with pytest.raises(DataError, match="does not exist"):
        open_packed(tmp_path / "nowhere")


def test_malformed_header(tmp_path):
    out = pack(_tuple_ds(2), tmp_path / "p")
    (out / "header.json").write_text("{not json")
    with pytest.raises(DataError, match="not valid JSON"):
        open_packed(out)
    (out / "header.json").write_text(json.dumps({
        "format": "looptune-pack", "version": 1, "num_samples": 5,
        "structure": {"kind": "single"}, "fields": [], "shards": []}))
    with pytest.raises(DataError, match="malformed"):
        open_packed(out)


def test_truncated_shard_detected_by_open_and_verify(tmp_path):
    out = pack(_tuple_ds(10), tmp_path / "p", shard_bytes=24 * 5)
    shard = open_packed(out).header.shards[1]
    data = (out / shard.file).read_bytes()
    (out / shard.file).write_bytes(data[:-3])
    problems = verify_packed(out)
    assert len(problems) == 1
    assert shard.file in problems[0] and f"{len(data) - 3} bytes, expected {len(data)}" in problems[0]
    with pytest.raises(DataError, match=f"{shard.file}.*{len(data) - 3} bytes, expected {len(data)}"):
        open_packed(out)


def test_corrupt_shard_detected_by_verify(tmp_path):
    out = pack(_tuple_ds(10), tmp_path / "p")
    shard = open_packed(out).header.shards[0]
    data = bytearray((out / shard.file).read_bytes())
    data[5] ^= 0xFF
    (out / shard.file).write_bytes(bytes(data))
    open_packed(out)  # same size: only the hash check sees it
    (problem,) = verify_packed(out)
    assert shard.file in problem and shard.sha256 in problem and "corrupt" in problem


def test_missing_shard(tmp_path):
    out = pack(_tuple_ds(3), tmp_path / "p")
    shard = open_packed(out).header.shards[0]
    (out / shard.file).unlink()
    assert any("missing" in p and shard.file in p for p in verify_packed(out))
    with pytest.raises(DataError, match="missing"):
        open_packed(out)


# ------------------------------------------------------------------ overwrite / atomicity

def test_existing_out_refused_without_overwrite(tmp_path):
    out = pack(_tuple_ds(2), tmp_path / "p")
    with pytest.raises(ConfigError, match="already exists.*overwrite=True"):
        pack(_tuple_ds(3), out)
    assert len(open_packed(out)) == 2
    assert _tmp_leftovers(tmp_path) == []


def test_overwrite_keeps_old_until_new_complete(tmp_path):
    out = pack(_tuple_ds(2), tmp_path / "p")
    seen = []

    class Watching:
        def __len__(self):
            return 4

        def __getitem__(self, i):
            seen.append(len(open_packed(out)))  # the old dataset is still whole while packing
            return torch.tensor(float(i))

    pack(Watching(), out, overwrite=True)
    assert seen == [2] * 4  # every sample read while the old folder was still whole
    assert len(open_packed(out)) == 4
    assert _tmp_leftovers(tmp_path) == []


def test_overwrite_refuses_a_folder_that_is_not_packed(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "precious.txt").write_text("x")
    with pytest.raises(ConfigError, match="not a packed dataset"):
        pack(_tuple_ds(2), tmp_path / "mine", overwrite=True)
    assert (tmp_path / "mine" / "precious.txt").exists()


class _Failing:
    def __len__(self):
        return 10

    def __getitem__(self, i):
        if i == 7:
            raise RuntimeError("boom at 7")
        return torch.tensor(i)


def test_failure_mid_write_leaves_no_out_and_no_temp(tmp_path):
    with pytest.raises(RuntimeError, match="boom"):
        pack(_Failing(), tmp_path / "p", shard_bytes=8 * 2)
    assert not (tmp_path / "p").exists()
    assert list(tmp_path.iterdir()) == []


def test_disk_full_mid_write_leaves_no_out_and_keeps_old(tmp_path, monkeypatch):
    out = pack(_tuple_ds(2), tmp_path / "p")
    real = writer._write_shard
    calls = []

    def full(path, data):
        calls.append(path)
        if len(calls) > 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, data)

    monkeypatch.setattr(writer, "_write_shard", full)
    with pytest.raises(DataError, match=r"disk holding .* is full \(No space.*nothing was changed"):
        pack(_tuple_ds(10), tmp_path / "q", shard_bytes=24 * 2)
    assert not (tmp_path / "q").exists()
    calls.clear()
    with pytest.raises(DataError, match="No space"):
        pack(_tuple_ds(10), out, shard_bytes=24 * 2, overwrite=True)
    assert len(open_packed(out)) == 2 and verify_packed(out) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p"]


def test_keyboard_interrupt_cleans_up(tmp_path, monkeypatch):
    def interrupt(path, data):
        raise KeyboardInterrupt

    monkeypatch.setattr(writer, "_write_shard", interrupt)
    with pytest.raises(KeyboardInterrupt):
        pack(_tuple_ds(3), tmp_path / "p")
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ bad input

def test_mismatched_shape_names_index_field_expected_actual(tmp_path):
    ds = [(torch.zeros(3), 0), (torch.zeros(3), 1), (torch.zeros(4), 2)]
    with pytest.raises(DataError, match=r"sample 2, field '0': shape \(4,\).*expected shape \(3,\)"):
        pack(ds, tmp_path / "p")
    assert list(tmp_path.iterdir()) == []


def test_mismatched_dtype(tmp_path):
    ds = [{"x": torch.zeros(2), "y": 1}, {"x": torch.zeros(2), "y": 1.5}]
    with pytest.raises(DataError, match=r"sample 1, field 'y'.*dtype <f8.*expected.*dtype <i8"):
        pack(ds, tmp_path / "p")


def test_mismatched_structure(tmp_path):
    with pytest.raises(DataError, match="sample 1: structure"):
        pack([(1, 2), (1, 2, 3)], tmp_path / "p")


@pytest.mark.parametrize("bad, typename", [("text", "str"), (None, "NoneType"),
                                           ((1, [2, 3]), "list"), (np.array(["a"]), "<U1")])
def test_unsupported_type_names_field_and_type(tmp_path, bad, typename):
    with pytest.raises(DataError, match=f"field .*{typename}"):
        pack([bad], tmp_path / "p")
    assert list(tmp_path.iterdir()) == []


def test_bfloat16_and_non_string_key_refused(tmp_path):
    with pytest.raises(DataError, match="bfloat16.*float32"):
        pack([torch.zeros(2, dtype=torch.bfloat16)], tmp_path / "p")
    with pytest.raises(DataError, match="string keys"):
        pack([{1: torch.zeros(1)}], tmp_path / "p")


def test_bad_arguments_collected(tmp_path):
    with pytest.raises(ConfigError) as err:
        pack(iter([1]), tmp_path / "missing" / "p", shard_bytes=0, format="tfrecord", workers=-1)
    assert len(err.value.problems) == 5
    text = str(err.value)
    assert "format='tfrecord' is invalid: allowed memmap, lmdb" in text
    assert "workers=-1 is invalid" in text


def test_other_os_errors_are_not_called_disk_full(tmp_path, monkeypatch):
    def denied(path, data):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(writer, "_write_shard", denied)
    with pytest.raises(PermissionError):
        pack(_tuple_ds(3), tmp_path / "p")
    assert list(tmp_path.iterdir()) == []


def test_workers_read_in_order_and_give_the_same_pack(tmp_path):
    ds = _tuple_ds(150)  # > one 64-sample worker chunk, several chunks per worker
    a = pack(ds, tmp_path / "a", shard_bytes=24 * 40)
    b = pack(ds, tmp_path / "b", shard_bytes=24 * 40, workers=2)
    ha, hb = json.loads((a / "header.json").read_text()), json.loads((b / "header.json").read_text())
    assert ha["shards"] == hb["shards"]  # same bytes, same hashes


def test_memmap_refuses_variable_shapes_and_points_at_lmdb(tmp_path):
    with pytest.raises(DataError, match="format='lmdb'"):
        pack([torch.zeros(3), torch.zeros(4)], tmp_path / "p")


def test_format_module_round_trip():
    spec = fmt.FieldSpec("0", "<f4", (2,))
    shard = fmt.ShardSpec(field="0", file="0-00000.bin", first=0, count=3, bytes=24, sha256="ab")
    h = fmt.build_header(num_samples=3, kind="single", fields=[spec], shards=[shard])
    parsed = fmt.parse_header(fmt.header_to_text(h), "x")
    assert parsed.fields == (spec,) and parsed.shards == (shard,) and parsed.kind == "single"
    assert parsed.fields[0].sample_bytes == 8 and parsed.storage == "memmap"


def test_record_codec_round_trip_and_corruption():
    fields = (fmt.FieldSpec("x", "<f4", (None, 2)), fmt.FieldSpec("y", "<i8", ()))
    arrays = [np.arange(6, dtype=np.float32).reshape(3, 2), np.array(7)]
    rec = fmt.encode_record(arrays, fields)
    assert len(rec) == (2 * 8 + 24) + (0 + 8)  # x: 2 dims + 6 floats; y: 0 dims + one int64
    back = fmt.decode_record(rec, fields)
    assert np.array_equal(back[0], arrays[0]) and int(back[1]) == 7
    with pytest.raises(DataError, match="corrupt"):
        fmt.decode_record(rec + b"x", fields)
    assert fmt.record_key(1) < fmt.record_key(256)  # big-endian: byte order == index order


def test_variable_shape_only_allowed_in_lmdb_header():
    h = fmt.build_header(num_samples=1, kind="single",
                         fields=[fmt.FieldSpec("0", "<f4", (None,))],
                         shards=[fmt.ShardSpec(field="*", file="shard-00000.lmdb", first=0, count=1, bytes=99, sha256="ab")],
                         storage="lmdb")
    assert fmt.parse_header(fmt.header_to_text(h), "x").fields[0].shape == (None,)
    with pytest.raises(DataError, match="malformed"):
        fmt.parse_header(fmt.header_to_text({**h, "storage": "memmap"}), "x")
    with pytest.raises(DataError, match="malformed"):
        fmt.parse_header(fmt.header_to_text({**h, "storage": "tfrecord"}), "x")


def test_header_layout_errors_are_data_errors():
    base = fmt.build_header(num_samples=3, kind="single", fields=[fmt.FieldSpec("0", "<f4", (2,))],
                            shards=[fmt.ShardSpec(field="0", file="0-00000.bin", first=0, count=3, bytes=24, sha256="ab")])
    for bad in ({"shards": []}, {"num_samples": 4}, {"fields": [{"name": "0", "dtype": ">f4",
                                                                  "shape": [2]}]}):
        with pytest.raises(DataError, match="malformed.*Re-pack"):
            fmt.parse_header(json.dumps({**base, **bad}), "x")
    assert PackedDataset.__name__ == "PackedDataset"


def test_a_worker_failure_stops_the_workers_and_cleans_up(tmp_path):
    import multiprocessing

    with pytest.raises(RuntimeError, match="boom at 7"):
        pack(_Failing(), tmp_path / "p", workers=2)
    assert multiprocessing.active_children() == []  # no reader process left behind
    assert list(tmp_path.iterdir()) == []
