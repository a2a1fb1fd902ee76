"""Adapters that attach looptune's diagnose probes inside training frameworks' own loops:
``looptune.integrations.lightning.DiagnoseCallback`` (PyTorch Lightning) and
``looptune.integrations.transformers.DiagnoseCallback`` (Hugging Face ``Trainer``). Each needs its
framework installed (``pip install 'looptune[lightning]'`` / ``'looptune[transformers]'``); the
core install does not. Both drive one :class:`FitWatch`, so they measure the same way."""

from __future__ import annotations

import os
from typing import Any, Iterable

__all__ = ["FitWatch", "missing_extra"]


def missing_extra(package: str, extra: str, err: ImportError) -> ImportError:
    """The ImportError for a missing optional framework, naming the pip command that fixes it."""
    return ImportError(
        f"looptune.integrations.{extra} needs the {package!r} package, which is not installed "
        f"({err}). Install it beside your torch: pip install 'looptune[{extra}]' (it pins "
        "versions that keep the torch you have).")


class FitWatch:
    """``looptune.watch()`` driven by a framework's fit-loop hooks: ``start`` when training
    begins, ``after_step`` after each optimizer step, ``finish`` when training ends (or once
    ``steps`` steps were measured: after the warm-up, one step under the FLOP counter and, on
    CUDA, the profiler window's steps, none of them timed), ``abort`` on an exception. The probes then come off; training goes on untouched.

    Step boundaries come from torch's optimizer step hook (frameworks call ``optimizer.step``,
    often with a closure that runs forward and backward inside it) and data waits from the
    DataLoader iterators the framework draws from.
    """

    def __init__(self, *, warmup: int, steps: int, json_path: str | os.PathLike | None,
                 verbose: bool, label: str) -> None:
        from looptune.diagnose.runner import watch

        watch(warmup=warmup, steps=steps)  # validates the arguments now, before training
        self.warmup, self.steps, self.json_path = warmup, steps, json_path
        self.verbose, self.label = verbose, label
        self.diagnosis = None
        self._watch = None

    @property
    def active(self) -> bool:
        return self._watch is not None

    def start(self, loaders: Iterable[Any] = ()) -> None:
        """Put the probes on (once); ``loaders``: DataLoaders whose iterators may already exist."""
        from looptune.diagnose.runner import watch

        if self.diagnosis is not None or self._watch is not None:
            return
        # steps=None: no StopScript inside the framework's loop; finish() takes the probes off
        self._watch = watch(warmup=self.warmup, steps=None, label=self.label)
        self._watch.__enter__()
        for loader in loaders:
            self._watch.record_loader(loader)

    def after_step(self) -> None:
        # counted from where the measurement began: on CUDA the profiler's steps come first
        if self._watch is not None and self._watch.steps_measured >= self.steps:
            self.finish()

    def abort(self) -> None:
        """Take the probes off without a diagnosis (the framework re-raises its exception)."""
        if self._watch is not None:
            self._watch.__exit__(None, None, None)
            self._watch = None

    def finish(self) -> None:
        """Take the probes off and diagnose what was seen (a short run: what it had)."""
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


def dataloaders(loaders: Any) -> list[Any]:
    """The torch DataLoaders inside what a framework holds: a DataLoader (subclasses such as
    Accelerate's included), a Lightning CombinedLoader (``.flattened``), or a list/dict of them."""
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
