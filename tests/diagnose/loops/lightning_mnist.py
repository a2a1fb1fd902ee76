"""A PyTorch Lightning loop, in its shape (our code): a LightningModule with training_step and
configure_optimizers, a DataLoader from the module's train_dataloader, ``Trainer(max_steps=...)``
on the CPU with Lightning's progress bar, logger and checkpointing off. The per-sample Dataset
does a little Python work per image, as a decoding Dataset would. With ``--callback`` the run
carries looptune's DiagnoseCallback instead of being run under ``looptune diagnose``."""
import argparse
import time

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Digits(Dataset):
    def __init__(self, n: int, work: int) -> None:
        gen = torch.Generator().manual_seed(0)
        self.images = torch.randint(0, 256, (n, 784), dtype=torch.uint8, generator=gen)
        self.labels = torch.randint(0, 10, (n,), generator=gen)
        self.work = work

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        x = self.images[i].float().div(255)
        for _ in range(self.work):  # per-sample decoding work
            x = (x - 0.1307) / 0.3081
        return x, self.labels[i]


class LitMLP(L.LightningModule):
    def __init__(self, args) -> None:
        super().__init__()
        self.args = args
        self.net = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 10))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)

    def train_dataloader(self):
        return DataLoader(Digits(self.args.samples, self.args.work), batch_size=64, shuffle=True)


def parse(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--samples", type=int, default=20000)
    p.add_argument("--work", type=int, default=20)
    p.add_argument("--max-steps", type=int, default=300)
    p.add_argument("--callback", action="store_true")
    return p.parse_args(argv)


def parts(argv=None):
    """(loader, step(batch)) for benchmarks/diagnose_fidelity.py: the module's own dataloader and
    training_step with its optimizer, stepped as Lightning's automatic optimization does."""
    args = parse(argv)
    torch.manual_seed(0)
    model = LitMLP(args)
    opt = model.configure_optimizers()

    def step(batch):
        opt.zero_grad()
        loss = model.training_step(batch, 0)
        loss.backward()
        opt.step()
        return loss.item()

    model.log = lambda *a, **k: None  # no Trainer attached: logging is the Trainer's job
    return model.train_dataloader(), step


def framework_step_ms(argv, batch, steps):
    """ms per step of ``Trainer.fit`` itself fed one fixed batch from memory (for
    benchmarks/diagnose_fidelity.py): Lightning's per-step machinery (fetcher, hooks, logging,
    the closure) is part of the step a user's run pays for, so the step alone includes it."""
    args = parse(argv)
    args.max_steps = steps + 4
    torch.manual_seed(0)
    model = LitMLP(args)
    cached = DataLoader([batch] * args.max_steps, batch_size=None)  # no loading work left
    model.train_dataloader = lambda: cached
    ends = []

    class Clock(L.Callback):
        def on_train_batch_end(self, *_args):
            ends.append(time.perf_counter())

    trainer(args, [Clock()]).fit(model)
    return [(b - a) * 1e3 for a, b in zip(ends[3:], ends[4:])]  # 3 warm-up steps left out


def trainer(args, callbacks=()):
    return L.Trainer(max_steps=args.max_steps, accelerator="cpu", devices=1, logger=False,
                     enable_progress_bar=False, enable_checkpointing=False,
                     enable_model_summary=False, callbacks=list(callbacks))


def main(argv=None):
    args = parse(argv)
    torch.manual_seed(0)
    callbacks = []
    if args.callback:
        from looptune.integrations.lightning import DiagnoseCallback

        callbacks.append(DiagnoseCallback(warmup=3, steps=20))
    model = LitMLP(args)
    trainer(args, callbacks).fit(model)
    return callbacks


if __name__ == "__main__":
    main()
