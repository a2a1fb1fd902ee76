"""Choosing the training device."""

from __future__ import annotations

from typing import Literal, get_args

import torch

from looptune.errors import ConfigError

__all__ = ["DeviceChoice", "device_problem", "device_type", "resolve_device"]

DeviceChoice = Literal["auto", "cpu", "cuda"]


def device_problem(choice: str) -> str | None:
    """Why ``choice`` cannot be used here, or None."""
    if choice not in get_args(DeviceChoice):
        return (f"device={choice!r} is invalid: allowed values are "
                f"{', '.join(map(repr, get_args(DeviceChoice)))}.")
    if choice == "cuda" and not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}"
        return (f"device='cuda' was asked for but no CUDA device is available (torch "
                f"{torch.__version__}, {build}). Use --device cpu, or --device auto to take a "
                "GPU when there is one.")
    return None


def resolve_device(choice: str = "auto") -> torch.device:
    """``auto`` -> ``cuda`` when available, else ``cpu``; raises ConfigError for what can't run."""
    problem = device_problem(choice)
    if problem:
        raise ConfigError(problem)
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device("cuda", torch.cuda.current_device()) if choice == "cuda" else torch.device("cpu")


def device_type(choice: str) -> str:
    """The device type ``choice`` would give ("cpu" or "cuda"); "cpu" when it is invalid."""
    return "cuda" if choice in ("auto", "cuda") and torch.cuda.is_available() else "cpu"
