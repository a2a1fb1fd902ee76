"""What the step probes see of the script's DataLoaders: each loader's settings and passes as it
is iterated (``iter(loader)``), whether this torch's iterator pins its batches, and the time the
training thread waits in ``next()`` (the data wait). A mixin of
:class:`looptune.measure.probes.StepProbes`, whose state (the open part, the deadline, the loaders
seen) these methods read and write."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable

from torch.utils.data import DataLoader

from looptune.measure.loader_info import batches_per_pass, loader_info, loader_parts

__all__ = ["LoaderProbes"]


class LoaderProbes:
    """The DataLoader side of the step probes (patched onto DataLoader and its iterators by
    ``StepProbes.__enter__``)."""

    def _timed_next(self, original: Callable) -> Callable:
        probes = self

        def __next__(it):
            if threading.get_ident() != probes._thread or probes.paused:
                return original(it)  # a background thread's loading is not the step's wait
            t0 = time.perf_counter()
            outer, probes._in_data = probes._in_data, True  # loading is data wait, not syncs
            probes._enter("data_wait")
            try:
                batch = original(it)
                probes.drawn += 1
                probes._check_deadline()
                return batch
            finally:
                probes._leave("data_wait")
                probes._in_data = outer
                probes._wait += time.perf_counter() - t0

        return __next__

    def record_loader(self, loader: DataLoader) -> None:
        """Note ``loader``'s settings and one pass of batches (done on every ``iter(loader)``;
        callable directly for a loader whose iterator was made before the probes went on, as
        a framework does before its training hooks run)."""
        if self.paused:  # looptune's own loader (diagnose/worker_read.py)
            return
        if id(loader) not in self.loaders:
            self.loaders[id(loader)] = loader_info(loader)
            self.loader_parts[id(loader)] = loader_parts(loader)
        self.batches.setdefault(id(loader), 0)
        self.batches[id(loader)] += batches_per_pass(loader)

    def _recorded_iter(self, original: Callable) -> Callable:
        probes = self

        def __iter__(loader):
            probes.record_loader(loader)
            it = original(loader)
            probes.note_pinning(loader, it)
            return it

        return __iter__

    def note_pinning(self, loader: DataLoader, it: object) -> None:
        """Whether the iterator pins its batches, as this torch decided (LoaderInfo.pinned)."""
        info = self.loaders.get(id(loader))
        pinned = getattr(it, "_pin_memory", None)
        if info is not None and info.pinned is None and isinstance(pinned, bool):
            self.loaders[id(loader)] = dataclasses.replace(info, pinned=pinned)
