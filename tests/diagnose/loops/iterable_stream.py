"""A loop over a streaming IterableDataset (no len), as people write one for data that does not
fit a map-style Dataset: each DataLoader worker reads its own shard of the stream
(``get_worker_info``), decodes records one by one (here: bytes -> float image, a per-record cost)
and yields them; a small MLP trains on the batches. ``parts()`` gives the benchmark its pieces."""
import argparse
import math

import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, get_worker_info


class RecordStream(IterableDataset):
    """``n`` records of 784 uint8 pixels, decoded and normalized one record at a time."""

    def __init__(self, n: int, decode_rounds: int) -> None:
        self.n, self.rounds = n, decode_rounds

    def __iter__(self):
        info = get_worker_info()
        shard, shards = (0, 1) if info is None else (info.id, info.num_workers)
        per = math.ceil(self.n / shards)
        gen = torch.Generator().manual_seed(shard)
        for i in range(shard * per, min(self.n, (shard + 1) * per)):
            raw = torch.randint(0, 256, (784,), dtype=torch.uint8, generator=gen)
            x = raw.float().div_(255)
            for _ in range(self.rounds):  # the per-record parsing a real decoder does
                x = (x - x.mean()) / (x.std() + 1e-6)
            yield x, i % 10


def parse(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--records", type=int, default=200_000)
    p.add_argument("--decode-rounds", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=0)
    return p.parse_args(argv)


def build(args):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


def loader(args):
    return DataLoader(RecordStream(args.records, args.decode_rounds), batch_size=args.batch_size,
                      num_workers=args.workers)


def parts(argv=None):
    args = parse(argv)
    model, opt = build(args)

    def step(batch):
        x, y = batch
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    return loader(args), step


def main(argv=None):
    args = parse(argv)
    model, opt = build(args)
    for x, y in loader(args):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
