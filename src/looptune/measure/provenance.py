"""Where and with what a result was measured: versions, hardware, git SHA, date."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import torch

from looptune._version import __version__

__all__ = ["cpu_name", "provenance"]


def provenance(device: torch.device) -> dict[str, Any]:
    """A JSON-ready record of the environment a measurement ran in."""
    import numpy


    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "looptune": __version__, **_git(),
        "python": platform.python_version(), "torch": torch.__version__,
        "numpy": numpy.__version__, "torchvision": _version_of("torchvision"),
        "platform": platform.platform(), "cpu": cpu_name(), "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(), "device": str(device),
        "device_name": _device_name(device), "cuda": torch.version.cuda,
    }


def _version_of(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except Exception:  # missing, or installed but broken (e.g. an ABI mismatch with torch)
        return None


def cpu_name() -> str:
    """The CPU model (/proc/cpuinfo's "model name"), else what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass  # not Linux: fall back to what platform knows
    return platform.processor() or platform.machine()


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_name()


def _git() -> dict[str, Any]:
    """``git_sha`` and ``git_dirty`` of the looptune checkout this code runs from (src layout);
    None for an installed copy, never the SHA of some repository that merely encloses it."""
    root = Path(__file__).resolve().parents[3]  # <root>/src/looptune/measure/provenance.py
    top = _run_git(root, "rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() != root:
        return {"git_sha": None, "git_dirty": None}
    status = _run_git(root, "status", "--porcelain", "--untracked-files=no")
    return {"git_sha": _run_git(root, "rev-parse", "HEAD"),
            "git_dirty": None if status is None else bool(status)}


def _run_git(folder: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True,
                             timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None
