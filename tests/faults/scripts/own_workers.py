"""Preprocesses with its own multiprocessing pool (spawned processes), then trains."""
import multiprocessing as mp

import torch
from _loop import setup, step


def scale(chunk):
    return (chunk * 2.0).tolist()


if __name__ == "__main__":
    model, opt, loader = setup()
    with mp.get_context("spawn").Pool(2) as pool:
        parts = pool.map(scale, [torch.randn(4, 32) for _ in range(4)])
    assert len(parts) == 4
    for epoch in range(3):
        for x, y in loader:
            step(model, opt, x, y)
