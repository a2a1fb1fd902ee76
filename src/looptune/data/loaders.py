"""Recipe -> batches on the training device.

Two strategies (``LoaderConfig.strategy``):

* ``dataloader``: a ``torch.utils.data.DataLoader`` produces host batches, copied per step. With
  ``decode="per_sample"`` it is the reference's pipeline (one ``__getitem__`` per sample: uint8 ->
  PIL image -> float tensor -> Normalize); with ``decode="tensorized"`` the dataset is a uint8 tensor
  and each ``__getitem__`` call gathers a whole batch by index (no per-sample Python).
* ``device``: the whole uint8 dataset lives on the training device; each epoch is one on-device
  gather by a permutation, batches are slices of it.

Every strategy draws the same shuffle order from the same seed (:func:`epoch_permutation`), and
normalization performs the same float operations in the same order everywhere, so every recipe sees
bit-identical first batches.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

from looptune.data.faults import Traced, guarded, shm_problem, worker_failure
from looptune.data.order import (
    EpochBatchSampler,
    EpochSampler,
    batch_indices,
    epoch_batches,
    epoch_permutation,
    num_batches,
    rank_num_batches,
    rank_samples_per_epoch,
)
from looptune.data.per_sample import (  # noqa: F401
    PerSampleImages,
    _ToTensorNormalize,
    reference_transform,
    transform_kind,
)
from looptune.errors import ConfigError, DataError
from looptune.recipe import LoaderConfig

__all__ = [
    "BatchAugment",
    "BatchSource",
    "BatchedData",
    "ImageData",
    "PerSampleImages",
    "batch_indices",
    "epoch_batches",
    "epoch_permutation",
    "has_get_batch",
    "make",
    "normalize_batch",
    "num_batches",
    "per_sample_dataset",
    "prepare_batch",
    "reference_transform",
    "transform_kind",
]

Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
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
    # how the per-sample (seed/baseline) pipeline reads this data one sample at a time; None:
    # PIL decode + Normalize for images with mean/std, else indexing the tensors
    per_sample: Callable[[ImageData], Dataset] | None = None

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
        return ImageData(x, y, self.mean, self.std)

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


def per_sample_dataset(data: ImageData) -> Dataset:
    """How the per-sample (seed/baseline) pipeline reads ``data``: the workload's own reader, the
    reference's PIL decode + Normalize for images, else indexing the tensors."""
    if data.per_sample is not None:
        return data.per_sample(data)
    if data.mean is not None:
        return PerSampleImages(data)
    return TensorDataset(data.images, data.labels)


class TensorBatches(Dataset):
    """Gathers a whole batch per call: ``ds[index_tensor] -> (x, y)`` (tensors or a packed set)."""

    def __init__(self, data: ImageData | BatchedData) -> None:
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: torch.Tensor) -> Batch:
        return self.data.gather(index)


