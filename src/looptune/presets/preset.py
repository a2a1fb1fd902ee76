"""A recipe whose settings depend on the device it will run on."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from looptune.recipe import Recipe

__all__ = ["Preset"]


@dataclass(frozen=True)
class Preset:
    """A recipe whose settings depend on the device: ``build(device_type) -> Recipe``."""

    name: str
    description: str
    build: Callable[[str], Recipe]
