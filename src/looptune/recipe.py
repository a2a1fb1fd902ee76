"""Recipes: every knob of the training loop, as frozen dataclasses with units and trade-offs.

A :class:`Recipe` is a value: it has a name, it can be printed, compared, serialized
(:func:`dataclasses.asdict`) and it never changes. :func:`resolve` adapts a recipe to the device it
will run on and records the reason for every change it makes, so nothing is silently downgraded.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from looptune.errors import ConfigError

__all__ = [
    "Strategy", "Decode", "LossSync", "OptimizerName", "Decision",
    "LoaderConfig", "OptimConfig", "Recipe", "RECIPES", "get_recipe", "parse_recipes", "resolve",
]

# Where batches come from. dataloader: a torch DataLoader in host memory, copied to the device per
# step. device: the whole (uint8) dataset lives on the training device, batches gathered there.
Strategy = Literal["dataloader", "device"]
# How samples are decoded. per_sample: the reference's __getitem__ (uint8 -> PIL -> float tensor ->
# Normalize), one Python call per sample. tensorized: decoded once into a uint8 tensor, batches
# gathered by index and normalized per batch on the training device.
Decode = Literal["per_sample", "tensorized"]
# When the step's loss is read on the host. step: loss.item() every step (the reference; a device
# sync per step on CUDA). epoch: summed on the device, read once per epoch.
LossSync = Literal["step", "epoch"]
OptimizerName = Literal["adam"]


@dataclass(frozen=True)
class Decision:
    """An automatic choice and why it was made (DESIGN.md convention 6)."""

    name: str  # the setting decided, e.g. "pin_memory"
    value: Any  # the value chosen
    reason: str  # one sentence a user can check
    evidence: Any = None  # measurements behind it, if any


@dataclass(frozen=True, kw_only=True)
class LoaderConfig:
    """How training batches are produced and moved to the device."""

    strategy: Strategy = "dataloader"
    decode: Decode = "per_sample"
    batch_size: int = 64  # samples per step; bigger = fewer launches and copies, other optimum
    num_workers: int = 0  # DataLoader worker processes; 0 = load in the training process
    pin_memory: bool = False  # page-locked host batches: faster, async host-to-GPU copies
    non_blocking: bool = False  # .to(device, non_blocking=...): overlaps copies when pinned
    prefetch_factor: int | None = None  # batches each worker keeps ready (None = torch default 2)
    persistent_workers: bool = False  # keep workers between epochs (saves the start-up per epoch)
    drop_last: bool = False  # the reference keeps the last partial batch (60000 = 937 x 64 + 32)

    def problems(self) -> list[str]:
        """Every invalid field, as a message with the received value, what is allowed and the fix."""
        out = _literal_problems(self, {"strategy": Strategy, "decode": Decode})
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            out.append(f"batch_size={self.batch_size!r} is invalid: must be an integer >= 1.")
        if not isinstance(self.num_workers, int) or self.num_workers < 0:
            out.append(f"num_workers={self.num_workers!r} is invalid: must be >= 0. "
                       "Use 0 to load in the main process.")
        if self.prefetch_factor is not None and self.prefetch_factor < 1:
            out.append(f"prefetch_factor={self.prefetch_factor!r} is invalid: must be >= 1 or None.")
        uses_workers = self.strategy == "dataloader" and self.num_workers > 0
        if not uses_workers and (self.prefetch_factor is not None or self.persistent_workers):
            out.append("prefetch_factor/persistent_workers need DataLoader workers: "
                       f"got num_workers={self.num_workers!r} with strategy={self.strategy!r}. "
                       "Set num_workers >= 1 or drop those settings.")
        if self.strategy == "device" and self.decode != "tensorized":
            out.append(f"strategy='device' needs decode='tensorized' (got decode={self.decode!r}): "
                       "a device-resident dataset is decoded once. Use decode='tensorized'.")
        return out


@dataclass(frozen=True, kw_only=True)
class OptimConfig:
    """The optimizer. The reference uses Adam with lr=1e-3."""

    name: OptimizerName = "adam"
    lr: float = 1e-3  # learning rate per optimizer step
    weight_decay: float = 0.0  # L2 penalty (Adam) added to the gradient

    def problems(self) -> list[str]:
        out = _literal_problems(self, {"name": OptimizerName})
        if not (isinstance(self.lr, (int, float)) and self.lr > 0):
            out.append(f"lr={self.lr!r} is invalid: must be a number > 0, e.g. 1e-3.")
        if not (isinstance(self.weight_decay, (int, float)) and self.weight_decay >= 0):
            out.append(f"weight_decay={self.weight_decay!r} is invalid: must be >= 0.")
        return out


@dataclass(frozen=True, kw_only=True)
class Recipe:
    """Every knob of one training run. ``name`` identifies it in tables and JSON."""

    name: str
    description: str = ""
    loader: LoaderConfig = field(default_factory=LoaderConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    loss_sync: LossSync = "step"

    def problems(self) -> list[str]:
        return (self.loader.problems() + self.optim.problems()
                + _literal_problems(self, {"loss_sync": LossSync}))

    def validate(self) -> Recipe:
        """Raise :class:`ConfigError` listing every problem at once; return self when valid."""
        found = self.problems()
        if found:
            raise ConfigError([f"recipe {self.name!r}: {p}" for p in found])
        return self

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _literal_problems(obj: Any, fields: dict[str, Any]) -> list[str]:
    out = []
    for name, literal in fields.items():
        value, allowed = getattr(obj, name), get_args(literal)
        if value not in allowed:
            out.append(f"{name}={value!r} is invalid: allowed values are "
                       f"{', '.join(map(repr, allowed))}.")
    return out


_SEED = "the reference experiment: per-sample PIL decode + Normalize, loss.item() every step"
RECIPES: dict[str, Recipe] = {r.name: r for r in [
    Recipe(name="seed-baseline", description=f"{_SEED}; num_workers=0"),
    Recipe(name="seed-workers", description=f"{_SEED}; num_workers=8",
           loader=LoaderConfig(num_workers=8)),
    Recipe(name="seed-pinned", description=f"{_SEED}; num_workers=8, pin_memory, non_blocking",
           loader=LoaderConfig(num_workers=8, pin_memory=True, non_blocking=True)),
    Recipe(name="tensorized", loss_sync="epoch",
           description="decoded once to a uint8 tensor; batches gathered by index, "
                       "normalized per batch on the device; loss read once per epoch",
           loader=LoaderConfig(decode="tensorized", non_blocking=True)),
    Recipe(name="device", loss_sync="epoch",
           description="whole uint8 dataset resident on the device; on-device shuffle and "
                       "normalization; loss read once per epoch",
           loader=LoaderConfig(strategy="device", decode="tensorized")),
]}


def get_recipe(name: str) -> Recipe:
    """Look up a built-in recipe; the error lists the valid names and suggests the closest."""
    if name in RECIPES:
        return RECIPES[name]
    close = difflib.get_close_matches(name, RECIPES, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ConfigError(f"unknown recipe {name!r}: valid recipes are {', '.join(RECIPES)}.{hint}")


def parse_recipes(spec: str) -> list[Recipe]:
    """Parse ``"a,b,c"``; reports every unknown or repeated name together."""
    names = [n.strip() for n in spec.split(",") if n.strip()]
    problems, recipes = [], []
    if not names:
        problems.append(f"--recipes {spec!r} names no recipe: give a comma-separated list "
                        f"from {', '.join(RECIPES)}.")
    for i, name in enumerate(names):
        if name in names[:i]:
            problems.append(f"recipe {name!r} is listed twice in --recipes {spec!r}: list it once.")
            continue
        try:
            recipes.append(get_recipe(name))
        except ConfigError as err:
            problems.extend(err.problems)
    if problems:
        raise ConfigError(problems)
    return recipes


def resolve(recipe: Recipe, device_type: str) -> tuple[Recipe, list[Decision]]:
    """Adapt ``recipe`` to ``device_type`` ("cpu" or "cuda"); every change comes with its reason."""
    recipe.validate()
    loader, decisions = recipe.loader, []
    if loader.pin_memory and device_type != "cuda":
        loader = dataclasses.replace(loader, pin_memory=False)
        decisions.append(Decision("pin_memory", False, reason=(
            f"pin_memory=True only speeds host-to-GPU copies; the training device is "
            f"{device_type}, so pinning would cost a copy and buy nothing")))
    cores = os.cpu_count() or 1
    if loader.strategy == "dataloader" and loader.num_workers >= cores:
        decisions.append(Decision("num_workers", loader.num_workers, reason=(
            f"kept as the recipe asks, but {loader.num_workers} workers on {cores} CPU cores "
            "compete with the training step for the same cores; expect a slowdown")))
    return dataclasses.replace(recipe, loader=loader), decisions
