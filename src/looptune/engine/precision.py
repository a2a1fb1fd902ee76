"""Precision: the autocast context a step runs its forward in (``fp32`` | ``bf16`` | ``fp16``).

The eager step, the CUDA-graph capture (``graphs.py``) and the benchmarks' hand-written loops all
enter autocast through :func:`autocast`, so the dtype a precision means is decided once.
"""

from __future__ import annotations

import contextlib

import torch

__all__ = ["AUTOCAST_DTYPES", "autocast"]

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}  # "fp32": no autocast


def autocast(device: torch.device, precision: str, *, cache: bool = True):
    """``torch.autocast`` for ``precision`` ("fp32" disables it). ``cache=False`` inside graphs."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=AUTOCAST_DTYPES[precision], cache_enabled=cache)
