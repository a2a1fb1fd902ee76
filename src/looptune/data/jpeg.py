"""Decoding and augmenting a folder of JPEGs: per sample as people write it, and the faster ways.

* :class:`FolderDataset` is the pipeline of the tutorials (``ImageFolder`` + ``RandomResizedCrop``
  + ``RandomHorizontalFlip`` + ``ToTensor`` + ``Normalize``), written without torchvision: one
  file read and decoded with PIL per sample, a random crop of 8-100% of the image's area (aspect
  3/4 to 4/3, torchvision's draw, ten tries then a centre crop) resized to ``size`` x ``size``
  (bilinear), a coin-flip mirror, scaled to [0, 1] and normalized per channel.
  ``draft=True`` decodes the same crop at a reduced size: the crop is drawn from the image's
  header (its size, before any decoding), then PIL's JPEG ``draft`` mode decodes at the largest
  1/2, 1/4 or 1/8 scale that still gives the crop at least ``size`` pixels a side (the DCT is
  scaled inside libjpeg, so most of the decode is skipped), and the box is scaled to match.
* :func:`decode_all` decodes every file once into one uint8 tensor ``(N, 3, S, S)`` (the whole
  image resized to S x S, as FFCV's "raw" mode stores pixels at a set resolution) with each
  file's original width and height; :func:`crop_batch` then draws the same random resized crop
  and flip for a whole batch at once, in the original image's coordinates, and resamples the
  batch with one ``affine_grid`` + ``grid_sample`` on its device: the same crops as the per-sample
  path (normalized coordinates do not change when the image is resized), from S-pixel pixels.
* With a ``seed``, both paths draw each sample's crop and flip from ``(seed, epoch, index)``
  (:func:`~looptune.data.crops.keyed_crops`, :class:`EpochSampler`): the same pictures whichever
  path, process or worker made them, so recipes that differ only in how they feed the step train
  alike. The crop draw itself lives in :mod:`looptune.data.crops`; decoding on the GPU in
  :mod:`looptune.data.jpeg_gpu`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import Dataset

from looptune.data.crops import RATIO, SCALE, crop_box, draw_crops, keyed_box, keyed_crops
from looptune.data.image_folder import Samples
from looptune.errors import ConfigError, DataError

__all__ = ["DECODERS", "MEAN", "STD", "DecodeResize", "EpochSampler", "FolderCrops", "FolderDataset", "FolderReader",
           "ResizedFolder", "crop_batch", "crop_box", "decode_all", "decode_whole", "draw_crops",
           "keyed_crops", "normalize", "simplejpeg_missing", "sizes_of", "with_sizes"]

# the per-channel mean and std of ImageNet's pixels in [0, 1], as the tutorials' Normalize uses
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
DECODERS = ("pil", "simplejpeg")


def simplejpeg_missing() -> str | None:
    """Why the simplejpeg decoder cannot be used here, or None."""
    import importlib.util

    if importlib.util.find_spec("simplejpeg") is None:
        return ("decoder='simplejpeg' needs the simplejpeg package (libjpeg-turbo): pip install "
                "'looptune[jpeg]', or use decoder='pil'")
    return None


def normalize(x: torch.Tensor, mean: Sequence[float] = MEAN, std: Sequence[float] = STD) -> torch.Tensor:
    """uint8 or [0, 1] float ``(..., 3, H, W)`` -> normalized float32."""
    if x.dtype == torch.uint8:
        x = x.float().div_(255)
    m = torch.tensor(mean, device=x.device).view(3, 1, 1)
    s = torch.tensor(std, device=x.device).view(3, 1, 1)
    return (x - m) / s


class FolderDataset(Dataset):
    """Per-sample decode + augmentation of an ImageFolder-layout folder (see the module doc).

    Args:
        samples: :func:`looptune.data.image_folder.scan` of the folder.
        size: the training resolution (pixels a side).
        train: random resized crop + flip; False: the whole image resized (evaluation).
        draft: decode at a reduced size where the crop allows (JPEG only; PNGs decode whole).
        scale: the crop's share of the image's area, drawn uniformly in this range.
        decoder: ``"pil"`` (Pillow), or ``"simplejpeg"`` (libjpeg-turbo without Pillow's
            decoder objects; ``pip install 'looptune[jpeg]'``; PNG files still go through PIL).
        seed: draw each sample's crop and flip from ``(seed, epoch, index)``
            (:func:`looptune.data.crops.keyed_crops`), its index then ``(index, epoch)`` (:class:`EpochSampler`);
            None: from torch's RNG, as torchvision does.
    """

    def __init__(self, samples: Samples, size: int = 64, *, train: bool = True,
                 draft: bool = False, scale: tuple[float, float] = SCALE,
                 seed: int | None = None, decoder: str = "pil") -> None:
        if not isinstance(size, int) or isinstance(size, bool) or not 8 <= size <= 1024:
            raise ConfigError(f"size={size!r}: must be an integer from 8 to 1024 (pixels a side)")
        if not 0 < scale[0] <= scale[1] <= 1:
            raise ConfigError(f"scale={scale!r}: need 0 < low <= high <= 1 (shares of the area)")
        self.samples, self.size, self.train, self.draft = samples, size, train, draft
        if decoder not in DECODERS:
            raise ConfigError(f"decoder={decoder!r}: must be one of {DECODERS}")
        if decoder == "simplejpeg" and (why := simplejpeg_missing()) is not None:
            raise ConfigError(why)
        self.scale, self.seed, self.decoder = tuple(scale), seed, decoder
        self._mean = torch.tensor(MEAN).view(3, 1, 1)
        self._std = torch.tensor(STD).view(3, 1, 1)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, key: int | tuple[int, int]) -> tuple[torch.Tensor, int]:
        i, epoch = key if isinstance(key, tuple) else (key, 0)
        path = self.samples.paths[i]
        try:
            if self.decoder == "simplejpeg" and path.suffix.lower() in (".jpg", ".jpeg"):
                out, mirror = self._simplejpeg(path, i, epoch)
            else:
                with Image.open(path) as img:
                    out, mirror = self._pil(img, i, epoch)
        except (OSError, ValueError) as err:  # a file that changed or broke after the scan
            raise DataError(f"{path}: cannot be decoded ({err}). Remove or replace it, and "
                            "scan the folder again (skip_bad=True skips such files).") from None
        if mirror:
            out = out.transpose(Image.FLIP_LEFT_RIGHT)
        x = torch.from_numpy(np.asarray(out).copy()).permute(2, 0, 1).float().div_(255)
        return (x - self._mean) / self._std, self.samples.labels[i]

    def _crop(self, width: int, height: int, i: int, epoch: int
              ) -> tuple[tuple[int, int, int, int], bool]:
        """The sample's crop box and mirror flag (whole image, no flip when not training)."""
        if not self.train:
            return (0, 0, width, height), False
        if self.seed is not None:  # keyed_crops' draw, one sample
            return keyed_box(self.seed, epoch, i, width, height, self.scale)
        box = crop_box(width, height, scale=self.scale)
        return box, torch.rand(1).item() < 0.5

    def _pil(self, img: Image.Image, i: int, epoch: int) -> tuple[Image.Image, bool]:
        s, (width, height) = self.size, img.size
        (left, top, w, h), mirror = self._crop(width, height, i, epoch)
        if self.draft and img.format == "JPEG":
            img.draft("RGB", (math.ceil(width * s / w), math.ceil(height * s / h)))
        fx, fy = img.size[0] / width, img.size[1] / height  # the draft's scale
        return img.convert("RGB").resize(
            (s, s), Image.BILINEAR, box=(left * fx, top * fy, (left + w) * fx, (top + h) * fy)), mirror

    def _simplejpeg(self, path, i: int, epoch: int) -> tuple[Image.Image, bool]:
        """libjpeg-turbo through simplejpeg: the same crop, decoded (with ``draft``, at the DCT
        scale that keeps the crop at least ``size`` pixels a side), then PIL's resize."""
        import simplejpeg

        s, data = self.size, path.read_bytes()
        height, width, _, _ = simplejpeg.decode_jpeg_header(data)
        (left, top, w, h), mirror = self._crop(width, height, i, epoch)
        small = {"min_width": math.ceil(width * s / w), "min_height": math.ceil(height * s / h)} \
            if self.draft else {}
        pixels = simplejpeg.decode_jpeg(data, colorspace="RGB", **small)
        fy, fx = pixels.shape[0] / height, pixels.shape[1] / width
        img = Image.fromarray(pixels, "RGB")
        return img.resize((s, s), Image.BILINEAR,
                          box=(left * fx, top * fy, (left + w) * fx, (top + h) * fy)), mirror


