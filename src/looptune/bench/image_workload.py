"""The ``jpeg-folder`` workload: a folder of JPEGs read from disk, decoded and augmented per
sample (issue 33), the pipeline the tutorials are about.

Data: ``DIR/train`` and ``DIR/test``, image folders in the ``ImageFolder`` layout (``looptune
data images --out DIR/train`` and ``--split test --out DIR/test`` make them from MNIST digits).
Model: :class:`looptune.models.ImageCNN` at 32 x 32. Training input, as each recipe reads it:

* ``decode='per_sample'``: every step's samples are read from their files and decoded one by one
  (``loader.image_decoder``: PIL, JPEG draft mode, or simplejpeg), cropped at random (35-100% of
  the area, aspect 3/4-4/3, torchvision's draw), mirrored at random, scaled and normalized per
  channel (:class:`looptune.data.jpeg.FolderDataset`).
* ``decode='tensorized'``: every file was decoded once at load time, the whole image resized to
  48 x 48 (FFCV's "raw" mode; the seconds it took are in the results' provenance), and the same
  random crops and flips are drawn for whole batches, in the originals' coordinates, and applied
  with one ``affine_grid`` + ``grid_sample`` on the training device
  (:class:`looptune.data.jpeg.FolderCrops`).

Scored by accuracy on the test folder decoded once (the whole image resized to 32 x 32).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
from torch import nn

from looptune.data.batches import ImageData
from looptune.errors import ConfigError

__all__ = ["STORED", "SIZE", "SCALE", "check_folders", "folder_info", "load_folders", "score_folder"]

SIZE, STORED = 32, 48  # training resolution; the stored (decode-once) resolution, 1.5x
SCALE = (0.35, 1.0)  # crops keep 35-100% of the area (8% would often crop the digit away)
_DECODE_S: dict[str, float] = {}  # folder -> seconds its decode-once took in this process


def _folders(data_dir: str | os.PathLike | None) -> tuple[Path, Path]:
    if data_dir is None:
        raise ConfigError(
            "workload jpeg-folder needs --data DIR: a folder holding train/ and test/ image "
            "folders (class sub-folders of JPEG files). Make them from MNIST with: looptune data "
            "images --out DIR/train --samples 12000 && looptune data images --out DIR/test "
            "--split test --samples 2000")
    root = Path(data_dir)
    train, test = root / "train", root / "test"
    missing = [str(p) for p in (train, test) if not p.is_dir()]
    if missing:
        raise ConfigError(
            f"--data {str(root)!r}: no {' and no '.join(missing)}. jpeg-folder reads DIR/train and "
            "DIR/test (ImageFolder layout). Make them with: looptune data images --out "
            f"{root}/train --samples 12000 && looptune data images --out {root}/test --split "
            "test --samples 2000")
    return train, test


def check_folders(*, data_dir: str | None = None) -> int:
    """The training files (both folders scanned: a bad file is named before any training)."""
    from looptune.data import image_folder

    train, test = _folders(data_dir)
    image_folder.scan(test)
    return len(image_folder.scan(train))


def load_folders(*, data_dir: str | None = None) -> tuple[ImageData, ImageData]:
    """The training data (both pipelines' inputs) and the test data decoded once."""
    from looptune.data import image_folder
    from looptune.data.jpeg import FolderCrops, FolderReader, decode_all, with_sizes

    train_dir, test_dir = _folders(data_dir)
    train, test = image_folder.scan(train_dir), image_folder.scan(test_dir)
    workers = max(0, len(os.sched_getaffinity(0)) - 1) if hasattr(os, "sched_getaffinity") else 0
    t0 = time.perf_counter()
    images, labels, sizes = decode_all(train, STORED, workers=workers)
    _DECODE_S[str(train_dir.resolve())] = time.perf_counter() - t0
    test_x, test_y, _ = decode_all(test, SIZE, workers=workers)
    return (ImageData(images=with_sizes(images, sizes), labels=labels,
                      augment=FolderCrops(SIZE, SCALE), per_sample=FolderReader(train, SIZE, SCALE)),
            ImageData(images=test_x, labels=test_y))


def folder_info(*, data_dir: str | None = None) -> dict:
    """The folders, their files and bytes, and the decode-once seconds of this process's load."""
    from looptune.data import image_folder

    train, test = _folders(data_dir)
    out = {}
    for name, folder in (("train", train), ("test", test)):
        s = image_folder.scan(folder)
        out[name] = {"path": str(folder), "files": len(s), "bytes": s.bytes,
                     "classes": len(s.classes)}
    decode_s = _DECODE_S.get(str(train.resolve()))
    if decode_s is not None:
        out["decode_once_s"] = round(decode_s, 3)
        out["decode_once"] = (f"every training file decoded once, resized to {STORED} x {STORED}: "
                              f"{decode_s:.2f} s (tensorized recipes; not in their training time)")
    return out


def score_folder(model: nn.Module, data: ImageData, device: torch.device,
                 batch_size: int = 1000) -> tuple[float, int]:
    """(correct, count) on uint8 (N, 3, 32, 32) test images, normalized per channel as in
    training; one sync at the end."""
    from looptune.data.jpeg import normalize

    was_training = model.training
    model.eval()
    correct = torch.zeros((), dtype=torch.int64, device=device)
    with torch.no_grad():
        for i in range(0, len(data), batch_size):
            x = normalize(data.images[i:i + batch_size].to(device).float().div_(255))
            y = data.labels[i:i + batch_size].to(device)
            correct += (model(x).argmax(1) == y).sum()
    model.train(was_training)
    return float(correct.item()), len(data)
