"""``looptune bench WORKLOAD``: the workload under several recipes, side by side."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import get_args

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from looptune._io import writable_problem
from looptune.bench.results import BenchResults
from looptune.bench.runner import bench, check_bench_args, schedule_problems
from looptune.bench.workloads import ALIASES, WORKLOADS, get_workload
from looptune.cli.report import add_report_option, print_written, report_problems
from looptune.data import mnist
from looptune.dist.context import DEFAULT_TIMEOUT_S, env_world_size, timeout_problem
from looptune.dist.launch import launch, nproc_problem
from looptune.engine.device import DeviceChoice, device_type
from looptune.errors import ConfigError, DataError, MeasurementError
from looptune.presets import REGISTRIES, default_recipes, get_recipe, parse_recipes
from looptune.engine.run_state import RunOptions
from looptune.recipe import Recipe, with_overrides
from looptune.report.build import save_and_render
from looptune.report.render import bench_notes, bench_table, wide_console


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="run a workload under several recipes and compare them",
                       description="Run a workload under several recipes, one after another in "
                                   "one process, and print a table of measured results.")
    p.add_argument("workload", help=f"workload: {', '.join([*ALIASES, *WORKLOADS])}")
    recipes = "; ".join(f"{w}: {', '.join(r)} (default {','.join(d)})"
                        for w, (r, d) in REGISTRIES.items())
    p.add_argument("--recipes", default=None,
                   help=f"comma-separated recipes of the workload, the first is the speedup "
                        f"baseline. {recipes}")
    p.add_argument("--epochs", type=int, default=None,
                   help="passes over the training data (default: the workload's; 5 for mnist)")
    p.add_argument("--data", metavar="DIR", default=None,
                   help="folder with the dataset files (default: $LOOPTUNE_DATA, then the cache)")
    p.add_argument("--device", default="auto", help=f"{' | '.join(get_args(DeviceChoice))}")
    p.add_argument("--seed", type=int, default=0, help="seed for weights and shuffling")
    p.add_argument("--json", metavar="PATH", default=None, help="write the results here (atomic)")
    p.add_argument("--repeats", type=int, default=1, metavar="N",
                   help="run each recipe N times (interleaved) and report the median run")
    p.add_argument("--set", metavar="FIELD=VALUE", action="append", default=[], dest="overrides",
                   help="change a recipe field for every recipe, e.g. --set step.precision=bf16 "
                        "--set loader.batch_size=256 (repeatable)")
    p.add_argument("--target", type=float, default=None, metavar="VALUE",
                   help="evaluate each epoch and record the training time until the workload's "
                        "metric reaches VALUE (accuracy: at or above, e.g. 0.975; char-gpt's "
                        "val_loss: at or below, e.g. 1.6)")
    p.add_argument("--target-accuracy", type=float, default=None, metavar="ACC",
                   help="the same as --target for an accuracy (kept for older commands)")
    p.add_argument("--corpus", default=None, metavar="NAME|FILE",
                   help="char-gpt: pystdlib (default, offline), tinyshakespeare (see looptune "
                        "data tinyshakespeare --download), or a UTF-8 text file")
    p.add_argument("--context", type=int, default=None, metavar="T",
                   help="char-gpt: tokens (bytes) per window, default 128")
    p.add_argument("--max-bytes", type=int, default=None, metavar="B",
                   help="char-gpt: bytes of the pystdlib corpus to use (default 1048576)")
    p.add_argument("--eval-every", type=int, default=None, metavar="N",
                   help="also evaluate every N batches (evaluation time is excluded from training)")
    p.add_argument("--checkpoint", metavar="DIR", default=None,
                   help="save checkpoints under DIR/RECIPE (atomic; the previous stays valid)")
    p.add_argument("--checkpoint-every", type=int, default=None, metavar="N",
                   help="optimizer steps between checkpoints (with --checkpoint)")
    p.add_argument("--resume", action="store_true",
                   help="continue each recipe from its newest valid checkpoint in --checkpoint DIR")
    p.add_argument("--nproc", type=int, default=None, metavar="N",
                   help="train on N processes with torch.distributed (DDP; gloo on CPU, nccl on "
                        "CUDA with one GPU each), launched like torchrun; also runs 1 process "
                        "first for the scaling efficiency. loader.batch_size is per process")
    p.add_argument("--dist-timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S",
                   help="with several processes: seconds a collective waits for a slow or dead "
                        f"rank before the job fails (default {DEFAULT_TIMEOUT_S:g})")
    add_report_option(p)
    p.add_argument("--json-only", action="store_true", help=argparse.SUPPRESS)  # --nproc's ranks
    p.set_defaults(handler=run)


def _preflight(args: argparse.Namespace) -> tuple[list[Recipe], RunOptions]:
    """Check every argument and the data before any training; raise all problems at once."""
    problems, recipes, wl_options, known = [], [], {}, True
    try:
        workload = get_workload(args.workload)
    except ConfigError as err:
        problems += err.problems
        workload, known = get_workload("mnist-mlp"), False  # keep checking the other arguments
    if args.recipes is None:
        args.recipes = ",".join(default_recipes(workload.recipe_set))
    try:
        recipes = parse_recipes(args.recipes, device_type(args.device), workload.recipe_set)
        recipes = [with_overrides(r, args.overrides) for r in recipes]
    except ConfigError as err:
        problems += err.problems
    try:
        wl_options = workload.check_options(workload_options(args))
    except ConfigError as err:
        problems += err.problems
    if args.target is not None and args.target_accuracy is not None:
        problems.append("give --target or --target-accuracy, not both.")
    if args.target_accuracy is not None and workload.metric.name != "accuracy":
        problems.append(f"--target-accuracy: workload {workload.name} is scored by "
                        f"{workload.metric.name}; use --target in its units.")
    target = args.target if args.target is not None else args.target_accuracy
    options = RunOptions(
        epochs=workload.default_epochs if args.epochs is None else args.epochs, seed=args.seed,
        target=target, metric=workload.metric, eval_every=args.eval_every,
        checkpoint_dir=None if args.checkpoint is None else Path(args.checkpoint),
        checkpoint_every=args.checkpoint_every, resume=args.resume)
    problems += check_bench_args(recipes=recipes or [Recipe(name="x")], options=options,
                                 device=args.device, workload=workload.recipe_set)
    if args.repeats < 1:
        problems.append(f"--repeats {args.repeats} is invalid: must be >= 1 (median of N runs).")
    if args.nproc is not None and (problem := nproc_problem(args.nproc)):
        problems.append(problem)
    if args.nproc is not None and env_world_size() > 1:
        problems.append("--nproc launches the ranks itself: drop it under torchrun (or run "
                        "without torchrun).")
    if problem := timeout_problem(args.dist_timeout, "--dist-timeout"):
        problems.append(problem)
    if args.json is not None:
        problems += [p for p in [writable_problem(args.json, "--json")] if p]
    problems += report_problems(args.report)
    if (known and not problems and args.data is None and env_world_size() == 1
            and workload.name in ("mnist-mlp", "mnist-cnn")):
        _fetch_mnist_if_missing()  # a user online expects `looptune bench mnist` to just work
    if known:
        try:  # the data last: it may read a corpus or hash the MNIST files
            train_size = workload.check_data(data_dir=args.data, **wl_options)
        except (DataError, ConfigError) as err:
            problems += getattr(err, "problems", None) or [str(err)]
        else:  # the schedules against the run's steps: only for recipes that passed their checks
            problems += [] if problems else _schedule_problems(recipes, workload, options,
                                                               train_size, args)
    if problems:
        raise ConfigError(problems)
    return recipes, options


def _fetch_mnist_if_missing() -> None:
    """No --data and no MNIST in $LOOPTUNE_DATA or the user cache: download it into the cache
    (every file verified by SHA-256, with progress bars), say where, and go on. Offline, the
    error names every way to give it the data."""
    from looptune.cli.data import _progress_bars

    try:
        mnist.locate(None)
        return
    except DataError as missing:
        if os.environ.get(mnist.ENV_VAR):  # the user pointed somewhere: no silent download
            raise ConfigError(str(missing)) from None
    err = Console(stderr=True, soft_wrap=True)
    err.print(f"MNIST was not found (no --data, {mnist.ENV_VAR} unset, nothing in the user "
              f"cache): downloading it into {mnist.cache_dir()} (about 11 MB, each file checked "
              "by SHA-256)", highlight=False, markup=False)
    try:
        with _progress_bars() as report:
            folder = mnist.download(mnist.cache_dir(), mirrors=mnist.DEFAULT_MIRRORS, progress=report)
    except DataError as failed:
        raise ConfigError(
            f"MNIST was not found and could not be downloaded ({failed}). Fix: pass --data DIR "
            f"with the four files, set {mnist.ENV_VAR}=DIR, or run `looptune data mnist "
            "--download` where the internet is reachable.") from None
    err.print(f"MNIST downloaded and verified in {folder}", highlight=False, markup=False)


def _schedule_problems(recipes, workload, options, train_size: int, args) -> list[str]:
    """The recipes' LR schedules against the run's optimizer steps (a 20-step warm-up cannot
    fit a 5-step run): refused now, not when that recipe's turn comes after others trained."""
    try:
        dev = device_type(args.device)
        chosen = [r if isinstance(r, Recipe) else get_recipe(r, dev, workload.recipe_set)
                  for r in recipes]
    except ConfigError:
        return []  # already reported by check_bench_args
    world = args.nproc or env_world_size()
    return schedule_problems(chosen, epochs=options.epochs, train_size=train_size,
                             world_size=world)


