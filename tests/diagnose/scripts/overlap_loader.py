"""Planted: loading and the step take about as long, so one worker on a spare core overlaps them.

Per-sample Python decoding (~0.25 ms, ~8 ms per batch of 32) beside a one-thread step of ~12 ms:
num_workers=0 pays both in turn; one worker reads the next batch while the step runs (2+ cores).
"""
import argparse

import torch
from torch.utils.data import DataLoader, Dataset


class Decoded(Dataset):
    def __len__(self):
        return 200_000

    def __getitem__(self, i):
        acc = 0  # a fixed amount of Python work per sample, not a wall-clock wait
        for k in range(6000):
            acc += k * k % 7
        return torch.full((256,), float(acc % 7 + i % 3)), i % 10


torch.set_num_threads(1)  # the step keeps one core: the other is the worker's
parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--workers", type=int, default=0)
parser.add_argument("--width", type=int, default=2048)
args = parser.parse_args()
model = torch.nn.Sequential(torch.nn.Linear(256, args.width), torch.nn.ReLU(),
                            torch.nn.Linear(args.width, args.width), torch.nn.ReLU(),
                            torch.nn.Linear(args.width, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for x, y in DataLoader(Decoded(), batch_size=args.batch_size, num_workers=args.workers):
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
