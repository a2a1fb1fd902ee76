"""`looptune diagnose` on an unchanged Hugging Face Accelerate loop (Accelerator.prepare wraps
the DataLoader in a DataLoaderShard whose batch_size is None and the optimizer in an
AcceleratedOptimizer). Skipped when accelerate is not installed (``looptune[accelerate]``)."""

import importlib.util
from pathlib import Path

import pytest

import looptune
from loop_checks import loader_vs_step_ms, the_steps_own_verdict
from looptune.diagnose.rules.loading import LOADER_SHARE

LOOPS = Path(__file__).parents[1] / "diagnose" / "loops"


def test_diagnose_runs_an_unchanged_accelerate_loop():
    pytest.importorskip("accelerate")
    d = looptune.diagnose(str(LOOPS / "accelerate_loop.py"), ["--samples", "2048"], steps=12,
                          warmup=3)
    assert d.steps_measured == 12 and sum(d.shares.values()) == pytest.approx(1.0)
    (ld,) = d.loaders
    assert ld.dataset == "Sentences" and ld.batch_size == 32  # through the BatchSamplerShard
    # measured apart: encoding 32 short lines takes a fraction of the step; the loader is not
    # the bottleneck, and between compute and overhead the verdict's own numbers decide
    loading, stepping = loader_vs_step_ms(LOOPS / "accelerate_loop.py", ["--samples", "2048"])
    assert loading / (loading + stepping) < LOADER_SHARE, (loading, stepping)
    assert d.shares["data_wait"] < LOADER_SHARE, d.shares
    assert d.bottleneck == the_steps_own_verdict(d), d.evidence


def test_watch_diagnoses_an_accelerate_loop_in_process():
    pytest.importorskip("accelerate")
    import importlib.util

    spec = importlib.util.spec_from_file_location("accelerate_loop", LOOPS / "accelerate_loop.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    w = module.main(["--samples", "1024", "--watch", "10"])  # 3 warm-up + 1 counted + 10, then stop
    d = w.diagnosis
    assert d is not None and d.steps_measured == 10 and d.script == "accelerate loop"
    (ld,) = d.loaders
    assert ld.dataset == "Sentences" and ld.batch_size == 32
