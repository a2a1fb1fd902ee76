"""A Hugging Face Accelerate loop, in its shape (our code): ``Accelerator()``,
``accelerator.prepare(model, optimizer, dataloader, scheduler)``, ``accelerator.backward(loss)``,
``accelerator.print`` of the loss; on the CPU here. The Dataset tokenizes text per sample (a
byte-level encode with padding), as a text-classification loop does."""
import argparse
import contextlib

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, Dataset

from looptune.data.text import load_corpus


class Sentences(Dataset):
    def __init__(self, n: int, length: int) -> None:
        text = load_corpus("pystdlib", max_bytes=1 << 18).data.decode("utf-8", "replace")
        self.lines = [ln for ln in text.splitlines() if ln.strip()][:n]
        self.length = length

    def __len__(self) -> int:
        return len(self.lines)

    def __getitem__(self, i: int):
        ids = list(self.lines[i].encode("utf-8"))[: self.length]  # "tokenize"
        ids += [0] * (self.length - len(ids))  # pad
        return {"input_ids": torch.tensor(ids), "labels": torch.tensor(len(self.lines[i]) % 2)}


class Classifier(nn.Module):
    def __init__(self, length: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(256, 64)
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(64 * length, 256), nn.ReLU(),
                                  nn.Linear(256, 2))

    def forward(self, input_ids):
        return self.head(self.emb(input_ids))


def parse(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--samples", type=int, default=4096)
    p.add_argument("--length", type=int, default=64)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--watch", type=int, default=0,
                   help="diagnose this many steps in-process with looptune.watch(), then stop")
    return p.parse_args(argv)


def build(args):
    """Accelerator.prepare(model, optimizer, loader, scheduler), as main() and parts() use."""
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = Classifier(args.length)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = DataLoader(Sentences(args.samples, args.length), batch_size=32, shuffle=True)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=100, gamma=0.9)
    return accelerator, *accelerator.prepare(model, optimizer, loader, scheduler)


def parts(argv=None):
    """(prepared loader, step(batch)) for benchmarks/diagnose_fidelity.py."""
    accelerator, model, optimizer, loader, _ = build(parse(argv))

    def step(batch):
        loss = nn.functional.cross_entropy(model(batch["input_ids"]), batch["labels"])
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        return loss.item()

    return loader, step


def main(argv=None):
    args = parse(argv)
    accelerator, model, optimizer, loader, scheduler = build(args)
    if args.watch:
        import looptune

        watcher = looptune.watch(warmup=3, steps=args.watch, label="accelerate loop")
    else:
        watcher = contextlib.nullcontext()
    with watcher:  # with steps=, the block ends once they were measured
        train(args, accelerator, model, optimizer, loader, scheduler)
    return watcher


def train(args, accelerator, model, optimizer, loader, scheduler):
    for epoch in range(args.epochs):
        model.train()
        for step, batch in enumerate(loader):
            outputs = model(batch["input_ids"])
            loss = nn.functional.cross_entropy(outputs, batch["labels"])
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            if step % 50 == 0:
                accelerator.print(f"epoch {epoch} step {step}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