class _Bar:
    """Adapts a rich progress task to the engine's Progress protocol."""

    def __init__(self, progress: Progress, recipe: Recipe, total: int) -> None:
        self.progress, self.name = progress, recipe.name
        self.task = progress.add_task(recipe.name, total=total)

    def advance(self, steps: int) -> None:
        self.progress.advance(self.task, steps)

    def epoch_done(self, epoch: int, loss: float, seconds: float) -> None:
        text = f"{self.name} · epoch {epoch + 1} loss {loss:.4f} ({seconds:.2f} s)"
        self.progress.update(self.task, description=text)


def run(args: argparse.Namespace) -> int:
    recipes, options = _preflight(args)
    if args.nproc is not None:
        return _launch(args)
    main_rank = int(os.environ.get("RANK", "0")) == 0  # under torchrun: rank 0 reports
    err = Console(stderr=True, quiet=not main_rank)
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("steps"), TimeElapsedColumn()]
    with warnings.catch_warnings(), Progress(*columns, console=err) as progress:
        # torch warns about more workers than cores; the bench notes already explain that case
        warnings.filterwarnings("ignore", message="This DataLoader will create")
        results = bench(workload=args.workload, recipes=recipes, epochs=options.epochs,
                        seed=options.seed, device=args.device, data_dir=args.data,
                        target=options.target, eval_every=options.eval_every,
                        **workload_options(args),
                        checkpoint_dir=options.checkpoint_dir,
                        checkpoint_every=options.checkpoint_every, resume=options.resume,
                        repeats=args.repeats, dist_timeout_s=args.dist_timeout,
                        progress=lambda recipe, total: _Bar(progress, recipe, total))
    if not main_rank:
        return 0
    if args.json_only and args.json is not None:  # a rank of --nproc: the launcher renders
        results.write_json(args.json)
        return 0
    _report(results, args.json, args.report)
    return 0


