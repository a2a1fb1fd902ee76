"""The gain of packing: a dataset stored as one small .npy file per sample (a common layout) read
through a DataLoader, against the same data packed as memmap and as LMDB, in one run.

Data: N CIFAR-sized samples (uint8 3x32x32 image in its own .npy file, labels in one array).
Every way reads shuffled batches through the same DataLoader settings (batch size, workers);
repeats are interleaved and the median is reported (see looptune.data.pack.throughput). All files
were just written, so every way reads from the page cache: the ratios compare software paths, not
disks. Goals (issue 6): memmap >= 10x the samples/s of the .npy files, each read at its best
worker setting (a user picks that; the same-settings ratios are printed too: DataLoader workers
help the per-file reads and cost packed batches an inter-process copy, so with 2 workers on 2
cores the gap is smaller); memmap random batch reads (get_batch alone) >= 1 GB/s.

    python benchmarks/pack_gain.py                # full: 20000 samples, workers 0 and 2
    python benchmarks/pack_gain.py --smoke        # CI: small, memmap >= 5x
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import looptune
from _goals import exit_code, smoke_check
from looptune.data.pack.throughput import bench_pack
from looptune.data.pack.writer import lmdb_missing

SPEEDUP_GOAL = 10.0
SMOKE_GAIN = SPEEDUP_GOAL / 2  # half the goal, as every smoke speed check
READ_GOAL_BPS = 1e9


class NpyFiles(torch.utils.data.Dataset):
    """One ``.npy`` file per sample: ``ds[i] -> (uint8 image, int label)``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.labels = np.load(folder / "labels.npy")

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        return torch.from_numpy(np.load(self.folder / f"{i:07d}.npy")), int(self.labels[i])


def write_npy_files(folder: Path, n: int, seed: int = 0) -> NpyFiles:
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    for i in range(n):
        np.save(folder / f"{i:07d}.npy", rng.integers(0, 256, (3, 32, 32), dtype=np.uint8))
    np.save(folder / "labels.npy", rng.integers(0, 10, n, dtype=np.int64))
    return NpyFiles(folder)


def raw_read_rate(packed, batch_size: int, batches: int, repeats: int) -> float:
    """Bytes/s of get_batch alone on random indices (no DataLoader): median over repeats."""
    rng = np.random.default_rng(1)
    rates = []
    for _ in range(repeats):
        idx = [rng.integers(0, len(packed), batch_size) for _ in range(batches)]
        packed.get_batch(idx[0])  # warm
        t0, nbytes = time.perf_counter(), 0
        for i in idx:
            x, y = packed.get_batch(i)
            nbytes += x.numel() * x.element_size() + y.numel() * y.element_size()
        rates.append(nbytes / (time.perf_counter() - t0))
    return statistics.median(rates)


def show(result) -> None:
    print(f"  {result.storage}, batch {result.batch_size}, {result.workers} workers, "
          f"{result.batches} batches x {result.repeats} repeats (median):")
    for r in result.rates:
        speed = result.speedup(r.name)
        print(f"    {r.name:<22} {r.samples_per_s:>12,.0f} samples/s {r.bytes_per_s / 1e6:>9,.1f} MB/s"
              f"   {speed:6.2f}x vs npy files")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", type=int, default=20000)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--batches", type=int, default=40)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    p.add_argument("--dir", type=Path, default=None, help="work folder (default: a temp folder)")
    p.add_argument("--smoke", action="store_true", help="tiny sizes (CI): memmap >= 5x the npy files")
    args = p.parse_args(argv)
    if args.smoke:
        args.samples, args.batches, args.repeats, args.workers = 1500, 3, 1, [0]
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        files = write_npy_files(root / "npy", args.samples)
        print(f"wrote {args.samples} samples as .npy files in {time.perf_counter() - t0:.1f} s")
        formats = ["memmap"] + ([] if lmdb_missing() else ["lmdb"])
        if "lmdb" not in formats:
            print(f"lmdb: skipped ({lmdb_missing()})")
        results = {}
        for fmt in formats:
            t0 = time.perf_counter()
            out = looptune.pack(files, root / f"data.{fmt}", format=fmt, workers=2)
            print(f"packed as {fmt} in {time.perf_counter() - t0:.1f} s (2 reader workers)")
            for workers in args.workers:
                result = bench_pack(out, files, batch_size=args.batch_size, workers=workers,
                                    batches=args.batches, repeats=args.repeats)
                show(result)
                results[fmt, workers] = result
        packed = looptune.open_packed(root / "data.memmap")
        read_bps = raw_read_rate(packed, args.batch_size, max(args.batches, 20), args.repeats)
        print(f"memmap get_batch alone, random batches of {args.batch_size}: "
              f"{read_bps / 1e9:.2f} GB/s")
    memmap = [r for (fmt, _), r in results.items() if fmt == "memmap"]
    same = {r.workers: r.speedup("packed, whole batches") for r in memmap}
    best_files = max(r.rates[0].samples_per_s for r in memmap)
    best_memmap = max(r.rates[2].samples_per_s for r in memmap)
    gain = best_memmap / best_files
    print("memmap whole batches vs npy files, same settings: "
          + ", ".join(f"{w} workers {g:.1f}x" for w, g in same.items()))
    print(f"memmap whole batches vs npy files, each at its best worker setting: {gain:.1f}x "
          f"({best_memmap:,.0f} vs {best_files:,.0f} samples/s)")
    if args.smoke:  # small files, few batches: the packed read still far ahead of per-file reads
        return exit_code(False, smoke_check(
            f"memmap whole batches {gain:.1f}x the npy files, >= {SMOKE_GAIN:g}x", gain >= SMOKE_GAIN),
            True)
    ok = gain >= SPEEDUP_GOAL and read_bps >= READ_GOAL_BPS
    print(f"goals: >= {SPEEDUP_GOAL:.0f}x samples/s and >= {READ_GOAL_BPS / 1e9:.0f} GB/s reads: "
          f"{'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
