"""Download one file from a list of mirrors, verified by a content hash, written atomically."""

from __future__ import annotations

import http.client
import os
import tempfile
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO

from looptune._version import __version__
from looptune.errors import DataError

__all__ = ["fetch_verified"]

_CHUNK = 1 << 20  # 1 MiB per read: few syscalls, still a smooth progress bar
_USER_AGENT = f"looptune/{__version__}"  # some mirrors refuse Python's default agent

Digest = Callable[[str], str]  # path of the downloaded file -> hex digest of its content
ByteProgress = Callable[[int, "int | None"], None]  # (bytes done, bytes total or None)


def fetch_verified(urls: Sequence[str], target: Path, *, expected_sha256: str, digest: Digest,
                   timeout_s: float = 30.0, progress: ByteProgress | None = None) -> Path:
    """Try each URL in order until one yields content whose ``digest`` is ``expected_sha256``.

    The bytes stream into a temp file beside ``target`` that takes ``target``'s name only once
    verified (fsync, then rename); a mismatch, a cut connection or a timeout removes the temp file
    and moves on to the next URL.

    Raises:
        DataError: every URL failed; the message lists each URL's failure (with both hashes for
            a mismatch).
    """
    failures = []
    for url in urls:
        problem = _try(url, target, expected=expected_sha256, digest=digest, timeout_s=timeout_s,
                       progress=progress)
        if problem is None:
            return target
        failures.append(f"{url}: {problem}")
    raise DataError("every mirror failed:\n  - " + "\n  - ".join(failures))


def _try(url: str, target: Path, *, expected: str, digest: Digest, timeout_s: float,
         progress: ByteProgress | None) -> str | None:
    """None on success, else why this URL failed. The temp file never survives."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out:
            _stream(url, out, timeout_s=timeout_s, progress=progress)
            out.flush()
            os.fsync(out.fileno())  # durable before it takes the real name
        actual = digest(tmp)
        if actual != expected:
            return f"SHA-256 mismatch: expected {expected}, got {actual}"
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; data files are meant to be shared
        os.replace(tmp, target)
        return None
    except DataError as exc:  # the digest could not read the content (e.g. a corrupt gzip)
        return f"bad download: {exc.__cause__ or exc}"
    except (OSError, http.client.HTTPException, ValueError) as exc:  # URLError, timeout, cut, bad URL
        return f"{type(exc).__name__}: {exc}"
    finally:
        Path(tmp).unlink(missing_ok=True)  # gone already after a successful os.replace


def _stream(url: str, out: BinaryIO, *, timeout_s: float, progress: ByteProgress | None) -> None:
    request = urllib.request.Request(url, headers={"User-Agent": _USER_AGENT})
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        length = response.headers.get("Content-Length")
        total = int(length) if length and length.isdigit() else None
        done = 0
        while chunk := response.read(_CHUNK):
            out.write(chunk)
            done += len(chunk)
            if progress is not None:
                progress(done, total)
    if total is not None and done != total:
        # http.client returns b"" rather than raising when the peer closes early
        raise ConnectionError(f"connection closed after {done} of {total} bytes (Content-Length)")
