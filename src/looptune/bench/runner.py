"""Run one workload under several recipes, in one process, one after another."""

from __future__ import annotations

import dataclasses
import gc
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from looptune.bench.results import BenchResults
from looptune.bench.workloads import Workload, get_workload
from looptune.data import loaders
from looptune.data.loaders import ImageData
from looptune.dist import context as dist_context
from looptune.dist.context import DEFAULT_TIMEOUT_S, DistContext
from looptune.dist.ddp import sharded_mean
from looptune.engine import schedule
from looptune.engine.device import device_problem, device_type, resolve_device
from looptune.engine.loop import Progress, RunOptions, train
from looptune.errors import ConfigError
from looptune.measure.provenance import provenance
from looptune.measure.results import RunResult
from looptune.measure.timing import sync
from looptune.presets import default_recipes, get_recipe, recipe_names
from looptune.recipe import Recipe
from looptune.resolve import resolve

__all__ = ["bench", "run_recipe", "check_bench_args", "schedule_problems"]

ProgressFactory = Callable[[Recipe, int], Progress]  # (recipe, total steps) -> progress sink


def check_bench_args(*, recipes: Sequence[str | Recipe], options: RunOptions,
                     device: str, workload: str = "mnist-mlp") -> list[str]:
    """Every problem with these bench arguments (empty when all are fine); nothing runs."""
    problems, dev_type = [], device_type(device)
    for r in recipes:
        if isinstance(r, Recipe):
            try:
                resolve(r, dev_type)  # validates, and refuses what this device cannot run
            except ConfigError as err:
                problems += err.problems
        elif r not in recipe_names(workload):
            try:
                get_recipe(r, workload=workload)
            except ConfigError as err:
                problems += err.problems
    if not recipes:
        problems.append(f"no recipe given: name at least one of "
                        f"{', '.join(recipe_names(workload))}.")
    problems += options.problems()
    device_issue = device_problem(device)
    if device_issue:
        problems.append(device_issue)
    return problems


