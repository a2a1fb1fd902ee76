"""A user's own data as batch sources: any DataLoader as it is, a stream (IterableDataset, no
``len``), or a map-style Dataset decoded once into tensors (so the ``device``/``prefetch``
strategies need no per-sample Python).

Samples and batches may be ``(input, target)`` pairs or dicts; a dict's target is found under a
usual key (:data:`TARGET_KEYS`) and its input is the one other value (or the rest of the dict).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from looptune.data.loaders import Batch, BatchedData, ImageData
from looptune.errors import ConfigError

__all__ = ["UserLoaderSource", "tensorize", "is_map_dataset", "is_stream", "split_sample",
           "to_device", "TARGET_KEYS"]

# where a dict sample or batch keeps its target, in the order looked for (torchvision, HF, ours)
TARGET_KEYS = ("target", "targets", "label", "labels", "y")
_INPUT_KEYS = ("input", "inputs", "image", "images", "input_ids", "x")


def is_map_dataset(data: object) -> bool:
    return (hasattr(data, "__getitem__") and hasattr(data, "__len__")
            and not isinstance(data, (DataLoader, IterableDataset)))


def is_stream(data: object) -> bool:
    """An IterableDataset, or a DataLoader over one (neither has a usable length)."""
    dataset = data.dataset if isinstance(data, DataLoader) else data
    return isinstance(dataset, IterableDataset)


def split_sample(sample: Any, where: str) -> tuple[Any, Any]:
    """``(input, target)`` of a sample or batch that is a pair or a dict.

    A dict with one of :data:`TARGET_KEYS`: the target is that value; the input is the value of
    the only other key, or of a usual input key, else the dict of the other keys (passed to the
    model as it is).

    Raises:
        ConfigError: neither a pair nor a dict with a target key; ``where`` names the sample.
    """
    if isinstance(sample, (tuple, list)) and len(sample) == 2:
        return sample[0], sample[1]
    if isinstance(sample, Mapping):
        key = next((k for k in TARGET_KEYS if k in sample), None)
        if key is not None:
            rest = {k: v for k, v in sample.items() if k != key}
            named = next((k for k in _INPUT_KEYS if k in rest), None)
            if len(rest) == 1 or named is not None:
                return rest[named] if named is not None else next(iter(rest.values())), sample[key]
            return rest, sample[key]
        raise ConfigError(f"{where} is a dict with keys {sorted(sample)}; looptune finds the "
                          f"target under one of {', '.join(TARGET_KEYS)}. Rename the target's "
                          "key, or return an (input, target) tuple.")
    kind = f"{type(sample).__name__} of {len(sample)}" if isinstance(sample, (tuple, list)) \
        else type(sample).__name__
    raise ConfigError(f"{where} is a {kind}; looptune needs (input, target) pairs or dicts with "
                      f"a target key ({', '.join(TARGET_KEYS)}). Return a tuple or a dict from "
                      "__getitem__ / your collate_fn.")


def to_device(obj: Any, device: torch.device, non_blocking: bool) -> Any:
    """Tensors, and dicts/lists/tuples of tensors, moved to ``device``; anything else as is."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device, non_blocking=non_blocking)
    if isinstance(obj, Mapping):
        return {k: to_device(v, device, non_blocking) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_device(v, device, non_blocking) for v in obj)
    return obj


def tensorize(dataset: Dataset) -> ImageData:
    """Read every sample once and stack inputs and targets into two tensors.

    Raises:
        ConfigError: a sample is neither an (input, target) pair nor a dict with a target key,
            or the inputs differ in shape (such datasets need strategy='dataloader').
    """
    inputs, targets = [], []
    for i in range(len(dataset)):
        x, y = split_sample(dataset[i], f"sample {i} of {type(dataset).__name__}")
        if isinstance(x, Mapping):
            raise ConfigError(f"sample {i} of {type(dataset).__name__} has several inputs "
                              f"({sorted(x)}); decoding into one tensor needs one input. Use "
                              "strategy='dataloader' with decode='per_sample'.")
        inputs.append(torch.as_tensor(x))
        targets.append(torch.as_tensor(y))
    if not inputs:
        raise ConfigError(f"{type(dataset).__name__} is empty: there is nothing to train on.")
    try:
        return ImageData(images=torch.stack(inputs), labels=torch.stack(targets))
    except RuntimeError as err:
        raise ConfigError(f"the samples of {type(dataset).__name__} cannot be stacked into one "
                          f"tensor ({err}); use strategy='dataloader' with decode='per_sample', "
                          "or pass your own DataLoader with a collate_fn.") from None


