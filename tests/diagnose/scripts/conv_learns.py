"""Planted: a pytorch/examples-style MNIST conv net (two convolutions, max-pool, two linear
layers, Adadelta-like Adam step) on learnable 28x28 images (each class a fixed pattern plus
noise), data in memory through a DataLoader. Its loss falls from ~2.3 well below 1 within a few
dozen steps: a rerun that stops learning shows at once."""
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, 1)
        self.conv2 = nn.Conv2d(16, 32, 3, 1)
        self.fc1 = nn.Linear(32 * 12 * 12, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = torch.relu(self.conv1(x))
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        x = torch.relu(self.fc1(torch.flatten(x, 1)))
        return torch.log_softmax(self.fc2(x), dim=1)


def main(batch=64, steps=100_000):
    torch.manual_seed(0)
    patterns = torch.randn(10, 1, 28, 28)
    y = torch.randint(0, 10, (batch * 32,))
    x = patterns[y] + 2.0 * torch.randn(len(y), 1, 28, 28)
    loader = DataLoader(TensorDataset(x, y), batch_size=batch, shuffle=True)
    model = Net()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    done = 0
    while done < steps:
        for data, target in loader:
            optimizer.zero_grad()
            loss = nn.functional.nll_loss(model(data), target)
            loss.backward()
            optimizer.step()
            done += 1


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 64)
