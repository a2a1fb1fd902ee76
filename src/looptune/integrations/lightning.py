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

from looptune.integrations import missing_extra

try:
    from lightning.pytorch.callbacks import Callback
except ImportError as _err:  # pragma: no cover - depends on the environment
    try:
        from pytorch_lightning.callbacks import Callback  # the older package name
    except ImportError:
        raise missing_extra("lightning", "lightning", _err) from None

from looptune.diagnose.result import Diagnosis
from looptune.diagnose.runner import watch

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
        watch(warmup=warmup, steps=steps)  # validates the arguments now, before training
        self.warmup, self.steps, self.json_path, self.verbose = warmup, steps, json_path, verbose
        self.diagnosis: Diagnosis | None = None
        self._watch: watch | None = None

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if self.diagnosis is None and self._watch is None:
            # steps=None: no StopScript inside Lightning's loop; _finish takes the probes off
            self._watch = watch(warmup=self.warmup, steps=None, label="lightning Trainer.fit")
            self._watch.__enter__()
            for loader in _dataloaders(getattr(trainer, "train_dataloader", None)):
                self._watch.record_loader(loader)  # Lightning made its iterator before this hook

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        # + 1: the step after the warm-up runs under the FLOP counter and is not timed
        if self._watch is not None and self._watch.steps_seen >= self.warmup + 1 + self.steps:
            self._finish()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._finish()  # a run shorter than warmup + steps: diagnose what was seen

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if self._watch is not None:  # take the probes off; the exception is Lightning's to raise
            self._watch.__exit__(None, None, None)
            self._watch = None

    def _finish(self) -> None:
        if self._watch is None:
            return
        w, self._watch = self._watch, None
        w.__exit__(None, None, None)
        self.diagnosis = w.diagnosis
        if self.diagnosis is None:
            return
        if self.json_path is not None:
            self.diagnosis.write_json(self.json_path)
        if self.verbose:
            from looptune.report.diagnose_view import print_diagnosis
            from looptune.report.render import wide_console

            print_diagnosis(self.diagnosis, wide_console())


def _dataloaders(loaders: Any) -> list[Any]:
    """The torch DataLoaders inside what Lightning holds: a DataLoader, a CombinedLoader
    (``.flattened``), or a list/dict of them."""
    from torch.utils.data import DataLoader

    if loaders is None:
        return []
    if isinstance(loaders, DataLoader):
        return [loaders]
    flat = getattr(loaders, "flattened", None)
    items = flat if flat is not None else (
        list(loaders.values()) if isinstance(loaders, dict) else
        list(loaders) if isinstance(loaders, (list, tuple)) else [])
    return [x for x in items if isinstance(x, DataLoader)]
