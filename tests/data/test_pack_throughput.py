"""bench_pack: the three ways are timed and reported; bad arguments fail before any read."""

from __future__ import annotations

import pytest
import torch

from looptune.data.pack import pack
from looptune.data.pack.throughput import bench_pack
from looptune.errors import ConfigError


@pytest.fixture
def data(tmp_path):
    ds = torch.utils.data.TensorDataset(torch.randint(0, 255, (500, 8), dtype=torch.uint8),
                                        torch.arange(500))
    return ds, pack(ds, tmp_path / "p")


def test_three_ways_with_speedups_against_the_original(data):
    ds, out = data
    res = bench_pack(out, ds, batch_size=50, batches=4, repeats=2)
    assert [r.name for r in res.rates] == ["original", "packed, per sample", "packed, whole batches"]
    assert res.speedup("original") == 1.0
    for r in res.rates:
        assert len(r.seconds) == 2 and r.samples == 200 and r.samples_per_s > 0
        assert r.bytes_per_batch == 50 * 8 + 50 * 8  # uint8 x 8 + one int64 label per sample
    d = res.to_dict()
    assert d["rates"][2]["speedup"] == pytest.approx(res.speedup("packed, whole batches"))
    assert "torch" in d["provenance"]


def test_packed_only_has_no_speedup(data):
    _, out = data
    res = bench_pack(out, batch_size=100, batches=50, repeats=1)
    assert [r.name for r in res.rates] == ["packed, per sample", "packed, whole batches"]
    assert res.batches == 3  # 5 batches minus 2 warm-up
    assert res.speedup("packed, per sample") is None


def test_bad_arguments(data):
    ds, out = data
    with pytest.raises(ConfigError) as err:
        bench_pack(out, ds, batch_size=0, workers=-1, repeats=0)
    assert len(err.value.problems) == 3
    with pytest.raises(ConfigError, match="too few"):
        bench_pack(out, ds, batch_size=400)
    with pytest.raises(ConfigError, match="not the same data"):
        bench_pack(out, list(range(10)))


def test_cold_ways_unmap_and_drop_the_files_before_each_pass(data, monkeypatch):
    from looptune.data.pack import open_packed

    ds, out = data
    with pytest.raises(ConfigError, match=r"files\(\)"):  # no way to drop the original's files
        bench_pack(out, ds, batch_size=50, batches=2, repeats=1, cold=True)
    dropped = []
    monkeypatch.setattr("looptune._io.drop_page_cache", lambda files: dropped.append(list(files)))

    class Files(torch.utils.data.Dataset):
        def __len__(self):
            return len(ds)

        def __getitem__(self, i):
            return ds[i]

        def files(self):
            return ["a.jpg", "b.jpg"]

    res = bench_pack(out, Files(), batch_size=50, batches=2, repeats=1, cold=True)
    assert [r.name for r in res.rates][3:] == [
        "original (cold)", "packed, per sample (cold)", "packed, whole batches (cold)"]
    assert dropped[0] == ["a.jpg", "b.jpg"] and len(dropped) == 3
    assert all(p.name in ("header.json",) or p.suffix == ".bin" for p in dropped[1])
    packed = open_packed(out)
    first = packed[3]
    assert packed._maps  # a read maps the shards
    packed.release()  # unmapped: the kernel may drop their pages now
    assert packed._maps == {} and torch.equal(packed[3][0], first[0])  # and it reads again
