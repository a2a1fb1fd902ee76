"""A loop whose model is ``torch.compile``d, as the PyTorch 2 tutorials write it: the data is an
in-memory tensor dataset (cheap to load), the model a wide MLP, ``model = torch.compile(model)``
before the loop; the first steps compile (seconds), later ones run the compiled graph.
``parts()`` gives the benchmark its pieces (the compiled model, warmed up)."""
import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def parse(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--samples", type=int, default=65536)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--epochs", type=int, default=50)
    return p.parse_args(argv)


def build(args):
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(args.samples, 256, generator=gen),
                         torch.randint(0, 10, (args.samples,), generator=gen))
    model = nn.Sequential(nn.Linear(256, args.width), nn.GELU(), nn.Linear(args.width, args.width),
                          nn.GELU(), nn.Linear(args.width, 10))
    model = torch.compile(model)
    return data, model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def parts(argv=None):
    args = parse(argv)
    data, model, opt = build(args)

    def step(batch):
        x, y = batch
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    return DataLoader(data, batch_size=args.batch_size, shuffle=True), step


def main(argv=None):
    args = parse(argv)
    data, model, opt = build(args)
    for epoch in range(args.epochs):
        for x, y in DataLoader(data, batch_size=args.batch_size, shuffle=True):
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
        print(f"epoch {epoch}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
