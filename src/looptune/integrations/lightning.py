"""A PyTorch Lightning callback that diagnoses the run it is attached to.

    trainer = lightning.Trainer(max_steps=200, callbacks=[DiagnoseCallback(steps=50)])
    trainer.fit(model, datamodule)          # prints the diagnosis after 5 + 50 steps
    callback.diagnosis.bottleneck           # the same Diagnosis as `looptune diagnose`

The probes are those of ``looptune.watch()``: Lightning calls ``optimizer.step(closure)`` (the
forward and backward run inside it), so step boundaries come from torch's optimizer step hook
and the data wait from the DataLoader iterator Lightning's fetcher draws from. After ``warmup +
steps`` optimizer steps the probes come off and training goes on untouched.
"""

from __future__ import annotations

import os
from typing import Any

from looptune.integrations import FitWatch, dataloaders, missing_extra

try:
    from lightning.pytorch.callbacks import Callback
except ImportError as _err:  # pragma: no cover - depends on the environment
    try:
        from pytorch_lightning.callbacks import Callback  # the older package name
    except ImportError:
        raise missing_extra("lightning", "lightning", _err) from None

from looptune.diagnose.result import Diagnosis

__all__ = ["DiagnoseCallback"]


class DiagnoseCallback(Callback):
    """Diagnose ``warmup + steps`` optimizer steps of ``Trainer.fit``, then print (and with
    ``json_path`` save) the Diagnosis; ``self.diagnosis`` holds it afterwards.

    Args:
        warmup: steps left unmeasured first (start-up, compilation).
        steps: steps measured; the probes come off after them (training continues).
        json_path: also write the Diagnosis JSON here (``looptune report`` renders it).
        verbose: print the diagnosis table when it is taken.
    """

    def __init__(self, *, warmup: int = 5, steps: int = 50,
                 json_path: str | os.PathLike | None = None, verbose: bool = True) -> None:
        super().__init__()
        self._fit = FitWatch(warmup=warmup, steps=steps, json_path=json_path, verbose=verbose,
                             label="lightning Trainer.fit")

    @property
    def diagnosis(self) -> Diagnosis | None:
        return self._fit.diagnosis

    @property
    def active(self) -> bool:
        """Whether the probes are on (between the start of training and the last measured step)."""
        return self._fit.active

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        # Lightning made the DataLoader iterator before this hook: tell the probes about it
        self._fit.start(dataloaders(getattr(trainer, "train_dataloader", None)))

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self._fit.after_step()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._fit.finish()  # a run shorter than warmup + steps: diagnose what was seen

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._fit.abort()  # the exception is Lightning's to raise
