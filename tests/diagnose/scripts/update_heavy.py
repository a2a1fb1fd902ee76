"""Planted: an update-heavy step. A wide MLP (784-2048-2048-10, 5.8 M parameters) at batch 256
with torch.optim.AdamW at its defaults (on a CPU: the per-parameter for-loop update), data in
memory (on a GPU when there is one). The AdamW update streams every parameter, gradient and both moments each step: on a
2-core CPU about a third of the step, a fixed cost per step that the fused update shrinks without
changing the training."""
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset


def main(batch=256, steps=100_000):
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"  # benchmarks/gpu_check.sh
    model = torch.nn.Sequential(torch.nn.Linear(784, 2048), torch.nn.ReLU(),
                                torch.nn.Linear(2048, 2048), torch.nn.ReLU(),
                                torch.nn.Linear(2048, 10)).to(device)
    opt = torch.optim.AdamW(model.parameters(), 1e-3)
    # learnable: the label is which of 10 fixed directions the input is closest to
    x = torch.randn(batch * 16, 784)
    y = (x @ torch.randn(784, 10)).argmax(1)
    loader = DataLoader(TensorDataset(x, y), batch_size=batch, shuffle=True)
    done = 0
    while done < steps:
        for xb, yb in loader:
            xb, yb = xb.to(device), yb.to(device)
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            done += 1


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 256)
