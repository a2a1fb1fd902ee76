"""Planted: compute on a CPU that looks like overhead by GFLOP/s. The pytorch/examples MNIST conv
net (two 3x3 convs, max-pool, two linear layers, Adadelta, batch 64): small-channel convolutions
run far below a large GEMM's rate, yet the step's time grows linearly with the batch, so a larger
batch gains little. Data is pre-made tensors, so the step itself is what is measured."""
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "loops"))
from pytorch_examples_mnist import Net  # noqa: E402  the same conv net


def main(batch=64, steps=400):
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(batch * 16, 1, 28, 28), torch.randint(0, 10, (batch * 16,)))
    loader = DataLoader(data, batch_size=batch, shuffle=True)
    model = Net()
    opt = torch.optim.Adadelta(model.parameters(), lr=1.0)
    done = 0
    while done < steps:
        for x, y in loader:
            opt.zero_grad()
            F.nll_loss(model(x), y).backward()
            opt.step()
            done += 1


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 64)
