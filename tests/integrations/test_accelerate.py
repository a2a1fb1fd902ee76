"""`looptune diagnose` on an unchanged Hugging Face Accelerate loop (Accelerator.prepare wraps
the DataLoader in a DataLoaderShard whose batch_size is None and the optimizer in an
AcceleratedOptimizer). Skipped when accelerate is not installed (``looptune[accelerate]``)."""

import importlib.util
import time
from pathlib import Path

import pytest

import looptune
from looptune.diagnose import verdict

LOOPS = Path(__file__).parents[1] / "diagnose" / "loops"


def loader_vs_step_ms(script: Path, argv: list[str], batches: int = 3) -> tuple[float, float]:
    """The independent measurement: the script's own loader alone and its own step alone
    (its ``parts()``), ms per batch, each the fastest of ``batches`` after one untimed (the
    fastest: what each costs, without a busy neighbour's share of the machine)."""
    spec = importlib.util.spec_from_file_location(f"_parts_{script.stem}", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    loader, step = module.parts(argv)
    it = iter(loader)
    batch = next(it)
    loading, stepping = [], []
    for _ in range(batches):
        t0 = time.perf_counter()
        next(it)
        loading.append(time.perf_counter() - t0)
    step(batch)
    for _ in range(batches):
        t0 = time.perf_counter()
        step(batch)
        stepping.append(time.perf_counter() - t0)
    return 1e3 * min(loading), 1e3 * min(stepping)


def the_steps_own_verdict(d) -> str:
    """Where the loader is not the bottleneck, compute or overhead as the verdict's own numbers
    decide it (diagnose/verdict.py): the share of per-step overhead against its threshold when
    the model was replayed at two batch sizes, else the FLOP rate against the matmul rate, else
    the shares of host time. A verdict that contradicts its own evidence fails."""
    ev = d.evidence
    assert ev["rule"] == d.bottleneck, ev
    if "fixed_share" in ev:  # the CPU replay decided, at the documented 30%
        assert ev["threshold"] == verdict.OVERHEAD_SHARE == 0.30, ev
        over = ev["overhead_share"] >= ev["threshold"]
        assert ev["reason"].endswith(f"({'>=' if over else '<'} {ev['threshold']:.0%}: "
                                     f"{'per-step overhead' if over else 'the work itself'})")
    elif "flops_ratio" in ev and ev.get("threshold") == verdict.COMPUTE_RATIO:
        over = ev["flops_ratio"] < verdict.COMPUTE_RATIO
    else:  # no FLOP count: the shares of syncs and host time
        assert ev["flops"] == "unknown", ev
        host = d.shares["sync"] + d.shares["other"]
        over = host >= verdict.OVERHEAD_SHARE or (
            ev["syncs_per_step"] >= 1 and d.shares["sync"] >= verdict.SYNC_SHARE)
    return "overhead" if over else "compute"


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
    assert loading / (loading + stepping) < verdict.LOADER_SHARE, (loading, stepping)
    assert d.shares["data_wait"] < verdict.LOADER_SHARE, d.shares
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
