"""Planted bottleneck: overhead. Batches of 4, a tiny model, loss.item() and a print every step."""
import torch

x = torch.randn(4096, 16)
y = torch.randint(0, 2, (4096,))
model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
total = 0.0
for epoch in range(100):
    for xb, yb in zip(x.split(4), y.split(4)):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        total += loss.item()
