"""The global random generators' state: captured and restored around anything that must not
shift a run's random stream (checkpoints, probes that read a sample twice, the batch tuner).

A base module: checkpoints (engine), data loaders, measurement probes and the diagnosis all use it,
so it sits below them all.
"""

from __future__ import annotations

import random
import warnings
from typing import Any

import numpy as np
import torch

from looptune.errors import ConfigError

__all__ = ["rng_state", "set_rng_state"]

_RNG_KEYS = ("torch_cpu", "torch_cuda", "python", "numpy")


def rng_state() -> dict:
    """Every global random generator's state, as data ``torch.load(weights_only=True)`` accepts.

    Captures torch's CPU generator, every CUDA device's generator (only when CUDA is already
    initialized: asking would initialize it, and no CUDA numbers were drawn otherwise), Python's
    ``random`` and numpy's global generator (as lists and ints, never numpy objects).

    Returns:
        ``{"torch_cpu": uint8 tensor, "torch_cuda": [uint8 tensor per device],
        "python": {...}, "numpy": {...}}``; restore it with ``set_rng_state``.

    Example:
        >>> state = {"model": model.state_dict(), "rng": rng_state()}
    """
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else []
    version, internal, gauss_next = random.getstate()
    return {
        "torch_cpu": torch.get_rng_state(),
        "torch_cuda": cuda,
        "python": {"version": version, "internal": list(internal), "gauss_next": gauss_next},
        "numpy": _plain(np.random.get_state(legacy=False)),
    }


def set_rng_state(state: dict) -> None:
    """Restore the generators captured by ``rng_state`` (also after a save/load round trip).

    Args:
        state: the dict ``rng_state()`` returned. Tensors may sit on any device (e.g. after
            ``map_location="cuda"``); they are moved to the CPU, where generator states live.

    Raises:
        ConfigError: ``state`` is not such a dict.

    Example:
        >>> set_rng_state(checkpoint["rng"])
    """
    missing = [k for k in _RNG_KEYS if k not in state] if isinstance(state, dict) else _RNG_KEYS
    if missing:
        raise ConfigError(f"rng state={type(state).__name__} lacks {list(missing)}: must be the "
                          "dict rng_state() returned. Save rng_state() in the checkpoint.")
    torch.set_rng_state(state["torch_cpu"].cpu())
    _set_cuda_rng([s.cpu() for s in state["torch_cuda"]])
    py = state["python"]
    random.setstate((py["version"], tuple(py["internal"]), py["gauss_next"]))
    np.random.set_state(state["numpy"])  # numpy accepts lists where it returned arrays


def _set_cuda_rng(states: list[torch.Tensor]) -> None:
    if not states:
        return
    if not torch.cuda.is_available():
        warnings.warn(f"the checkpoint holds {len(states)} CUDA RNG states but CUDA is not "
                      "available: they are not restored, so CUDA-side randomness will differ.",
                      stacklevel=3)
        return
    count = torch.cuda.device_count()
    if count != len(states):
        warnings.warn(f"the checkpoint holds {len(states)} CUDA RNG states but {count} devices "
                      f"are visible: restoring the first {min(count, len(states))}.", stacklevel=3)
    torch.cuda.set_rng_state_all(states[:count])  # queued until CUDA initializes, if it has not


def _plain(value: Any) -> Any:
    """``value`` with numpy arrays and scalars turned into lists and Python numbers."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (np.ndarray, np.generic)):
        return value.tolist()
    return value