class UserLoaderSource:
    """A user's DataLoader, used as given (its batch size, workers and sampler).

    A stream (IterableDataset) has no length: ``steps_per_epoch`` then says how many batches
    make an epoch; each epoch iterates the stream anew and stops there (or where it ends).
    """

    def __init__(self, loader: DataLoader, *, device: torch.device, non_blocking: bool,
                 steps_per_epoch: int | None = None) -> None:
        self.loader, self.device, self.non_blocking = loader, device, non_blocking
        self.steps = steps_per_epoch
        if steps_per_epoch is None:
            steps_per_epoch = len(loader)  # a stream without steps_per_epoch is refused upstream
        dataset_len = len(loader.dataset) if _has_len(loader.dataset) else None
        self.n_batches = min(steps_per_epoch, len(loader)) if _has_len(loader) else steps_per_epoch
        self.samples_per_epoch = (dataset_len if dataset_len is not None and not loader.drop_last
                                  and self.n_batches == len(loader)
                                  else self.n_batches * (loader.batch_size or 1))

    def __len__(self) -> int:
        return self.n_batches

    def epoch(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        sampler = getattr(self.loader, "sampler", None)
        if hasattr(sampler, "set_epoch"):  # e.g. DistributedSampler: reshuffle per epoch
            sampler.set_epoch(epoch)
        batches = itertools.islice(iter(self.loader), start, self.n_batches)  # resume: skip done
        return (split_sample(b, f"a batch of the DataLoader (epoch {epoch})") for b in batches)

    def to_device(self, x: Any, y: Any) -> Batch:
        return to_device(x, self.device, self.non_blocking), to_device(y, self.device, self.non_blocking)

    def batch_indices(self, epoch: int, i: int) -> torch.Tensor | None:
        return None  # the user's sampler decides; looptune cannot name the samples


def _has_len(obj: object) -> bool:
    try:
        len(obj)  # type: ignore[arg-type]
    except TypeError:
        return False
    return True


def check_integer_inputs(model: torch.nn.Module, train_data: Any, device: torch.device) -> None:
    """Refuse integer inputs the model cannot take, with the fix, before any training.

    Token ids (an embedding's input) are integers on purpose, so nothing is assumed: when the
    first two training inputs are integer tensors (e.g. raw uint8 images from
    ``looptune.open_packed``), the model runs them once, without gradients and in eval mode (no
    BatchNorm statistics move); if that fails, the error says which dtypes met and how to fix it.

    Raises:
        ConfigError: the model's forward fails on the integer inputs.
    """
    x = _first_inputs(train_data)
    if not isinstance(x, torch.Tensor) or x.is_floating_point() or x.is_complex():
        return
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            model(x.to(device))
    except (RuntimeError, TypeError) as err:
        params = next((p.dtype for p in model.parameters() if p.is_floating_point()), None)
        raise ConfigError(
            f"the model cannot take the training inputs as they are: they are {x.dtype} "
            f"(shape {tuple(x.shape[1:])}) and the model's parameters {params}; its forward on "
            f"two samples raised {type(err).__name__}: {str(err).splitlines()[0][:200]}. Raw "
            "uint8 images need scaling to floats: pass ImageData(images, labels, mean=..., "
            "std=...) (normalized per batch on the device), or convert in the Dataset "
            "(x.float() / 255). Integer inputs are fine for a model that embeds them (token "
            "ids).") from err
    finally:
        model.train(was_training)


def _integer_field(data: Any) -> bool:
    """Whether a packed dataset holds an integer field with a shape (an input, not a label);
    True when it does not say (read a sample to find out)."""
    import numpy as np

    fields = getattr(getattr(data, "header", None), "fields", None)
    if not fields:
        return True
    return any(np.dtype(f.dtype).kind in "iu" and tuple(f.shape) for f in fields)


def _first_inputs(data: Any) -> Any:
    """The first two samples' inputs, as a batch; None where reading them is not cheap or safe
    (DataLoaders and streams are read only by the run itself)."""
    from looptune._rng import rng_state, set_rng_state

    saved = rng_state()  # a random per-sample transform must not shift the run's random stream
    try:
        if isinstance(data, ImageData):
            return None if data.mean is not None else data.images[:2]
        if isinstance(data, BatchedData) or isinstance(data, DataLoader) or is_stream(data):
            return None
        if hasattr(data, "get_batch"):
            if not _integer_field(data):
                return None  # a packed file says its dtypes: read nothing when none is integer
            return split_sample(data.get_batch([0, min(1, len(data) - 1)]), "a batch")[0]
        if is_map_dataset(data) and len(data) > 0:
            firsts = [split_sample(data[i], "a sample")[0] for i in range(min(2, len(data)))]
            if all(isinstance(f, torch.Tensor) for f in firsts):
                return torch.stack(firsts)
    except Exception:  # a dataset that cannot be read this way: the run will say what is wrong
        return None
    finally:
        set_rng_state(saved)
    return None
