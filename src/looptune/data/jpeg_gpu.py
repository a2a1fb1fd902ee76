"""Decoding a batch of JPEGs on the GPU (DALI's approach): ``torchvision.io.decode_jpeg`` on CUDA
(nvJPEG) decodes the whole batch in one call, and the per-sample pipeline's crop, resize, flip and
normalize run there too (:func:`crop_decoded`). :func:`gpu_decode_missing` says why it cannot
run where it cannot (no CUDA, no torchvision built for this torch).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from looptune.data.jpeg import normalize

__all__ = ["crop_decoded", "decode_on", "gpu_decode_missing"]


def gpu_decode_missing(device: torch.device | str) -> str | None:
    """Why JPEGs cannot be decoded on ``device`` here, or None."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return (f"decoding on the GPU needs a CUDA device (got {dev}): nvJPEG through "
                "torchvision.io.decode_jpeg(device='cuda'); on this machine the CPU decodes")
    if not torch.cuda.is_available():
        return "decoding on the GPU needs CUDA: torch.cuda.is_available() is False here"
    try:
        from torchvision import io as tvio

        tvio.decode_jpeg  # noqa: B018 - an old torchvision has no batched GPU decode
    except Exception as err:  # noqa: BLE001 - a torchvision built for another torch fails oddly
        return (f"decoding on the GPU needs torchvision.io.decode_jpeg ({type(err).__name__}: "
                f"{err}); install the torchvision built for this torch (pip install "
                "'looptune[vision]')")
    return None


def decode_on(datas: Sequence[torch.Tensor], device: torch.device | str) -> list[torch.Tensor]:
    """Encoded JPEGs (1-D uint8 tensors of each file's bytes) -> decoded RGB uint8 ``(3, H, W)``
    on ``device``, the whole batch in one call (nvJPEG's batched decode on CUDA)."""
    from torchvision.io import ImageReadMode, decode_jpeg

    return decode_jpeg(list(datas), mode=ImageReadMode.RGB, device=torch.device(device))


def crop_decoded(images: Sequence[torch.Tensor], boxes: torch.Tensor, flips: torch.Tensor,
                 size: int) -> torch.Tensor:
    """Decoded uint8 ``(3, H, W)`` images of any sizes, on their device -> each one's crop
    ``boxes[i]`` (left, top, width, height in its pixels) resized to ``size`` x ``size``
    (bilinear with antialiasing, as PIL's resize filters a reduction), mirrored where ``flips``,
    scaled and normalized: float32 ``(B, 3, size, size)``, the per-sample pipeline's output."""
    out = []
    for img, (left, top, w, h), mirror in zip(images, boxes.round().long().tolist(),
                                              flips.tolist()):
        crop = img[None, :, top:top + h, left:left + w].float()
        crop = F.interpolate(crop, size=(size, size), mode="bilinear", antialias=True,
                             align_corners=False)
        out.append(crop.flip(-1) if mirror else crop)
    return normalize(torch.cat(out).div_(255))
