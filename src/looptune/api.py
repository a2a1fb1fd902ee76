"""``looptune.train``: the engine on a user's own model and data."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

from looptune.data import loaders
from looptune.data.loaders import BatchedData, ImageData, has_get_batch
from looptune.data.user import (UserLoaderSource, check_integer_inputs, is_map_dataset,
                                is_stream, split_sample, tensorize, to_device)
from looptune.dist import context as dist_context
from looptune.dist.context import DEFAULT_TIMEOUT_S, DistContext
from looptune.engine.device import device_problem, resolve_device
from looptune.engine.loop import Progress, RunOptions
from looptune.engine.loop import train as run_loop
from looptune.errors import ConfigError
from looptune.measure.metric import ACCURACY, metric_spec
from looptune.measure.results import RunResult
from looptune.measure.timing import sync
from looptune.presets import get_recipe
from looptune.recipe import Recipe
from looptune.resolve import resolve

__all__ = ["train", "top1_correct"]

Metric = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (outputs, targets) -> batch sum


def top1_correct(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The default metric: number of correct top-1 predictions in the batch."""
    return (outputs.argmax(dim=1) == targets).sum()


def train(model: torch.nn.Module, train_data: Dataset | DataLoader | ImageData, *,
          recipe: str | Recipe | None = None, loss_fn: Callable, eval_data=None,
          metric: Metric = top1_correct, metric_name: str = "accuracy",
          higher_is_better: bool | None = None, device: str = "auto", epochs: int = 1,
          seed: int = 0, target: float | None = None, target_accuracy: float | None = None,
          eval_every: int | None = None, steps_per_epoch: int | None = None,
          checkpoint_dir: str | os.PathLike | None = None, checkpoint_every: int | None = None,
          resume: bool = False, progress: Progress | None = None,
          dist_timeout_s: float = DEFAULT_TIMEOUT_S) -> RunResult:
    """Train ``model`` on ``train_data`` under ``recipe`` and measure the run.

    Args:
        model: any ``nn.Module``; moved to the device. Called as ``model(inputs)``.
        train_data: a map-style Dataset of ``(input, target)`` samples or dicts with a target
            key (``looptune.data.user.TARGET_KEYS``), decoded once into tensors for the
            ``tensorized``/``prefetch``/``device`` strategies; a dataset with
            ``get_batch(indices)`` such as ``looptune.open_packed(path)`` (read a whole batch at
            a time by every strategy, never decoded per sample); an IterableDataset (a stream:
            batched by a DataLoader with the recipe's loader settings; needs
            ``steps_per_epoch``); any DataLoader (used as given; needs strategy ``dataloader``);
            or an ``ImageData``/``BatchedData``.
        recipe: a built-in name (``looptune.presets.RECIPES``) or a Recipe. Default: ``device``
            for map-style data, ``seed-baseline`` (a DataLoader, as given) for a DataLoader or a
            stream.
        loss_fn: ``loss_fn(outputs, targets) -> scalar``.
        eval_data: optional Dataset/DataLoader/ImageData scored after training (and per epoch
            with ``target``/``eval_every``).
        metric: ``metric(outputs, targets) -> per-batch sum``; reported as the mean per sample
            under ``metric_name`` (e.g. a summed per-sample loss with ``metric_name="val_loss"``).
        metric_name, higher_is_better: what the metric is called in results and its direction
            ("accuracy" and "val_loss" know theirs; a new name defaults to higher is better).
        target: record the training time when the metric first reaches this value (in the
            metric's direction); ``target_accuracy`` is the same for accuracy.
        steps_per_epoch: batches per epoch; required for a stream (no length), optional cap
            otherwise (a DataLoader).
        device, epochs, seed, eval_every, checkpoint_dir, checkpoint_every, resume: as for
            ``looptune bench``.
        dist_timeout_s: launched by ``torchrun`` (``WORLD_SIZE`` > 1): the process group's
            timeout. Each rank then trains under DDP on its share of every global batch
            (``batch_size`` per rank; a DataLoader you pass is used as given, with its own
            DistributedSampler), the epoch losses are averaged over ranks and only rank 0
            writes checkpoints. The process group stays up for your script.

    Returns:
        RunResult: the same record as one run of the bench JSON.

    Raises:
        ConfigError: every invalid argument at once, before any work.

    Example:
        >>> ds = torch.utils.data.TensorDataset(torch.randn(256, 8), torch.randint(0, 2, (256,)))
        >>> res = looptune.train(torch.nn.Linear(8, 2), ds, loss_fn=torch.nn.functional.cross_entropy)
    """
    spec = metric_spec(metric_name, higher_is_better)
    options = RunOptions(epochs=epochs, seed=seed, target=target if target is not None
                         else target_accuracy, metric=spec, eval_every=eval_every,
                         checkpoint_every=checkpoint_every, resume=resume,
                         checkpoint_dir=None if checkpoint_dir is None else Path(checkpoint_dir))
    recipe = _check(model, train_data, recipe, loss_fn, options, device, steps_per_epoch,
                    target_accuracy if spec != ACCURACY else None)
    dev = resolve_device(device)
    ctx = dist_context.init(dev, timeout_s=dist_timeout_s)  # no-op unless launched distributed
    dev = dist_context.rank_device(dev, ctx)
    resolved, decisions = resolve(recipe, dev.type, ctx.world_size, ddp=ctx.enabled)
    model.to(dev)
    check_integer_inputs(model, train_data, dev)  # raw uint8 images into a conv net: say so now
    t0 = time.perf_counter()
    source = _source(train_data, resolved, dev, seed, ctx, steps_per_epoch)
    sync(dev)  # sync: the dataset copy to the device belongs to setup, not to epoch 1
    setup_s = time.perf_counter() - t0
    score = None if eval_data is None else _evaluator(eval_data, metric, dev)
    result = run_loop(model=model, source=source, recipe=resolved, loss_fn=loss_fn, device=dev,
                      options=options, evaluate=score, setup_s=setup_s, decisions=decisions,
                      progress=progress, dist=ctx)
    if score is None or result.metric is not None:
        return result
    t0 = time.perf_counter()
    value = score(model)
    return result.with_eval(value=value, eval_s=time.perf_counter() - t0)


