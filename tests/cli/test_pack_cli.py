"""`looptune pack`: pack, --verify, --bench end to end on a tiny dataset; bad input exits 2 first."""

from __future__ import annotations

import json

import pytest

from looptune.cli.main import main
from looptune.cli.pack import parse_size

DATASET = '''
import torch
CALLS = []

def tiny():
    CALLS.append(1)
    g = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(torch.randint(0, 255, (600, 4, 4), dtype=torch.uint8,
                                                        generator=g), torch.arange(600) % 10)

def ragged():
    return [torch.zeros(i + 1) for i in range(5)]
'''


@pytest.fixture
def spec(tmp_path, monkeypatch):
    (tmp_path / "tinydata.py").write_text(DATASET)
    monkeypatch.chdir(tmp_path)
    return "tinydata:tiny"


def _run(capsys, *argv) -> tuple[int, str, str]:
    code = main(["pack", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_pack_verify_bench_round_trip(spec, tmp_path, capsys):
    code, out, _ = _run(capsys, "--dataset", spec, "t.pack", "--shard-bytes", "2K")
    assert code == 0 and "packed 600 samples" in out and "memmap" in out
    assert len(json.loads((tmp_path / "t.pack" / "header.json").read_text())["shards"]) > 2
    code, out, _ = _run(capsys, "--verify", "t.pack")
    assert code == 0 and "match their SHA-256" in out
    code, out, _ = _run(capsys, "--bench", "t.pack", "--dataset", spec, "--batch-size", "32",
                        "--batches", "3", "--repeats", "1", "--json", "b.json")
    assert code == 0
    for way in ("original", "packed, per sample", "packed, whole batches", "samples/s", "speedup"):
        assert way in out
    data = json.loads((tmp_path / "b.json").read_text())
    assert data["kind"] == "pack-bench" and data["rates"][0]["name"] == "original"
    assert all(r["samples_per_s"] > 0 and len(r["seconds"]) == 1 for r in data["rates"])
    assert data["rates"][0]["speedup"] == 1.0


def test_existing_out_is_refused_before_the_dataset_is_built(spec, tmp_path, capsys):
    assert _run(capsys, "--dataset", spec, "t.pack")[0] == 0
    import tinydata

    calls = len(tinydata.CALLS)
    code, _, err = _run(capsys, "--dataset", spec, "t.pack")
    assert code == 2 and "already exists" in err and "--overwrite" in err
    assert len(tinydata.CALLS) == calls  # refused before the factory ran
    assert _run(capsys, "--dataset", spec, "t.pack", "--overwrite")[0] == 0


def test_verify_names_the_corrupt_shard(spec, tmp_path, capsys):
    _run(capsys, "--dataset", spec, "t.pack")
    shard = tmp_path / "t.pack" / "0-00000.bin"
    data = bytearray(shard.read_bytes())
    data[5] ^= 1
    shard.write_bytes(bytes(data))
    code, _, err = _run(capsys, "--verify", "t.pack")
    assert code == 2 and "0-00000.bin" in err and "sha256" in err and "expected" in err


def test_variable_shapes_need_lmdb(spec, tmp_path, capsys):
    code, _, err = _run(capsys, "--dataset", "tinydata:ragged", "r.pack")
    assert code == 2 and "format='lmdb'" in err and not (tmp_path / "r.pack").exists()
    pytest.importorskip("lmdb", reason="the lmdb extra is not installed")
    code, out, _ = _run(capsys, "--dataset", "tinydata:ragged", "r.pack", "--format", "lmdb")
    assert code == 0 and "lmdb" in out and "None" in out


@pytest.mark.parametrize("argv, needle", [
    ([], "give the folder to write"),
    (["out"], "give --dataset MODULE:FACTORY"),
    (["--dataset", "nocolon", "out"], "expected MODULE:FACTORY"),
    (["--dataset", "m:f", "out", "--shard-bytes", "12X"], "--shard-bytes '12X' is invalid"),
    (["--dataset", "m:f", "out", "--workers", "-1"], "--workers -1 is invalid"),
    (["--verify", "a", "--bench", "b"], "not both"),
    (["--verify", "a", "--dataset", "m:f"], "drop --dataset"),
    (["--verify", "a", "out"], "is not used with --verify"),
    (["--images", "d", "out"], "--images needs --size S"),
    (["--images", "d", "--size", "4", "out"], "--images needs --size S"),
    (["--images", "d", "--size", "48", "--dataset", "m:f", "out"], "not both"),
    (["--dataset", "m:f", "--size", "48", "out"], "--size goes with --images"),
    (["--dataset", "m:f", "--cold", "out"], "--cold goes with --bench"),
])
def test_bad_input_exits_2_with_the_fix(capsys, argv, needle):
    code, _, err = _run(capsys, *argv)
    assert code == 2 and needle in err


def test_missing_folder_for_verify_and_bench(capsys, tmp_path):
    code, _, err = _run(capsys, "--verify", str(tmp_path / "nope"))
    assert code == 2 and "does not exist" in err
    code, _, err = _run(capsys, "--bench", str(tmp_path / "nope"))
    assert code == 2 and "does not exist" in err


def test_parse_size():
    assert parse_size("256M") == 256 * 2**20 and parse_size("1GiB") == 2**30
    assert parse_size("4096") == 4096 and parse_size("2k") == 2048
    with pytest.raises(ValueError):
        parse_size("1.5G")


@pytest.mark.integration
def test_an_image_folder_is_packed_resized_and_benched_warm_and_cold(capsys, tmp_path, mnist_dir):
    # issue 33: decode once at the stored resolution (FFCV's raw mode), against the folder
    from looptune.data import image_folder
    from looptune.data.jpeg import ResizedFolder
    from looptune.data.pack import open_packed

    image_folder.write(tmp_path / "jpegs", samples=200, mnist_dir=mnist_dir, max_size=160)
    code, out, _ = _run(capsys, "--images", str(tmp_path / "jpegs"), "--size", "24",
                        str(tmp_path / "j.pack"))
    assert code == 0 and "packed 200 samples" in out and "|u1 [3, 24, 24]" in out
    packed = open_packed(tmp_path / "j.pack", verify=True)
    folder = ResizedFolder(image_folder.scan(tmp_path / "jpegs"), 24)
    for i in (0, 57, 199):  # the same pixels and label as the folder decoded per sample
        x, y = packed[i]
        assert (x == folder[i][0]).all() and int(y) == folder[i][1]
    code, out, _ = _run(capsys, "--bench", str(tmp_path / "j.pack"), "--images",
                        str(tmp_path / "jpegs"), "--size", "24", "--cold", "--batch-size", "16",
                        "--batches", "3", "--repeats", "1", "--json", str(tmp_path / "b.json"))
    assert code == 0
    names = [r["name"] for r in json.loads((tmp_path / "b.json").read_text())["rates"]]
    assert names == ["original", "packed, per sample", "packed, whole batches", "original (cold)",
                     "packed, per sample (cold)", "packed, whole batches (cold)"]


@pytest.mark.integration
@pytest.mark.parametrize("fmt", ["tfrecord", "webdataset"])
def test_an_image_folder_into_record_shards_verified_and_benched(capsys, tmp_path, mnist_dir, fmt):
    # issue 33: the formats the tutorials name, against the folder, warm and cold
    pytest.importorskip(fmt)
    from looptune.data import image_folder
    from looptune.data.pack.records import RecordDataset

    image_folder.write(tmp_path / "jpegs", samples=120, mnist_dir=mnist_dir, min_size=64, max_size=96)
    code, out, _ = _run(capsys, "--images", str(tmp_path / "jpegs"), "--format", fmt,
                        "--shard-bytes", "100K", str(tmp_path / "r"))
    assert code == 0 and "packed 120 samples (encoded bytes + label) into" in out and fmt in out
    scan = image_folder.scan(tmp_path / "jpegs")
    ds = RecordDataset(tmp_path / "r")
    assert all(ds[i] == (scan.paths[i].read_bytes(), scan.labels[i]) for i in (0, 61, 119))
    code, out, _ = _run(capsys, "--verify", str(tmp_path / "r"))
    assert code == 0 and "and their indexes match their SHA-256 (120 samples" in out
    code, _, err = _run(capsys, "--bench", str(tmp_path / "r"), "--images", str(tmp_path / "jpegs"))
    assert code == 2 and "the records' decode needs --size S" in err
    code, out, _ = _run(capsys, "--bench", str(tmp_path / "r"), "--images", str(tmp_path / "jpegs"),
                        "--size", "24", "--cold", "--batch-size", "8", "--batches", "3",
                        "--repeats", "1", "--json", str(tmp_path / "b.json"))
    assert code == 0
    data = json.loads((tmp_path / "b.json").read_text())
    assert data["storage"] == fmt and [r["name"] for r in data["rates"]] == [
        "original", f"{fmt}, random access", f"{fmt}, streamed", "original (cold)",
        f"{fmt}, random access (cold)", f"{fmt}, streamed (cold)"]
    code, _, err = _run(capsys, "--images", str(tmp_path / "jpegs"), "--format", fmt, "--size",
                        "24", str(tmp_path / "r2"))
    assert code == 2 and "stores each file's bytes as they are" in err
    code, _, err = _run(capsys, "--images", str(tmp_path / "jpegs"), "--format", fmt,
                        str(tmp_path / "r"))
    assert code == 2 and "already exists" in err
