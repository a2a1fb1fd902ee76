"""The built-in recipes, one registry per workload: each workload's baseline (the way people
write that loop), looptune's fixes, and the device-aware presets ``fast`` and ``tta`` whose every
choice carries its measured reason. Recipe names are looked up in the workload's registry.
"""

from __future__ import annotations

import difflib

from looptune.errors import ConfigError
from looptune.presets import cnn, images, lm
from looptune.presets.mnist import DEFAULT_BENCH, RECIPES
from looptune.presets.preset import Preset
from looptune.recipe import Recipe

__all__ = ["Preset", "RECIPES", "DEFAULT_BENCH", "REGISTRIES", "get_recipe", "parse_recipes",
           "recipe_names", "default_recipes"]

# workload name -> (its recipes by name, the recipes `looptune bench WORKLOAD` runs by default)
REGISTRIES: dict[str, tuple[dict[str, Recipe | Preset], tuple[str, ...]]] = {
    "mnist-mlp": (RECIPES, DEFAULT_BENCH),
    "mnist-cnn": (cnn.RECIPES, cnn.DEFAULT_BENCH),
    "char-gpt": (lm.RECIPES, lm.DEFAULT_BENCH),
    "jpeg-folder": (images.RECIPES, images.DEFAULT_BENCH),
}
_DEFAULT_WORKLOAD = "mnist-mlp"


def _registry(workload: str) -> dict[str, Recipe | Preset]:
    if workload not in REGISTRIES:
        raise ConfigError(f"no recipes for workload {workload!r}: workloads with recipes are "
                          f"{', '.join(REGISTRIES)}.")
    return REGISTRIES[workload][0]


def recipe_names(workload: str = _DEFAULT_WORKLOAD) -> list[str]:
    return list(_registry(workload))


def default_recipes(workload: str = _DEFAULT_WORKLOAD) -> tuple[str, ...]:
    _registry(workload)
    return REGISTRIES[workload][1]


def get_recipe(name: str, device_type: str = "cpu", workload: str = _DEFAULT_WORKLOAD) -> Recipe:
    """A built-in recipe of ``workload`` by name (presets built for ``device_type``); unknown
    names get the list of valid names and the closest suggestion."""
    registry = _registry(workload)
    found = registry.get(name)
    if found is None:
        close = difflib.get_close_matches(name, registry, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"unknown recipe {name!r} for workload {workload}: valid recipes are "
                          f"{', '.join(registry)}.{hint}")
    return found.build(device_type) if isinstance(found, Preset) else found


def parse_recipes(spec: str, device_type: str = "cpu",
                  workload: str = _DEFAULT_WORKLOAD) -> list[Recipe]:
    """Parse ``"a,b,c"``; reports every unknown or repeated name together."""
    names = [n.strip() for n in spec.split(",") if n.strip()]
    problems, recipes = [], []
    if not names:
        problems.append(f"--recipes {spec!r} names no recipe: give a comma-separated list "
                        f"from {', '.join(_registry(workload))}.")
    for i, name in enumerate(names):
        if name in names[:i]:
            problems.append(f"recipe {name!r} is listed twice in --recipes {spec!r}: list it once.")
            continue
        try:
            recipes.append(get_recipe(name, device_type, workload))
        except ConfigError as err:
            problems.extend(err.problems)
    if problems:
        raise ConfigError(problems)
    return recipes
