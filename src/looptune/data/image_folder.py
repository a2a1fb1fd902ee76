"""A folder of JPEG files in the ``ImageFolder`` layout: written from real images offline, and read.

The canonical starving pipeline (issue 33) reads compressed images from disk, one file a sample,
and decodes and augments each on the CPU. :func:`write` makes such a folder without a download:
``ROOT/<class>/<n>.jpg`` (the layout ``torchvision.datasets.ImageFolder`` reads), one RGB JPEG
per MNIST digit, drawn at a random size and place on a coloured, textured background of a
random size (``min_size`` to ``max_size`` pixels a side), the class its digit. ``manifest.json``
beside the class folders records the count, the bytes and the SHA-256 of every file.

:func:`scan` lists a folder's samples (sorted class folders, sorted files, as ImageFolder does)
and checks what can be checked before any training: no class folder, an empty class, a file
that is not a JPEG/PNG by its first bytes, a truncated JPEG (no end-of-image marker). Each is an
error naming the file, or, with ``skip_bad=True``, skipped and counted in
:attr:`Samples.skipped`; never an exception deep inside a DataLoader worker.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from looptune._io import atomic_write_text, fsync_dir
from looptune.errors import ConfigError, DataError

__all__ = ["IMAGE_SUFFIXES", "MANIFEST", "Samples", "manifest", "scan", "write"]

MANIFEST = "manifest.json"
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
_JPEG_START, _JPEG_END, _PNG_START = b"\xff\xd8\xff", b"\xff\xd9", b"\x89PNG\r\n\x1a\n"


@dataclass(frozen=True, kw_only=True)
class Samples:
    """A folder's samples: file paths and class indices, in ImageFolder's order."""

    root: Path
    classes: list[str]  # class folder names, sorted; a sample's label is its index here
    paths: list[Path]
    labels: list[int]
    skipped: dict[str, str] = field(default_factory=dict)  # path -> why (skip_bad=True only)

    def __len__(self) -> int:
        return len(self.paths)

    @property
    def bytes(self) -> int:
        return sum(p.stat().st_size for p in self.paths)


def write(out: str | os.PathLike, *, samples: int, mnist_dir: str | os.PathLike | None = None,
          split: str = "train", min_size: int = 128, max_size: int = 256, quality: int = 90,
          seed: int = 0, progress: Callable[[int, int], None] | None = None) -> dict:
    """Write ``samples`` JPEG files under ``out`` in the ImageFolder layout; returns the manifest.

    The folder appears whole or not at all: files go to a temporary folder beside ``out``, which
    is renamed to ``out`` once every file and the manifest are written. ``out`` must not exist, or
    be an empty folder.

    Raises:
        ConfigError: a bad count, size or quality (before anything is read or written); ``out``
            exists and is not an empty folder.
        DataError: the MNIST files are missing or corrupt (from :func:`looptune.data.mnist.load`).
    """
    problems = []
    if not isinstance(samples, int) or isinstance(samples, bool) or samples < 10:
        problems.append(f"samples={samples!r}: must be an integer >= 10 (one file per class at least)")
    if not (isinstance(min_size, int) and isinstance(max_size, int) and 32 <= min_size <= max_size <= 4096):
        problems.append(f"min_size={min_size!r}, max_size={max_size!r}: need 32 <= min_size <= "
                        "max_size <= 4096 pixels")
    if not (isinstance(quality, int) and 1 <= quality <= 100):
        problems.append(f"quality={quality!r}: must be an integer from 1 to 100 (JPEG quality; 90 "
                        "is typical)")
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        problems.append(f"{out} exists and is not an empty folder: choose a new path, or delete it")
    if problems:
        raise ConfigError(problems)
    from looptune.data import mnist  # the digits the images are drawn from

    digits, labels = mnist.load(split, data_dir=mnist_dir)
    rng = np.random.default_rng(seed)
    order = _balanced(labels.numpy(), samples, rng)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    try:
        for c in range(10):
            (tmp / str(c)).mkdir()
        files: list[dict] = []
        for n, i in enumerate(order):
            label = int(labels[i])
            img = _compose(digits[int(i)].numpy(), rng, min_size, max_size)
            buf = io.BytesIO()
            img.save(buf, format="JPEG", quality=quality)
            data = buf.getvalue()
            rel = f"{label}/{n:07d}.jpg"
            (tmp / rel).write_bytes(data)
            files.append({"path": rel, "label": label, "mnist_index": int(i), "bytes": len(data),
                          "sha256": hashlib.sha256(data).hexdigest(), "size": list(img.size)})
            if progress is not None:
                progress(n + 1, samples)
        record = {"format": "looptune-image-folder", "version": 1, "count": len(files),
                  "bytes": sum(f["bytes"] for f in files), "classes": [str(c) for c in range(10)],
                  "source": f"MNIST {split} digits (seed {seed}), drawn on coloured backgrounds",
                  "min_size": min_size, "max_size": max_size, "quality": quality, "files": files}
        atomic_write_text(tmp / MANIFEST, json.dumps(record, indent=1))
        os.sync()  # the files' bytes reach the disk before the folder is renamed into place
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
        fsync_dir(out.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return record


def _balanced(labels: np.ndarray, samples: int, rng: np.random.Generator) -> np.ndarray:
    """``samples`` indices, every class within one of ``samples / 10`` (each class's digits
    shuffled, reused in turn past its count), in a shuffled order."""
    per = [rng.permutation(np.flatnonzero(labels == c)) for c in range(10)]
    counts = [samples // 10 + (1 if c < samples % 10 else 0) for c in range(10)]
    picked = np.concatenate([np.resize(per[c], counts[c]) for c in range(10)])
    return picked[rng.permutation(len(picked))]


def _compose(digit: np.ndarray, rng: np.random.Generator, min_size: int, max_size: int) -> Image.Image:
    """One RGB image: a smooth colour field around a random base colour, with grain; the digit
    scaled to 50-90% of the shorter side at a random place, in an ink of the opposite lightness."""
    w, h = (int(v) for v in rng.integers(min_size, max_size + 1, 2))
    base = rng.uniform(40, 215, 3)
    # a 3x3 field of colours within +-45 of the base, bilinearly upsampled, plus grain
    field_ = np.clip(base + rng.uniform(-45, 45, (3, 3, 3)), 0, 255).astype(np.uint8)
    bg = np.asarray(Image.fromarray(field_).resize((w, h), Image.BILINEAR), dtype=np.float32)
    bg = bg + rng.normal(0, 8, (h, w, 1)).astype(np.float32)
    side = int(min(w, h) * rng.uniform(0.5, 0.9))
    mask = np.asarray(Image.fromarray(digit).resize((side, side), Image.BILINEAR),
                      dtype=np.float32)[..., None] / 255.0
    x0, y0 = int(rng.integers(0, w - side + 1)), int(rng.integers(0, h - side + 1))
    light = float(base @ np.array([0.299, 0.587, 0.114])) > 127
    ink = (rng.uniform(0, 60, 3) if light else rng.uniform(195, 255, 3)).astype(np.float32)
    patch = bg[y0:y0 + side, x0:x0 + side]
    bg[y0:y0 + side, x0:x0 + side] = patch * (1 - mask) + ink * mask
    return Image.fromarray(np.clip(bg, 0, 255).astype(np.uint8), "RGB")


def manifest(root: str | os.PathLike) -> dict | None:
    """The folder's manifest (:func:`write`), or None when it has none."""
    path = Path(root) / MANIFEST
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise DataError(f"{path}: not a readable manifest ({err}). Delete it, or rewrite the "
                        "folder with `looptune data images`.") from None


