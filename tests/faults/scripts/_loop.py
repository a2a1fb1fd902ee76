"""Shared by the fault scripts: a tiny model, its optimizer and one training step."""
import torch
from torch.utils.data import DataLoader, TensorDataset


def setup(n=512, batch=16, **loader_kw):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = TensorDataset(torch.randn(n, 32), torch.randint(0, 4, (n,)))
    return model, opt, DataLoader(data, batch_size=batch, shuffle=True, **loader_kw)


def step(model, opt, x, y):
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss
