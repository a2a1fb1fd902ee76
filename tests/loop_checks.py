"""Independent checks shared by the tests that run diagnose on third-party-shaped loops
(tests/diagnose/loops): the loop's own loader and step timed alone, and the verdict its own
evidence gives."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

from looptune.diagnose.rules.batch import BUSY_OVERHEAD_SHARE
from looptune.diagnose.rules.overhead import COMPUTE_RATIO, HOST_OVERHEAD_SHARE, SYNC_SHARE


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
    decide it (diagnose/rules/batch.py and rules/overhead.py): the share of per-step overhead against its threshold when
    the model was replayed at two batch sizes, else the FLOP rate against the matmul rate, else
    the shares of host time. A verdict that contradicts its own evidence fails."""
    ev = d.evidence
    assert ev["rule"] == d.bottleneck, ev
    if "fixed_share" in ev:  # the CPU replay decided, at its threshold
        assert ev["threshold"] == BUSY_OVERHEAD_SHARE, ev
        over = ev["overhead_share"] >= ev["threshold"]
        assert ev["reason"].endswith(f"({'>=' if over else '<'} {ev['threshold']:.0%}: "
                                     f"{'per-step overhead' if over else 'the work itself'})")
    elif "flops_ratio" in ev and ev.get("threshold") == COMPUTE_RATIO:
        over = ev["flops_ratio"] < COMPUTE_RATIO
    else:  # no FLOP count: the shares of syncs and host time
        assert ev["flops"] == "unknown", ev
        host = d.shares["sync"] + d.shares["other"]
        over = host >= HOST_OVERHEAD_SHARE or (
            ev["syncs_per_step"] >= 1 and d.shares["sync"] >= SYNC_SHARE)
    return "overhead" if over else "compute"


def _parts(script: Path, argv: list[str]):
    spec = importlib.util.spec_from_file_location(f"_parts_{script.stem}", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.parts(argv)


def per_sample_gain(script: Path, small: list[str], large: list[str], factor: int,
                    rounds: int = 4) -> float:
    """The independent measurement of a larger batch: the script's own step (its ``parts()``) at
    the two batch sizes ``small`` and ``large`` (argv), interleaved (ABBA) after a warm-up each,
    the fastest step of each; returns time per sample at small / at large."""
    steps = {}
    for key, argv in (("small", small), ("large", large)):
        loader, step = _parts(script, argv)
        batches = list(loader) if isinstance(loader, list) else [next(iter(loader))]
        step(batches[0])  # warm-up: first-call allocations
        steps[key] = (step, batches)
    best = {"small": float("inf"), "large": float("inf")}
    for i in range(rounds):
        for key in (("small", "large") if i % 2 == 0 else ("large", "small")):
            step, batches = steps[key]
            t0 = time.perf_counter()
            step(batches[i % len(batches)])
            best[key] = min(best[key], time.perf_counter() - t0)
    return factor * best["small"] / best["large"]
