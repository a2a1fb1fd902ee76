"""Never calls optimizer.step(): diagnose must say so clearly."""
import torch

model = torch.nn.Linear(8, 2)
for _ in range(20):
    model(torch.randn(16, 8)).sum().backward()
