import time

import pytest
import torch

from looptune.measure.memory import PeakMemory
from looptune.measure.provenance import provenance
from looptune.measure.timing import Stopwatch, sync

CPU = torch.device("cpu")


def test_stopwatch_measures_the_region():
    sw = Stopwatch(CPU)
    sw.start()
    time.sleep(0.02)
    assert 0.015 < sw.stop() < 1.0
    with pytest.raises(RuntimeError, match="before start"):
        sw.stop()


@pytest.fixture
def device_events(monkeypatch):
    """torch.cuda.synchronize and the timing module's clock, recorded in call order (nothing
    reaches a GPU: the test runs on a CPU-only machine too)."""
    from looptune.measure import timing

    events, clock = [], iter(range(100, 200))
    monkeypatch.setattr(torch.cuda, "synchronize",
                        lambda device=None: events.append(("sync", device)))
    monkeypatch.setattr(timing.time, "perf_counter", lambda: events.append("clock") or next(clock))
    return events


def test_sync_is_a_no_op_on_cpu(device_events):
    cuda_was_initialized = torch.cuda.is_initialized()
    assert sync(CPU) is None
    assert device_events == []  # must not touch CUDA on a CPU-only build
    assert torch.cuda.is_initialized() == cuda_was_initialized


def test_sync_waits_for_the_cuda_device_it_is_given(device_events):
    gpu = torch.device("cuda", 1)
    sync(gpu)
    assert device_events == [("sync", gpu)]


def test_stopwatch_waits_for_the_device_before_each_clock_read(device_events):
    gpu = torch.device("cuda", 0)
    sw = Stopwatch(gpu)
    sw.start()
    assert device_events == [("sync", gpu), "clock"]
    assert sw.stop() == 1  # the planted clock: 100 at start, 101 at stop
    assert device_events == [("sync", gpu), "clock", ("sync", gpu), "clock"]
    device_events.clear()
    cpu = Stopwatch(CPU)
    cpu.start()
    assert cpu.stop() == 1 and device_events == ["clock", "clock"]  # nothing to wait for


def test_peak_memory_sees_a_large_allocation_and_resets():
    mem = PeakMemory(CPU)
    mem.start()
    block = torch.ones(40_000_000)  # 160 MB, touched
    high = mem.read()
    del block
    mem.start()
    low = mem.read()
    assert high.kind.startswith("cpu_peak_rss")
    if high.kind == "cpu_peak_rss":  # the peak can be reset here: the second reading is lower
        assert high.peak_bytes - low.peak_bytes > 100_000_000


def test_provenance_names_versions_device_and_commit():
    p = provenance(CPU)
    for key in ("date", "looptune", "git_sha", "git_dirty", "python", "torch", "cpu_count", "device"):
        assert key in p
    assert p["device"] == "cpu" and p["cpu_count"] >= 1 and p["torch"] == torch.__version__
