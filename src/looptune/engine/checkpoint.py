"""Checkpoint save / resume: the only module that knows the checkpoint file layout.

One checkpoint is one file ``DIR/ckpt-{step:09d}.pt`` laid out as (format version 1)::

    b"LOOPTUNE-CHECKPOINT sha256=<64 hex digits>\\n"        frame line, 92 bytes, every version
    b'{"format_version": 1, "payload_bytes": N, "step": S}\\n'   header line (JSON)
    <N bytes: torch.save(state)>                              payload

The SHA-256 in the frame line covers everything after it (header and payload), so a file cut
at any length or with any byte flipped fails the check and is never unpickled, and the version
number is only trusted once the bytes are known to be the ones written. Files are written whole
to a temp file and renamed (``atomic_write_bytes``), so the final name never holds half a file.
The payload holds only types ``torch.load(weights_only=True)`` accepts; ``save_checkpoint``
refuses anything else up front rather than writing a checkpoint that could never be resumed.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import re
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from looptune._io import atomic_write_bytes
from looptune._rng import rng_state, set_rng_state  # held in every checkpoint; re-exported
from looptune.errors import ConfigError, DataError

if TYPE_CHECKING:
    from torch.serialization import MAP_LOCATION

__all__ = [
    "FORMAT_VERSION",
    "save_checkpoint",
    "load_checkpoint",
    "latest_checkpoint",
    "rng_state",
    "set_rng_state",
]

FORMAT_VERSION = 1  # bump when the header or payload layout changes; loaders refuse other values
_MAGIC = b"LOOPTUNE-CHECKPOINT sha256="
_FRAME_BYTES = len(_MAGIC) + 64 + 1  # magic + hex digest + newline
_NAME = re.compile(r"ckpt-(\d+)\.pt")
_STRAY_TEMPS = ".ckpt-*.tmp"  # what atomic_write_bytes leaves behind when its writer is killed


# ---------------------------------------------------------------------------------------- save

def save_checkpoint(directory: str | os.PathLike, state: dict, *, step: int, keep: int = 2) -> Path:
    """Write ``state`` atomically as ``directory/ckpt-{step:09d}.pt``, then prune older ones.

    The previous checkpoint stays valid until the new file is complete and renamed into place;
    only then are checkpoints with a smaller step beyond the newest ``keep`` deleted. Stray temp
    files of a killed writer are removed first (one writer per folder is assumed).

    Args:
        directory: folder for the checkpoints; created if missing.
        state: plain data (dicts, lists, tuples, numbers, strings, tensors, ``rng_state()``):
            whatever ``torch.load(weights_only=True)`` accepts. CUDA tensors are fine.
        step: the global step; orders checkpoints. Must be >= 0.
        keep: how many checkpoints to keep, this one included. Must be >= 1.

    Returns:
        The path of the checkpoint written.

    Raises:
        ConfigError: bad ``directory``/``step``/``keep``, or ``state`` holds a type that
            ``weights_only`` loading would refuse (e.g. a numpy array). Nothing is written then.
        OSError: the file could not be written; the previous checkpoints are untouched.

    Example:
        >>> path = save_checkpoint("runs/a", {"model": model.state_dict(), "rng": rng_state()},
        ...                        step=1200)
    """
    problems = _directory_problems(directory) + _save_problems(state, step, keep)
    if problems:
        raise ConfigError(problems)
    payload = _serialize(state)
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    _remove_stray_temps(folder)  # before writing: frees the disk space a killed writer took
    path = atomic_write_bytes(folder / f"ckpt-{step:09d}.pt", _frame(payload, step))
    _prune(folder, step=step, keep=keep)
    return path


def _save_problems(state: object, step: object, keep: object) -> list[str]:
    problems = []
    if not isinstance(state, dict):
        problems.append(f"state={type(state).__name__} is invalid: must be a dict. "
                        "Collect the state_dicts, counters and rng_state() in one dict.")
    if not _is_int(step) or step < 0:
        problems.append(f"step={step!r} is invalid: must be an int >= 0. Pass the global step.")
    if not _is_int(keep) or keep < 1:
        problems.append(f"keep={keep!r} is invalid: must be an int >= 1. "
                        "Use keep=2 to keep the previous checkpoint as a fallback.")
    return problems


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # True is an int to Python


def _serialize(state: dict) -> bytes:
    buffer = io.BytesIO()
    try:
        torch.save(state, buffer)
    except (pickle.PicklingError, TypeError, AttributeError) as err:  # e.g. a lambda in state
        raise ConfigError(f"state cannot be saved ({err}). Keep only plain data in it: "
                          "state_dict()s, numbers, strings, tensors, rng_state().") from err
    payload = buffer.getvalue()
    # A static scan of the pickle (no code runs): the same allowlist torch.load uses, so a
    # state that passes here loads with weights_only=True, and one that fails is never written.
    unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(io.BytesIO(payload))
    if unsafe:
        raise ConfigError(
            f"state holds types that torch.load(weights_only=True) refuses: {sorted(unsafe)}. "
            "Convert them to plain data first: numpy arrays to tensors (torch.from_numpy) or "
            "lists, numpy scalars to int/float, objects to their state_dict(); "
            "use rng_state() for random generator states.")
    return payload


def _frame(payload: bytes, step: int) -> bytes:
    header = {"format_version": FORMAT_VERSION, "payload_bytes": len(payload), "step": step}
    body = json.dumps(header, sort_keys=True).encode("ascii") + b"\n" + payload
    digest = hashlib.sha256(body).hexdigest().encode("ascii")
    return _MAGIC + digest + b"\n" + body


def _remove_stray_temps(folder: Path) -> None:
    for stray in folder.glob(_STRAY_TEMPS):
        stray.unlink(missing_ok=True)


def _prune(folder: Path, *, step: int, keep: int) -> None:
    found = _checkpoints(folder)
    older = [path for s, path in found if s < step]
    for path in older[keep - 1:]:  # ``found`` is newest first; the new file is one of ``keep``
        path.unlink(missing_ok=True)
    newer = [path.name for s, path in found if s > step]
    if newer:  # kept: deleting them could lose a run; but resuming would pick them, so say so
        warnings.warn(f"{folder} holds checkpoints with a step above {step}: {newer}. "
                      "latest_checkpoint() resumes from the highest step, not from this one. "
                      "Use a fresh folder per run, or move those files away.", stacklevel=3)


# ---------------------------------------------------------------------------------------- load

def latest_checkpoint(
    directory: str | os.PathLike, *, map_location: MAP_LOCATION = "cpu"
) -> tuple[dict | None, Path | None, list[tuple[Path, str]]]:
    """The newest checkpoint in ``directory`` that loads, skipping broken ones.

    A truncated, corrupt or other-version checkpoint is skipped and reported (the caller warns
    with it); the next older one is tried. Temp files of a killed writer are ignored.

    Args:
        directory: the folder ``save_checkpoint`` wrote to.
        map_location: where tensors land, as for ``torch.load``; the default ``"cpu"`` loads
            checkpoints saved from CUDA on any machine.

    Returns:
        ``(state, path, skipped)``: ``state`` and ``path`` are None when no checkpoint loads
        (or the folder does not exist); ``skipped`` lists ``(path, reason)`` newest first.

    Raises:
        ConfigError: ``directory`` is a file.
        OSError: a checkpoint could not be read (e.g. permissions): not a reason to skip it.

    Example:
        >>> state, path, skipped = latest_checkpoint("runs/a")
        >>> for bad, reason in skipped:
        ...     warnings.warn(reason)
    """
    problems = _directory_problems(directory)
    if problems:
        raise ConfigError(problems)
    folder = Path(directory)
    if not folder.exists():
        return None, None, []
    skipped: list[tuple[Path, str]] = []
    for _, path in _checkpoints(folder):
        try:
            return load_checkpoint(path, map_location=map_location), path, skipped
        except DataError as err:
            skipped.append((path, str(err)))
    return None, None, skipped


def load_checkpoint(path: str | os.PathLike, *, map_location: MAP_LOCATION = "cpu") -> dict:
    """Load one checkpoint file after checking its digest and format version.

    Args:
        path: a ``ckpt-*.pt`` file written by ``save_checkpoint``.
        map_location: where tensors land, as for ``torch.load``.

    Returns:
        The ``state`` dict that was saved (loaded with ``weights_only=True``).

    Raises:
        DataError: the file is truncated, corrupt, of another format version, or holds types
            ``weights_only`` refuses; the message names the file and what to do.
        OSError: the file cannot be read.

    Example:
        >>> state = load_checkpoint("runs/a/ckpt-000001200.pt")
    """
    path = Path(path)
    header, payload = _verified_parts(path, path.read_bytes())
    version = header.get("format_version")
    if version != FORMAT_VERSION:
        raise DataError(f"{path} is checkpoint format version {version!r}, but this looptune "
                        f"reads version {FORMAT_VERSION}. Resume it with the looptune release "
                        "that wrote it, or move it out of the folder to use an older checkpoint.")
    return _unpickle(path, payload, map_location)


def _verified_parts(path: Path, data: bytes) -> tuple[dict, bytes]:
    frame, body = data[:_FRAME_BYTES], data[_FRAME_BYTES:]
    if not (frame.startswith(_MAGIC) and frame.endswith(b"\n")):
        raise _corrupt(path, f"has no checkpoint frame line ({len(data)} bytes in all): "
                       "truncated, or not written by save_checkpoint")
    header_line, _, payload = body.partition(b"\n")
    if hashlib.sha256(body).hexdigest().encode("ascii") != frame[len(_MAGIC):-1]:
        raise _corrupt(path, _mismatch_detail(header_line, payload))
    try:  # the digest matched, so a bad header means another writer, not damage in transit
        header = json.loads(header_line)
    except ValueError:
        header = None
    if not isinstance(header, dict):
        raise _corrupt(path, f"has a header that is not a JSON object: {header_line[:80]!r}")
    return header, payload


def _mismatch_detail(header_line: bytes, payload: bytes) -> str:
    # Only to word the reason: an unverified header may itself be damaged, so never trust it.
    try:
        expected = json.loads(header_line)["payload_bytes"]
    except (ValueError, KeyError, TypeError):
        expected = None
    if isinstance(expected, int) and len(payload) < expected:
        return f"is truncated: {len(payload)} of {expected} payload bytes (SHA-256 mismatch)"
    return "is corrupt: its SHA-256 does not match its contents"


def _corrupt(path: Path, detail: str) -> DataError:
    return DataError(f"{path} {detail}. It was not loaded: resume from an older checkpoint "
                     "(latest_checkpoint() does so); move this file aside to inspect it.")


def _unpickle(path: Path, payload: bytes, map_location: MAP_LOCATION) -> dict:
    try:
        state = torch.load(io.BytesIO(payload), map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:  # intact bytes, but types weights_only refuses
        raise DataError(f"{path} holds data torch.load(weights_only=True) refuses ({err}). "
                        "It was not written by save_checkpoint; re-save it with plain data.") from err
    # Other errors (e.g. CUDA tensors with map_location=None on a CPU-only machine) are about
    # the caller's set-up, not the file: they propagate so a good checkpoint is never skipped.
    return state


def _checkpoints(folder: Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of every ``ckpt-N.pt`` file in ``folder``, highest step first."""
    found = []
    for path in folder.iterdir():
        match = _NAME.fullmatch(path.name)
        if match and path.is_file():
            found.append((int(match.group(1)), path))
    return sorted(found, key=lambda item: item[0], reverse=True)


def _directory_problems(directory: object) -> list[str]:
    if not isinstance(directory, (str, os.PathLike)):
        return [f"directory={directory!r} is invalid: must be a str or Path to a folder."]
    if Path(directory).exists() and not Path(directory).is_dir():
        return [f"directory={str(directory)!r} is a file, not a folder. Pass the folder that "
                "holds the ckpt-*.pt files (e.g. its parent), or move the file away."]
    return []
