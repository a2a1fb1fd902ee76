"""Where looptune keeps what it caches for the user: datasets, probe results, the built C++ step."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_root"]


def cache_root() -> Path:
    """``$XDG_CACHE_HOME/looptune``, or ``~/.cache/looptune`` when XDG_CACHE_HOME is unset."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "looptune"
