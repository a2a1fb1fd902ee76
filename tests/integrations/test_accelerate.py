"""`looptune diagnose` on an unchanged Hugging Face Accelerate loop (Accelerator.prepare wraps
the DataLoader in a DataLoaderShard whose batch_size is None and the optimizer in an
AcceleratedOptimizer). Skipped when accelerate is not installed (``looptune[accelerate]``)."""

from pathlib import Path

import pytest

import looptune

LOOPS = Path(__file__).parents[1] / "diagnose" / "loops"


def test_diagnose_runs_an_unchanged_accelerate_loop():
    pytest.importorskip("accelerate")
    d = looptune.diagnose(str(LOOPS / "accelerate_loop.py"), ["--samples", "2048"], steps=12,
                          warmup=3)
    assert d.steps_measured == 12 and sum(d.shares.values()) == pytest.approx(1.0)
    (ld,) = d.loaders
    assert ld.dataset == "Sentences" and ld.batch_size == 32  # through the BatchSamplerShard
    assert d.bottleneck in {"compute", "overhead", "data_loading"}


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