def scan(root: str | os.PathLike, *, skip_bad: bool = False, verify: bool = False) -> Samples:
    """The samples of an ImageFolder-layout folder, checked (see the module docstring).

    Args:
        skip_bad: skip a file that is not an image or is truncated, and count it in
            ``skipped``, instead of raising.
        verify: also check each file's SHA-256 against the folder's manifest (when it has one).

    Raises:
        DataError: no such folder, no class folders, an empty class, or (without ``skip_bad``)
            a bad file: each naming the path and the fix.
    """
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"{root}: no such folder. Give the folder that holds one sub-folder per "
                        "class (write one with `looptune data images --out DIR`).")
    classes = sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    if not classes:
        raise DataError(f"{root}: no class folders in it. The layout is ROOT/<class>/<file>.jpg "
                        "(as torchvision.datasets.ImageFolder reads).")
    sums = {}
    if verify and (record := manifest(root)) is not None:
        sums = {f["path"]: f["sha256"] for f in record.get("files", [])}
    paths, labels, skipped = [], [], {}
    for index, name in enumerate(classes):
        found = 0
        for path in sorted((root / name).iterdir()):
            if path.name.startswith(".") or not path.is_file():
                continue
            problem = _file_problem(path, sums.get(f"{name}/{path.name}"))
            if problem is not None:
                if not skip_bad:
                    raise DataError(f"{path}: {problem}. Remove or replace the file, or pass "
                                    "skip_bad=True (--skip-bad) to skip such files and count them.")
                skipped[str(path)] = problem
                continue
            paths.append(path)
            labels.append(index)
            found += 1
        if not found:
            raise DataError(f"{root / name}: class {name!r} has no image files "
                            f"({', '.join(IMAGE_SUFFIXES)}). Remove the empty folder, or add its images.")
    return Samples(root=root, classes=classes, paths=paths, labels=labels, skipped=skipped)


def _file_problem(path: Path, sha256: str | None) -> str | None:
    """Why ``path`` is not a usable image file (by name, first and last bytes), or None."""
    if path.suffix.lower() not in IMAGE_SUFFIXES:
        return f"not an image file (suffix {path.suffix or 'none'!r}; allowed {', '.join(IMAGE_SUFFIXES)})"
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        f.seek(max(0, size - 2))
        tail = f.read(2)
    if head.startswith(_JPEG_START):
        if tail != _JPEG_END:
            return f"a truncated JPEG ({size} bytes, no end-of-image marker)"
    elif not head.startswith(_PNG_START):
        return f"not a JPEG or PNG (its first bytes are {head[:4].hex()})"
    if sha256 is not None and hashlib.sha256(path.read_bytes()).hexdigest() != sha256:
        return "its SHA-256 differs from the manifest's (changed since it was written)"
    return None
