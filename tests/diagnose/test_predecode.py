"""diagnose/predecode.py: --verify of the pre-decode remedy, and what it leaves of the wait."""

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from looptune.diagnose import predecode
from looptune.diagnose.predecode import PreDecoded, gather_seconds, gathered, predecoded


@pytest.fixture(autouse=True)
def _fresh():
    predecode.reset()
    yield
    predecode.reset()


class _Decoding(Dataset):
    """Per-sample work in __getitem__, as a decoder would."""

    def __init__(self, n=512):
        self.n, self.reads = n, 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.reads += 1
        return torch.full((3, 4), float(i)) / 7, i % 10


def test_batches_are_the_same_gathered_by_index_and_the_dataset_is_read_once():
    ds = _Decoding()
    named = predecoded({"dataset": ds, "batch_size": 32, "collate_fn": None})
    assert isinstance(named["dataset"], PreDecoded) and named["collate_fn"] is gathered
    assert ds.reads >= len(ds)
    again = predecoded({"dataset": ds, "batch_size": 32})  # a new DataLoader every epoch
    assert again["dataset"] is named["dataset"]
    plain = DataLoader(ds, batch_size=32, shuffle=True, generator=torch.Generator().manual_seed(3))
    fast = DataLoader(**named, shuffle=True, generator=torch.Generator().manual_seed(3))
    for (x0, y0), (x1, y1) in zip(plain, fast):
        assert torch.equal(x0, x1) and torch.equal(y0, y1) and y0.dtype == y1.dtype
    assert not predecode.refused


class _Stream(IterableDataset):
    def __iter__(self):
        yield from (torch.zeros(2) for _ in range(8))


class _Ragged(Dataset):
    def __len__(self):
        return 40

    def __getitem__(self, i):
        return torch.zeros(1 + i % 3), 0


def test_what_cannot_be_pre_decoded_is_left_as_it_is_with_the_reason(monkeypatch):
    for ds, why in [(_Stream(), "a stream (IterableDataset) has no index to gather by"),
                    (_Ragged(), "cannot be stacked into one tensor")]:
        named = {"dataset": ds, "batch_size": 4}
        assert predecoded(named) is named
        assert why in predecode.refused[-1] and type(ds).__name__ in predecode.refused[-1]
    custom = {"dataset": _Decoding(), "collate_fn": lambda b: b}
    assert predecoded(custom) is custom and "its own collate_fn" in predecode.refused[-1]
    monkeypatch.setattr(predecode, "BUDGET_S", 1e-9)
    assert predecoded({"dataset": _Decoding()})["dataset"].__class__ is _Decoding
    assert "would take ~" in predecode.refused[-1]
    monkeypatch.setattr(predecode, "BUDGET_S", 60.0)
    monkeypatch.setattr(predecode, "MAX_BYTES", 1000)
    assert predecoded({"dataset": _Decoding()})["dataset"].__class__ is _Decoding
    assert "GiB decoded (more than" in predecode.refused[-1]


def test_gather_seconds_times_a_pre_decoded_loader_of_the_same_batch_bytes():
    assert gather_seconds(batch_bytes=None, batch_size=64, samples=1000) is None
    assert gather_seconds(batch_bytes=4096, batch_size=None, samples=10) is None
    small = gather_seconds(batch_bytes=64 * 16, batch_size=64, samples=60000)
    assert 0 < small < 0.05
    tiny_set = gather_seconds(batch_bytes=64 * 16, batch_size=64, samples=3)  # fewer samples than batches need: 4 batches' worth
    assert tiny_set > 0