def schedule_problems(recipes: Sequence[Recipe], *, epochs: int, train_size: int,
                      world_size: int = 1) -> list[str]:
    """Each recipe's LR-schedule problems for a run of ``epochs`` over ``train_size`` samples
    (e.g. a warm-up longer than the run), so that a bench refuses them before any recipe trains
    rather than when the recipe that has them starts."""
    out = []
    for r in recipes:
        batches = loaders.rank_num_batches(train_size, r.loader.batch_size, r.loader.drop_last,
                                           world_size)
        total = epochs * -(-batches // r.step.accumulate)  # the loop's optimizer steps
        out += [f"recipe {r.name!r}: {p}" for p in schedule.problems(r.schedule, total)]
    return out


def run_recipe(workload: Workload, recipe: Recipe, *, train_data: ImageData,
               test_data: ImageData | None, device: torch.device, options: RunOptions,
               progress: Progress | None = None, dist: DistContext | None = None,
               model_options: dict | None = None) -> RunResult:
    """Train a freshly seeded model under ``recipe`` and measure it; evaluate on ``test_data``.

    With ``dist`` (several ranks): each rank trains on its share of every global batch under
    DDP, and the test set is scored in shards whose counts are summed over the ranks.
    """
    ctx = dist or DistContext()
    resolved, decisions = resolve(recipe, device.type, ctx.world_size, ddp=ctx.enabled)
    if train_data.mean is None or train_data.per_sample is not None:  # no PIL decode here
        decisions = [d for d in decisions if d.name != "per_sample_transform"]
    torch.manual_seed(options.seed)  # same seed -> same initial weights in every recipe
    model = workload.build_model(**(model_options or {})).to(device)
    t0 = time.perf_counter()
    source = loaders.make(resolved.loader, train_data, device=device, seed=options.seed,
                          rank=ctx.rank, world=ctx.world_size)
    sync(device)  # sync: the dataset copy to the device belongs to setup, not to epoch 1
    setup_s = time.perf_counter() - t0
    score = None if test_data is None else _scorer(workload, test_data, device, ctx)
    result = train(model=model, source=source, recipe=resolved, loss_fn=workload.loss_fn,
                   device=device, options=options, evaluate=score, setup_s=setup_s,
                   decisions=decisions, progress=progress, dist=ctx)
    if score is None or result.metric is not None:
        return result
    t0 = time.perf_counter()
    value = score(model)
    return result.with_eval(value=value, eval_s=time.perf_counter() - t0)


def bench(*, workload: str = "mnist-mlp", recipes: Sequence[str | Recipe] | None = None,
          epochs: int | None = None, seed: int = 0, device: str = "auto",
          data_dir: str | None = None, target: float | None = None,
          target_accuracy: float | None = None, eval_every: int | None = None,
          checkpoint_dir: str | os.PathLike | None = None,
          checkpoint_every: int | None = None, resume: bool = False, repeats: int = 1,
          progress: ProgressFactory | None = None, dist_timeout_s: float = DEFAULT_TIMEOUT_S,
          **workload_options) -> BenchResults:
    """Run ``workload`` under each recipe, side by side in one process, and measure each.

    Args:
        workload: a name from ``looptune.bench.workloads.WORKLOADS`` (``mnist-mlp``,
            ``mnist-cnn``, ``char-gpt``; aliases ``mnist``, ``cnn``, ``gpt``).
        recipes: recipe names of that workload (``looptune.presets.recipe_names(workload)``) or
            Recipe values, in table order; speedups are against the first. Default: the
            workload's default comparison.
        epochs: passes over the training data (default: the workload's, 5 for mnist-mlp).
        seed: seeds the initial weights and every epoch's shuffle order, identically per recipe.
        device: ``auto``, ``cpu`` or ``cuda``.
        data_dir: where the dataset files are (else ``$LOOPTUNE_DATA``, then the user cache).
        target: evaluate at every epoch's end (and every ``eval_every`` batches) and record the
            training time at which the workload's metric first reached it (accuracy: at or
            above; validation loss: at or below). ``target_accuracy`` is the same for accuracy.
        workload_options: the workload's own options (char-gpt: ``corpus``, ``context``,
            ``max_bytes``).
        checkpoint_dir: checkpoints go to ``checkpoint_dir/RECIPE`` every ``checkpoint_every``
            optimizer steps; ``resume`` continues each recipe from its newest valid one.
        repeats: run every recipe this many times (interleaved) and keep the median run.
        progress: optional factory of progress sinks, one per recipe.
        dist_timeout_s: launched with several ranks (``torchrun``, ``WORLD_SIZE`` > 1): how
            long a collective waits for a slow or dead rank before the job fails. Each rank
            then trains on its share of every global batch (``loader.batch_size`` per rank).

    Returns:
        BenchResults with provenance and one RunResult per recipe.

    Raises:
        ConfigError: every invalid argument at once, before anything runs.
        DataError: the dataset is missing, truncated or corrupt.

    Example:
        >>> res = looptune.bench(recipes=["seed-baseline", "device"], epochs=1)  # doctest: +SKIP
    """
    spec = get_workload(workload)
    if recipes is None:
        recipes = default_recipes(spec.recipe_set)
    if isinstance(recipes, str):  # "a,b" or "a": a name, not a sequence of one-letter names
        recipes = [name.strip() for name in recipes.split(",") if name.strip()]
    wl_options = spec.check_options(workload_options)
    options = RunOptions(epochs=spec.default_epochs if epochs is None else epochs, seed=seed,
                         target=target if target is not None else target_accuracy,
                         metric=spec.metric, eval_every=eval_every,
                         checkpoint_dir=None if checkpoint_dir is None else Path(checkpoint_dir),
                         checkpoint_every=checkpoint_every, resume=resume)
    problems = check_bench_args(recipes=recipes, options=options, device=device,
                                workload=spec.recipe_set)
    if target_accuracy is not None and spec.metric.name != "accuracy":
        problems.append(f"target_accuracy={target_accuracy!r}: workload {spec.name} is scored "
                        f"by {spec.metric.name}; give target= (--target) in its units.")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        problems.append(f"repeats={repeats!r} is invalid: must be an integer >= 1 (median of N runs).")
    if problems:
        raise ConfigError(problems)
    dev = resolve_device(device)
    chosen = [r if isinstance(r, Recipe) else get_recipe(r, dev.type, spec.recipe_set) for r in recipes]
    ctx = dist_context.init(dev, timeout_s=dist_timeout_s)  # no-op unless launched distributed
    try:
        dev = dist_context.rank_device(dev, ctx)
        train_data, test_data = spec.load(data_dir=data_dir, **wl_options)
        problems = schedule_problems(chosen, epochs=options.epochs, train_size=len(train_data),
                                     world_size=ctx.world_size)
        if getattr(train_data, "augment", None) is not None:  # before any recipe trains
            problems += [f"recipe {r.name!r}: loader.normalize='once' with workload "
                         f"{spec.name}'s augmented images: each epoch needs new random "
                         "transforms of the uint8 pixels. Use loader.normalize='batch'."
                         for r in chosen if r.loader.normalize == "once"]
        if getattr(train_data, "per_sample", None) is None:
            problems += [f"recipe {r.name!r}: loader.image_decoder={r.loader.image_decoder!r} "
                         f"with workload {spec.name}, whose data is in memory (no image files "
                         "to decode). Use loader.image_decoder='pil'."
                         for r in chosen if r.loader.image_decoder != "pil"]
        if problems:
            raise ConfigError(problems)
        _warm_up(spec, train_data, dev, wl_options)
        trials: list[list[RunResult]] = [[] for _ in chosen]
        for _ in range(repeats):  # interleaved: drifts in machine speed hit every recipe alike
            for recipe, runs in zip(chosen, trials):
                steps = options.epochs * loaders.rank_num_batches(
                    len(train_data), recipe.loader.batch_size, recipe.loader.drop_last,
                    ctx.world_size)
                sink = progress(recipe, steps) if progress else None
                runs.append(run_recipe(spec, recipe, train_data=train_data, test_data=test_data,
                                       device=dev, options=_for_recipe(options, recipe),
                                       progress=sink, dist=ctx, model_options=wl_options))
                _release(dev)
        results = BenchResults(workload=spec.name, epochs=options.epochs, seed=seed,
                               provenance=_provenance(spec, dev, data_dir, wl_options),
                               runs=[_median(r) for r in trials], unit=spec.unit,
                               world_size=ctx.world_size, backend=ctx.backend)
    except BaseException:
        dist_context.shutdown(ok=False)  # no barrier: the other ranks may be mid-collective
        raise
    dist_context.shutdown()  # leaves a caller's own process group up
    return results


def _scorer(workload: Workload, test_data: ImageData, device: torch.device, ctx: DistContext):
    def shard(model: torch.nn.Module, rank: int, world: int) -> tuple[float, int]:
        part = dataclasses.replace(test_data, images=test_data.images[rank::world],
                                   labels=test_data.labels[rank::world])
        return workload.score(model, part, device)

    return lambda m: sharded_mean(shard, m, ctx)  # one process: rank 0 of 1, the whole set


def _provenance(spec: Workload, device: torch.device, data_dir: str | None,
                wl_options: dict) -> dict:
    found = provenance(device)
    if spec.data_info is not None:
        found["data"] = spec.data_info(data_dir=data_dir, **wl_options)
    return found


def _median(runs: list[RunResult]) -> RunResult:
    """The run with the median training time; every repeat's time is kept in ``extra``."""
    ordered = sorted(runs, key=lambda r: r.wall_s)
    chosen = ordered[(len(ordered) - 1) // 2]
    if len(runs) == 1:
        return chosen
    return dataclasses.replace(chosen, extra={**chosen.extra, "repeat_wall_s": [r.wall_s for r in runs]})


def _warm_up(workload: Workload, data: ImageData, device: torch.device, wl_options: dict,
             steps: int = 30, budget_s: float = 2.0) -> None:
    """Untimed steps before the first measured run, so it does not pay one-time start-up costs
    (kernel libraries' first-call setup, allocator growth, lazy CUDA module loading); at most
    ``steps`` steps or ``budget_s`` seconds (an LM step can take a second on a CPU)."""
    model = workload.build_model(**wl_options).to(device)
    optimizer = torch.optim.Adam(model.parameters())
    x = loaders.prepare_batch(data.images[:64].to(device), data.mean, data.std, data.augment)
    y = data.labels[:64].to(device)
    deadline = time.perf_counter() + budget_s
    for _ in range(steps):
        if time.perf_counter() > deadline:
            break
        optimizer.zero_grad(set_to_none=True)
        workload.loss_fn(model(x), y).backward()
        optimizer.step()
    sync(device)


def _for_recipe(options: RunOptions, recipe: Recipe) -> RunOptions:
    if options.checkpoint_dir is None:
        return options
    return dataclasses.replace(options, checkpoint_dir=options.checkpoint_dir / recipe.name)


def _release(device: torch.device) -> None:
    """Free what the last run held so the next one starts from the same memory state."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()  # returns cached blocks to the driver: a fair start for the next
