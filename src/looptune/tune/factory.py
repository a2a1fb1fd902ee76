"""``MODULE:FACTORY`` specs: a callable that returns a Dataset (or a model), named on the CLI."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from looptune.errors import ConfigError

__all__ = ["load_factory", "build_dataset", "build_model", "spec_problem"]


def spec_problem(spec: str, flag: str) -> str | None:
    """Why ``spec`` is not a ``MODULE:FACTORY`` string, or None (no import happens here)."""
    module, sep, name = str(spec).partition(":")
    if not sep or not module or not name.isidentifier():
        return (f"{flag} {spec!r} is invalid: expected MODULE:FACTORY, e.g. mydata:make_dataset "
                "(a module on sys.path or in the current folder, and a callable in it).")
    return None


def load_factory(spec: str, flag: str) -> Callable[[], Any]:
    """Import ``MODULE`` (the current folder first on sys.path) and return its ``FACTORY``."""
    problem = spec_problem(spec, flag)
    if problem:
        raise ConfigError(problem)
    module_name, _, name = spec.partition(":")
    sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # ImportError, or the module itself failing at import
        raise ConfigError(f"{flag} {spec!r}: importing {module_name!r} failed: "
                          f"{type(err).__name__}: {err}. Check the module name and that it "
                          "imports on its own (python -c 'import " + module_name + "').") from None
    finally:
        sys.path.pop(0)
    factory = getattr(module, name, None)
    if not callable(factory):
        raise ConfigError(f"{flag} {spec!r}: {module_name!r} has no callable {name!r}. "
                          "Name a function (or class) that returns the object.")
    return factory


def build_dataset(spec: str, flag: str = "--dataset") -> Dataset:
    """Call the factory; the result must be a map-style Dataset (``__getitem__`` and ``__len__``)."""
    data = _call(spec, flag)
    if not (hasattr(data, "__getitem__") and hasattr(data, "__len__")):
        raise ConfigError(f"{flag} {spec!r} returned a {type(data).__name__}, not a map-style "
                          "Dataset: return an object with __getitem__ and __len__ (e.g. a "
                          "torch.utils.data.Dataset or TensorDataset).")
    if len(data) == 0:
        raise ConfigError(f"{flag} {spec!r} returned an empty dataset: nothing to measure.")
    return data


def build_model(spec: str, flag: str = "--model") -> torch.nn.Module:
    model = _call(spec, flag)
    if not isinstance(model, torch.nn.Module):
        raise ConfigError(f"{flag} {spec!r} returned a {type(model).__name__}, not a "
                          "torch.nn.Module: return the model.")
    return model


def _call(spec: str, flag: str) -> Any:
    factory = load_factory(spec, flag)
    try:
        return factory()
    except Exception as err:
        raise ConfigError(f"{flag} {spec!r}: calling it raised {type(err).__name__}: {err}") from None
