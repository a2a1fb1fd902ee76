"""Steps by hand, as pytorch/examples' word-language-model does by default: no torch.optim,
``p.data.add_(p.grad, alpha=-lr)`` after each backward. Batches are sliced from one tensor (no
DataLoader): the batch size is only visible as the model input's leading dimension."""
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))
x, y = torch.randn(20 * 200, 32), torch.randint(0, 4, (20 * 200,))
lr = 0.1
for epoch in range(50):
    for xb, yb in zip(x.split(20), y.split(20)):
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(xb), yb).backward()
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)
