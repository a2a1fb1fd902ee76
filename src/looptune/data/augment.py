"""Random affine augmentation (rotate, shift, scale) for MNIST-like images, done two ways.

``RandomAffine.per_sample()`` is the transform people put in a Dataset's ``__getitem__``: one PIL
image at a time on the CPU, torchvision's ``RandomAffine`` when it imports, else
:class:`_PilRandomAffine`, which repeats torchvision 0.2x op for op. ``RandomAffine.batch()`` warps
a whole batch with one ``affine_grid`` + ``grid_sample`` on the batch's device. Both draw from the
same distribution and share torchvision's geometry, so swapping one for the other changes the cost,
not the distribution of the training data (the tests check it statistically, not bit for bit).

Geometry (torchvision's ``F.affine`` convention, image y axis pointing down): the image is scaled
by ``scale`` and rotated by ``angle`` degrees about its center ``(W/2, H/2)``, positive = clockwise
on screen (torchvision documents ``F.affine``'s angle as clockwise; its ``F.rotate``, like PIL's
``rotate``, is counter-clockwise); then moved by ``tx`` pixels right and ``ty`` pixels down. The
draw is symmetric in the angle, so the direction only matters for matching the two paths.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from PIL import Image

from looptune.errors import ConfigError

__all__ = ["RandomAffine", "apply_batch", "draw_params_batch", "draw_params_per_sample",
           "torchvision_transforms"]

Params = tuple[float, int, int, float]  # (angle degrees, tx pixels, ty pixels, scale)


@dataclass(frozen=True, kw_only=True)
class RandomAffine:
    """A random rotation + shift + zoom per sample, no shear, black (0) fill, nearest sampling.

    Example:
        >>> aug = RandomAffine(degrees=10.0, translate=0.1, scale=(0.9, 1.1))
        >>> transform = aug.per_sample()  # PIL -> PIL, in a Dataset's __getitem__
        >>> x = aug.batch(torch.rand(256, 1, 28, 28))  # on the batch's device, before Normalize
    """

    degrees: float = 10.0  # rotation drawn uniformly in [-degrees, degrees]
    translate: float = 0.1  # max shift, a fraction of W (x) and H (y); uniform, rounded to pixels
    scale: tuple[float, float] = (0.9, 1.1)  # zoom drawn uniformly in [scale[0], scale[1]]

    def problems(self) -> list[str]:
        """Every invalid field: a message with the received value, what is allowed and the fix."""
        out: list[str] = []
        if not _is_number(self.degrees) or self.degrees < 0:
            out.append(f"degrees={self.degrees!r} is invalid: must be >= 0, e.g. 10. "
                       "Use 0 for no rotation.")
        if not _is_number(self.translate) or not 0 <= self.translate <= 1:
            out.append(f"translate={self.translate!r} is invalid: must be a fraction of the image "
                       "size in [0, 1], e.g. 0.1. Use 0 for no shift.")
        if not _valid_scale(self.scale):
            out.append(f"scale={self.scale!r} is invalid: must be (low, high) with "
                       "0 < low <= high, e.g. (0.9, 1.1). Use (1.0, 1.0) for no zoom.")
        return out

    def validate(self) -> RandomAffine:
        """Raise :class:`ConfigError` listing every problem at once; return self when valid."""
        found = self.problems()
        if found:
            raise ConfigError(found)
        return self

    def describe(self) -> str:
        """One line, e.g. ``RandomAffine(degrees=10, translate=0.1, scale=(0.9, 1.1))``."""
        return (f"RandomAffine(degrees={self.degrees:g}, translate={self.translate:g}, "
                f"scale=({self.scale[0]:g}, {self.scale[1]:g}))")

    def per_sample(self) -> Callable[[Image.Image], Image.Image]:
        """The per-image transform for a Dataset's ``__getitem__`` (CPU, PIL, global torch RNG).

        Returns:
            torchvision's ``transforms.RandomAffine`` when torchvision imports, else an equivalent
            :class:`_PilRandomAffine`. Both draw with :func:`draw_params_per_sample`'s recipe.

        Raises:
            ConfigError: a field is invalid (all problems listed).
        """
        self.validate()
        transforms = _torchvision_transforms()
        if transforms is None:
            return _PilRandomAffine(self)
        return transforms.RandomAffine(self.degrees, translate=(self.translate, self.translate),
                                       scale=self.scale)

    def batch(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Warp every sample of ``x`` with its own random parameters, on ``x.device``.

        Apply it before normalizing, while 0 means background (the fill is 0). No host sync.

        Args:
            x: float images, N x H x W or N x C x H x W, on any device.
            generator: a ``torch.Generator`` on ``x.device`` for reproducible draws; None uses
                the device's default generator.

        Returns:
            A new tensor with the shape, dtype and device of ``x``.

        Raises:
            ConfigError: a field is invalid, or ``x`` is not a float 3-D/4-D tensor.
        """
        self.validate()
        height, width = _check_images(x).shape[-2:]
        angle, tx, ty, scale = draw_params_batch(self, x.shape[0], width, height, x.device,
                                                 generator)
        return apply_batch(x, angle, tx, ty, scale)


