"""Deletes its DataLoader (2 workers) mid-epoch, then trains on with a new DataLoader and a new
optimizer (the first one is gone: the new one's steps are the steps)."""
import gc

from _loop import setup, step

model, opt, loader = setup(num_workers=2)
for i, (x, y) in enumerate(loader):
    step(model, opt, x, y)
    if i == 8:
        break
del loader, opt
gc.collect()
model, opt, loader = setup(num_workers=0)
for epoch in range(2):
    for x, y in loader:
        step(model, opt, x, y)
