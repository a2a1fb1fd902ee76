"""Planted input-chain causes, each correct by construction (a tiny model: the step waits for data).

--cause decode:     each sample costs ~1 ms of Python on a CPU in __getitem__ (a fixed amount of
                    work, not a sleep);
--cause storage:    each sample is a 256 KiB file read cold: its pages are dropped from the page
                    cache (fsync + posix_fadvise DONTNEED) right before the read, almost no CPU;
--cause collate:    cheap samples, a collate_fn that spends ~6 ms of Python per batch;
--cause transfer:   cheap samples of 1.5 MiB float32 numpy arrays, collated into one numpy array
                    (12 MiB a batch, pickled through a pipe from 2 workers);
--cause contention: the decode dataset read by more workers than cores, beside a step allowed
                    every core (torch's intra-op threads).
"""
import argparse
import atexit
import os
import shutil
import tempfile

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset


def burn(n):
    acc = 0
    for k in range(n):
        acc += k * k % 7
    return acc


class Decode(Dataset):
    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        return torch.full((32,), float(burn(12_000) % 7 + i % 3)), i % 2


class Cold(Dataset):
    """Files written once; each read is cold (its pages dropped first)."""

    SIZE = 256 * 1024

    def __init__(self, root, files=64):
        self.paths = []
        for k in range(files):
            path = os.path.join(root, f"{k}.bin")
            with open(path, "wb") as f:
                f.write(os.urandom(self.SIZE))
                f.flush()
                os.fsync(f.fileno())  # clean pages: DONTNEED can drop them
            self.paths.append(path)

    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        fd = os.open(self.paths[i % len(self.paths)], os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            data = os.read(fd, self.SIZE)
        finally:
            os.close(fd)
        return torch.full((32,), float(data[0] % 7)), i % 2


class Cheap(Dataset):
    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        return torch.full((32,), float(i % 7)), i % 2


class Big(Dataset):
    """Samples of 1.5 MiB float32 already in memory (a view: no work to fetch them)."""

    def __init__(self):
        self.rows = np.random.default_rng(0).random((16, 384 * 1024), dtype=np.float32)

    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        return self.rows[i % 16], i % 2


def heavy_collate(batch):
    burn(70_000)
    return torch.stack([x for x, _ in batch]), torch.tensor([y for _, y in batch])


def numpy_collate(batch):
    return np.stack([x for x, _ in batch]), np.array([y for _, y in batch])


def build(cause, root):
    """(dataset, collate_fn, model input width) of a planted cause."""
    return {"decode": (Decode(), None, 32), "storage": (Cold(root), None, 32),
            "collate": (Cheap(), heavy_collate, 32),
            "transfer": (Big(), numpy_collate, 384 * 1024),
            "contention": (Decode(), None, 32)}[cause]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cause", required=True,
                        choices=["decode", "storage", "collate", "transfer", "contention"])
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args()
    torch.manual_seed(0)
    # one intra-op thread (the contention case takes every core on purpose)
    torch.set_num_threads(os.cpu_count() if args.cause == "contention" else 1)
    # kept until the process exits: diagnose reads the loader again after the script stops
    root = tempfile.mkdtemp()
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    dataset, collate, width = build(args.cause, root)
    model = torch.nn.Linear(width, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(dataset, batch_size=args.batch_size, num_workers=args.workers,
                        collate_fn=collate)
    for x, y in loader:
        x, y = torch.as_tensor(x), torch.as_tensor(y)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x.float()), y).backward()
        opt.step()


if __name__ == "__main__":
    main()
