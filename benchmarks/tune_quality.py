"""Loader tuning quality: the tuned settings against an exhaustive grid over the same space.

Two datasets with different costs (cheap in-memory tensors; expensive per-sample decoding in
Python), each with a training step (a small MLP). For each: `tune_loader` (timed), then every grid
point measured the same way (timed); the tuned settings' throughput is read from the grid.
Goal: the tuned loader reaches >= 90% of the grid's best samples/s in <= 30% of the grid's time.

    python benchmarks/tune_quality.py [--data MNIST]   # --data: also a folder of JPEGs
    python benchmarks/tune_quality.py --smoke      # CI: fewer batches, quality >= 50%
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time

import torch
from torch.utils.data import Dataset, TensorDataset

import looptune
from _goals import exit_code, smoke_check
from looptune.tune.loader import _Search

# --smoke: 15 batches a point, once; seen 68-118% here (the decoding set's tuned 0 workers read
# 68% of 2 workers once on a quiet machine: a finding for the tuner, not noise to hide).
# Half: a tuner that picks workers for in-memory tensors, or fails, falls far below it.
SMOKE_QUALITY = 0.5


class Decoding(Dataset):
    """Per-sample decoding in Python (a fixed amount of work per sample, like a JPEG decode)."""

    def __len__(self) -> int:
        return 50_000

    def __getitem__(self, i: int):
        acc = 0
        for k in range(3000):
            acc += (k * i) % 7
        return torch.full((64,), float(acc % 5)), i % 10


def cheap() -> Dataset:
    return TensorDataset(torch.randn(50_000, 64), torch.randint(0, 10, (50_000,)))


def grid(cores: int) -> list[dict]:
    """Workers x prefetch x persistence, and with workers the step's threads as they are and on
    the cores the workers leave (the tuner measures both since issue 33)."""
    workers = sorted({0, 1, 2, min(4, max(cores, 1))})
    points = [{"num_workers": 0}]
    for w, pf, pers in itertools.product([w for w in workers if w], (2, 4), (False, True)):
        points.append({"num_workers": w, "prefetch_factor": pf, "persistent_workers": pers})
        if 1 <= cores - w < torch.get_num_threads():
            points.append({"num_workers": w, "intra_op_threads": cores - w, "prefetch_factor": pf,
                           "persistent_workers": pers})
    return points


# what a grid point's result holds beside its settings (the loss checks added in issue 28)
_MEASURED = {"samples_per_s", "status", "reason", "loss", "loss_parity"}


def _same_point(result: dict, settings: dict) -> bool:
    """The grid point measured at exactly these settings (so the tuned loader is read from the
    grid, measured beside the others, never timed again on its own)."""
    return {k: v for k, v in result.items() if k not in _MEASURED} == {
        k: v for k, v in settings.items() if settings.get("num_workers") or k == "num_workers"}


def evaluate(name: str, dataset: Dataset, model: torch.nn.Module, batches: int,
             repeats: int, cost_goal: bool = True) -> tuple[bool, float]:
    """``cost_goal``: also judge the tuner's time against the grid's (issue 6); the folder of
    JPEGs (issue 33) is judged by quality alone (its worker trials restart workers each time)."""
    warm = _Search(dataset=dataset, batch_size=64, device=torch.device("cpu"), model=model, loss_fn=torch.nn.functional.cross_entropy,
                   batches=batches, warmup=3, repeats=1, threshold=0.03, deadline=float("inf"))
    warm.measure(num_workers=0)  # untimed: first-call costs must not land on whichever runs first
    warm.measure(num_workers=1)
    t0 = time.perf_counter()
    tuned = looptune.tune_loader(dataset, batch_size=64, model=model, device="cpu", budget_s=120,
                                 batches=batches, repeats=repeats)
    tune_s = time.perf_counter() - t0
    search = _Search(dataset=dataset, batch_size=64, device=torch.device("cpu"), model=model, loss_fn=torch.nn.functional.cross_entropy,
                     batches=batches, warmup=3, repeats=repeats, threshold=0.03, deadline=float("inf"))
    t0 = time.perf_counter()
    results = [search.measure(**point) for point in grid(os.cpu_count() or 1)]
    grid_s = time.perf_counter() - t0
    ok_results = [r for r in results if r["status"] == "ok"]
    best = max(ok_results, key=lambda r: r["samples_per_s"])
    rec = {k: v for k, v in tuned.recommended.items() if k not in ("pin_memory", "batched")}
    if tuned.threads:
        rec["intra_op_threads"] = tuned.threads
    match = next((r for r in ok_results if _same_point(r, rec)), None)
    got = match["samples_per_s"] if match else search.measure(**rec)["samples_per_s"]
    quality, cost = got / best["samples_per_s"], tune_s / grid_s
    ok = quality >= 0.9 and (cost <= 0.3 or not cost_goal)
    shown = {k: v for k, v in best.items() if k not in _MEASURED}
    print(f"{name}: tuned {rec} -> {got:,.0f} samples/s; grid best {shown} "
          f"-> {best['samples_per_s']:,.0f}; quality {quality:.1%} (goal >= 90%), time {tune_s:.1f} s vs "
          f"grid {grid_s:.1f} s = {cost:.1%} ({'goal <= 30%' if cost_goal else 'not judged'}): "
          f"{'PASS' if ok else 'FAIL'}")
    return ok, quality


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="CI mode: fewer batches, quality >= 50%")
    p.add_argument("--data", default=None,
                   help="MNIST folder: also a folder of JPEGs drawn from its digits (issue 33), "
                        "decoded and augmented per sample beside a small conv net")
    args = p.parse_args(argv)
    batches, repeats = (15, 1) if args.smoke else (30, 3)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    got = [evaluate("cheap in-memory", cheap(), model, batches, repeats),
           evaluate("per-sample decoding", Decoding(), model, batches, repeats)]
    if args.data:
        import tempfile

        from looptune.data import image_folder
        from looptune.data.jpeg import FolderDataset
        from looptune.models import ImageCNN

        with tempfile.TemporaryDirectory() as tmp:
            image_folder.write(f"{tmp}/jpegs", samples=3000, mnist_dir=args.data)
            jpegs = FolderDataset(image_folder.scan(f"{tmp}/jpegs"), 32, scale=(0.35, 1.0))
            got.append(evaluate("a folder of JPEGs", jpegs, ImageCNN(size=32), batches, repeats,
                                cost_goal=False))
    ok = all(g for g, _ in got)
    smoke_ok = args.smoke and smoke_check(
        f"quality {', '.join(f'{q:.0%}' for _, q in got)}; each >= {SMOKE_QUALITY:.0%} of the grid's "
        "best",
        all(q >= SMOKE_QUALITY for _, q in got))
    return exit_code(ok, smoke_ok, args.smoke)


if __name__ == "__main__":
    sys.exit(main())
