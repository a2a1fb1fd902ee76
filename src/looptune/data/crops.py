"""The random resized crop of torchvision's ``RandomResizedCrop``, drawn without torchvision:
for one image on torch's RNG (:func:`crop_box`), for a batch at once (:func:`draw_crops`), or keyed
on ``(seed, epoch, index)`` (:func:`keyed_crops`: a counter-based generator, splitmix64), so a
per-sample pipeline in any DataLoader worker and a batched pipeline draw the same crop and flip
for the same sample. Only boxes in the original image's pixels: applying them is the caller's
(:func:`looptune.data.jpeg.crop_batch`, :func:`looptune.data.jpeg_gpu.crop_decoded`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

__all__ = ["RATIO", "SCALE", "TRIES", "crop_box", "draw_crops", "keyed_box", "keyed_crops"]

SCALE, RATIO = (0.08, 1.0), (3 / 4, 4 / 3)  # torchvision RandomResizedCrop's defaults
TRIES = 10  # torchvision draws this many crops before it falls back to a centre crop


def crop_box(width: int, height: int, rng: torch.Generator | None = None,
             scale: tuple[float, float] = SCALE, ratio: tuple[float, float] = RATIO
             ) -> tuple[int, int, int, int]:
    """``(left, top, w, h)`` of a random resized crop, torchvision's draw on torch's RNG."""
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(TRIES):
        target = area * torch.empty(1).uniform_(scale[0], scale[1], generator=rng).item()
        aspect = math.exp(torch.empty(1).uniform_(log_ratio[0], log_ratio[1], generator=rng).item())
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(torch.randint(0, height - h + 1, size=(1,), generator=rng).item())
            left = int(torch.randint(0, width - w + 1, size=(1,), generator=rng).item())
            return left, top, w, h
    return _centre(width, height, ratio)


def _centre(width: int, height: int, ratio: tuple[float, float]) -> tuple[int, int, int, int]:
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        w, h = int(round(height * max(ratio))), height
    else:
        w, h = width, height
    return (width - w) // 2, (height - h) // 2, w, h


def draw_crops(sizes: torch.Tensor, generator: torch.Generator | None = None,
               scale: tuple[float, float] = SCALE, ratio: tuple[float, float] = RATIO
               ) -> torch.Tensor:
    """Random resized crops for a batch at once: ``sizes`` (B, 2) widths and heights -> (B, 4)
    ``left, top, w, h`` in pixels, torchvision's draw (ten tries each, then a centre crop), on
    torch's RNG."""
    u = torch.rand(len(sizes), 2 * TRIES + 2, dtype=torch.float64, generator=generator)
    return _crops(sizes.to(torch.float64), u, scale, ratio)


