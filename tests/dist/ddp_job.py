"""A small data-parallel job on the looptune engine, for the tests in this folder.

Run under torchrun (any world size) or as a plain process (world size 1). Trains the reference
MLP on synthetic MNIST-shaped data and writes, per rank, ``OUT/rank-R.pt`` (final weights) and
rank 0's result as ``OUT/result.json``. ``--kill-rank R --kill-at K`` makes rank R SIGKILL itself
at its batch K (a rank dying mid-epoch); ``--hang-rank R --kill-at K`` makes it sleep instead.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
import time
from pathlib import Path

import torch

from looptune.bench.workloads import SimpleFeedForwardNN
from looptune.data import loaders
from looptune.data.loaders import ImageData
from looptune.dist import context
from looptune.engine.loop import RunOptions, train
from looptune.presets import get_recipe
from looptune.resolve import resolve


class WriteAudit:
    """Records every file this process opens for writing, creates by rename, or removes under
    ``folder`` (an audit hook: what the engine really did, not what it says)."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.events = str(folder.resolve()), []
        sys.addaudithook(self._hook)

    def _hook(self, event: str, args: tuple) -> None:
        if event == "open" and len(args) >= 3:
            path, mode, flags = args[0], args[1], args[2]
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))
            self._note("write", path, writes)
        elif event in ("os.rename", "os.remove"):
            self._note(event, args[1] if event == "os.rename" else args[0], True)

    def _note(self, what: str, path: object, relevant: bool) -> None:
        if relevant and isinstance(path, (str, os.PathLike)):
            full = os.path.abspath(os.fspath(path))
            if full.startswith(self.folder):
                self.events.append([what, os.path.basename(full)])


class Saboteur:
    """Progress sink that kills (or hangs) one rank at a given batch."""

    def __init__(self, rank: int, at: int, hang: bool) -> None:
        self.rank, self.at, self.hang, self.seen = rank, at, hang, 0

    def advance(self, steps: int) -> None:
        self.seen += steps
        if context.current().rank == self.rank and self.seen >= self.at:
            if self.hang:
                time.sleep(3600)
            os.kill(os.getpid(), signal.SIGKILL)

    def epoch_done(self, epoch, loss, seconds) -> None:
        pass


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("out", type=Path)
    p.add_argument("--recipe", default="tensorized")
    p.add_argument("--strategy", default=None, help="override the recipe's loader strategy")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--accumulate", type=int, default=1)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--samples", type=int, default=1000)
    p.add_argument("--checkpoint", default=None)
    p.add_argument("--checkpoint-every", type=int, default=None)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--kill-rank", type=int, default=None)
    p.add_argument("--hang-rank", type=int, default=None)
    p.add_argument("--kill-at", type=int, default=10)
    p.add_argument("--timeout", type=float, default=30.0)
    p.add_argument("--audit", action="store_true",
                   help="write OUT/writes-rank-R.json: the files this rank wrote under --checkpoint")
    args = p.parse_args()
    audit = WriteAudit(Path(args.checkpoint)) if args.audit and args.checkpoint else None
    torch.set_num_threads(1)
    device = torch.device("cpu")
    ctx = context.init(device, timeout_s=args.timeout)
    gen = torch.Generator().manual_seed(0)
    data = ImageData(images=torch.randint(0, 256, (args.samples, 28, 28), dtype=torch.uint8, generator=gen),
                     labels=torch.randint(0, 10, (args.samples,), generator=gen), mean=0.1307, std=0.3081)
    recipe = get_recipe(args.recipe)
    recipe = dataclasses.replace(
        recipe, loader=dataclasses.replace(recipe.loader, batch_size=args.batch,
                                           strategy=args.strategy or recipe.loader.strategy),
        step=dataclasses.replace(recipe.step, accumulate=args.accumulate))
    resolved, decisions = resolve(recipe, "cpu", ctx.world_size)
    torch.manual_seed(1)
    model = SimpleFeedForwardNN()
    source = loaders.make(resolved.loader, data, device=device, seed=5, rank=ctx.rank,
                          world=ctx.world_size)
    options = RunOptions(epochs=args.epochs, seed=5, resume=args.resume,
                         checkpoint_dir=Path(args.checkpoint) if args.checkpoint else None,
                         checkpoint_every=args.checkpoint_every, nonfinite_check_every=1)
    bad = args.kill_rank if args.kill_rank is not None else args.hang_rank
    sink = None if bad is None else Saboteur(bad, args.kill_at, args.hang_rank is not None)
    result = train(model=model, source=source, recipe=resolved, loss_fn=torch.nn.CrossEntropyLoss(),
                   device=device, options=options, decisions=decisions, progress=sink, dist=ctx)
    args.out.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), args.out / f"rank-{ctx.rank}.pt")
    if ctx.is_main:
        (args.out / "result.json").write_text(json.dumps(result.to_dict()))
    if audit is not None:
        (args.out / f"writes-rank-{ctx.rank}.json").write_text(json.dumps(audit.events))
    context.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
