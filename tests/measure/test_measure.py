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


def test_sync_is_a_no_op_on_cpu():
    sync(CPU)  # must not touch CUDA on a CPU-only build


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
