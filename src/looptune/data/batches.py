"""What every loader strategy shares: the data it reads (:class:`ImageData`, tensors in memory;
:class:`BatchedData`, a reader of whole batches such as a packed file), what it yields
(:class:`BatchSource`), and the per-batch preparation on the device (augmentation, then the float
ops of ToTensor + Normalize). The bottom of ``looptune.data``: the loaders, the prefetcher and the
per-sample pipeline build on it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import torch
from torch.utils.data import Dataset

from looptune.errors import ConfigError

__all__ = ["Batch", "BatchAugment", "BatchSource", "BatchedData", "ImageData", "has_get_batch",
           "normalize_batch", "prepare_batch"]

Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True, kw_only=True)
class ImageData:
    """Inputs and targets held as tensors (first dimension = samples): images, token windows,
    any fixed-shape samples.

    With ``mean``/``std`` the inputs are uint8 images, normalized per batch on the device as
    ToTensor + Normalize would; without them the inputs are used as they are. With ``augment``
    every training batch gets a random transform first (batched, on the training device), and
    the per-sample pipeline applies the same transform to each PIL image instead.
    """

    images: torch.Tensor  # inputs, N x ...: uint8 images when mean/std are given
    labels: torch.Tensor  # targets, N x ...
    mean: float | None = None  # per-pixel mean of the [0, 1]-scaled images, subtracted
    std: float | None = None  # per-pixel std of the [0, 1]-scaled images, divided by
    augment: BatchAugment | None = None  # random training transform (e.g. augment.RandomAffine)
    # how the per-sample (seed/baseline) pipeline reads this data one sample at a time, given the
    # recipe's loader.image_decoder (for files it decodes); None: PIL decode + Normalize for images
    # with mean/std, else indexing the tensors
    per_sample: Callable[[ImageData, str], Dataset] | None = None

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def gather(self, index: torch.Tensor, out: Batch | None = None) -> Batch:
        """Rows ``index`` of images and labels; into the leading rows of ``out`` when given."""
        if out is None:
            return self.images.index_select(0, index), self.labels.index_select(0, index)
        rows = len(index)  # the last batch may be partial: fill a prefix of the full-size buffer
        return (torch.index_select(self.images, 0, index, out=out[0][:rows]),
                torch.index_select(self.labels, 0, index, out=out[1][:rows]))

    def layout(self) -> tuple[tuple[int, ...], torch.dtype, tuple[int, ...], torch.dtype]:
        """Per-sample (input shape, input dtype, target shape, target dtype)."""
        return (tuple(self.images.shape[1:]), self.images.dtype, tuple(self.labels.shape[1:]),
                self.labels.dtype)

    def materialize(self) -> ImageData:
        return self


@dataclass(frozen=True)
class BatchedData:
    """A dataset that reads whole batches itself: ``dataset.get_batch(indices) -> (inputs,
    targets)`` (e.g. :func:`looptune.open_packed`). Every strategy gathers through it, so no
    per-sample Python runs: ``dataloader`` workers each read whole batches, ``prefetch`` reads in
    its thread, ``device`` reads everything once with one call.

    ``mean``/``std`` as for :class:`ImageData` (uint8 inputs normalized on the device).
    """

    dataset: object  # has __len__ and get_batch(indices) -> (inputs, targets)
    mean: float | None = None
    std: float | None = None

    def __post_init__(self) -> None:
        if len(self):
            self._read(torch.zeros(1, dtype=torch.int64))  # fail now, not in a worker or thread

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def gather(self, index: torch.Tensor, out: Batch | None = None) -> Batch:
        x, y = self._read(index)
        if out is None:
            return x, y
        rows = len(index)
        return out[0][:rows].copy_(x), out[1][:rows].copy_(y)

    def layout(self) -> tuple[tuple[int, ...], torch.dtype, tuple[int, ...], torch.dtype]:
        x, y = self._read(torch.zeros(1, dtype=torch.int64))
        return tuple(x.shape[1:]), x.dtype, tuple(y.shape[1:]), y.dtype

    def materialize(self) -> ImageData:
        """Everything in memory as tensors: one ``get_batch`` over all indices."""
        x, y = self._read(torch.arange(len(self)))
        return ImageData(images=x, labels=y, mean=self.mean, std=self.std)

    def _read(self, index: torch.Tensor) -> Batch:
        got = self.dataset.get_batch(index)  # type: ignore[attr-defined]
        if (isinstance(got, (tuple, list)) and len(got) == 2
                and all(isinstance(t, torch.Tensor) for t in got)):
            return got[0], got[1]
        kind = getattr(getattr(self.dataset, "header", None), "kind", None)
        what = (f"{type(got).__name__} of {len(got)}" if isinstance(got, (tuple, list, dict))
                else type(got).__name__)
        raise ConfigError(
            f"{type(self.dataset).__name__}.get_batch returned a {what}"
            + (f" (a packed dataset of {kind} samples)" if kind else "")
            + "; training needs (inputs, targets): two tensors. Pack (input, target) tuples, "
              "or wrap the dataset so get_batch returns that pair.")


def has_get_batch(data: object) -> bool:
    """Whether ``data`` reads whole batches itself (a packed dataset, or anything alike)."""
    return callable(getattr(data, "get_batch", None)) and hasattr(data, "__len__")


class BatchAugment(Protocol):
    """A random transform with a batched form (tensor ops on the device) and a per-sample form
    (for one PIL image in a Dataset), drawing from the same distribution."""

    def batch(self, x: torch.Tensor) -> torch.Tensor: ...  # float N x ... -> same shape

    def per_sample(self) -> Callable: ...  # -> callable(PIL image) -> PIL image


class BatchSource(Protocol):
    """What the training loop iterates: ``epoch(e)`` yields raw batches, ``to_device`` readies one."""

    samples_per_epoch: int  # samples one epoch trains on (less than the dataset with drop_last)

    def __len__(self) -> int: ...  # batches per epoch

    def epoch(self, epoch: int, start: int = 0) -> Iterator[Batch]: ...  # from batch `start`

    def to_device(self, x: torch.Tensor, y: torch.Tensor) -> Batch: ...

    def batch_indices(self, epoch: int, i: int) -> torch.Tensor | None: ...  # samples of a batch


def normalize_batch(x: torch.Tensor, mean: float | None, std: float | None) -> torch.Tensor:
    """uint8 -> float32 normalized: the float ops of ToTensor + Normalize, batched.

    Divides by 0-d tensors, as torchvision's Normalize does: CUDA turns a division by a Python
    number into a multiplication by its reciprocal (one bit off), a tensor divisor stays a true
    division, so results match the per-sample CPU path bit for bit. ``mean=None``: returned as is.
    """
    if mean is None or std is None:
        return x
    c255, cmean, cstd = _constants(x.device, mean, std)
    return x.to(torch.float32).div_(c255).sub_(cmean).div_(cstd)


def prepare_batch(x: torch.Tensor, mean: float | None, std: float | None,
                  augment: BatchAugment | None = None) -> torch.Tensor:
    """A gathered uint8 batch -> model input, on its device: the random augmentation first (in
    pixel units, where 0 stays the background it fills with), then :func:`normalize_batch`."""
    if augment is not None:
        x = augment.batch(x.to(torch.float32))  # a new tensor: normalizing it in place is safe
    return normalize_batch(x, mean, std)


@functools.lru_cache(maxsize=16)
def _constants(device: torch.device, mean: float, std: float) -> tuple[torch.Tensor, ...]:
    return tuple(torch.tensor(v, dtype=torch.float32, device=device) for v in (255.0, mean, std))


