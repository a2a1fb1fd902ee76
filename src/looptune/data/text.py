"""Text corpora for a byte-level GPT language model: find, download, verify, split and window.

Tokens are bytes: the vocabulary is the 256 byte values, with no vocabulary file (a non-ASCII
character spans 2-4 tokens), so loss in nats per token / ln 2 is *bits per byte* (= bits per
character on ASCII). Corpora: ``"pystdlib"`` (default; this Python's standard library sources, so
it exists offline everywhere; :class:`Corpus` records its ``source`` and ``sha256`` since it varies
with the Python version), ``"tinyshakespeare"`` (downloaded once, SHA-256 verified), or any UTF-8
text file.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import math
import os
import platform
import sysconfig
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence, Union

import numpy as np
import torch

from looptune.data import fetch, mnist
from looptune.errors import ConfigError, DataError

__all__ = ["Corpus", "RemoteCorpus", "REMOTE_CORPORA", "CORPUS_NAMES", "DEFAULT_CORPUS",
           "DEFAULT_MAX_BYTES", "VOCAB_SIZE", "ENV_VAR", "cache_dir", "locate_corpus", "load_corpus",
           "download_corpus", "bits_per_byte", "split_tokens", "check_context", "token_windows",
           "TokenWindowDataset"]

PathLike = Union[str, "os.PathLike[str]"]
Progress = Callable[[str, int, Union[int, None]], None]  # (file name, bytes done, bytes total)

VOCAB_SIZE = 256  # byte-level: every byte value is a token, no vocabulary file
DEFAULT_CORPUS = "pystdlib"
DEFAULT_MAX_BYTES = 2 * 1024 * 1024  # pystdlib cap: 2 MiB, about two tinyshakespeares
ENV_VAR = mnist.ENV_VAR  # one variable names the data folder for every data set


def bits_per_byte(loss: float) -> float:
    """Mean cross-entropy in nats per token -> bits per byte: ``loss / ln 2`` (a token is a byte)."""
    return loss / math.log(2.0)


@dataclass(frozen=True, kw_only=True)
class Corpus:
    """The bytes a model trains on, with enough provenance to say exactly which bytes they were."""

    name: str  # "pystdlib", "tinyshakespeare", or the absolute path of a text file
    source: str  # human-readable origin, e.g. "Python 3.11.7 standard library sources, ..."
    data: bytes = field(repr=False)  # the corpus itself; one byte = one token
    sha256: str  # hex SHA-256 of ``data``: two runs trained on the same bytes iff these match
    num_bytes: int  # len(data), i.e. the number of tokens

    @classmethod
    def of(cls, name: str, source: str, data: bytes) -> Corpus:
        """A corpus of ``data``, its hash and length computed here so they cannot disagree."""
        return cls(name=name, source=source, data=data, sha256=hashlib.sha256(data).hexdigest(),
                   num_bytes=len(data))

    def tokens(self) -> torch.Tensor:
        """The corpus as a fresh 1-D uint8 tensor (one token per byte; the caller may modify it)."""
        return torch.from_numpy(np.frombuffer(self.data, dtype=np.uint8).copy())


@dataclass(frozen=True, kw_only=True)
class RemoteCorpus:
    """A corpus fetched from the web once, then found on disk and verified on every load."""

    file_name: str  # the name it has on disk in the data folder
    sha256: str  # hex SHA-256 of the official file; a download or a load that differs is refused
    num_bytes: int  # size of the official file, named in a mismatch message
    mirrors: tuple[str, ...]  # full URLs tried in order
    title: str  # shown in Corpus.source


# A plain dict (not a MappingProxyType) so tests can swap in a small fake with monkeypatch.setitem.
REMOTE_CORPORA: dict[str, RemoteCorpus] = {
    "tinyshakespeare": RemoteCorpus(
        file_name="tinyshakespeare.txt",
        sha256="86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
        num_bytes=1_115_394,
        mirrors=("https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/"
                 "input.txt", "https://storage.googleapis.com/download.tensorflow.org/data/"
                 "shakespeare.txt"),
        title="Karpathy's char-rnn tiny Shakespeare",
    ),
}
CORPUS_NAMES: tuple[str, ...] = (DEFAULT_CORPUS, *REMOTE_CORPORA)


def cache_dir() -> Path:
    """The user cache folder for text corpora: ``$XDG_CACHE_HOME/looptune/text`` (MNIST's sibling)."""
    return mnist.cache_dir().parent / "text"


# --- loading ----------------------------------------------------------------------------------


def load_corpus(spec: PathLike = DEFAULT_CORPUS, *, data_dir: PathLike | None = None,
                max_bytes: int = DEFAULT_MAX_BYTES) -> Corpus:
    """Load a corpus by name (see :data:`CORPUS_NAMES`), or any UTF-8 text file, with its SHA-256.

    Args:
        spec: ``"pystdlib"``, ``"tinyshakespeare"``, or a path (``./pystdlib`` for such a file).
        data_dir: folder holding downloaded corpora (``--data DIR``); see :func:`locate_corpus`.
        max_bytes: cap of the ``pystdlib`` corpus; files and downloaded corpora are used whole.

    Raises:
        ConfigError: ``spec`` is neither a name nor an existing path, or ``max_bytes`` < 1.
        DataError: a downloaded corpus is missing or fails its SHA-256; a file is missing, a
            folder, empty, binary (NUL bytes) or not UTF-8 (names the byte offset).
    """
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
        raise ConfigError(f"max_bytes={max_bytes!r} is invalid: must be an int >= 1. "
                          f"Use the default {DEFAULT_MAX_BYTES} (2 MiB).")
    resolved = _resolve(spec)
    if isinstance(resolved, Path):
        return _load_file(resolved)
    return _pystdlib(max_bytes) if resolved == DEFAULT_CORPUS else _load_remote(resolved, data_dir)


def _resolve(spec: PathLike) -> str | Path:
    """A corpus name, or the path of a file; a Path is a path even when spelled like a name."""
    if isinstance(spec, str) and spec in CORPUS_NAMES:  # no name holds a "/": ./pystdlib is a file
        return spec
    path = Path(spec).expanduser()
    if not isinstance(spec, str) or "/" in spec or os.sep in spec or path.exists():
        return path
    close = difflib.get_close_matches(spec, CORPUS_NAMES, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ConfigError(f"corpus {spec!r} is neither a corpus name ({', '.join(CORPUS_NAMES)}) nor an "
                      f"existing file (no {path.absolute()}). Give a name, or the path of a UTF-8 "
                      f"text file (e.g. ./{spec}).{hint}")


def _load_file(path: Path) -> Corpus:
    fix = ("Fix: give the path of a non-empty UTF-8 text file (--corpus FILE), or a corpus name "
           f"({', '.join(CORPUS_NAMES)}).")
    if not path.is_file():
        what = "is a folder, not a file" if path.is_dir() else "does not exist"
        raise DataError(f"corpus file {path} {what}. {fix}")
    data = path.read_bytes()
    if problem := _text_problem(data):
        raise DataError(f"corpus file {path} {problem}. {fix}")
    return Corpus.of(str(path.absolute()), f"text file {path.absolute()}", data)


def _text_problem(data: bytes) -> str | None:
    """Why ``data`` is not usable text, or None. NUL first: it is valid UTF-8 but marks binaries."""
    if not data:
        return "is empty (0 bytes)"
    if (nul := data.find(b"\x00")) >= 0:
        return f"is not text: it holds a NUL byte at offset {nul} (a binary file?)"
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return (f"is not valid UTF-8: byte 0x{data[exc.start]:02x} at offset {exc.start} "
                f"({exc.reason}); convert it, e.g. iconv -t UTF-8")
    return None


def _pystdlib(max_bytes: int) -> Corpus:
    """The stdlib's top-level ``*.py`` files sorted by name, each after a one-line header,
    concatenated and cut exactly at ``max_bytes`` (mid-file: a full cap beats a ragged end)."""
    folder = Path(sysconfig.get_paths()["stdlib"])
    paths = sorted(folder.glob("*.py"), key=lambda p: p.name) if folder.is_dir() else []
    if not paths:
        raise DataError(f"the pystdlib corpus needs this Python's standard library sources, but "
                        f"{folder} holds no *.py files (an embedded or stripped Python?). "
                        "Fix: pass a text file instead (--corpus FILE), or 'tinyshakespeare'.")
    parts, size = [], 0
    for path in paths:
        if size >= max_bytes:
            break
        parts.append(f"# ==== file: {path.name} ====\n".encode() + path.read_bytes())
        size += len(parts[-1])
    cut = (f", cut at the {max_bytes}-byte cap inside {paths[len(parts) - 1].name}"
           if size > max_bytes else ", whole files")
    source = (f"Python {platform.python_version()} standard library sources, {len(parts)} of "
              f"{len(paths)} top-level files from {folder}{cut}")
    return Corpus.of(DEFAULT_CORPUS, source, b"".join(parts)[:max_bytes])


# --- downloaded corpora -----------------------------------------------------------------------


def _remote(name: str) -> RemoteCorpus:
    if name not in REMOTE_CORPORA:
        raise ConfigError(f"corpus {name!r} cannot be downloaded: downloadable corpora are "
                          f"{', '.join(REMOTE_CORPORA)} ('pystdlib' needs no download).")
    return REMOTE_CORPORA[name]


def _env_dir() -> Path | None:  # an empty value counts as unset
    return Path(os.environ[ENV_VAR]).expanduser() if os.environ.get(ENV_VAR) else None


def locate_corpus(name: str = "tinyshakespeare", data_dir: PathLike | None = None) -> Path:
    """The path of a downloaded corpus's file (unverified: :func:`load_corpus` verifies it).

    Looks in ``data_dir`` only, when given; else in ``$LOOPTUNE_DATA``, then :func:`cache_dir`.

    Raises:
        ConfigError: ``name`` is not a downloadable corpus.
        DataError: the file is in none of the places (lists each place looked and the fix).
    """
    file_name = _remote(name).file_name
    if data_dir is not None:
        places = [("--data / data_dir", Path(data_dir).expanduser())]
    else:
        env = _env_dir()
        places = [(f"{ENV_VAR}={env}" if env else f"{ENV_VAR} (not set)", env),
                  ("user cache", cache_dir())]
    for _, folder in places:
        if folder is not None and (folder / file_name).is_file():
            return folder / file_name
    looked = [label if folder is None else f"{label}: no {folder / file_name}"
              for label, folder in places]
    raise DataError(f"{name} not found. Looked in:\n  - " + "\n  - ".join(looked) + "\nFix: download "
                    f"it with `looptune data {name} --download` (add --data DIR to choose the "
                    f"folder), copy the file into DIR as {file_name} and pass --data DIR (or set "
                    f"{ENV_VAR}=DIR), or train on any text file with --corpus FILE.")


def _load_remote(name: str, data_dir: PathLike | None) -> Corpus:
    remote, path = _remote(name), locate_corpus(name, data_dir)
    data = path.read_bytes()
    if (actual := hashlib.sha256(data).hexdigest()) != remote.sha256:
        raise DataError(f"{path}: SHA-256 is {actual} ({len(data)} bytes), expected {remote.sha256} "
                        f"({remote.num_bytes} bytes): the file is damaged or not the official "
                        f"{name}. Fix: re-download it with `looptune data {name} --download "
                        f"--data {path.parent}`, or replace it with a good copy.")
    return Corpus.of(name, f"{remote.title} ({path})", data)


def download_corpus(name: str = "tinyshakespeare", data_dir: PathLike | None = None, *,
                    mirrors: Sequence[str] | None = None, timeout_s: float = 30.0,
                    progress: Progress | None = None) -> Path:
    """Fetch a corpus into ``data_dir`` unless a verified copy is there; the file takes its name
    only once its SHA-256 matches (:func:`fetch.fetch_verified`), so nothing partial is left.

    Args:
        name: a key of :data:`REMOTE_CORPORA`.
        data_dir: target folder (created if needed); default ``$LOOPTUNE_DATA`` if set, else
            :func:`cache_dir`, so :func:`locate_corpus` finds the file afterwards.
        mirrors: URLs tried in order (``.../`` means ``.../FILE_NAME``); default: the official.
        timeout_s: socket timeout per connection attempt and per read, in seconds.
        progress: called as ``progress(file_name, bytes_done, bytes_total_or_None)`` per chunk.

    Returns:
        The path of the verified file.

    Raises:
        ConfigError: ``name`` is not downloadable, or ``mirrors`` is empty.
        DataError: the folder is not writable, or every mirror failed (each failure named, with
            both hashes for a mismatch).
    """
    remote = _remote(name)
    urls = _urls(remote, remote.mirrors if mirrors is None else mirrors)
    folder = Path(data_dir).expanduser() if data_dir is not None else (_env_dir() or cache_dir())
    target = folder / remote.file_name
    if target.is_file() and _sha256_file(target) == remote.sha256:
        return target  # present and valid: nothing to fetch
    _prepare_dest(folder, name)
    ticks = None if progress is None else functools.partial(progress, remote.file_name)
    try:
        return fetch.fetch_verified(urls, target, expected_sha256=remote.sha256,
                                    digest=_sha256_file, timeout_s=timeout_s, progress=ticks)
    except DataError as exc:
        raise DataError(f"could not download {name} into {target}: {exc}\nOffline fix: on a "
                        f"machine with internet access fetch {remote.mirrors[0]}, copy it into a "
                        f"folder DIR as {remote.file_name} and pass --data DIR (or set "
                        f"{ENV_VAR}=DIR); or train on any text file with --corpus FILE.") from None


def _prepare_dest(folder: Path, name: str) -> None:
    try:  # prove the folder writable before any download starts
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".looptune-probe.")
    except OSError as exc:
        raise DataError(f"cannot download {name} into {folder}: {exc.strerror or exc}. Choose a "
                        f"writable folder with --data DIR (or set {ENV_VAR}=DIR).") from None
    os.close(fd)
    os.unlink(probe)


def _urls(remote: RemoteCorpus, mirrors: Sequence[str]) -> list[str]:
    """Full URLs; a mirror ending in "/" is a folder holding the file under its on-disk name."""
    mirrors = [mirrors] if isinstance(mirrors, str) else list(mirrors)
    if not mirrors:
        raise ConfigError(f"mirrors=[] is empty: give at least one URL, e.g. {remote.mirrors[0]}.")
    return [m + remote.file_name if m.endswith("/") else m for m in mirrors]


def _sha256_file(path: PathLike) -> str:  # corpora are MBs: one read is fine
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# --- tokens, splits, windows ------------------------------------------------------------------


def split_tokens(corpus: Corpus, val_fraction: float = 0.1) -> tuple[torch.Tensor, torch.Tensor]:
    """Split the byte tokens nanoGPT's way: the first ``1 - val_fraction`` trains, the rest
    validates (a contiguous tail, not a sample: no validation text sits between training text).

    Returns:
        ``(train, val)``: 1-D uint8 tensors, views of one fresh buffer.

    Raises:
        ConfigError: ``val_fraction`` is not strictly between 0 and 1.
    """
    if not (isinstance(val_fraction, (int, float)) and 0.0 < val_fraction < 1.0):
        raise ConfigError(f"val_fraction={val_fraction!r} is invalid: must be strictly between 0 "
                          "and 1. Use 0.1 (nanoGPT's split).")
    tokens, n_train = corpus.tokens(), int(corpus.num_bytes * (1.0 - val_fraction))
    return tokens[:n_train], tokens[n_train:]


def check_context(context: int, n_tokens: int, which: str) -> int:
    """Check that one window (``context + 1`` tokens: targets are shifted by one) fits the
    ``which`` split (e.g. ``"train"``) of ``n_tokens`` tokens.

    Returns:
        N = ``(n_tokens - 1) // context``, the number of non-overlapping windows.

    Raises:
        ConfigError: ``context`` is not an int >= 2, or N < 1 (names both lengths and the fix).
    """
    if isinstance(context, bool) or not isinstance(context, int) or context < 2:
        raise ConfigError(f"context={context!r} is invalid: must be an int >= 2 (tokens the model "
                          "sees at once). Use e.g. --context 256.")
    windows = (n_tokens - 1) // context
    if windows < 1:
        raise ConfigError(f"context={context} is longer than the {which} split ({n_tokens} tokens; "
                          f"one window needs context + 1 = {context + 1}). Use a shorter --context "
                          f"(at most {max(n_tokens - 1, 0)}) or a larger corpus.")
    return windows


def token_windows(tokens: torch.Tensor, context: int, *,
                  which: str = "given") -> tuple[torch.Tensor, torch.Tensor]:
    """Cut a token stream into non-overlapping windows and their next-token targets, no copy.

    Window ``i`` starts at ``o = i * context``: ``x[i] = tokens[o:o+context]``, ``y[i] =
    tokens[o+1:o+context+1]``; a tail too short for a window is dropped (like ``drop_last``).

    Args:
        tokens: a 1-D token stream (one split); context: tokens per window; which: the split's
            name for an error message (``"train"``, ``"val"``).

    Returns:
        ``(x, y)``: views of ``tokens``, shape ``[N, context]``, N = ``(len - 1) // context``.

    Raises:
        ConfigError: ``tokens`` is not 1-D, or ``context`` does not fit (see :func:`check_context`).

    Example:
        >>> x, y = token_windows(torch.arange(10, dtype=torch.uint8), 4)
        >>> x.tolist(), y.tolist()
        ([[0, 1, 2, 3], [4, 5, 6, 7]], [[1, 2, 3, 4], [5, 6, 7, 8]])
    """
    if tokens.dim() != 1:
        raise ConfigError(f"tokens of shape {tuple(tokens.shape)} are invalid: must be 1-D (a token "
                          "stream). Flatten them first (tokens.reshape(-1)).")
    n = check_context(context, len(tokens), which)
    span = n * context  # unfold: a strided view, fine for any input strides
    return tokens[:span].unfold(0, context, context), tokens[1:span + 1].unfold(0, context, context)


class TokenWindowDataset(torch.utils.data.Dataset):
    """One window per ``__getitem__``, sliced from a 1-D uint8 array (or ``np.memmap``), as int64.

    nanoGPT-style per-sample reading: the slow baseline batched loaders are measured against.
    Windows match :func:`token_windows` element for element; it pickles (DataLoader workers).
    """

    def __init__(self, arr: np.ndarray, context: int, *, which: str = "given") -> None:
        if not isinstance(arr, np.ndarray) or arr.ndim != 1 or arr.dtype != np.uint8:
            raise ConfigError(f"arr={type(arr).__name__} {getattr(arr, 'dtype', '')} is invalid: "
                              "must be a 1-D uint8 numpy array. Use e.g. tensor.numpy() or "
                              "np.memmap(path, np.uint8, mode='r').")
        self.arr, self.context = arr, context
        self.n = check_context(context, len(arr), which)  # before any DataLoader starts workers

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not -self.n <= i < self.n:
            raise IndexError(f"window index {i} is out of range: the dataset has {self.n} windows "
                             f"(0..{self.n - 1}).")
        T = self.context  # noqa: N806 (nanoGPT's name for the context length)
        o = (i % self.n) * T
        return (torch.from_numpy(self.arr[o:o + T].astype(np.int64)),
                torch.from_numpy(self.arr[o + 1:o + T + 1].astype(np.int64)))
