"""A user's own data as batch sources: any DataLoader as it is, or a map-style Dataset decoded
once into tensors (so the ``device``/``prefetch`` strategies need no per-sample Python)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader, Dataset

from looptune.data.loaders import Batch, ImageData
from looptune.errors import ConfigError

__all__ = ["UserLoaderSource", "tensorize", "is_map_dataset"]


def is_map_dataset(data: object) -> bool:
    return hasattr(data, "__getitem__") and hasattr(data, "__len__") and not isinstance(data, DataLoader)


def tensorize(dataset: Dataset) -> ImageData:
    """Read every ``(input, target)`` sample once and stack them into two tensors.

    Raises:
        ConfigError: a sample is not an (input, target) pair of tensors/numbers, or the
            inputs differ in shape (such datasets need strategy='dataloader').
    """
    inputs, targets = [], []
    for i in range(len(dataset)):
        sample = dataset[i]
        if not (isinstance(sample, (tuple, list)) and len(sample) == 2):
            raise ConfigError(f"sample {i} of {type(dataset).__name__} is a {type(sample).__name__}; "
                              "looptune.train needs (input, target) pairs. Return a tuple from "
                              "__getitem__, or pass your own DataLoader with strategy='dataloader'.")
        inputs.append(torch.as_tensor(sample[0]))
        targets.append(torch.as_tensor(sample[1]))
    if not inputs:
        raise ConfigError(f"{type(dataset).__name__} is empty: there is nothing to train on.")
    try:
        return ImageData(torch.stack(inputs), torch.stack(targets))
    except RuntimeError as err:
        raise ConfigError(f"the samples of {type(dataset).__name__} cannot be stacked into one "
                          f"tensor ({err}); use strategy='dataloader' with decode='per_sample', "
                          "or pass your own DataLoader with a collate_fn.") from None


class UserLoaderSource:
    """A user's DataLoader, used as given (its batch size, workers and sampler)."""

    def __init__(self, loader: DataLoader, device: torch.device, non_blocking: bool) -> None:
        self.loader, self.device, self.non_blocking = loader, device, non_blocking
        dataset_len = len(loader.dataset) if hasattr(loader.dataset, "__len__") else None
        self.samples_per_epoch = (dataset_len if dataset_len is not None and not loader.drop_last
                                  else len(loader) * (loader.batch_size or 1))

    def __len__(self) -> int:
        return len(self.loader)

    def epoch(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        sampler = getattr(self.loader, "sampler", None)
        if hasattr(sampler, "set_epoch"):  # e.g. DistributedSampler: reshuffle per epoch
            sampler.set_epoch(epoch)
        return itertools.islice(iter(self.loader), start, None)  # resume: skip what was trained

    def to_device(self, x: torch.Tensor, y: torch.Tensor) -> Batch:
        return (x.to(self.device, non_blocking=self.non_blocking),
                y.to(self.device, non_blocking=self.non_blocking))

    def batch_indices(self, epoch: int, i: int) -> torch.Tensor | None:
        return None  # the user's sampler decides; looptune cannot name the samples
