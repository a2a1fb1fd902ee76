"""The reference's per-sample pipeline: one ``__getitem__`` per sample, uint8 -> PIL image ->
(random augmentation) -> float tensor -> Normalize, exactly as people write it with torchvision.

It is slow on purpose: the seed and baseline recipes time what the reference runs. looptune's
own recipes read whole batches instead (``loaders.TensorBatches``, ``DeviceSource``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
from torch.utils.data import Dataset

from looptune.data.augment import torchvision_transforms as _torchvision_transforms

if TYPE_CHECKING:
    from looptune.data.batches import ImageData

__all__ = ["PerSampleImages", "reference_transform", "transform_kind"]


class _ToTensorNormalize:
    """torchvision's ``Compose([ToTensor(), Normalize((mean,), (std,))])`` for a grayscale PIL
    image, op for op (torchvision 0.2x ``F.to_tensor`` and ``F_t.normalize``): the same results
    *and* the same per-sample cost, so the seed recipes time what the reference runs."""

    def __init__(self, mean: float, std: float) -> None:
        self.mean, self.std = [mean], [std]

    def __call__(self, img) -> torch.Tensor:
        return self._normalize(self._to_tensor(img))

    @staticmethod
    def _to_tensor(pic) -> torch.Tensor:
        img = torch.from_numpy(np.array(pic, np.uint8, copy=True))
        img = img.view(pic.size[1], pic.size[0], len(pic.getbands()))
        img = img.permute((2, 0, 1)).contiguous()  # HWC -> CHW
        return img.to(dtype=torch.get_default_dtype()).div(255)

    def _normalize(self, tensor: torch.Tensor) -> torch.Tensor:
        tensor = tensor.clone()  # Normalize(inplace=False)
        mean = torch.as_tensor(self.mean, dtype=tensor.dtype, device=tensor.device)
        std = torch.as_tensor(self.std, dtype=tensor.dtype, device=tensor.device)
        if (std == 0).any():
            raise ValueError(f"std evaluated to zero after conversion to {tensor.dtype}")
        return tensor.sub_(mean.view(-1, 1, 1)).div_(std.view(-1, 1, 1))


def reference_transform(mean: float, std: float):
    """The reference's per-sample transform: torchvision's when installed, an equivalent otherwise."""
    transforms, _ = _torchvision_transforms()
    if transforms is None:
        return _ToTensorNormalize(mean, std)
    return transforms.Compose([transforms.ToTensor(), transforms.Normalize((mean,), (std,))])


def transform_kind() -> tuple[str, str]:
    """Which per-sample transform the seed recipes use here, and why."""
    transforms, error = _torchvision_transforms()
    if transforms is not None:
        return "torchvision", "torchvision is installed: its ToTensor() and Normalize(), as the reference"
    return "equivalent", (f"torchvision is not usable ({error}); looptune's equivalent "
                          "ToTensor + Normalize performs the same float operations")


class PerSampleImages(Dataset):
    """The reference dataset: like ``torchvision.datasets.MNIST``, one PIL decode per sample."""

    def __init__(self, data: ImageData) -> None:
        from PIL import Image  # imported here: only the per-sample path needs Pillow

        self._image = Image
        self.images, self.labels = data.images, data.labels
        self.transform = reference_transform(data.mean, data.std)
        # training data with augmentation: torchvision's RandomAffine (or its equivalent) on the
        # PIL image before ToTensor, the usual Compose([RandomAffine, ToTensor, Normalize])
        self.augment = data.augment.per_sample() if data.augment is not None else None

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        img, target = self.images[index], int(self.labels[index])
        img = self._image.fromarray(img.numpy())  # uint8 2-D array -> mode "L", as torchvision
        if self.augment is not None:
            img = self.augment(img)
        return self.transform(img), target
