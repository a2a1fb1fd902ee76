"""Argument checks of ``tune_batch_size``: every problem found, reported together, before any work."""

from __future__ import annotations

import math
import numbers
from typing import Any

import torch
from torch import nn

from looptune.engine.device import device_problem

__all__ = ["problems"]

def problems(model, dataset, loss_fn, device, candidates, max_memory_fraction, keep_effective,
              steps, warmup, repeats, threshold, memory_limit_bytes, budget_s) -> list[str]:
    out = [] if isinstance(model, nn.Module) else [(
        f"model={type(model).__name__} is invalid: must be a torch.nn.Module. Pass the module "
        "itself, not its state_dict or a factory.")]
    if not out and not any(p.requires_grad for p in model.parameters()):
        out.append(f"model={type(model).__name__} has no trainable parameters: a training step "
                   "has nothing to update. Pass a model with requires_grad=True parameters.")
    out += _dataset_problems(dataset)
    if not callable(loss_fn):
        out.append(f"loss_fn={loss_fn!r} is invalid: must be callable as loss_fn(outputs, "
                   "targets), e.g. torch.nn.functional.cross_entropy.")
    out += [p for p in [device_problem(device)] if p]
    out += _candidate_problems(candidates)
    if not _is_real(max_memory_fraction) or not 0 < max_memory_fraction <= 1:
        out.append(f"max_memory_fraction={max_memory_fraction!r} is invalid: must be in (0, 1], "
                   "e.g. 0.9 to keep 10% headroom.")
    for name, value, low, what, optional in (
            ("keep_effective", keep_effective, 1, "the effective batch to hold, or None", True),
            ("steps", steps, 1, "timed steps per repeat", False),
            ("warmup", warmup, 0, "untimed steps first; 0 = none", False),
            ("repeats", repeats, 1, "repeats; the median is reported", False),
            ("memory_limit_bytes", memory_limit_bytes, 1, "bytes, or None for no limit", True)):
        if not ((optional and value is None) or (_is_int(value) and value >= low)):
            out.append(f"{name}={value!r} is invalid: must be an integer >= {low} ({what}).")
    if not _is_real(threshold) or not 0 <= threshold < 1:
        out.append(f"threshold={threshold!r} is invalid: must be in [0, 1), e.g. 0.05 for 5%.")
    if budget_s is not None and (not _is_real(budget_s) or not 0 < budget_s < math.inf):
        out.append(f"budget_s={budget_s!r} is invalid: must be a number of seconds > 0, or None "
                   "for no time limit.")
    return out


def _dataset_problems(dataset: Any) -> list[str]:
    if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
        return [(f"dataset={type(dataset).__name__} is invalid: must be map-style (__getitem__ "
                 "and __len__), e.g. a TensorDataset. Collect an iterable's samples into a list.")]
    if len(dataset) == 0:
        return ["dataset is empty (len 0): nothing to measure. Pass at least one sample."]
    try:
        sample = dataset[0]
    except (IndexError, KeyError, TypeError) as err:
        return [f"dataset[0] failed ({type(err).__name__}: {err}): must index samples 0..len-1."]
    if not (isinstance(sample, (tuple, list)) and len(sample) == 2
            and isinstance(sample[0], torch.Tensor)):
        return [(f"dataset[0] is a {type(sample).__name__}: must be an (input tensor, target) "
                 "pair, as TensorDataset(inputs, targets) returns.")]
    return []


def _candidate_problems(candidates: Any) -> list[str]:
    if candidates is None:
        return []
    items = list(candidates) if isinstance(candidates, (list, tuple, range)) else None
    if not items or not all(_is_int(c) and c >= 1 for c in items):
        return [(f"candidates={candidates!r} is invalid: must be a non-empty list of positive "
                 "integers, e.g. [64, 128, 256], or None for the automatic sweep.")]
    return []


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)
