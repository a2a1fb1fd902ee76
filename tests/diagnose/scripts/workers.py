"""DataLoader worker processes (fork) with a cheap dataset."""
import torch
from torch.utils.data import DataLoader, TensorDataset

ds = TensorDataset(torch.randn(20_000, 32), torch.randint(0, 2, (20_000,)))
model = torch.nn.Linear(32, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
if __name__ == "__main__":
    for x, y in DataLoader(ds, batch_size=64, num_workers=2, persistent_workers=True):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