class EpochSampler(torch.utils.data.Sampler):
    """A shuffled order of ``n`` samples drawn from ``(seed, epoch)``, yielding ``(index, epoch)``
    keys for a :class:`FolderDataset` with a ``seed``; :meth:`set_epoch` before each epoch (as
    ``DistributedSampler``). The order is :meth:`order`, so a batched path can follow it."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed, self.epoch = n, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def order(self) -> torch.Tensor:
        return torch.randperm(self.n, generator=torch.Generator().manual_seed(
            self.seed * 100_003 + self.epoch))

    def __iter__(self):
        return iter([(int(i), self.epoch) for i in self.order()])

    def __len__(self) -> int:
        return self.n


def decode_all(samples: Samples, size: int, *, workers: int = 0
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every file decoded once, resized whole to ``size`` x ``size``: ``(images uint8 (N, 3,
    size, size), labels int64 (N,), original sizes int64 (N, 2) as (width, height))``.
    ``workers`` > 0 decodes in that many DataLoader worker processes."""
    data = _Whole(samples, size)
    images = torch.empty(len(samples), 3, size, size, dtype=torch.uint8)
    sizes = torch.empty(len(samples), 2, dtype=torch.long)
    loader = torch.utils.data.DataLoader(data, batch_size=64, num_workers=workers)
    n = 0
    for x, wh in loader:
        images[n:n + len(x)], sizes[n:n + len(x)] = x, wh
        n += len(x)
    return images, torch.tensor(samples.labels, dtype=torch.long), sizes


