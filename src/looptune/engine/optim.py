"""Optimizer factory."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from looptune.errors import ConfigError
from looptune.recipe import OptimConfig

__all__ = ["build_optimizer"]


def build_optimizer(params: Iterable[torch.nn.Parameter], cfg: OptimConfig) -> torch.optim.Optimizer:
    """The optimizer ``cfg`` names, over ``params``.

    Example:
        >>> opt = build_optimizer(torch.nn.Linear(2, 2).parameters(), OptimConfig(lr=1e-3))
    """
    problems = cfg.problems()
    if problems:
        raise ConfigError(problems)
    if cfg.name == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    raise AssertionError(f"unreachable: optimizer {cfg.name!r} passed validation")
