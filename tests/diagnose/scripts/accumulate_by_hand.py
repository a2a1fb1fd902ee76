"""Gradient accumulation with updates by hand: 4 backward calls per update, no torch.optim.
diagnose's steps are then the backward calls (micro-batches), and it says so."""
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
x, y = torch.randn(16 * 400, 32), torch.randint(0, 4, (16 * 400,))
for i, (xb, yb) in enumerate(zip(x.split(16), y.split(16))):
    (torch.nn.functional.cross_entropy(model(xb), yb) / 4).backward()
    if i % 4 == 3:
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.05 * p.grad
                p.grad = None
