"""diagnose/worker_read.py: the training loader read by one worker after the script."""

import multiprocessing

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset

from looptune.diagnose.worker_read import MIN_BATCHES, RECEIVES, measure_worker_read
from looptune.measure.loader_info import loader_parts
from looptune.measure.probes import StepProbes


def _parts(ds, **kw):
    return loader_parts(DataLoader(ds, **{"batch_size": 16, "shuffle": True, **kw}))


def test_one_worker_is_timed_and_shut_down_and_the_random_streams_are_restored():
    ds = TensorDataset(torch.randn(4096, 8), torch.randint(0, 2, (4096,)))
    torch.manual_seed(1)
    expected = torch.rand(3)
    torch.manual_seed(1)
    got = measure_worker_read(_parts(ds), budget_s=0.05)
    assert torch.equal(torch.rand(3), expected)  # the sampler's shuffle drew nothing for good
    assert got.measured and got.note is None
    assert got.batch_s > 0 and got.receive_s >= 0 and got.start_s > 0
    assert got.batches >= MIN_BATCHES
    assert not multiprocessing.active_children()  # the worker is gone


def test_the_samplers_own_generator_is_restored():
    ds = TensorDataset(torch.randn(4096, 8))
    gen = torch.Generator().manual_seed(7)
    before = gen.get_state()
    assert measure_worker_read(_parts(ds, generator=gen), budget_s=0.05).measured
    assert torch.equal(gen.get_state(), before)


class _Stream(IterableDataset):
    def __iter__(self):
        for i in range(2000):
            yield torch.full((4,), float(i))


def test_an_iterable_dataset_is_read_too():
    got = measure_worker_read(loader_parts(DataLoader(_Stream(), batch_size=8)), budget_s=0.05)
    assert got.measured, got.note


class _Broken(Dataset):
    def __len__(self):
        return 1000

    def __getitem__(self, i):
        raise ValueError(f"cannot decode sample {i}")


def test_a_failure_and_too_few_batches_are_reasons_not_numbers():
    broken = measure_worker_read(_parts(_Broken()), budget_s=0.05)
    assert not broken.measured and broken.batch_s is None
    assert "reading it with one worker failed (ValueError" in broken.note
    tiny = TensorDataset(torch.randn(16 * (MIN_BATCHES + RECEIVES), 4))
    short = measure_worker_read(_parts(tiny), budget_s=0.05)
    assert not short.measured and "too few batches" in short.note
    assert measure_worker_read(None).note == "no DataLoader was iterated"
    assert not multiprocessing.active_children()


def test_the_probes_ignore_looptunes_own_loader_while_paused():
    ds = TensorDataset(torch.randn(64, 4))
    with StepProbes() as probes:
        probes.paused = True
        for _ in DataLoader(ds, batch_size=16):
            pass
        assert not probes.loaders and probes.drawn == 0
        probes.paused = False
        for _ in DataLoader(ds, batch_size=16):
            pass
    assert len(probes.loaders) == 1 and probes.drawn == 4
    (parts,) = probes.loader_parts.values()
    assert parts["dataset"] is ds and parts["batch_size"] == 16


def test_the_scripts_multiprocessing_context_is_kept():
    ds = TensorDataset(torch.randn(2048, 4))
    parts = _parts(ds, num_workers=2, multiprocessing_context="spawn")
    assert parts["multiprocessing_context"].get_start_method() == "spawn"
    got = measure_worker_read(parts, budget_s=0.05)
    assert got.measured, got.note


class _WorkerOnly(Dataset):
    """Reads only inside a worker (as a dataset that opens its file in worker_init_fn)."""

    def __len__(self):
        return 4096

    def __getitem__(self, i):
        if torch.utils.data.get_worker_info() is None:
            raise RuntimeError("open the database in worker_init_fn first")
        return torch.full((4,), float(i))


def test_the_main_process_read_is_measured_when_asked_and_missing_when_it_cannot():
    ds = TensorDataset(torch.randn(4096, 8))
    both = measure_worker_read(_parts(ds), budget_s=0.05, in_process=True)
    assert both.measured and both.main_s > 0
    assert measure_worker_read(_parts(ds), budget_s=0.05).main_s is None  # not asked
    worker_only = measure_worker_read(_parts(_WorkerOnly()), budget_s=0.05, in_process=True)
    assert worker_only.measured and worker_only.main_s is None
