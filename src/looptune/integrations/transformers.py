"""A Hugging Face ``transformers.TrainerCallback`` that diagnoses the ``Trainer.train()`` it is
attached to.

    callback = DiagnoseCallback(warmup=5, steps=50, json_path="diagnosis.json")
    Trainer(model=model, args=args, train_dataset=ds, callbacks=[callback]).train()
    callback.diagnosis.bottleneck           # the same Diagnosis as `looptune diagnose`

The probes are those of ``looptune.watch()``: the Trainer steps a torch optimizer (through
Accelerate's wrapper), so step boundaries come from torch's optimizer step hook, and data waits
from the DataLoader iterator each epoch draws from. After ``warmup + steps`` optimizer steps the
probes come off and training goes on untouched. ``TrainerCallback`` has no exception event: when
``train()`` raises before the probes came off, call ``callback.close()`` (or run under ``with
callback:``) to take them off.
"""

from __future__ import annotations

import os
from typing import Any

from looptune.integrations import FitWatch, missing_extra

try:
    from transformers import TrainerCallback
except ImportError as _err:  # pragma: no cover - depends on the environment
    raise missing_extra("transformers", "transformers", _err) from None

from looptune.diagnose.result import Diagnosis

__all__ = ["DiagnoseCallback"]


class DiagnoseCallback(TrainerCallback):
    """Diagnose ``warmup + steps`` optimizer steps of ``Trainer.train()``, then print (and with
    ``json_path`` save) the Diagnosis; ``self.diagnosis`` holds it afterwards.

    Args:
        warmup: steps left unmeasured first (start-up, compilation).
        steps: steps measured; the probes come off after them (training continues).
        json_path: also write the Diagnosis JSON here (``looptune report`` renders it).
        verbose: print the diagnosis table when it is taken (on the main process only).
    """

    def __init__(self, *, warmup: int = 5, steps: int = 50,
                 json_path: str | os.PathLike | None = None, verbose: bool = True) -> None:
        self._fit = FitWatch(warmup=warmup, steps=steps, json_path=json_path, verbose=verbose,
                             label="transformers Trainer.train")

    @property
    def diagnosis(self) -> Diagnosis | None:
        return self._fit.diagnosis

    @property
    def active(self) -> bool:
        """Whether the probes are on (between the start of training and the last measured step)."""
        return self._fit.active

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not getattr(state, "is_world_process_zero", True):
            self._fit.verbose = False  # one printed diagnosis per job
        # each epoch makes its DataLoader iterator after this event, where the probes see it; the
        # train_dataloader the event carries is the one before Accelerate's prepare(), not that one
        self._fit.start()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._fit.after_step()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._fit.finish()  # a run shorter than warmup + steps: diagnose what was seen

    def close(self) -> None:
        """Take the probes off without a diagnosis (after ``train()`` raised)."""
        self._fit.abort()

    def __enter__(self) -> DiagnoseCallback:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.close()
        else:
            self._fit.finish()
