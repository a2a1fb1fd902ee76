"""Planted bottleneck: data_loading. Every sample costs ~0.3 ms of Python in __getitem__."""
import argparse
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Slow(Dataset):
    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 3e-4:  # per-sample decoding work, in Python
            pass
        return torch.full((32,), float(i % 7)), i % 2


parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--workers", type=int, default=0)
args = parser.parse_args()
model = torch.nn.Linear(32, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for x, y in DataLoader(Slow(), batch_size=args.batch_size, num_workers=args.workers):
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
