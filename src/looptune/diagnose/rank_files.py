"""How the ranks of a distributed diagnosis hand their results over: one JSON file per rank.

Each rank writes ``rank-{RANK}.json`` (atomically: a reader never sees half a file) into a folder
every rank of the node agrees on: the one ``looptune diagnose --nproc N`` passed (``--rank-dir``),
or under a bare ``torchrun``, :func:`torchrun_folder`. One process then reads them all.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from pathlib import Path

from looptune.diagnose.result import Diagnosis
from looptune.errors import ConfigError

__all__ = ["RANK_WAIT_S", "node_ranks", "rank_file", "read_ranks", "torchrun_folder",
           "wait_for_ranks", "write_rank"]

RANK_WAIT_S = 120.0  # how long the reporting rank waits for the others' files (they finish
# within moments of each other in a synchronized job; longer means one crashed or hangs)
POLL_S = 0.2  # between looks at the folder: a stat per rank, negligible


def rank_file(folder: str | os.PathLike, rank: int) -> Path:
    return Path(folder) / f"rank-{rank}.json"


def write_rank(folder: str | os.PathLike, d: Diagnosis) -> Path:
    """Write ``d`` as ``folder/rank-{d.rank}.json`` (atomic)."""
    if d.rank is None:
        raise ConfigError("this diagnosis has no rank (RANK was not set): only the ranks of a "
                          "distributed job write rank files. Launch with torchrun or --nproc N.")
    path = rank_file(folder, d.rank)
    d.write_json(path)
    return path


def read_ranks(folder: str | os.PathLike, ranks: list[int]) -> tuple[list[Diagnosis], list[int]]:
    """The diagnoses of ``ranks`` found in ``folder``, and the ranks whose file is not there.

    Raises:
        MeasurementError: a rank file exists but is not a diagnosis.
    """
    found, missing = [], []
    for rank in ranks:
        path = rank_file(folder, rank)
        if path.is_file():
            found.append(Diagnosis.read_json(path))
        else:
            missing.append(rank)
    return found, missing


def wait_for_ranks(folder: str | os.PathLike, ranks: list[int], *, timeout_s: float = RANK_WAIT_S,
                   poll_s: float = POLL_S) -> tuple[list[Diagnosis], list[int]]:
    """:func:`read_ranks` once every rank's file is there, or after ``timeout_s`` with what is."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(rank_file(folder, r).is_file() for r in ranks):
            break
        time.sleep(poll_s)
    return read_ranks(folder, ranks)


def torchrun_folder() -> Path:
    """The folder the ranks on this node share under a bare ``torchrun`` (created).

    Named after ``TORCHELASTIC_RUN_ID`` and the launcher's process id (the ranks' common parent):
    torchrun's run id is ``none`` unless ``--rdzv-id``/``--standalone`` set one, so the id alone
    would collide with an earlier run's files.
    """
    run_id = os.environ.get("TORCHELASTIC_RUN_ID") or (
        f"{os.environ.get('MASTER_ADDR', 'local')}-{os.environ.get('MASTER_PORT', '0')}")
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", run_id)[:80]
    folder = Path(tempfile.gettempdir()) / f"looptune-diagnose-{safe}-{os.getppid()}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def node_ranks() -> list[int]:
    """The global ranks on this node (torchrun numbers them contiguously per node)."""
    rank, local, world = _env_int("RANK", 0), _env_int("LOCAL_RANK", 0), _env_int("WORLD_SIZE", 1)
    first = rank - local
    return list(range(first, min(first + _env_int("LOCAL_WORLD_SIZE", world), world)))


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"{name}={value!r} is not an integer: launch with torchrun (which sets "
                          f"it), or unset {name}.") from None
