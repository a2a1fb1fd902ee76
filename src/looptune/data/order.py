"""The order of samples: per-epoch permutations, and each rank's share of every batch.

Every strategy draws its batches from here, so every recipe (and every world size) trains on the
same global order for the same seed.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import DistributedSampler

from looptune.recipe import LoaderConfig

__all__ = ["EpochBatchSampler", "EpochSampler", "batch_indices", "epoch_batches",
           "epoch_permutation", "num_batches", "rank_num_batches", "rank_samples_per_epoch"]


def epoch_permutation(n: int, *, seed: int, epoch: int) -> torch.Tensor:
    """The shuffle order of ``epoch``: a CPU int64 permutation of ``range(n)``.

    Derived from (seed, epoch) alone, so any epoch can be replayed (resume, several ranks) without
    replaying the earlier ones.
    """
    state = np.random.SeedSequence([seed, epoch]).generate_state(2, dtype=np.uint32)
    gen = torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))
    return torch.randperm(n, generator=gen)


def epoch_batches(n: int, batch_size: int, *, seed: int, epoch: int, drop_last: bool,
                  rank: int = 0, world: int = 1) -> list[torch.Tensor]:
    """This rank's batches of ``epoch``: one int64 index tensor per batch.

    One process: ``epoch_permutation(...).split(batch_size)`` (the last partial batch kept unless
    ``drop_last``). ``world`` ranks: the same global permutation is cut into global batches of
    ``batch_size * world`` and each is split into ``world`` equal parts, part ``rank`` being this
    rank's batch: at every step the ranks' batches together are one global batch, so an epoch on
    ``world`` ranks with ``batch_size`` each is the single-process epoch with batch
    ``batch_size * world``. Without ``drop_last`` the order is padded to a multiple of ``world``
    with its first indices (as DistributedSampler does), so every rank gets the same number of
    batches and the last one splits evenly.
    """
    perm = epoch_permutation(n, seed=seed, epoch=epoch)
    if world == 1:
        return list(perm.split(batch_size)[: num_batches(n, batch_size, drop_last)])
    step = batch_size * world
    if drop_last:
        perm = perm[: (n // step) * step]
    elif n % world:  # pad with the first indices, cycling when the data is smaller than the pad
        pad = world - n % world
        perm = torch.cat([perm, perm.repeat(-(-pad // n))[:pad]])
    return [chunk.tensor_split(world)[rank] for chunk in perm.split(step)]


class EpochSampler(DistributedSampler):
    """Yields this rank's sample indices of :func:`epoch_batches` for the current epoch.

    A ``DistributedSampler`` (``set_epoch`` before every epoch, ``num_replicas``/``rank``), whose
    order is the global per-epoch permutation shared by every strategy.
    """

    def __init__(self, *, n: int, seed: int, batch_size: int, drop_last: bool, rank: int = 0,
                 world: int = 1) -> None:
        super().__init__(range(n), num_replicas=world, rank=rank, shuffle=True, seed=seed,
                         drop_last=drop_last)
        self.n, self.batch_size, self.skip = n, batch_size, 0

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        """Select the epoch's permutation; ``skip`` leading items (a resumed epoch's done part)."""
        self.epoch, self.skip = epoch, skip

    def _batches(self) -> list[torch.Tensor]:
        return epoch_batches(self.n, self.batch_size, seed=self.seed, epoch=self.epoch,
                             drop_last=self.drop_last, rank=self.rank, world=self.num_replicas)

    def __len__(self) -> int:
        return sum(len(b) for b in self._batches())

    def __iter__(self) -> Iterator[int]:
        return iter(torch.cat(self._batches())[self.skip:].tolist())


class EpochBatchSampler(EpochSampler):
    """Yields one int64 index tensor per batch (for datasets that gather whole batches)."""

    def __len__(self) -> int:
        return rank_num_batches(self.n, self.batch_size, self.drop_last, self.num_replicas)

    def __iter__(self) -> Iterator[torch.Tensor]:  # type: ignore[override]
        return iter(self._batches()[self.skip:])


def num_batches(n: int, batch_size: int, drop_last: bool) -> int:
    return n // batch_size if drop_last else -(-n // batch_size)


def rank_num_batches(n: int, batch_size: int, drop_last: bool, world: int = 1) -> int:
    """Batches per epoch on each of ``world`` ranks (see :func:`epoch_batches`)."""
    if world == 1:
        return num_batches(n, batch_size, drop_last)
    padded = n if drop_last or n % world == 0 else n + world - n % world
    return num_batches(padded, batch_size * world, drop_last)


def rank_samples_per_epoch(n: int, cfg: LoaderConfig, world: int = 1) -> int:
    """Samples one rank trains on per epoch."""
    if world == 1:
        return samples_per_epoch(n, cfg)
    step = cfg.batch_size * world
    if cfg.drop_last:
        return (n // step) * cfg.batch_size
    return -(-n // world)


def batch_indices(n: int, batch_size: int, *, seed: int, epoch: int, i: int,
                  drop_last: bool = False, rank: int = 0, world: int = 1) -> torch.Tensor:
    """The dataset indices in this rank's batch ``i`` of ``epoch`` (names a bad batch's samples)."""
    if world == 1:
        return epoch_permutation(n, seed=seed, epoch=epoch)[i * batch_size: (i + 1) * batch_size]
    return epoch_batches(n, batch_size, seed=seed, epoch=epoch, drop_last=drop_last, rank=rank,
                         world=world)[i]


def samples_per_epoch(n: int, cfg: LoaderConfig) -> int:
    return num_batches(n, cfg.batch_size, True) * cfg.batch_size if cfg.drop_last else n