def draw_params_per_sample(aug: RandomAffine, width: int, height: int) -> Params:
    """One sample's parameters, drawn from the global torch RNG as torchvision's ``get_params``.

    Same calls in the same order (angle, tx, ty, scale; each a ``torch.empty(1).uniform_``), so a
    given ``torch.manual_seed`` gives torchvision's parameters exactly.

    Args:
        aug: the augmentation settings.
        width, height: the image size in pixels (shifts are fractions of it).

    Returns:
        ``(angle, tx, ty, scale)``: degrees, whole pixels right, whole pixels down, zoom factor.
    """
    angle = float(torch.empty(1).uniform_(-float(aug.degrees), float(aug.degrees)).item())
    max_dx = float(aug.translate * width)
    max_dy = float(aug.translate * height)
    # round() is half-to-even, as torch.round in the batch path
    tx = int(round(torch.empty(1).uniform_(-max_dx, max_dx).item()))
    ty = int(round(torch.empty(1).uniform_(-max_dy, max_dy).item()))
    scale = float(torch.empty(1).uniform_(aug.scale[0], aug.scale[1]).item())
    return angle, tx, ty, scale


def draw_params_batch(aug: RandomAffine, n: int, width: int, height: int,
                      device: torch.device | str | None = None,
                      generator: torch.Generator | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``n`` samples' parameters at once, drawn on ``device``: the per-sample distribution.

    One ``torch.rand(n, 4)`` on the device (no host round trip); each column is mapped to its
    range exactly as ``uniform_(low, high)`` does (``low + (high - low) * u``).

    Args:
        aug: the augmentation settings.
        n: number of samples.
        width, height: the image size in pixels.
        device: where to draw (the batch's device).
        generator: a ``torch.Generator`` on ``device``; None uses the device's default one.

    Returns:
        ``(angle, tx, ty, scale)``: float32 tensors of shape ``[n]``; ``tx``/``ty`` hold whole
        numbers (rounded half-to-even, like Python's ``round``).
    """
    u = torch.rand(n, 4, device=device, generator=generator)
    spread = 2 * u[:, :3] - 1  # uniform in [-1, 1)
    angle = spread[:, 0] * aug.degrees
    tx = torch.round(spread[:, 1] * float(aug.translate * width))
    ty = torch.round(spread[:, 2] * float(aug.translate * height))
    scale = aug.scale[0] + (aug.scale[1] - aug.scale[0]) * u[:, 3]
    return angle, tx, ty, scale


def apply_batch(x: torch.Tensor, angle: Any, tx: Any, ty: Any, scale: Any) -> torch.Tensor:
    """Warp each sample of ``x`` by its own (angle, tx, ty, scale), fill 0, nearest sampling.

    The geometry of the per-sample PIL transform (see the module doc); pixels that agree with it
    differ only where a sample point falls on a pixel boundary. No Python loop, no host sync.

    Args:
        x: float images, N x H x W or N x C x H x W, on any device.
        angle: degrees, positive = clockwise on screen; a tensor of shape [N] or a number.
        tx, ty: pixels right / down; tensors of shape [N] or numbers.
        scale: zoom factor about the image center; a tensor of shape [N] or a number.

    Returns:
        A new tensor with the shape, dtype and device of ``x``.

    Raises:
        ConfigError: ``x`` is not a float 3-D/4-D tensor.
    """
    images = _check_images(x)
    images = images.unsqueeze(1) if images.ndim == 3 else images
    n, _, height, width = images.shape
    cols = [torch.as_tensor(v, dtype=x.dtype, device=x.device).broadcast_to((n,))
            for v in (angle, tx, ty, scale)]
    theta = _theta(*cols, width=width, height=height)
    grid = F.affine_grid(theta, list(images.shape), align_corners=False)
    out = F.grid_sample(images, grid, mode="nearest", padding_mode="zeros", align_corners=False)
    return out.reshape(x.shape)


def _theta(angle: torch.Tensor, tx: torch.Tensor, ty: torch.Tensor, scale: torch.Tensor, *,
           width: int, height: int) -> torch.Tensor:
    """N x 2 x 3 output->input maps in ``affine_grid``'s coordinates ([-1, 1] over pixel edges).

    torchvision's inverse matrix for PIL, in pixels about the center c, is
    ``p_in - c = R(-angle) (p_out - c - t) / scale`` (R(-a) = [[cos, sin], [-sin, cos]]).
    With ``align_corners=False``, ``x_norm = (x_px - W/2) / (W/2)``, so the off-diagonal terms pick
    up the aspect ratio and the shifts become ``2 t / size``.
    """
    rad = angle * (math.pi / 180.0)
    cos, sin = torch.cos(rad) / scale, torch.sin(rad) / scale
    row_x = [cos, sin * (height / width), -(cos * tx + sin * ty) * (2.0 / width)]
    row_y = [-sin * (width / height), cos, (sin * tx - cos * ty) * (2.0 / height)]
    return torch.stack(row_x + row_y, dim=-1).view(-1, 2, 3)


class _PilRandomAffine:
    """torchvision 0.2x ``RandomAffine(d, translate=(t, t), scale=s)`` on a PIL image, op for op.

    Used when torchvision does not import. Deliberately unoptimized: it is the per-sample
    baseline people actually run (a PIL warp per image in ``__getitem__``).
    """

    def __init__(self, aug: RandomAffine) -> None:
        self.aug = aug

    def __call__(self, img: Image.Image) -> Image.Image:
        width, height = img.size
        return self._apply(img, *draw_params_per_sample(self.aug, width, height))

    def _apply(self, img: Image.Image, angle: float, tx: int, ty: int,
               scale: float) -> Image.Image:
        """Warp ``img`` with fixed parameters (torchvision ``F.affine`` for PIL, center=None)."""
        width, height = img.size
        # torchvision's PIL branch: center in pixels, no +0.5 offset ("visually better")
        center = (width * 0.5, height * 0.5)
        matrix = _inverse_affine_matrix(center, angle, (tx, ty), scale)
        return img.transform(img.size, Image.Transform.AFFINE, matrix,
                             Image.Resampling.NEAREST, fillcolor=0)

    def __repr__(self) -> str:
        return f"_PilRandomAffine({self.aug.describe()})"


def _inverse_affine_matrix(center: tuple[float, float], angle: float,
                           translate: tuple[float, float], scale: float) -> list[float]:
    """torchvision's ``_get_inverse_affine_matrix`` with shear (0, 0): output px -> input px.

    The forward map is ``T * C * R(angle) * S(scale) * C^-1``; PIL wants its inverse. Written in
    torchvision's current operation order so the floats (and so nearest picks) match it.
    """
    rot = math.radians(angle)
    cx, cy = center
    cx_plus_tx, cy_plus_ty = cx + translate[0], cy + translate[1]
    a, b, c, d = math.cos(rot), -math.sin(rot), math.sin(rot), math.cos(rot)
    matrix = [d / scale, -b / scale, 0.0, -c / scale, a / scale, 0.0]
    matrix[2] += cx - matrix[0] * cx_plus_tx - matrix[1] * cy_plus_ty
    matrix[5] += cy - matrix[3] * cx_plus_tx - matrix[4] * cy_plus_ty
    return matrix


@functools.lru_cache(maxsize=1)
def torchvision_transforms() -> tuple[Any, str | None]:
    """(``torchvision.transforms``, None), or (None, why) when torchvision is absent or broken.

    Any exception counts: a torchvision built for another torch is installed but fails on import
    (operator registration errors), and looptune's equivalents give the same results.
    """
    try:
        from torchvision import transforms
    except Exception as err:  # noqa: BLE001 - absent or broken: both mean "use the equivalent"
        return None, f"{type(err).__name__}: {err}"[:200]
    return transforms, None


def _torchvision_transforms() -> Any:
    """``torchvision.transforms``, or None (see torchvision_transforms)."""
    return torchvision_transforms()[0]


def _check_images(x: Any) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or x.ndim not in (3, 4) or not x.is_floating_point():
        got = (f"shape={tuple(x.shape)} dtype={x.dtype}" if isinstance(x, torch.Tensor)
               else type(x).__name__)
        raise ConfigError(f"x ({got}) is invalid: must be a float tensor N x H x W or "
                          "N x C x H x W. Convert uint8 images with x.float() (before Normalize).")
    return x


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _valid_scale(v: Any) -> bool:
    return (isinstance(v, (tuple, list)) and len(v) == 2 and all(_is_number(s) for s in v)
            and 0 < v[0] <= v[1])
