"""A training process the fault tests kill, signal or break: ``python child_train.py MODE
VARIANT FOLDER OUT [MARKER]``. MODE: ``plain`` (no checkpoints), ``die`` (checkpoints every 5
steps, SIGKILLs itself inside step 23), ``resume`` (continue from FOLDER), ``term`` (checkpoints;
waits for a SIGTERM while the loader's workers run), ``killsave`` (SIGKILLs itself half-way
through writing its second checkpoint). Writes ``{"model": state_dict, "epoch_loss": [...]}``
to OUT when training ends."""

import dataclasses
import os
import signal
import sys
import time

import torch

import looptune
from looptune.data.loaders import ImageData
from looptune.engine.run_state import Interrupted
from looptune.recipe import (
    LoaderConfig,
    OptimConfig,
    Recipe,
    ScheduleConfig,
    StepConfig,
)

BASE = Recipe(name="fault", loss_sync="epoch", optim=OptimConfig(lr=1e-2),
              loader=LoaderConfig(strategy="device", decode="tensorized", batch_size=32))
VARIANTS = {
    "dataloader": {"loader": {"strategy": "dataloader"}},
    "workers": {"loader": {"strategy": "dataloader", "num_workers": 2,
                           "persistent_workers": True}},
    "prefetch": {"loader": {"strategy": "prefetch"}},
    "device": {},
    "accum-cosine-bf16": {"step": {"accumulate": 2, "precision": "bf16"},
                          "schedule": {"name": "cosine", "warmup_steps": 3}},
    # fast's and tta's engine: the fused kernel called directly, the data normalized once
    "direct-once-onecycle": {"optim": {"name": "adamw", "impl": "direct"},
                             "loader": {"normalize": "once"}, "schedule": {"name": "onecycle"}},
}


def recipe(variant: str) -> Recipe:
    parts = {"loader": BASE.loader, "step": StepConfig(), "schedule": ScheduleConfig(),
             "optim": BASE.optim}
    changes = {k: dataclasses.replace(parts[k], **v) for k, v in VARIANTS[variant].items()}
    return dataclasses.replace(BASE, **changes)


def data(n: int = 512) -> ImageData:
    x = torch.randn(n, 10, generator=torch.Generator().manual_seed(0))
    w = torch.randn(10, 3, generator=torch.Generator().manual_seed(123))
    return ImageData(images=x, labels=(x @ w).argmax(dim=1))


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))


def main(mode: str, variant: str, folder: str, out: str) -> None:
    calls = [0]

    def loss_fn(o, y):
        calls[0] += 1
        if mode == "die" and calls[0] == 23:
            os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, no handler: a hard crash
        if mode == "term" and calls[0] == 7:
            print("READY", flush=True)  # the parent sends SIGTERM now, workers running
            time.sleep(2)  # looptune's handler only sets a flag: this step still completes
        return torch.nn.functional.cross_entropy(o, y)

    if mode == "killsave":
        from looptune import _io

        real, saves = _io.os.fsync, [0]

        def dying_fsync(fd):  # the second checkpoint's bytes are half-written when it dies
            saves[0] += 1
            if saves[0] == 3:  # fsync 1: ckpt 5, 2: its folder, 3: ckpt 10
                os.kill(os.getpid(), signal.SIGKILL)
            real(fd)

        _io.os.fsync = dying_fsync
    m = model()
    resumable = mode != "plain"
    result = looptune.train(m, data(), recipe=recipe(variant), loss_fn=loss_fn, device="cpu",
                            epochs=3, checkpoint_dir=folder if resumable else None,
                            checkpoint_every=5 if resumable else None, resume=mode == "resume")
    torch.save({"model": m.state_dict(), "epoch_loss": result.epoch_loss}, out)


if __name__ == "__main__":
    try:
        main(*sys.argv[1:5])  # argv[5], if any: a marker the test finds orphans by
    except Interrupted as stop:  # what the CLI does: 128 + the signal number
        print(stop, file=sys.stderr)
        sys.exit(stop.exit_code)
