"""Raises after a few steps: diagnose reports the error and what it measured."""
import torch

model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(100):
    if step == 12:
        raise RuntimeError("planted failure at step 12")
    opt.zero_grad()
    model(torch.randn(16, 8)).sum().backward()
    opt.step()
