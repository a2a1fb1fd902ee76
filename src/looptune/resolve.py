"""Adapt a recipe to the device it will run on; every change or warning carries its reason.

Nothing is silently downgraded: what can't run here is either changed with a :class:`Decision`
saying why, or refused with a :class:`ConfigError` naming the fix, before any training starts.
"""

from __future__ import annotations

import dataclasses
import os

import torch

from looptune.data.loaders import transform_kind
from looptune.errors import ConfigError
from looptune.recipe import CUDA_ONLY_ATTENTION, Decision, Recipe

__all__ = ["resolve"]


def resolve(recipe: Recipe, device_type: str, world_size: int = 1,
            ddp: bool | None = None) -> tuple[Recipe, list[Decision]]:
    """Return ``recipe`` adapted to ``device_type`` ("cpu" or "cuda") and the reasons; with
    ``world_size`` > 1, also to data-parallel training (DDP).

    Raises:
        ConfigError: the recipe is invalid, or asks for what this device cannot do at all
            (CUDA graphs on a CPU).
    """
    recipe.validate()
    if recipe.step.cuda_graphs and device_type != "cuda":
        raise ConfigError(f"recipe {recipe.name!r}: cuda_graphs=True needs a CUDA device; the "
                          f"training device is {device_type}. Set cuda_graphs=False (or run "
                          "--device cuda on a machine with a GPU).")
    decisions: list[Decision] = []
    loader = _resolve_loader(recipe, device_type, decisions)
    step = _resolve_precision(recipe, device_type, decisions)
    if step.attention in CUDA_ONLY_ATTENTION and device_type != "cuda":
        decisions.append(Decision("attention", "auto", reason=(
            f"attention={step.attention!r} is a CUDA kernel of scaled_dot_product_attention; on "
            f"{device_type} only 'math' and 'flash' exist, so PyTorch picks between them")))
        step = dataclasses.replace(step, attention="auto")
    if (world_size > 1 if ddp is None else ddp) and step.cuda_graphs:
        step = dataclasses.replace(step, cuda_graphs=False)
        decisions.append(Decision("cuda_graphs", False, reason=(
            f"DDP ({world_size} rank(s)): the gradient all-reduce runs in autograd hooks on NCCL "
            "streams, which this engine's whole-step graph capture does not cover; eager steps "
            "(with compile, if the recipe asks) keep DDP's bucketed overlap")))
    return dataclasses.replace(recipe, loader=loader, step=step), decisions


def _resolve_loader(recipe: Recipe, device_type: str, decisions: list[Decision]):
    loader = recipe.loader
    if loader.pin_memory and device_type != "cuda":
        loader = dataclasses.replace(loader, pin_memory=False)
        decisions.append(Decision("pin_memory", False, reason=(
            f"pin_memory=True only speeds host-to-GPU copies; the training device is "
            f"{device_type}, so pinning would cost a copy and buy nothing")))
    if loader.strategy == "dataloader" and loader.decode == "per_sample":
        kind, reason = transform_kind()
        decisions.append(Decision("per_sample_transform", kind, reason=reason))
    cores = os.cpu_count() or 1
    if loader.strategy == "dataloader" and loader.num_workers >= cores:
        decisions.append(Decision("num_workers", loader.num_workers, reason=(
            f"kept as the recipe asks, but {loader.num_workers} workers on {cores} CPU cores "
            "compete with the training step for the same cores; expect a slowdown")))
    return loader


def _resolve_precision(recipe: Recipe, device_type: str, decisions: list[Decision]):
    step, precision = recipe.step, recipe.step.precision
    if precision == "fp16" and device_type != "cuda":
        decisions.append(Decision("precision", "fp32", reason=(
            "fp16 autocast with a GradScaler is a GPU technique; on a CPU fp16 has no fast "
            "matmul kernels and needs loss scaling. Use precision='bf16' on CPU instead")))
        return dataclasses.replace(step, precision="fp32")
    if precision == "bf16" and device_type == "cuda" and not torch.cuda.is_bf16_supported():
        decisions.append(Decision("precision", "fp16", reason=(
            f"{torch.cuda.get_device_name()} has no native bf16 (needs compute capability 8.0+); "
            "fp16 with a GradScaler gives the same memory and speed benefit")))
        return dataclasses.replace(step, precision="fp16")
    return step