class ResizedFolder(Dataset):
    """Each file of an image folder decoded (JPEG draft mode where it allows) and resized whole to
    ``size`` x ``size``: ``(uint8 tensor (3, size, size), label)``. What ``looptune pack --images
    DIR --size S`` packs (decode once at training resolution: FFCV's "raw" mode), and what
    ``--bench`` times it against."""

    def __init__(self, samples: Samples, size: int) -> None:
        if not isinstance(size, int) or isinstance(size, bool) or not 8 <= size <= 1024:
            raise ConfigError(f"size={size!r}: must be an integer from 8 to 1024 (pixels a side)")
        self.whole = _Whole(samples, size)

    def __len__(self) -> int:
        return len(self.whole)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.whole[i][0], self.whole.samples.labels[i]

    def files(self) -> list:
        """The files it reads (to drop from the page cache for a cold measurement)."""
        return list(self.whole.samples.paths)


class _Whole(Dataset):
    def __init__(self, samples: Samples, size: int) -> None:
        self.samples, self.size = samples, size

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return decode_whole(self.samples.paths[i], self.size)


def decode_whole(source, size: int, name: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One image (a path, or its encoded ``bytes``) decoded (JPEG draft mode where it allows) and
    resized whole to ``size`` x ``size``: ``(uint8 tensor (3, size, size), tensor([width, height]))``
    of the original. DataError names ``name`` (default: the path) when it cannot be decoded."""
    import io

    try:
        with Image.open(io.BytesIO(source) if isinstance(source, (bytes, bytearray, memoryview))
                        else source) as img:
            wh = torch.tensor(img.size)
            img.draft("RGB", (size, size)) if img.format == "JPEG" else None
            out = img.convert("RGB").resize((size, size), Image.BILINEAR)
    except (OSError, ValueError) as err:
        raise DataError(f"{name or source}: cannot be decoded ({err}). Remove or replace it.") from None
    return torch.from_numpy(np.asarray(out).copy()).permute(2, 0, 1), wh


class DecodeResize:
    """``bytes -> uint8 tensor (3, size, size)``: :func:`decode_whole` as a picklable transform
    for datasets of encoded samples (TFRecord, WebDataset shards), the per-sample work of
    :class:`ResizedFolder` without the file."""

    def __init__(self, size: int) -> None:
        if not isinstance(size, int) or isinstance(size, bool) or not 8 <= size <= 1024:
            raise ConfigError(f"size={size!r}: must be an integer from 8 to 1024 (pixels a side)")
        self.size = size

    def __call__(self, data: bytes, name: str = "a sample") -> torch.Tensor:
        return decode_whole(data, self.size, name)[0]


def crop_batch(images: torch.Tensor, sizes: torch.Tensor, size: int, *,
               generator: torch.Generator | None = None, flip: bool = True,
               scale: tuple[float, float] = SCALE, ratio: tuple[float, float] = RATIO,
               boxes: torch.Tensor | None = None, flips: torch.Tensor | None = None
               ) -> torch.Tensor:
    """A batch of stored uint8 images ``(B, 3, S, S)`` (each the whole original image resized)
    -> its random resized crops at ``size``, mirrored at random, normalized float32, on the
    images' device; ``sizes`` the originals' (width, height). ``boxes`` / ``flips``: the crops
    and mirror flags already drawn (:func:`keyed_crops`), else drawn here on ``generator``."""
    if boxes is None:
        boxes = draw_crops(sizes, generator, scale, ratio)  # in original pixels
    wh = sizes.to(torch.float64)
    x0, y0 = boxes[:, 0] / wh[:, 0], boxes[:, 1] / wh[:, 1]  # normalized: the same in any resize
    x1, y1 = (boxes[:, 0] + boxes[:, 2]) / wh[:, 0], (boxes[:, 1] + boxes[:, 3]) / wh[:, 1]
    sign = torch.ones(len(images), dtype=torch.float64)
    if flips is not None:
        sign = torch.where(flips, -1.0, 1.0).double()
    elif flip:
        sign = torch.where(torch.rand(len(images), generator=generator) < 0.5, -1.0, 1.0).double()
    theta = torch.zeros(len(images), 2, 3, dtype=torch.float64)
    theta[:, 0, 0], theta[:, 0, 2] = (x1 - x0) * sign, x0 + x1 - 1
    theta[:, 1, 1], theta[:, 1, 2] = y1 - y0, y0 + y1 - 1
    x = images.float().div_(255)
    grid = F.affine_grid(theta.to(x), [len(images), 3, size, size], align_corners=False)
    out = F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)
    return normalize(out)


# ---- the jpeg-folder workload's two pipelines over the same files ---------------------------

def with_sizes(images: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
    """``(N, 3, S, S)`` uint8 images and their originals' ``(N, 2)`` (width, height) -> ``(N, 4,
    S, S)``: a fourth plane whose first four bytes hold width and height (big-endian, 16 bits
    each), so the sizes travel with each sample through any loader (workers, pinned memory, the
    device) to :class:`FolderCrops`, which draws the crops in the original's coordinates."""
    if images.shape[-1] * images.shape[-2] < 4 or bool((sizes > 65535).any()):
        raise ConfigError("with_sizes needs images of >= 4 pixels and sides <= 65535")
    plane = torch.zeros(len(images), 1, *images.shape[2:], dtype=torch.uint8)
    flat = plane.view(len(images), -1)
    flat[:, 0], flat[:, 1] = sizes[:, 0] // 256, sizes[:, 0] % 256
    flat[:, 2], flat[:, 3] = sizes[:, 1] // 256, sizes[:, 1] % 256
    return torch.cat([images, plane], 1)


