"""Locate, download and verify MNIST; load a split as torch tensors.

Where the four files are looked for (the first folder holding all four wins):

1. ``data_dir`` (the CLI's ``--data DIR``). When given it is the only place looked: a wrong
   folder is an error, never a silent fall back to some other copy.
2. The environment variable ``LOOPTUNE_DATA``.
3. The user cache folder ``$XDG_CACHE_HOME/looptune/mnist`` (default ``~/.cache/looptune/mnist``).

Each place may be a flat folder or torchvision's ``ROOT/MNIST/raw/`` layout, and each file may be
gzip-compressed (``NAME.gz``) or raw (``NAME``). Checksums are of the *decompressed* contents, so
both forms verify against one table. Entry points: :func:`load`, :func:`verify`, :func:`download`.
"""

from __future__ import annotations

import functools
import hashlib
import os
import tempfile
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import MappingProxyType
from typing import Callable, Literal, Mapping, Sequence, Union, get_args

import numpy as np
import torch

from looptune._paths import cache_root
from looptune.data import fetch, idx
from looptune.errors import ConfigError, DataError

__all__ = [
    "Split", "SPLITS", "NAMES", "SHA256", "COUNTS", "DEFAULT_MIRRORS", "ENV_VAR",
    "cache_dir", "locate", "files", "load", "verify", "download", "clear_cache",
]

PathLike = Union[str, "os.PathLike[str]"]
Progress = Callable[[str, int, Union[int, None]], None]  # (file name, bytes done, bytes total)

Split = Literal["train", "test"]
SPLITS: tuple[Split, ...] = get_args(Split)
IMAGES: Mapping[Split, str] = MappingProxyType(
    {"train": "train-images-idx3-ubyte", "test": "t10k-images-idx3-ubyte"})
LABELS: Mapping[Split, str] = MappingProxyType(
    {"train": "train-labels-idx1-ubyte", "test": "t10k-labels-idx1-ubyte"})
NAMES: tuple[str, ...] = (IMAGES["train"], LABELS["train"], IMAGES["test"], LABELS["test"])
# SHA-256 of the decompressed contents: one table serves NAME.gz and raw NAME alike
SHA256: Mapping[str, str] = MappingProxyType({
    "train-images-idx3-ubyte": "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
    "train-labels-idx1-ubyte": "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
    "t10k-images-idx3-ubyte": "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
    "t10k-labels-idx1-ubyte": "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
})
COUNTS: Mapping[Split, int] = MappingProxyType({"train": 60000, "test": 10000})
IMAGE_SHAPE = (28, 28)
NUM_CLASSES = 10
# torchvision's mirrors, in its order; files are fetched as NAME + ".gz"
DEFAULT_MIRRORS = ("https://ossci-datasets.s3.amazonaws.com/mnist/", "http://yann.lecun.com/exdb/mnist/")
ENV_VAR = "LOOPTUNE_DATA"

_FIX = ("Fix: pass --data DIR (data_dir=DIR) with a folder holding the four files "
        f"({', '.join(NAMES)}; each as NAME.gz or raw NAME), set {ENV_VAR}=DIR, "
        "or download them with `looptune data mnist --download`.")


def cache_dir() -> Path:
    """The user cache folder for MNIST: ``$XDG_CACHE_HOME/looptune/mnist`` or ``~/.cache/...``."""
    return cache_root() / "mnist"


def locate(data_dir: PathLike | None = None) -> Path:
    """Find the folder holding the four MNIST files (search order in the module docstring).

    Args:
        data_dir: the folder from ``--data DIR``; when given, the only place looked.

    Returns:
        The folder holding the files (``ROOT/MNIST/raw`` for torchvision's layout).

    Raises:
        DataError: ``data_dir`` lacks the files (names the folder, the missing files and the fix),
            or nothing was given and no place holds them (lists every place looked).

    Example:
        >>> locate("~/data")  # torchvision's layout works too
        PosixPath('/home/me/data/MNIST/raw')
    """
    if data_dir is not None:
        root = Path(data_dir).expanduser()
        folder, problem = _probe(root)
        if folder is None:
            raise DataError(f"MNIST folder {root} (--data / data_dir): {problem}. {_FIX}")
        return folder
    looked: list[str] = []
    env = _env_dir()
    places = [(f"{ENV_VAR}={env}" if env else ENV_VAR, env), (f"user cache {cache_dir()}", cache_dir())]
    for place, root in places:
        folder, problem = (None, "not set") if root is None else _probe(root)
        if folder is not None:
            if looked and env is not None:  # a set-but-wrong LOOPTUNE_DATA deserves a word
                warnings.warn(f"{looked[0]}; using {folder} instead", stacklevel=2)
            return folder
        looked.append(f"{place}: {problem}")
    raise DataError("MNIST files not found. Looked in:\n  - " + "\n  - ".join(looked) + f"\n{_FIX}")


