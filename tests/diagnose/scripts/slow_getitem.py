"""Planted bottleneck: data_loading. Every sample costs ~0.3 ms of Python in __getitem__."""
import argparse

import torch
from torch.utils.data import DataLoader, Dataset


class Slow(Dataset):
    def __init__(self, samples=100_000):
        self.samples = samples

    def __len__(self):
        return self.samples

    def __getitem__(self, i):
        # per-sample decoding in Python: a fixed amount of work (not a wall-clock wait, which a
        # throttled VM would turn into a different share)
        acc = 0
        for k in range(4000):
            acc += k * k % 7
        return torch.full((32,), float(acc % 7 + i % 3)), i % 2


# one intra-op thread: on a VM whose vCPUs the host throttles, 2-thread OpenMP regions stall at
# their barriers for whole scheduler ticks, which would land in the step, not in the data wait
torch.set_num_threads(1)
parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--workers", type=int, default=0)
parser.add_argument("--samples", type=int, default=100_000)
args = parser.parse_args()
model = torch.nn.Linear(32, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for x, y in DataLoader(Slow(args.samples), batch_size=args.batch_size, num_workers=args.workers):
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
