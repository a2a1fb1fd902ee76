"""Builds a torch.optim optimizer but never calls its step(): diagnose must say so clearly (a
script with no optimizer at all is stepped by its backward calls instead)."""
import torch

model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(20):
    opt.zero_grad()
    model(torch.randn(16, 8)).sum().backward()
