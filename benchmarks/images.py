"""A folder of JPEGs, decoded and augmented per sample: the pipeline as people write it, against
looptune's ways of feeding the same training, in one run (issue 33).

Data: ``looptune data images`` folders (real MNIST digits drawn on coloured, textured
backgrounds, JPEG quality 90, 128-256 px a side): a training folder and a test folder.
Model: :class:`looptune.models.ImageCNN` at 32 x 32 (three strided conv/BN/ReLU layers and a
linear layer), Adam with a one-cycle schedule (peak 4e-3), batch 64, 6 epochs, the same seed
for every recipe in a round: the same
order and, for each sample and epoch, the same crop and flip in every recipe (drawn from
``(seed, epoch, index)``), so the recipes differ only in how the pixels reach the step; accuracy
on the test folder decoded once (the whole image resized to 32 x 32). The crops keep 35-100% of
the image's area (torchvision's 8% would often crop the digit away on these images).

Recipes (each trains the same epochs on the same files):
- ``baseline``: ``ImageFolder``-style per-sample PIL decode + RandomResizedCrop + flip + ToTensor
  + Normalize (:class:`looptune.data.jpeg.FolderDataset`) in a plain shuffled DataLoader, no
  workers, ``loss.item()`` every step.
- ``workers``: the same dataset, ``num_workers`` = the cores this process may use less one,
  persistent workers, the step's intra-op threads on the core left, the loss read once per epoch.
- ``draft+workers``: the same crops decoded at reduced size (JPEG draft mode) in those workers.
- ``simplejpeg+workers``: the same, decoded by libjpeg-turbo through ``simplejpeg`` (its DCT
  scaling for the reduced size), where installed (``pip install 'looptune[jpeg]'``); else left
  out with that reason.
- ``packed``: every file decoded once into one uint8 ``.npy`` file at 48 x 48 (the whole image
  resized; its pack time reported apart), read by index, the same random resized crops and
  flips drawn and applied to whole batches (``affine_grid`` + ``grid_sample``), no workers.
- ``gpu-decode`` (``--device cuda`` only; DALI's approach): workers read each file's bytes, the
  batch is decoded on the GPU in one ``torchvision.io.decode_jpeg(device='cuda')`` call (nvJPEG),
  and the same crops and flips are cut and resized there. Elsewhere it is left out with the
  reason (no CUDA here, or no torchvision built for this torch).

``--device cuda`` trains every recipe on the GPU (the per-sample ones copy each batch there).

Each recipe runs with the page cache warm (every file read once before) and cold (every file,
and the packed file, dropped from the page cache with ``posix_fadvise(DONTNEED)`` before each
epoch); ``--rounds`` rounds interleaved, the median reported.
Goals (this 2-core CPU): the fastest looptune recipe >= 5x the baseline's samples/s warm and
cold, its test accuracy within 0.5 points of the baseline's at equal epochs.

    python benchmarks/images.py --data DIR          # full: 12000 train / 5000 test files, 3 rounds
    python benchmarks/images.py --data DIR --smoke  # CI: 3000 / 500 files, one round, >= 2.5x
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from _goals import exit_code, passfail, smoke_check, smoke_floor
from looptune._io import drop_page_cache
from looptune.data import image_folder
from looptune.data.image_folder import Samples
from looptune.data.jpeg import (EpochSampler, FolderDataset, crop_batch, decode_all, keyed_crops,
                                normalize, simplejpeg_missing)
from looptune.data.jpeg_gpu import crop_decoded, decode_on, gpu_decode_missing
from looptune.models import ImageCNN

SPEEDUP_GOAL = 5.0
ACCURACY_POINTS = 0.5
# --smoke: the fastest recipe learned (chance is 10%; 500 test files: 18% is 6 standard errors up)
SMOKE_ACCURACY = 18.0
SIZE, STORED, BATCH = 32, 48, 64
# the crop's share of the image's area: torchvision's 0.08 would often crop the digit away on
# these images (it fills 40-90% of the shorter side), and a label without its digit is noise
SCALE = (0.35, 1.0)
RECIPES = ("baseline", "workers", "draft+workers", "simplejpeg+workers", "packed", "gpu-decode")
PER_SAMPLE = ("baseline", "workers", "draft+workers", "simplejpeg+workers")  # the same crops, full-size


def folders(root: Path, train: int, test: int, mnist: str | None) -> tuple[Samples, Samples]:
    """The training and test folders under ``root``, written once (reused when present)."""
    out = []
    for name, n, split in (("train", train, "train"), ("test", test, "test")):
        path = root / f"{name}-{n}"
        if not (path / image_folder.MANIFEST).is_file():
            t0 = time.perf_counter()
            image_folder.write(path, samples=n, mnist_dir=mnist, split=split, seed=1 if split == "test" else 0)
            print(f"wrote {n} files to {path} in {time.perf_counter() - t0:.1f} s", flush=True)
        out.append(image_folder.scan(path))
    return out[0], out[1]


def cores() -> int:
    import os

    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def warm(samples: Samples) -> None:
    for p in samples.paths:
        p.read_bytes()


class EncodedFiles(torch.utils.data.Dataset):
    """gpu-decode's dataset: ``(index, epoch) -> (the file's bytes as a uint8 tensor, label,
    index)``; nothing decoded on the CPU."""

    def __init__(self, samples: Samples) -> None:
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, key: tuple[int, int]):
        i = key[0]
        data = torch.frombuffer(bytearray(self.samples.paths[i].read_bytes()), dtype=torch.uint8)
        return data, self.samples.labels[i], i


def collate_encoded(batch):
    return [b[0] for b in batch], torch.tensor([b[1] for b in batch]), np.array([b[2] for b in batch])


def train(recipe: str, samples: Samples, packed: dict, test: tuple, *, epochs: int, cold: bool,
          seed: int, device: torch.device = torch.device("cpu")) -> dict:
    """One recipe's training; returns samples/s, data wait share, final loss, test accuracy."""
    torch.manual_seed(seed)
    model = ImageCNN(size=SIZE).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    # one cycle up to 4e-3 and down to ~0: the end of the run settles, so runs that differ only
    # in their pixels' last bits end near the same accuracy (without it: 1-5 points apart)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=4e-3, pct_start=0.15,
                                                total_steps=epochs * (len(samples) // BATCH))
    loss_fn = torch.nn.CrossEntropyLoss()
    # one order and one crop per sample and epoch, whichever recipe: they differ only in how
    # the pixels reach the step
    sampler = EpochSampler(len(samples), seed)
    n, wait, t_train, losses = 0, 0.0, 0.0, []
    if recipe == "packed":
        images = np.load(packed["path"], mmap_mode="r")
        labels, sizes = packed["labels"], packed["sizes"]
    else:
        # the step runs in the main process on one core's threads, the workers on the others
        # (2 cores: one worker, one intra-op thread: no oversubscription)
        workers = 0 if recipe == "baseline" else max(1, cores() - 1)
        if workers:
            torch.set_num_threads(max(1, cores() - workers))
        if recipe == "gpu-decode":
            data, collate = EncodedFiles(samples), collate_encoded
        else:
            data = FolderDataset(samples, SIZE, draft=recipe in ("draft+workers", "simplejpeg+workers"),
                                 scale=SCALE, seed=seed,
                                 decoder="simplejpeg" if recipe.startswith("simplejpeg") else "pil")
            collate = None
        loader = torch.utils.data.DataLoader(
            data, batch_size=BATCH, sampler=sampler, num_workers=workers, collate_fn=collate,
            persistent_workers=workers > 0, drop_last=True, pin_memory=device.type == "cuda")
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        if cold:
            drop_page_cache(samples.paths)
            if recipe == "packed":  # a mapped page stays cached: unmap, drop, map again
                del images
                gc.collect()
                drop_page_cache([packed["path"]])
                images = np.load(packed["path"], mmap_mode="r")
        total = torch.zeros((), device=device)
        sync(device)
        t0 = time.perf_counter()
        if recipe == "packed":
            order = sampler.order()
            batches = (order[i:i + BATCH] for i in range(0, len(order) - BATCH + 1, BATCH))
        else:
            batches = iter(loader)
        steps = 0
        while True:
            w0 = time.perf_counter()
            try:
                if recipe == "packed":
                    idx = next(batches)
                    rows = np.sort(idx.numpy())  # sorted reads of the memmap
                    boxes, flips = keyed_crops(seed, epoch, rows, sizes[rows], SCALE)
                    x = crop_batch(torch.from_numpy(images[rows]).to(device), sizes[rows], SIZE,
                                   boxes=boxes, flips=flips)
                    y = labels[rows].to(device)
                elif recipe == "gpu-decode":
                    datas, y, idx = next(batches)
                    decoded = decode_on(datas, device)  # one nvJPEG call for the batch
                    wh = torch.tensor([[d.shape[2], d.shape[1]] for d in decoded])
                    boxes, flips = keyed_crops(seed, epoch, idx, wh, SCALE)
                    x, y = crop_decoded(decoded, boxes, flips, SIZE), y.to(device)
                else:
                    x, y = next(batches)
                    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            except StopIteration:
                break
            wait += time.perf_counter() - w0
            loss = loss_fn(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            if recipe == "baseline":
                total += loss.item()  # sync: as the tutorials log every step
            else:
                total += loss.detach()
            n += len(y)
            steps += 1
        sync(device)
        t_train += time.perf_counter() - t0
        losses.append(float(total) / max(steps, 1))  # the epoch's mean loss
    torch.set_num_threads(cores())
    accuracy = evaluate(model, test[0].to(device), test[1].to(device))
    return {"samples_per_s": n / t_train, "seconds": t_train, "data_wait": wait / t_train,
            "loss": losses[-1], "accuracy": accuracy}


@torch.no_grad()
def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def evaluate(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor) -> float:
    model.eval()
    right = sum(int((model(normalize(images[i:i + 500])).argmax(1) == labels[i:i + 500]).sum())
                for i in range(0, len(labels), 500))
    model.train()
    return 100.0 * right / len(labels)


def pack(samples: Samples, folder: Path, *, cold: bool) -> dict:
    """Decode every training file once at STORED x STORED into a uint8 .npy; the pack's time."""
    if cold:
        drop_page_cache(samples.paths)
    t0 = time.perf_counter()
    images, labels, sizes = decode_all(samples, STORED, workers=cores())
    path = folder / "train-uint8.npy"
    np.save(path, images.numpy())
    return {"path": path, "labels": labels, "sizes": sizes, "seconds": time.perf_counter() - t0,
            "bytes": path.stat().st_size}


def read_rates(samples: Samples) -> tuple[float, float]:
    """MB/s reading every file's bytes warm (just read) and cold (dropped from the page cache):
    says whether the cold runs really read from storage here (a tmpfs cannot drop its pages)."""
    rates = []
    for cold in (False, True):
        warm(samples) if not cold else drop_page_cache(samples.paths)
        t0 = time.perf_counter()
        n = sum(len(p.read_bytes()) for p in samples.paths)
        rates.append(n / 1e6 / (time.perf_counter() - t0))
    return rates[0], rates[1]


def per_sample_costs(samples: Samples) -> tuple[float, float]:
    """ms per sample of the per-sample decode + augmentation alone (main process), and of the
    training step alone on a decoded batch (the net's forward, backward and update)."""
    data = FolderDataset(samples, SIZE, scale=SCALE)
    k = min(256, len(samples))
    t0 = time.perf_counter()
    batch = torch.stack([data[i][0] for i in range(k)])
    decode_ms = (time.perf_counter() - t0) * 1e3 / k
    model, y = ImageCNN(size=SIZE), torch.randint(0, 10, (BATCH,))
    opt = torch.optim.Adam(model.parameters())
    x = batch[:BATCH] if len(batch) >= BATCH else batch.repeat(BATCH // len(batch) + 1, 1, 1, 1)[:BATCH]
    times = []
    for _ in range(12):
        t0 = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    return decode_ms, statistics.median(times[2:]) * 1e3 / BATCH


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=None, help="MNIST folder (the digits the images are drawn from)")
    ap.add_argument("--folder", default=None,
                    help="where the image folders are written / reused (default: a temporary folder)")
    ap.add_argument("--train", type=int, default=12000, help="training files (default 12000)")
    ap.add_argument("--test", type=int, default=5000, help="test files (default 5000)")
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--smoke", action="store_true", help="3000/500 files, 4 epochs, one round")
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda: where every recipe trains")
    ap.add_argument("--recipes", default=",".join(RECIPES),
                    help=f"comma-separated, from {', '.join(RECIPES)} (baseline always runs)")
    args = ap.parse_args(argv)
    asked = [r for r in args.recipes.split(",") if r]
    if bad := [r for r in asked if r not in RECIPES]:
        ap.error(f"--recipes: unknown {', '.join(bad)}; allowed {', '.join(RECIPES)}")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: torch.cuda.is_available() is False here; use --device cpu")
    if args.smoke:
        args.train, args.test, args.epochs, args.rounds = 3000, 500, 4, 1
    torch.set_num_threads(cores())
    with tempfile.TemporaryDirectory(dir=args.folder) as tmp:
        root = Path(args.folder) if args.folder else Path(tmp)
        train_s, test_s = folders(root, args.train, args.test, args.data)
        timg, tlab, _ = decode_all(test_s, SIZE, workers=cores())
        decode_ms, step_ms = per_sample_costs(train_s)
        print(f"{len(train_s)} training files ({train_s.bytes / 1e6:.1f} MB), {len(test_s)} test; "
              f"{cores()} cores, torch {torch.__version__}")
        warm_mb, cold_mb = read_rates(train_s)
        print(f"reading the files: warm {warm_mb:.0f} MB/s, cold {cold_mb:.0f} MB/s"
              + ("" if warm_mb > 1.2 * cold_mb else
                 " (the page cache was not dropped here, or storage is as fast: cold = warm)"))
        print(f"per sample: decode + augmentation {decode_ms:.3f} ms, the step {step_ms:.3f} ms "
              f"(the step is {step_ms / decode_ms:.2f}x the decode: the pipeline is the bottleneck)")
        left_out = {"simplejpeg+workers": simplejpeg_missing(), "gpu-decode": gpu_decode_missing(device)}
        recipes = tuple(r for r in RECIPES if (r in asked or r == "baseline") and not left_out.get(r))
        for r, why in left_out.items():
            if why and r in asked:
                print(f"{r} left out: {why}")
        results: dict[str, dict[str, list[dict]]] = {m: {r: [] for r in recipes} for m in ("warm", "cold")}
        packs: dict[str, list[float]] = {"warm": [], "cold": []}
        for rnd in range(args.rounds):
            for mode in ("warm", "cold"):
                if mode == "warm":
                    warm(train_s)
                packed = pack(train_s, Path(tmp), cold=mode == "cold")
                packs[mode].append(packed["seconds"])
                order = recipes if rnd % 2 == 0 else recipes[::-1]
                for recipe in order:
                    if mode == "warm":
                        warm(train_s)
                    r = train(recipe, train_s, packed, (timg, tlab), epochs=args.epochs,
                              cold=mode == "cold", seed=rnd, device=device)
                    results[mode][recipe].append(r)
                    print(f"round {rnd + 1} {mode:4s} {recipe:18s} {r['samples_per_s']:8.0f} samples/s  "
                          f"data wait {r['data_wait']:6.1%}  loss {r['loss']:.3f}  "
                          f"accuracy {r['accuracy']:.2f}%", flush=True)
    return report(results, packs, args, decode_ms, step_ms, (warm_mb, cold_mb))


def report(results, packs, args, decode_ms: float, step_ms: float, read: tuple[float, float]) -> int:
    warm_mb, cold_mb = read
    med = {m: {r: {k: statistics.median(x[k] for x in runs) for k in runs[0]}
               for r, runs in rs.items()} for m, rs in results.items()}
    print(f"\n{'mode':5s} {'recipe':18s} {'samples/s':>10s} {'vs base':>8s} {'data wait':>10s} "
          f"{'accuracy':>9s}  (median of {args.rounds}, {args.epochs} epochs)")
    ok_goal, ok_smoke = True, True
    for mode, rs in med.items():
        base = rs["baseline"]
        for recipe, r in rs.items():
            print(f"{mode:5s} {recipe:18s} {r['samples_per_s']:10.0f} "
                  f"{r['samples_per_s'] / base['samples_per_s']:7.2f}x {r['data_wait']:10.1%} "
                  f"{r['accuracy']:8.2f}%")
        others = [r for r in rs if r != "baseline"]
        if not others:
            print(f"{mode}: only the baseline ran: no goal to judge")
            ok_goal = ok_smoke = False
            continue
        best = max(others, key=lambda r: rs[r]["samples_per_s"])
        gain = rs[best]["samples_per_s"] / base["samples_per_s"]
        gap = rs[best]["accuracy"] - base["accuracy"]
        pack_s = statistics.median(packs[mode])
        packing = (f"; packing took {pack_s:.2f} s once "
                   f"({pack_s / (rs['packed']['seconds'] / args.epochs):.1f} packed epochs)"
                   if "packed" in rs else "")
        print(f"{mode}: fastest {best} {gain:.2f}x the baseline, accuracy {gap:+.2f} points"
              + packing)
        # the noise of this accuracy: recipes that feed the step the same crops in the same
        # order (the per-sample ones) still end apart (thread counts, draft pixels)
        same = [max(a) - min(a) for a in zip(*(
            [run["accuracy"] for run in results[mode][r]] for r in PER_SAMPLE if r in results[mode]))]
        print(f"{mode}: the per-sample recipes (the same crops, the same order) ended "
              f"{statistics.median(same):.2f} points apart (median over rounds of max - min)")
        goal = gain >= SPEEDUP_GOAL and abs(gap) <= ACCURACY_POINTS
        print(f"goal ({mode}): {best} >= {SPEEDUP_GOAL:g}x and within {ACCURACY_POINTS} points: "
              f"{passfail(goal)}")
        ok_goal &= goal
        if args.smoke:  # too few files and epochs for accuracy: the speed, and that it learns
            floor = smoke_floor(SPEEDUP_GOAL)
            ok_smoke &= smoke_check(f"{mode}: {best} {gain:.2f}x the baseline (>= {floor:g}x), "
                                    f"accuracy {rs[best]['accuracy']:.1f}% above chance (>= "
                                    f"{SMOKE_ACCURACY:g}%)",
                                    gain >= floor and rs[best]["accuracy"] >= SMOKE_ACCURACY)
    if args.json:
        from looptune._io import atomic_write_text

        atomic_write_text(args.json, json.dumps({"median": med, "runs": results, "pack_s": packs,
                                                 "decode_ms": decode_ms, "step_ms": step_ms,
                                                 "read_mb_s": {"warm": warm_mb, "cold": cold_mb},
                                                 "torch": torch.__version__}, indent=1, default=str))
    return exit_code(ok_goal, ok_smoke, args.smoke)


if __name__ == "__main__":
    sys.exit(main())