def _check(model, train_data, recipe, loss_fn, options: RunOptions, device: str,
           steps_per_epoch, stray_target) -> Recipe:
    problems = list(options.problems())
    if stray_target is not None:
        problems.append(f"target_accuracy={stray_target!r} with metric_name="
                        f"{options.metric.name!r}: use target= for a metric other than accuracy.")
    if steps_per_epoch is not None and (isinstance(steps_per_epoch, bool)
                                        or not isinstance(steps_per_epoch, int)
                                        or steps_per_epoch < 1):
        problems.append(f"steps_per_epoch={steps_per_epoch!r} is invalid: an integer >= 1 "
                        "(batches per epoch), or None.")
    if is_stream(train_data) and steps_per_epoch is None:
        problems.append("train_data is a stream (IterableDataset) with no length: pass "
                        "steps_per_epoch=N, the number of batches that make one epoch.")
    if not isinstance(model, torch.nn.Module):
        problems.append(f"model is a {type(model).__name__}: pass a torch.nn.Module.")
    if not callable(loss_fn):
        problems.append(f"loss_fn={loss_fn!r} is not callable: pass e.g. torch.nn.CrossEntropyLoss().")
    if not (isinstance(train_data, (DataLoader, ImageData, BatchedData))
            or is_map_dataset(train_data) or is_stream(train_data)):
        problems.append(f"train_data is a {type(train_data).__name__}: pass a map-style Dataset "
                        "(with __getitem__ and __len__), an IterableDataset, a DataLoader, or "
                        "an ImageData.")
    problems += [p for p in [device_problem(device)] if p]
    try:
        if recipe is None:
            as_given = isinstance(train_data, DataLoader) or is_stream(train_data)
            recipe = "seed-baseline" if as_given else "device"
        recipe = get_recipe(recipe) if isinstance(recipe, str) else recipe
        problems += [f"recipe {recipe.name!r}: {p}" for p in recipe.problems()]
        if isinstance(train_data, DataLoader) and recipe.loader.strategy != "dataloader":
            problems.append(f"a DataLoader is used as given, so it needs strategy='dataloader' "
                            f"(recipe {recipe.name!r} has {recipe.loader.strategy!r}); pass its "
                            "Dataset instead to let looptune build the batches.")
        elif is_stream(train_data) and (recipe.loader.strategy != "dataloader"
                                        or recipe.loader.decode != "per_sample"):
            problems.append(f"a stream (IterableDataset) is read one sample at a time by a "
                            f"DataLoader, so it needs strategy='dataloader' and "
                            f"decode='per_sample' (recipe {recipe.name!r} has "
                            f"{recipe.loader.strategy!r}/{recipe.loader.decode!r}); use "
                            "recipe='seed-baseline', or a map-style Dataset to let looptune "
                            "decode it once.")
    except ConfigError as err:
        problems += err.problems
    if problems:
        raise ConfigError(problems)
    return recipe


