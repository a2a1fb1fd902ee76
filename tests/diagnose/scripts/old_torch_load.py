"""A full-batch regression written for torch < 2.6: its data is a pickled object loaded with
torch.load, which torch >= 2.6 refuses by default (weights_only=True) before the first step."""
import sys
import tempfile
from pathlib import Path

import torch


class Data:  # a plain pickled object, not tensors: weights_only refuses it
    def __init__(self, x, y):
        self.x, self.y = x, y


def main():
    path = Path(tempfile.mkdtemp()) / "data.pt"
    torch.save(Data(torch.randn(256, 8), torch.randn(256, 1)), path)
    data = torch.load(path)  # the line an old script has
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 100):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(data.x), data.y).backward()
        opt.step()


if __name__ == "__main__":
    main()
