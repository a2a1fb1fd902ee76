"""Synthetic results of every kind, built with the real records' ``to_dict()`` (no measuring)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from looptune.bench.results import BenchResults
from looptune.data.pack.throughput import LoadRate, PackBench
from looptune.measure.records import LoaderInfo
from looptune.diagnose.rules.records import Finding, Remedy
from looptune.diagnose.ranks import merge_ranks
from looptune.diagnose.result import Diagnosis
from looptune.measure.results import RunResult
from looptune.recipe import Decision
from looptune.tune.batch import BatchSizeResult
from looptune.tune.loader import LoaderTuneResult

PROVENANCE = {"date": "2026-12-02T10:00:00+00:00", "looptune": "0.1.0", "git_sha": "abc1234",
              "git_dirty": False, "python": "3.11.7", "torch": "2.13.0+cpu", "numpy": "2.1",
              "torchvision": None, "platform": "Linux", "cpu": "AMD EPYC", "cpu_count": 2,
              "torch_threads": 2, "device": "cpu", "device_name": "AMD EPYC", "cuda": None}


def run_result(name: str, wall: float, *, epochs: int = 2, target: float | None = None,
               per_rank: list[dict] | None = None) -> RunResult:
    evals = [{"epoch": e, "batches": 100 * (e + 1), "train_s": wall * (e + 1) / epochs,
              "accuracy": 0.95 + 0.01 * e, "eval_s": 0.1} for e in range(epochs)]
    reached = next((e["train_s"] for e in evals if target and e["accuracy"] >= target), None)
    return RunResult(
        recipe=name, config={}, decisions=[{"name": "pin_memory", "value": False,
                                            "reason": "no GPU"}],
        device="cpu", epochs=epochs, batches_per_epoch=938, samples_per_epoch=60000, setup_s=0.1,
        wall_s=wall, epoch_s=[wall / epochs] * epochs, samples_per_s=60000 * epochs / wall,
        epoch_loss=[0.3 / (e + 1) + 0.001 * len(name) for e in range(epochs)], first_loss=2.3,
        data_wait_s=wall * 0.4, data_wait_fraction=0.4, peak_mem_bytes=400 * 2**20,
        peak_mem_kind="cpu_peak_rss", test_accuracy=evals[-1]["accuracy"], eval_s=0.2,
        evals=evals, target_accuracy=target, time_to_target_s=reached,
        extra={"per_rank": per_rank} if per_rank else {})


def bench_dict(n: int = 4, *, epochs: int = 2, target: float | None = 0.955,
               world_size: int = 1) -> dict:
    names = ["seed-baseline", "seed-workers", "seed-pinned", "tensorized", "device", "fast",
             "tta", "strategy=prefetch", "precision=bf16", "a-rather-long-recipe-name-for-labels"]
    runs = []
    for i in range(n):
        wall = 20.0 / (1 + i)
        ranks = None
        if world_size > 1:
            ranks = [{"rank": r, "wall_s": wall, "epoch_s": [wall / epochs] * epochs,
                      "samples_per_epoch": 30000, "samples_per_s": 3000.0 + r,
                      "step_ms": 2.0 + 0.3 * r, "data_wait_s": 0.1, "data_wait_fraction": 0.2,
                      "peak_mem_bytes": 2**28, "setup_s": 0.1} for r in range(world_size)]
        runs.append(run_result(names[i % len(names)] + ("" if i < len(names) else f"-{i}"),
                               wall, epochs=epochs, target=target, per_rank=ranks))
    results = BenchResults(workload="mnist-mlp", epochs=epochs, seed=0, provenance=PROVENANCE,
                           runs=runs, world_size=world_size,
                           backend="gloo" if world_size > 1 else None)
    return results.to_dict()


def diagnosis(rank: int | None = None, *, verify: bool = True, slow: float = 1.0) -> Diagnosis:
    steps = [0.011 * slow] * 40 + [0.05] + [0.011 * slow] * 9
    return Diagnosis(
        bottleneck="data_loading", shares={"data_wait": 0.77, "host_to_device": 0.0, "sync": 0.03,
                                           "compute": 0.2, "other": 0.0},
        step_ms=11.0 * slow, phase_ms={"data_wait": 8.45, "host_to_device": 0.0, "sync": 0.31,
                                       "compute": 2.22, "other": 0.0},
        steps_measured=len(steps), steps_requested=50, warmup_steps=5,
        evidence={"rule": "data_loading", "data_wait_share": 0.77},
        findings=[Finding(name="workers_vs_cores", severity="warning",
                          message="8 workers on 2 cores compete with the step")],
        remedies=[Remedy(action="pre-decode the dataset into a tensor", expected_speedup=3.26,
                         reason="data wait is 77% of the step", kind="tensorized"),
                  Remedy(action="DataLoader(num_workers=1, persistent_workers=True)",
                         expected_speedup=1.27, reason="one worker overlaps decoding",
                         kind="loader"),
                  Remedy(action="DataLoader(pin_memory=True)", expected_speedup=1.11,
                         reason="assumed ~70% of the copies hidden", kind="transfer",
                         estimated=True)],
        loaders=[LoaderInfo(batch_size=64, num_workers=0, pin_memory=False, prefetch_factor=None,
                            persistent_workers=False, dataset="MNIST")],
        step_s=steps, peak_mem_bytes=300 * 2**20, peak_mem_kind="cpu_peak_rss",
        script="examples/mnist_tutorial.py --data d", stopped="steps",
        verify={"remedy": "DataLoader(num_workers=1, persistent_workers=True)",
                "overrides": {"num_workers": 1}, "before_step_ms": 13.32, "after_step_ms": 12.73,
                "expected_speedup": 1.96, "speedup": 1.046, "applied": True} if verify else None,
        provenance=PROVENANCE, rank=rank, world_size=None if rank is None else 2,
        wait_s=None if rank is None else [0.002] * len(steps),
        data_wait_step_s=[s * 0.7 for s in steps], warmup_step_s=[0.2, 0.05, 0.02, 0.015, 0.012,
                                                                0.03])


def loader_dict() -> dict:
    trials = [{"num_workers": 0, "samples_per_s": 9068.0, "status": "ok", "reason": ""},
              {"num_workers": 1, "samples_per_s": 5000.0, "status": "ok", "reason": ""},
              {"num_workers": 0, "batched": True, "samples_per_s": 9100.0, "status": "ok",
               "reason": ""},
              {"num_workers": 0, "batched": False, "samples_per_s": 4000.0, "status": "ok",
               "reason": ""}]
    decisions = [Decision("num_workers", 0, reason="0 workers: 9,068 samples/s; 1 gave -44.8%",
                          evidence=trials[:2]),
                 Decision("pin_memory", False, reason="no GPU"),
                 Decision("batched", True, reason="per-sample: -56%; below the threshold")]
    return LoaderTuneResult(recommended={"num_workers": 0}, decisions=decisions, trials=trials,
                            line="DataLoader(dataset, batch_size=64, shuffle=True, num_workers=0)",
                            elapsed_s=12.5, end_to_end=True, batch_size=64).to_dict()


def batch_dict() -> dict:
    trials = [{"batch_size": b, "samples_per_s": r, "step_ms": 1000 * b / r,
               "peak_mem_bytes": b * 2**16, "peak_mem_kind": "cpu_tensor_estimate",
               "status": "ok", "reason": "", "phase": "sweep"}
              for b, r in ((64, 84383.0), (128, 150000.0), (256, 179750.0), (512, 148852.0))]
    trials.append({"batch_size": 1024, "samples_per_s": None, "step_ms": None,
                   "peak_mem_bytes": None, "peak_mem_kind": "cpu_tensor_estimate",
                   "status": "oom", "reason": "out of memory", "phase": "sweep"})
    evidence = {"trials": trials, "search_ended": "oom", "detail": "1024: oom",
                "memory_limit_bytes": 2**26, "max_memory_fraction": 0.9, "device": "cpu",
                "peak_mem_kind": "cpu_tensor_estimate"}
    decisions = [Decision("batch_size", 256, reason="256: 179,750 samples/s, the best", evidence=evidence)]
    return BatchSizeResult(decisions=decisions, recommended={"batch_size": 256},
                           trials=trials).to_dict()


def pack_dict() -> dict:
    rates = [LoadRate(name="original", how="DataLoader(files)", samples=1000, seconds=[0.11, 0.1, 0.12], bytes_per_batch=4e5, samples_per_batch=256),
             LoadRate(name="packed, per sample", how="DataLoader(packed)", samples=1000, seconds=[0.02] * 3, bytes_per_batch=4e5, samples_per_batch=256),
             LoadRate(name="packed, whole batches", how="get_batch", samples=1000, seconds=[0.002] * 3, bytes_per_batch=4e5, samples_per_batch=256)]
    return PackBench(packed="t.pack", storage="memmap", batch_size=256, workers=0, batches=4,
                     repeats=3, rates=rates, provenance=PROVENANCE).to_dict()


def write(path: Path, data: dict) -> Path:
    path.write_text(json.dumps(data, indent=2, default=lambda v: vars(v)))
    return path


@pytest.fixture
def samples() -> dict:
    """One results dict per kind, by kind name."""
    ranks = merge_ranks([diagnosis(0), diagnosis(1, slow=1.3)], world_size=2)
    return {"bench": bench_dict(), "diagnosis": diagnosis().to_dict(),
            "diagnose-ranks": ranks.to_dict(), "tune-loader": loader_dict(),
            "tune-batch-size": batch_dict(), "pack-bench": pack_dict()}


@pytest.fixture
def make_bench():
    """``make_bench(n, epochs=2, target=0.955, world_size=1)``: bench results of n recipes."""
    return bench_dict


@pytest.fixture
def write_json():
    """``write_json(path, data)``: write a results dict, return the path."""
    return write


def _png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from the IHDR chunk; fails unless ``data`` starts like a PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG: bad signature"
    length, chunk = struct.unpack(">I4s", data[8:16])
    assert chunk == b"IHDR" and length == 13, "not a PNG: the first chunk is not IHDR"
    return struct.unpack(">II", data[16:24])


@pytest.fixture
def png_size():
    """``png_size(data)`` -> (width, height), checking the PNG signature and IHDR chunk."""
    return _png_size