def _source(train_data, recipe: Recipe, device: torch.device, seed: int, ctx: DistContext,
            steps_per_epoch: int | None):
    if is_stream(train_data) and not isinstance(train_data, DataLoader):
        cfg = recipe.loader  # workers each iterate the stream: the dataset shards it by worker
        extra = {"prefetch_factor": cfg.prefetch_factor} if cfg.prefetch_factor else {}
        train_data = DataLoader(train_data, batch_size=cfg.batch_size, drop_last=cfg.drop_last,
                                num_workers=cfg.num_workers, pin_memory=cfg.pin_memory,
                                persistent_workers=cfg.persistent_workers, **extra)
    if isinstance(train_data, DataLoader):
        return UserLoaderSource(train_data, device=device, non_blocking=recipe.loader.non_blocking,
                                steps_per_epoch=steps_per_epoch)
    if has_get_batch(train_data) and not isinstance(train_data, BatchedData):
        train_data = BatchedData(train_data)  # e.g. open_packed(): batches read whole, no decode
    if not isinstance(train_data, (ImageData, BatchedData)) and recipe.loader.decode == "tensorized":
        train_data = tensorize(train_data)  # decode once: batches become index gathers
    return loaders.make(recipe.loader, train_data, device=device, seed=seed, rank=ctx.rank,
                        world=ctx.world_size)


def _evaluator(eval_data, metric: Metric, device: torch.device):
    if isinstance(eval_data, DataLoader) or is_stream(eval_data):
        batches = eval_data if isinstance(eval_data, DataLoader) else DataLoader(eval_data, 256)
    else:
        if isinstance(eval_data, (ImageData, BatchedData)):
            data = eval_data.materialize()
        elif has_get_batch(eval_data):
            data = BatchedData(eval_data).materialize()
        else:
            data = tensorize(eval_data)
        batches = list(zip(data.images.split(1024), data.labels.split(1024)))
        prepare = (lambda x: loaders.normalize_batch(x, data.mean, data.std))

    @torch.no_grad()
    def score(model: torch.nn.Module) -> float:
        model.eval()
        total, count = torch.zeros((), device=device, dtype=torch.float64), 0
        for batch in batches:
            x, y = split_sample(batch, "an evaluation batch")
            x, y = to_device(x, device, False), to_device(y, device, False)
            if not (isinstance(eval_data, DataLoader) or is_stream(eval_data)):
                x = prepare(x)
            total += metric(model(x), y).to(torch.float64)
            count += len(y)
        model.train()
        return float(total.item()) / max(count, 1)  # sync: once per evaluation

    return score
