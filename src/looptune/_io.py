"""Atomic file writes (a reader sees the old file or the new one, never half of one), and files
dropped from the page cache (a cold read)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["atomic_write_bytes", "atomic_write_text", "drop_page_cache", "fsync_dir", "writable_problem"]


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to a temp file beside ``path``, fsync it, then rename it over ``path``."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())  # the bytes are on disk before the rename makes them visible
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; results and data files are meant to be read
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def fsync_dir(folder: Path) -> None:
    """Make renames and creations inside ``folder`` durable (best effort where unsupported)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # some platforms cannot open folders; the rename itself is still atomic
        return
    try:
        os.fsync(fd)  # makes the rename itself durable
    except OSError:
        pass  # e.g. filesystems that do not support fsync on folders: nothing more to do
    finally:
        os.close(fd)


def writable_problem(path: str | os.PathLike, flag: str) -> str | None:
    """Why ``path`` cannot be written as an output file, or None if it can (checked up front)."""
    path = Path(path)
    if path.is_dir():
        return f"{flag} {str(path)!r} is a folder: give a file path, e.g. {path / 'results.json'}."
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        return (f"{flag} {str(path)!r}: the folder {str(parent)!r} does not exist. "
                f"Create it first (mkdir -p {parent}) or choose another path.")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".looptune-probe.", dir=parent)
    except OSError as err:
        return f"{flag} {str(path)!r} cannot be written ({err.strerror}). Choose a writable path."
    os.close(fd)
    os.unlink(tmp)
    return None  # an existing read-only file is fine: the atomic rename replaces it


def folder_writable_problem(folder: str | os.PathLike, flag: str) -> str | None:
    """Why files cannot be created in ``folder`` (created later if missing), or None if they can:
    a probe file is written in it, or in its nearest existing parent (checked up front)."""
    folder = Path(folder)
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        return (f"{flag} {str(folder)!r}: {str(probe)!r} is a file, not a folder. Choose a "
                "folder path.")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".looptune-probe.", dir=probe)
    except OSError as err:
        return (f"{flag} {str(folder)!r} cannot be written ({err.strerror} in {str(probe)!r}). "
                "Make it writable, or choose another folder.")
    os.close(fd)
    os.unlink(tmp)
    return None


def drop_page_cache(paths) -> int:
    """Ask the kernel to drop the cached pages of each file (``posix_fadvise(DONTNEED)``; no root
    needed; dirty pages are written first, with ``fdatasync``): the next read comes from storage.
    Returns the bytes advised; 0 where the call does not exist (not Linux/POSIX)."""
    if not hasattr(os, "posix_fadvise"):
        return 0
    total = 0
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            size = os.fstat(fd).st_size
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            total += size
        finally:
            os.close(fd)
    return total
