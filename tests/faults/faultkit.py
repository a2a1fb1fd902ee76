"""Shared by the fault-injection suite: run tests/faults/child_train.py in a subprocess, and
find processes a test left behind (by a marker on their command line). The tests import it after
putting this folder on sys.path (pytest runs with --import-mode=importlib)."""

import os
import subprocess
import sys
from pathlib import Path

CHILD = Path(__file__).with_name("child_train.py")


def child_env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}


def _live_processes(matches) -> list[int]:
    """PIDs of live processes (zombies excluded) for which ``matches(cmdline, environ)``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline, environ = (entry / "cmdline").read_bytes(), (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and matches(cmdline, environ):
            found.append(int(entry.name))
    return found


def processes_with(marker: str) -> list[int]:
    """PIDs of live processes whose command line holds ``marker``."""
    return _live_processes(lambda cmdline, environ: marker.encode() in cmdline)


def run_child(mode: str, variant: str, folder: Path, out: Path, *extra: str,
              timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CHILD), mode, variant, str(folder), str(out),
                           *extra], env=child_env(), capture_output=True, text=True,
                          timeout=timeout)


def processes_with_env(marker: str) -> list[int]:
    """PIDs of live processes whose environment holds ``LOOPTUNE_FAULT_MARKER=marker``: every
    descendant, spawned ones (``python -c 'from multiprocessing.spawn ...'``) included."""
    needle = f"LOOPTUNE_FAULT_MARKER={marker}".encode()
    return _live_processes(lambda cmdline, environ: needle in environ.split(b"\0"))