def keyed_crops(seed: int, epoch: int, index: Sequence[int] | np.ndarray, sizes: torch.Tensor,
                scale: tuple[float, float] = SCALE, ratio: tuple[float, float] = RATIO
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """The crops (B, 4) and mirror flags (B,) of samples ``index`` in ``epoch``: torchvision's
    draw on random numbers that depend only on ``(seed, epoch, index)`` (a counter-based
    generator, splitmix64). The per-sample path (in any DataLoader worker) and the batched path
    then draw the same crops for the same sample: every recipe trains on the same pictures."""
    u = torch.from_numpy(_uniforms(seed, epoch, np.asarray(index, dtype=np.uint64), 2 * TRIES + 3))
    return _crops(sizes.to(torch.float64), u[:, :-1], scale, ratio), u[:, -1] < 0.5


def keyed_box(seed: int, epoch: int, index: int, width: int, height: int,
              scale: tuple[float, float] = SCALE, ratio: tuple[float, float] = RATIO
              ) -> tuple[tuple[int, int, int, int], bool]:
    """One sample's :func:`keyed_crops` (its box and mirror flag) in Python numbers: what a
    per-sample pipeline draws in a DataLoader worker, with no array set-up per sample."""
    u = _uniforms_one(seed, epoch, index, 2 * TRIES + 3)
    return _box(width, height, u, scale, ratio), u[-1] < 0.5


_M1, _M2, _GOLDEN = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB), \
    np.uint64(0x9E3779B97F4A7C15)


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer (uint64, wrapping)."""
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def _uniforms(seed: int, epoch: int, index: np.ndarray, k: int) -> np.ndarray:
    """(len(index), k) uniforms in [0, 1), each a function of (seed, epoch, index, column)."""
    with np.errstate(over="ignore"):
        key = _mix(_mix(np.array([seed % 2**64], dtype=np.uint64)) + np.uint64(epoch % 2**64) * _GOLDEN)
        counter = index[:, None] * np.uint64(k) + np.arange(k, dtype=np.uint64)[None, :]
        z = _mix(key + counter * _GOLDEN)
    return (z >> np.uint64(11)).astype(np.float64) * 2.0 ** -53


_MASK = 2**64 - 1


def _mix_one(z: int) -> int:
    z = ((z ^ (z >> 30)) * int(_M1)) & _MASK
    z = ((z ^ (z >> 27)) * int(_M2)) & _MASK
    return z ^ (z >> 31)


def _uniforms_one(seed: int, epoch: int, index: int, k: int) -> list[float]:
    """:func:`_uniforms` for one sample, in Python integers (no array set-up per sample)."""
    key = _mix_one((_mix_one(seed % 2**64) + (epoch % 2**64) * int(_GOLDEN)) & _MASK)
    return [(_mix_one((key + (index * k + j) * int(_GOLDEN)) & _MASK) >> 11) * 2.0 ** -53
            for j in range(k)]


def _box(width: int, height: int, u: list[float], scale: tuple[float, float],
         ratio: tuple[float, float]) -> tuple[int, int, int, int]:
    """:func:`_crops` for one image, in Python floats."""
    lo, hi = math.log(ratio[0]), math.log(ratio[1])
    for t in range(TRIES):
        target = width * height * (scale[0] + (scale[1] - scale[0]) * u[t])
        aspect = math.exp(lo + (hi - lo) * u[TRIES + t])
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            left = math.floor(u[2 * TRIES] * (width - w + 1))
            top = math.floor(u[2 * TRIES + 1] * (height - h + 1))
            return left, top, w, h
    return _centre(width, height, ratio)


def _crops(sizes: torch.Tensor, u: torch.Tensor, scale: tuple[float, float],
           ratio: tuple[float, float]) -> torch.Tensor:
    """torchvision's draw from given uniforms: ``u`` (B, 2 x TRIES + 2): the tries' areas, their
    log-aspects, then the left and top offsets."""
    width, height = sizes[:, 0], sizes[:, 1]
    b = len(sizes)
    target = width[:, None] * height[:, None] * (scale[0] + (scale[1] - scale[0]) * u[:, :TRIES])
    lo, hi = math.log(ratio[0]), math.log(ratio[1])
    aspect = torch.exp(lo + (hi - lo) * u[:, TRIES:2 * TRIES])
    w = torch.round(torch.sqrt(target * aspect))
    h = torch.round(torch.sqrt(target / aspect))
    ok = (w > 0) & (w <= width[:, None]) & (h > 0) & (h <= height[:, None])
    first = torch.where(ok.any(1), ok.to(torch.int8).argmax(1), 0)
    pick = torch.arange(b)
    w, h, found = w[pick, first], h[pick, first], ok.any(1)
    left = torch.floor(u[:, 2 * TRIES] * (width - w + 1))
    top = torch.floor(u[:, 2 * TRIES + 1] * (height - h + 1))
    out = torch.stack([left, top, w, h], 1)
    for i in torch.nonzero(~found).flatten().tolist():  # ten misses: the centre crop
        out[i] = torch.tensor(_centre(int(width[i]), int(height[i]), ratio), dtype=torch.float64)
    return out