def files(root: PathLike) -> dict[str, Path]:
    """Map each of the four file names to its path under ``root`` (flat or ``MNIST/raw``).

    When both ``NAME`` and ``NAME.gz`` exist the raw one wins: it skips a 0.2 s gunzip.

    Raises:
        DataError: ``root`` does not hold all four files (names the missing ones and the fix).
    """
    folder, problem = _probe(Path(root))
    if folder is None:
        raise DataError(f"{root}: {problem}. {_FIX}")
    return _resolve(folder)[0]


def load(
    split: Split = "train", *, data_dir: PathLike | None = None, verify: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Load one MNIST split as tensors; cached per process, keyed on path, mtime and size.

    Args:
        split: ``"train"`` (60000 examples) or ``"test"`` (10000).
        data_dir: the folder from ``--data DIR``; see :func:`locate` for the search order.
        verify: check the SHA-256 of the decompressed files against the official values.

    Returns:
        ``(images, labels)``: uint8 ``(N, 28, 28)`` and int64 ``(N,)``, fresh copies the caller
        may modify in place.

    Raises:
        ConfigError: ``split`` is not one of :data:`SPLITS`.
        DataError: files missing, corrupt, failing the checksum, of the wrong shape or count,
            or labels outside 0..9.

    Example:
        >>> images, labels = load("test", data_dir="~/data/mnist")
    """
    if split not in SPLITS:
        raise ConfigError(f"split={split!r} is invalid: must be one of {SPLITS}. Use 'train' or 'test'.")
    paths = files(locate(data_dir))
    stamps = _stamp(paths[IMAGES[split]]), _stamp(paths[LABELS[split]])
    images, labels = _load_cached(split, *stamps, verify)
    # clone: the cached tensors are shared by every caller in the process, and one recipe's
    # in-place normalisation must not leak into the next (47 MB copy, ~10 ms)
    return images.clone(), labels.clone()


def clear_cache() -> None:
    """Forget the tensors :func:`load` keeps (about 50 MB per split and verify setting) and which
    files were already verified."""
    _load_cached.cache_clear()
    _VERIFIED.clear()


def verify(data_dir: PathLike | None = None, *, sha256: Mapping[str, str] = SHA256) -> Path:
    """Check that all four files exist and hash correctly, without building tensors (~0.3 s).

    Args:
        data_dir: the folder from ``--data DIR``; see :func:`locate` for the search order.
        sha256: expected digests of the decompressed files (tests pass their own).

    Returns:
        The folder holding the files.

    Raises:
        DataError: files missing, or every file that is corrupt or fails its checksum.

    Example:
        >>> folder = verify(args.data)  # before any training starts: fail in 0.3 s, not later
    """
    folder = locate(data_dir)
    found = files(folder)
    with ThreadPoolExecutor(max_workers=len(found)) as pool:  # zlib and hashlib release the GIL
        checked = pool.map(lambda name: _hash_problem(found[name], sha256[name]), found)
        problems = [problem for problem in checked if problem is not None]
    if problems:
        raise DataError(f"{len(problems)} of 4 MNIST files are bad:\n  - " + "\n  - ".join(problems))
    return folder


def download(
    dest: PathLike | None = None,
    *,
    mirrors: Sequence[str] = DEFAULT_MIRRORS,
    timeout_s: float = 30.0,
    progress: Progress | None = None,
    sha256: Mapping[str, str] = SHA256,
) -> Path:
    """Fetch whichever of the four files are missing or bad into ``dest``, verified, atomically.

    Each file is streamed to a temp file in ``dest``, decompressed and hashed, and renamed to
    ``dest/NAME.gz`` only if the hash matches; otherwise the next mirror is tried. Nothing
    partial is ever left in ``dest``.

    Args:
        dest: target folder (created if needed); default ``$LOOPTUNE_DATA`` if set, else
            :func:`cache_dir`, so :func:`locate` finds the files afterwards.
        mirrors: base URLs tried in order.
        timeout_s: socket timeout per connection attempt and per read, in seconds.
        progress: called as ``progress(name, bytes_done, bytes_total_or_None)`` per chunk.
        sha256: expected digests of the decompressed files (tests serve small fakes).

    Returns:
        ``dest``.

    Raises:
        ConfigError: ``mirrors`` is empty.
        DataError: every mirror failed for a file (names each mirror's failure and the offline fix).

    Example:
        >>> download("~/data/mnist", progress=lambda name, done, total: print(name, done, total))
    """
    mirrors = (mirrors,) if isinstance(mirrors, str) else tuple(mirrors)
    if not mirrors:
        raise ConfigError("mirrors=() is empty: give at least one base URL, e.g. DEFAULT_MIRRORS.")
    folder = Path(dest).expanduser() if dest is not None else (_env_dir() or cache_dir())
    _prepare_dest(folder)
    for name in NAMES:
        present = _resolve(folder)[0].get(name)
        if present is None or _hash_problem(present, sha256[name]) is not None:
            _fetch(name, folder, mirrors, expected=sha256[name], timeout_s=timeout_s,
                   progress=progress)
    return folder


# --- locating ---------------------------------------------------------------------------------


def _env_dir() -> Path | None:
    env = os.environ.get(ENV_VAR)
    return Path(env).expanduser() if env else None  # an empty value counts as unset


def _resolve(folder: Path) -> tuple[dict[str, Path], list[str]]:
    """Return ({name: path} for the files present in ``folder``, [names missing])."""
    found: dict[str, Path] = {}
    for name in NAMES:
        candidates = (folder / name, folder / f"{name}.gz")  # raw first: no gunzip needed
        path = next((p for p in candidates if p.is_file()), None)
        if path is not None:
            found[name] = path
    return found, [n for n in NAMES if n not in found]


def _probe(root: Path) -> tuple[Path | None, str]:
    """Return (the folder under ``root`` holding all four files, "") or (None, why not)."""
    if not root.exists():
        return None, "the folder does not exist"
    if not root.is_dir():
        return None, "not a folder"
    layouts = [(folder, _resolve(folder)[1]) for folder in (root, root / "MNIST" / "raw")]
    for folder, missing in layouts:
        if not missing:
            return folder, ""
    folder, missing = min(layouts, key=lambda layout: len(layout[1]))  # the nearest miss
    return None, (f"{folder} is missing {', '.join(missing)} "
                  f"(looked in {root} and torchvision's {root / 'MNIST' / 'raw'})")


# --- loading ----------------------------------------------------------------------------------


def _stamp(path: Path) -> tuple[str, int, int]:
    # mtime and size in the cache key: a re-downloaded file is re-read, an unchanged one is not
    stat = path.stat()
    return str(path.absolute()), stat.st_mtime_ns, stat.st_size


@functools.lru_cache(maxsize=4)  # train + test, verified or not: at most ~100 MB
def _load_cached(
    split: Split, image_stamp: tuple[str, int, int], label_stamp: tuple[str, int, int], verify: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    image_path, label_path = Path(image_stamp[0]), Path(label_stamp[0])
    images = idx.read_idx(image_path, check=_hasher(IMAGES[split], image_path) if verify else None)
    labels = idx.read_idx(label_path, check=_hasher(LABELS[split], label_path) if verify else None)
    _check_images(image_path, images)
    _check_labels(label_path, labels)
    _check_counts(split, image_path, len(images), label_path, len(labels))
    return torch.from_numpy(images), torch.from_numpy(labels.astype(np.int64))


# (path, mtime, size, expected digest) of files whose content already hashed correctly in this
# process: `looptune bench` verifies the folder up front and then loads it; hash once, not twice
_VERIFIED: set[tuple[tuple[str, int, int], str]] = set()


def _hasher(name: str, path: Path) -> Callable[[bytes], None] | None:
    # read_idx hands the check its decompressed bytes: hashed once, the file never read twice
    key = (_stamp(path), SHA256[name])
    if key in _VERIFIED:
        return None

    def check(data: bytes) -> None:
        _check_sha256(data, path=path, expected=key[1])
        _VERIFIED.add(key)

    return check


def _check_sha256(data: bytes, *, path: Path, expected: str) -> None:
    actual = hashlib.sha256(data).hexdigest()
    if actual != expected:
        raise DataError(f"{path}: SHA-256 of the decompressed contents is {actual}, expected "
                        f"{expected}: the file is damaged or not the official MNIST file. "
                        + _refetch(path))


def _refetch(path: Path) -> str:
    # download() replaces a bad file in place; it only looks in the flat folder it is given
    return (f"Fix: re-download it with `looptune data mnist --download --data {path.parent}`, "
            "or replace it with a good copy.")


def _hash_problem(path: Path, expected: str) -> str | None:
    key = (_stamp(path), expected)
    if key in _VERIFIED:
        return None
    try:
        _check_sha256(idx.read_idx_bytes(path, validate=True), path=path, expected=expected)
    except DataError as exc:
        return str(exc)
    _VERIFIED.add(key)
    return None


def _check_images(path: Path, images: np.ndarray) -> None:
    if images.dtype != np.uint8 or images.ndim != 3 or images.shape[1:] != IMAGE_SHAPE:
        raise DataError(f"{path}: expected uint8 images of shape (N, 28, 28), "
                        f"got {images.dtype} {tuple(images.shape)}. {_refetch(path)}")


def _check_labels(path: Path, labels: np.ndarray) -> None:
    if labels.dtype.kind not in "ui" or labels.ndim != 1:
        raise DataError(f"{path}: expected integer labels of shape (N,), "
                        f"got {labels.dtype} {tuple(labels.shape)}. {_refetch(path)}")
    bad = np.flatnonzero((labels < 0) | (labels >= NUM_CLASSES))
    if bad.size:
        raise DataError(f"{path}: {bad.size} labels outside 0..{NUM_CLASSES - 1}, the first at index "
                        f"{bad[0]} is {labels[bad[0]]}. {_refetch(path)}")


def _check_counts(split: Split, image_path: Path, n_images: int, label_path: Path, n_labels: int) -> None:
    if n_images != n_labels:
        raise DataError(f"{image_path} holds {n_images} images but {label_path} holds "
                        f"{n_labels} labels; they must match. {_refetch(image_path)}")
    if n_images != COUNTS[split]:
        raise DataError(f"MNIST {split} split ({image_path}) holds {n_images} examples, "
                        f"expected {COUNTS[split]}. {_refetch(image_path)}")


# --- downloading ------------------------------------------------------------------------------


def _prepare_dest(folder: Path) -> None:
    """Create ``folder`` and prove it writable before any download starts."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".looptune-probe.")
    except OSError as exc:
        raise DataError(f"cannot download MNIST into {folder}: {exc.strerror or exc}. Choose a "
                        "writable folder with --data DIR (or set LOOPTUNE_DATA=DIR).") from None
    os.close(fd)
    os.unlink(probe)


def _content_sha256(path: PathLike) -> str:
    return hashlib.sha256(idx.read_idx_bytes(path)).hexdigest()


def _fetch(name: str, folder: Path, mirrors: tuple[str, ...], *, expected: str,
           timeout_s: float, progress: Progress | None) -> None:
    urls = [f"{mirror.rstrip('/')}/{name}.gz" for mirror in mirrors]
    try:
        fetch.fetch_verified(urls, folder / f"{name}.gz", expected_sha256=expected,
                             digest=_content_sha256, timeout_s=timeout_s,
                             progress=None if progress is None else functools.partial(progress, name))
    except DataError as exc:
        raise DataError(
            f"could not download {name}.gz into {folder}: {exc}\nOffline fix: on a machine with "
            f"internet access fetch the four files ({', '.join(NAMES)}), copy them into a folder "
            "DIR and pass --data DIR (or set LOOPTUNE_DATA=DIR).") from None
    (folder / name).unlink(missing_ok=True)  # a bad raw copy would shadow the new NAME.gz