def sizes_of(x: torch.Tensor) -> torch.Tensor:
    """The (width, height) :func:`with_sizes` stored in ``x`` (B, 4, S, S), as int64 on the CPU."""
    head = x[:, 3].reshape(len(x), -1)[:, :4].to("cpu", torch.int64)
    return torch.stack([head[:, 0] * 256 + head[:, 1], head[:, 2] * 256 + head[:, 3]], 1)


class FolderCrops:
    """The per-sample pipeline's random resized crop + flip + ToTensor + Normalize, on whole
    batches: ``batch(x)`` takes stored images with their sizes plane (:func:`with_sizes`, float
    in pixel units, any device) and returns normalized ``(B, 3, size, size)``
    (:func:`crop_batch`: one ``affine_grid`` + ``grid_sample``); ``per_sample()`` is the same draw
    on one PIL image."""

    def __init__(self, size: int, scale: tuple[float, float] = SCALE,
                 generator: torch.Generator | None = None) -> None:
        self.size, self.scale, self.generator = size, tuple(scale), generator

    def batch(self, x: torch.Tensor) -> torch.Tensor:
        return crop_batch(x[:, :3], sizes_of(x), self.size, scale=self.scale,
                          generator=self.generator)

    def per_sample(self):
        def crop(img: Image.Image) -> Image.Image:
            left, top, w, h = crop_box(*img.size, scale=self.scale)
            out = img.resize((self.size, self.size), Image.BILINEAR,
                             box=(left, top, left + w, top + h))
            return out.transpose(Image.FLIP_LEFT_RIGHT) if torch.rand(1).item() < 0.5 else out
        return crop


class FolderReader:
    """``per_sample(data, image_decoder) -> FolderDataset``: the workload's per-sample pipeline
    over the files (picklable, for DataLoader workers), decoded as the recipe's
    ``loader.image_decoder`` says: ``pil`` (full size), ``draft`` (JPEG draft mode), or
    ``simplejpeg`` (libjpeg-turbo, at the draft's scale)."""

    def __init__(self, samples: Samples, size: int, scale: tuple[float, float] = SCALE) -> None:
        self.samples, self.size, self.scale = samples, size, tuple(scale)

    def __call__(self, _data, image_decoder: str = "pil") -> FolderDataset:
        if image_decoder not in ("pil", "draft", "simplejpeg"):
            raise ConfigError(f"image_decoder={image_decoder!r}: allowed pil, draft, simplejpeg")
        return FolderDataset(self.samples, self.size, scale=self.scale,
                             draft=image_decoder != "pil",
                             decoder="simplejpeg" if image_decoder == "simplejpeg" else "pil")
