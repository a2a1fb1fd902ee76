"""Planted bottleneck: compute. Data already in memory as tensors, a wide MLP, big batches."""
import torch

torch.manual_seed(0)
x = torch.randn(256 * 8, 1024)
y = torch.randint(0, 10, (256 * 8,))
model = torch.nn.Sequential(torch.nn.Linear(1024, 2048), torch.nn.ReLU(),
                            torch.nn.Linear(2048, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for epoch in range(1000):
    for xb, yb in zip(x.split(256), y.split(256)):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