def workload_options(args: argparse.Namespace) -> dict:
    """The workload options given on the command line (None = the workload's default)."""
    return {k: v for k, v in (("corpus", args.corpus), ("context", args.context),
                              ("max_bytes", args.max_bytes)) if v is not None}


def _report(results, json_path: str | None, report_dir: str | None) -> None:
    out = wide_console()
    out.print(bench_table(results))
    for note in bench_notes(results):
        out.print(f"[dim]- {note}[/dim]", highlight=False)
    if json_path is not None:
        results.write_json(json_path)
        out.print(f"results written to {json_path}")
    if report_dir is not None:  # data first: the JSON is saved, then rendered from the file
        text = json.dumps(results.to_dict(), indent=2) + "\n"
        print_written(save_and_render(text, report_dir), out)


def _launch(args: argparse.Namespace) -> int:
    """``--nproc N``: the same bench as one plain process (the baseline: no process group, no
    DDP), then as N ranks through torch's launcher; one table with the N-rank results and their
    scaling efficiency."""
    argv = _child_argv(args)
    err = Console(stderr=True)
    with tempfile.TemporaryDirectory(prefix="looptune-bench-") as tmp:
        single = None
        if args.nproc > 1:
            err.print("[bold]1 process[/bold] (the baseline for the scaling efficiency)")
            _run_single([*_child_argv(args, baseline=True), "--json", f"{tmp}/1.json"])
            single = BenchResults.read_json(f"{tmp}/1.json")
        err.print(f"[bold]{args.nproc} processes[/bold] (torch.distributed)")
        launch([*argv, "--json", f"{tmp}/n.json"], nproc=args.nproc)
        results = BenchResults.read_json(f"{tmp}/n.json")
    if single is not None:
        results = dataclasses.replace(
            results, single_process={r.recipe: r.samples_per_s for r in single.runs})
    _report(results, args.json, args.report)
    return 0


def _run_single(argv: list[str]) -> None:
    """The baseline in a fresh process (same start-up as the ranks), outside any launcher."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    proc = subprocess.run([sys.executable, "-m", "looptune", *argv], env=env)
    if proc.returncode != 0:
        raise MeasurementError(f"the 1-process baseline run failed (exit code {proc.returncode}; "
                               "its error is printed above): no scaling efficiency without it.")


def _child_argv(args: argparse.Namespace, baseline: bool = False) -> list[str]:
    """The bench arguments each launched rank gets (everything but --nproc, --json, --report);
    the ``baseline`` run gets no checkpoint options (its checkpoints would mix with the ranks')."""
    argv = ["bench", args.workload, "--json-only", "--recipes", args.recipes, "--seed", str(args.seed),
            "--device", args.device, "--repeats", str(args.repeats),
            "--dist-timeout", str(args.dist_timeout)]
    checkpoints = [] if baseline else [("--checkpoint", args.checkpoint),
                                       ("--checkpoint-every", args.checkpoint_every)]
    for flag, value in (("--epochs", args.epochs), ("--data", args.data),
                        ("--target", args.target), ("--target-accuracy", args.target_accuracy),
                        ("--corpus", args.corpus), ("--context", args.context),
                        ("--max-bytes", args.max_bytes),
                        ("--eval-every", args.eval_every), *checkpoints):
        if value is not None:
            argv += [flag, str(value)]
    for assignment in args.overrides:
        argv += ["--set", assignment]
    return argv + (["--resume"] if args.resume and not baseline else [])
