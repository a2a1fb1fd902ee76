"""Planted: per-op dispatch overhead. A deep stack of 16-wide layers at batch 8: every op is a
few hundred nanoseconds of arithmetic behind microseconds of dispatch, so the step costs about the
same at 4x the batch and a larger batch really pays."""
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset


def main(batch=8, steps=3000):
    torch.manual_seed(0)
    layers = []
    for _ in range(24):
        layers += [torch.nn.Linear(16, 16), torch.nn.LayerNorm(16), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(16, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    data = TensorDataset(torch.randn(batch * 64, 16), torch.randint(0, 4, (batch * 64,)))
    loader = DataLoader(data, batch_size=batch, shuffle=True)
    done = 0
    while done < steps:
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            done += 1


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 8)
