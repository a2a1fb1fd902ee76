"""Planted: an update that is per-op cost. 64 parallel heads of Linear(16, 16) (128 small parameter
tensors) at batch 32, torch.optim.Adam(foreach=False): the update's Python loop runs a dozen ops
per tensor, each a few microseconds of dispatch for a few hundred elements, so the update costs
about the same whatever the tensors' sizes. foreach / fused run the same update in a few calls."""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Heads(nn.Module):
    def __init__(self, n=64):
        super().__init__()
        self.heads = nn.ModuleList(nn.Linear(16, 16) for _ in range(n))

    def forward(self, x):
        return torch.stack([h(x) for h in self.heads]).mean(0)


def main(steps=100_000):
    torch.manual_seed(0)
    model = Heads()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
    x = torch.randn(32 * 16, 16)
    y = x.roll(1, dims=1)
    loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)
    done = 0
    while done < steps:
        for xb, yb in loader:
            opt.zero_grad()
            nn.functional.mse_loss(model(xb), yb).backward()
            opt.step()
            done += 1


if __name__ == "__main__":
    main()
