"""The C++ step of ``step.backward='mlp-cpp'`` (fastpath/mlp_step.cpp): built once, loaded once.

The source is compiled with ``torch.utils.cpp_extension.load`` against the installed torch
(per-operator ATen headers: ~5 s on a 2-core machine) into
``$XDG_CACHE_HOME/looptune/native/<torch version>-<source hash>/``, so a later run (or another
rank: torch's build takes a file lock) only loads the library. The build needs a C++ compiler
and ninja (as ``torch.compile`` on a CPU does); where it fails, :func:`load_mlp_step` says why
and the engine runs the same step from Python (``backward='mlp'``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from looptune._paths import cache_root

__all__ = ["SOURCE", "build_dir", "load_mlp_step"]

SOURCE = Path(__file__).with_name("mlp_step.cpp")
_loaded: dict[str, Callable] = {}  # once per process: a namespace can be registered only once


def build_dir() -> Path:
    """Where the library is built and cached: ``$LOOPTUNE_NATIVE_DIR`` if set, else
    ``$XDG_CACHE_HOME/looptune/native`` (``~/.cache`` without XDG), one folder per torch
    version, Python version and source."""
    root = os.environ.get("LOOPTUNE_NATIVE_DIR") or cache_root() / "native"
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    tag = f"torch{torch.__version__}-py{sys.version_info[0]}{sys.version_info[1]}-{digest}"
    return Path(root) / tag.replace("+", "_")


def load_mlp_step() -> tuple[Callable | None, str]:
    """``(torch.ops.looptune_mlp.step, how it was had)``, or ``(None, why not)``. A cached
    library that does not load (a build cut short, another toolchain) is removed and built
    once more."""
    if "step" in _loaded:
        return _loaded["step"], "loaded earlier in this process"
    where = build_dir()
    built = (where / "looptune_mlp.so").exists()
    t0 = time.perf_counter()
    try:
        op = _build(where)
    except Exception as err:  # no compiler or ninja, a read-only cache, headers that differ
        if not built:
            return None, _why(where, err)
        shutil.rmtree(where, ignore_errors=True)
        try:
            op, built = _build(where), False
        except Exception as again:
            return None, _why(where, again)
    _loaded["step"] = op
    verb = "loaded from" if built else "built in"
    return op, f"{verb} {where} in {time.perf_counter() - t0:.1f} s"


def _build(where: Path) -> Callable:
    from torch.utils import cpp_extension

    where.mkdir(parents=True, exist_ok=True)
    cpp_extension.load(name="looptune_mlp", sources=[str(SOURCE)], build_directory=str(where),
                       extra_cflags=["-O2"], is_python_module=False, verbose=False)
    return torch.ops.looptune_mlp.step


def _why(where: Path, err: Exception) -> str:
    first = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
    return (f"the C++ step could not be built in {where} ({type(err).__name__}: {first}); a "
            "C++ compiler and ninja are needed (as for torch.compile on a CPU)")
