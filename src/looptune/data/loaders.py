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

from collections.abc import Iterator, Sequence

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
from looptune.data.batches import (  # re-exported: callers build and type loaders from here
    Batch,
    BatchAugment,
    BatchedData,
    BatchSource,
    ImageData,
    has_get_batch,
    normalize_batch,
    prepare_batch,
)
from looptune.data.per_sample import PerSampleImages, reference_transform, transform_kind
from looptune.data.prefetch import PrefetchSource
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

def per_sample_dataset(data: ImageData, image_decoder: str = "pil") -> Dataset:
    """How the per-sample (seed/baseline) pipeline reads ``data``: the workload's own reader (with
    the recipe's ``loader.image_decoder``, for one that decodes files), the reference's PIL decode
    + Normalize for images, else indexing the tensors."""
    if data.per_sample is not None:
        return data.per_sample(data, image_decoder)
    if image_decoder != "pil":
        raise ConfigError(f"loader.image_decoder={image_decoder!r}: this workload's data is in "
                          "memory, not image files to decode. Use image_decoder='pil'.")
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

    def __init__(self, *, cfg: LoaderConfig, data: ImageData | Dataset, device: torch.device,
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
            per_sample = per_sample_dataset(data, cfg.image_decoder)
        sampler = EpochSampler(n=len(data), seed=seed, batch_size=cfg.batch_size,
                               drop_last=cfg.drop_last, rank=rank, world=world)
        return DataLoader(Traced(per_sample, cfg.num_workers), batch_size=cfg.batch_size,
                          sampler=sampler, drop_last=cfg.drop_last, **common)
    batches = EpochBatchSampler(n=len(data), seed=seed, batch_size=cfg.batch_size,
                                drop_last=cfg.drop_last, rank=rank, world=world)
    # batch_size=None: each sampler item (an index tensor) is one already-batched __getitem__ call
    return DataLoader(Traced(TensorBatches(data), cfg.num_workers), batch_size=None,
                      sampler=batches, **common)


class DeviceSource:
    """The ``device`` strategy: the uint8 dataset resident on the device, shuffled there per epoch."""

    def __init__(self, *, cfg: LoaderConfig, data: ImageData | BatchedData,
                 device: torch.device, seed: int, rank: int = 0, world: int = 1):
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
        return PrefetchSource(cfg, data, device=device, seed=seed, rank=rank, world=world)
    if cfg.strategy == "device":
        return DeviceSource(cfg=cfg, data=data, device=device, seed=seed, rank=rank, world=world)
    return LoaderSource(cfg=cfg, data=data, device=device, seed=seed, rank=rank, world=world)
