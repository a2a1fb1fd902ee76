"""Trains 12 steps, then sys.exit(3): diagnose reports what it measured and exits with 3."""
import sys

from _loop import setup, step

model, opt, loader = setup()
for i, (x, y) in enumerate(loader):
    step(model, opt, x, y)
    if i == 11:
        sys.exit(3)