class LoaderSource:
    """The ``dataloader`` strategy: a torch DataLoader in host memory, one copy per step."""

    def __init__(self, cfg: LoaderConfig, data: ImageData | Dataset, device: torch.device,
                 seed: int, rank: int = 0, world: int = 1):
        self.cfg, self.device, self.n, self.seed = cfg, device, len(data), seed
        self.rank, self.world = rank, world
        self.mean, self.std = getattr(data, "mean", None), getattr(data, "std", None)
        self.augment = getattr(data, "augment", None)
        # uint8 batches to normalize on the device: gathered whole, or a packed dataset's
        # samples (which carry no per-sample transform)
        self.normalize = cfg.decode == "tensorized" or isinstance(data, BatchedData)
        self.loader = _build_dataloader(cfg, data, seed, rank, world)
        self.samples_per_epoch = rank_samples_per_epoch(len(data), cfg, world)
        problem = shm_problem(self.loader, batch_size=cfg.batch_size, num_workers=cfg.num_workers,
                              prefetch_factor=cfg.prefetch_factor)
        if problem:  # before any worker starts
            raise ConfigError(problem)

    def __len__(self) -> int:
        return rank_num_batches(self.n, self.cfg.batch_size, self.cfg.drop_last, self.world)

    def epoch(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        # per-sample sampler skips samples, the batch sampler skips whole batches
        skip = start * self.cfg.batch_size if self.cfg.decode == "per_sample" else start
        self.loader.sampler.set_epoch(epoch, skip)  # type: ignore[attr-defined]  # ours
        self._batches = iter(self.loader)
        return guarded(self.loader, self._batches)  # names a failing sample and its worker

    def failure(self, err: BaseException) -> DataError | None:
        """A dead or hung worker's error, naming the sample it was reading (workers stopped)."""
        return worker_failure(err, self.loader, getattr(self, "_batches", None))

    def batch_indices(self, epoch: int, i: int) -> torch.Tensor:
        return batch_indices(self.n, self.cfg.batch_size, seed=self.seed, epoch=epoch, i=i,
                             drop_last=self.cfg.drop_last, rank=self.rank, world=self.world)

    def to_device(self, x: torch.Tensor, y: torch.Tensor) -> Batch:
        nb = self.cfg.non_blocking
        x, y = x.to(self.device, non_blocking=nb), y.to(self.device, non_blocking=nb)
        if self.normalize:  # uint8 crossed the bus: 4x fewer bytes than float32
            x = prepare_batch(x, self.mean, self.std, self.augment)
        return x, y


def _build_dataloader(cfg: LoaderConfig, data: ImageData | Dataset, seed: int, rank: int,
                      world: int) -> DataLoader:
    workers = {}
    if cfg.num_workers > 0:
        workers = {"persistent_workers": cfg.persistent_workers}
        if cfg.prefetch_factor is not None:
            workers["prefetch_factor"] = cfg.prefetch_factor
        if cfg.timeout_s:
            workers["timeout"] = float(cfg.timeout_s)
    common = {"num_workers": cfg.num_workers, "pin_memory": cfg.pin_memory, **workers}
    if cfg.decode == "per_sample":
        # ImageData: the reference's PIL decode per sample; any other Dataset: its own __getitem__
        per_sample = data.dataset if isinstance(data, BatchedData) else data
        if isinstance(data, ImageData):
            per_sample = per_sample_dataset(data)
        sampler = EpochSampler(len(data), seed, cfg.batch_size, cfg.drop_last, rank, world)
        return DataLoader(Traced(per_sample, cfg.num_workers), batch_size=cfg.batch_size,
                          sampler=sampler, drop_last=cfg.drop_last, **common)
    batches = EpochBatchSampler(len(data), seed, cfg.batch_size, cfg.drop_last, rank, world)
    # batch_size=None: each sampler item (an index tensor) is one already-batched __getitem__ call
    return DataLoader(Traced(TensorBatches(data), cfg.num_workers), batch_size=None,
                      sampler=batches, **common)


class DeviceSource:
    """The ``device`` strategy: the uint8 dataset resident on the device, shuffled there per epoch."""

    def __init__(self, cfg: LoaderConfig, data: ImageData | BatchedData, device: torch.device,
                 seed: int, rank: int = 0, world: int = 1):
        self.cfg, self.seed, self.mean, self.std = cfg, seed, data.mean, data.std
        self.augment = getattr(data, "augment", None)
        self.rank, self.world, self.device = rank, world, device
        data = data.materialize()  # a packed dataset: read once, vectorized
        # one process: the whole uint8 dataset on the device (uint8: 4x less memory than float).
        # `world` ranks: the dataset stays in host memory and each epoch copies only this rank's
        # shard of the global permutation to the device, so a rank holds 1/world of the data.
        where = device if world == 1 else torch.device("cpu")
        self.images, self.labels = data.images.to(where), data.labels.to(where)
        self.n = len(data)
        self.samples_per_epoch = rank_samples_per_epoch(self.n, cfg, world)
        self.ready = cfg.normalize == "once"
        if self.ready:  # normalized once, here (setup time): batches are gathered ready to use
            if self.augment is not None:
                raise ConfigError("loader.normalize='once' with an augmented dataset: each "
                                  "epoch needs new random transforms of the uint8 pixels. Use "
                                  "normalize='batch'.")
            self.images = prepare_batch(self.images, self.mean, self.std)

    def __len__(self) -> int:
        return rank_num_batches(self.n, self.cfg.batch_size, self.cfg.drop_last, self.world)

    def epoch(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        sizes: int | list[int]
        if self.ready and self.world == 1:
            # float32 rows: an epoch gather would move 4x the uint8 bytes; a batch's gather of
            # ready rows is one small index_select per step (and needs no conversion after it)
            # (the labels, 8 bytes a sample, are gathered for the whole epoch at once)
            index = epoch_permutation(self.n, seed=self.seed, epoch=epoch).to(self.images.device)
            size = self.cfg.batch_size
            return self._gathered(index.split(size)[start: len(self)],
                                  self.labels.index_select(0, index).split(size)[start: len(self)])
        if self.world == 1:  # the whole permutation, cut in batch_size slices
            index, sizes = epoch_permutation(self.n, seed=self.seed, epoch=epoch), self.cfg.batch_size
        else:
            batches = epoch_batches(self.n, self.cfg.batch_size, seed=self.seed, epoch=epoch,
                                    drop_last=self.cfg.drop_last, rank=self.rank, world=self.world)
            index, sizes = torch.cat(batches), [len(b) for b in batches]
        index = index.to(self.images.device)
        # one gather per epoch, then every batch is a free slice (view) of contiguous memory
        images, labels = self.images.index_select(0, index), self.labels.index_select(0, index)
        # several ranks: this epoch's shard crosses to the device in one copy (else a no-op)
        images, labels = images.to(self.device), labels.to(self.device)
        pairs = zip(images.split(sizes), labels.split(sizes))
        return iter(list(pairs)[start: len(self)])

    def batch_indices(self, epoch: int, i: int) -> torch.Tensor:
        return batch_indices(self.n, self.cfg.batch_size, seed=self.seed, epoch=epoch, i=i,
                             drop_last=self.cfg.drop_last, rank=self.rank, world=self.world)

    def _gathered(self, chunks: Sequence[torch.Tensor],
                  labels: Sequence[torch.Tensor]) -> Iterator[Batch]:
        images = self.images
        for index, y in zip(chunks, labels):
            yield images.index_select(0, index), y

    def to_device(self, x: torch.Tensor, y: torch.Tensor) -> Batch:
        if self.ready:
            return x, y
        return prepare_batch(x, self.mean, self.std, self.augment), y


def make(cfg: LoaderConfig, data: ImageData | BatchedData, *, device: torch.device,
         seed: int, rank: int = 0, world: int = 1) -> BatchSource:
    """Build the batch source a (resolved) loader config asks for.

    Args:
        cfg: the loader settings, already resolved for ``device`` (see ``recipe.resolve``).
        data: the training images and labels as tensors, or a dataset that reads whole batches
            (:class:`BatchedData`, e.g. a packed dataset).
        device: the training device; ``device`` strategy copies the dataset there once.
        seed: shuffle seed; epoch ``e`` uses ``epoch_permutation(len(data), seed=seed, epoch=e)``.
        rank, world: this process's rank among ``world`` data-parallel ranks; each gets its
            share of every global batch (:func:`epoch_batches`).

    Returns:
        A :class:`BatchSource`.
    """
    if cfg.strategy == "prefetch":
        from looptune.data.prefetch import (
            PrefetchSource,  # local: prefetch.py imports this module
        )

        return PrefetchSource(cfg, data, device=device, seed=seed, rank=rank, world=world)
    if cfg.strategy == "device":
        return DeviceSource(cfg, data, device, seed, rank, world)
    return LoaderSource(cfg, data, device, seed, rank, world)
