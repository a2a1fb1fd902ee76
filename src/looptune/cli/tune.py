"""``looptune tune loader|batch-size``: measured settings, each with its reason."""

from __future__ import annotations

import argparse
import json
import math
import os

from rich.table import Table

from looptune._io import atomic_write_text, writable_problem
from looptune.cli.report import add_report_option, print_written, report_problems
from looptune.errors import ConfigError
from looptune.report.build import save_and_render
from looptune.report.render import wide_console
from looptune.tune.factory import build_dataset, build_model, spec_problem


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tune", help="measure DataLoader settings or the batch size, recommend one",
                       description="Measure on your data and hardware, recommend the fastest "
                                   "settings, and say why for each.")
    kinds = p.add_subparsers(dest="what", required=True, metavar="WHAT")
    loader = kinds.add_parser("loader", help="num_workers, prefetch, persistent, pin, batched reads")
    _common(loader)
    loader.add_argument("--batch-size", type=int, default=64, help="batch size of every trial")
    loader.add_argument("--budget-s", type=float, default=60.0, help="time budget in seconds")
    loader.set_defaults(handler=run_loader)
    batch = kinds.add_parser("batch-size", help="the throughput knee within the memory headroom")
    _common(batch)
    batch.add_argument("--max-memory-fraction", type=float, default=0.9,
                       help="use at most this share of device memory (default 0.9)")
    batch.add_argument("--keep-effective", type=int, default=None, metavar="BATCH",
                       help="also propose accumulation steps that keep this effective batch")
    batch.add_argument("--budget-s", type=float, default=None, help="time budget in seconds")
    batch.set_defaults(handler=run_batch)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dataset", metavar="MODULE:FACTORY", default=None,
                   help="a callable returning a map-style Dataset of (input, target)")
    p.add_argument("--model", metavar="MODULE:FACTORY", default=None,
                   help="a callable returning the model (measures with a training step)")
    p.add_argument("--workload", default=None,
                   help="a built-in target instead: mnist-mlp, mnist-cnn, char-gpt (its "
                        "per-sample dataset, model and loss)")
    p.add_argument("--data", metavar="DIR", default=None,
                   help="dataset folder for --workload (MNIST, tinyshakespeare)")
    p.add_argument("--corpus", default=None, metavar="NAME|FILE",
                   help="--workload char-gpt: pystdlib (default), tinyshakespeare or a text file")
    p.add_argument("--context", type=int, default=None, metavar="T",
                   help="--workload char-gpt: tokens per window (default 128)")
    p.add_argument("--max-bytes", type=int, default=None, metavar="B",
                   help="--workload char-gpt: bytes of the pystdlib corpus (default 1048576)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--json", metavar="PATH", default=None, help="write the result here (atomic)")
    add_report_option(p)


def _flag_problems(args: argparse.Namespace) -> list[str]:
    """The numeric flags and --device, checked before any data is loaded (the same rules as
    tune_loader / tune_batch_size apply again to their own arguments)."""
    from looptune.engine.device import device_problem

    problems = [p for p in [device_problem(args.device)] if p]
    batch = getattr(args, "batch_size", None)
    if batch is not None and batch < 1:
        problems.append(f"--batch-size {batch} is invalid: an integer >= 1, e.g. --batch-size 64.")
    budget = args.budget_s
    if budget is not None and not 0 < budget < math.inf:
        problems.append(f"--budget-s {budget!r} is invalid: a finite number of seconds > 0, "
                        "e.g. --budget-s 60.")
    fraction = getattr(args, "max_memory_fraction", None)
    if fraction is not None and not 0 < fraction <= 1:
        problems.append(f"--max-memory-fraction {fraction!r} is invalid: a share of device "
                        "memory in (0, 1], e.g. 0.9.")
    keep = getattr(args, "keep_effective", None)
    if keep is not None and keep < 1:
        problems.append(f"--keep-effective {keep} is invalid: an effective batch >= 1, e.g. 512.")
    return problems


def _targets(args: argparse.Namespace, need_model: bool):
    problems = _flag_problems(args)
    if args.workload is None and args.dataset is None:
        problems.append("give --dataset MODULE:FACTORY (or --workload mnist-mlp).")
    if args.workload is None and _workload_options(args):
        flags = ", ".join("--" + k.replace("_", "-") for k in _workload_options(args))
        problems.append(f"{flags}: options of --workload char-gpt, which is not given; add "
                        "--workload char-gpt, or drop them.")
    if args.workload is not None and args.dataset is not None:
        problems.append("give --dataset or --workload, not both.")
    if args.dataset is not None:
        problems += [p for p in [spec_problem(args.dataset, "--dataset")] if p]
    if args.model is not None:
        problems += [p for p in [spec_problem(args.model, "--model")] if p]
    if need_model and args.model is None and args.workload is None:
        problems.append("tune batch-size needs --model MODULE:FACTORY (or --workload mnist-mlp).")
    if args.json is not None:
        problems += [p for p in [writable_problem(args.json, "--json")] if p]
    problems += report_problems(args.report)
    if problems:
        raise ConfigError(problems)
    if args.workload is not None:
        return _workload(args)
    from torch.nn.functional import cross_entropy

    model = build_model(args.model) if args.model else None
    return build_dataset(args.dataset), model, cross_entropy


def _workload_options(args: argparse.Namespace) -> dict:
    return {k: v for k, v in (("corpus", args.corpus), ("context", args.context),
                              ("max_bytes", args.max_bytes)) if v is not None}


def _workload(args: argparse.Namespace):
    """The workload's per-sample (baseline) dataset, its model unless --model, and its loss (a
    language model's N x T x V logits need its own loss, not cross_entropy on N x C)."""
    from looptune.bench.workloads import get_workload
    from looptune.data.loaders import per_sample_dataset

    spec = get_workload(args.workload)
    options = spec.check_options(_workload_options(args))  # --corpus to mnist-cnn: refused
    train, _ = spec.load(data_dir=args.data, **options)  # a bad corpus/context: named, with the fix
    model = build_model(args.model) if args.model else spec.build_model(**options)
    return per_sample_dataset(train), model, spec.loss_fn


def run_loader(args: argparse.Namespace) -> int:
    from looptune.tune.loader import tune_loader

    dataset, model, loss_fn = _targets(args, need_model=False)
    result = tune_loader(dataset, batch_size=args.batch_size, model=model, loss_fn=loss_fn,
                         device=args.device, budget_s=args.budget_s)
    console = _console()
    console.print(_decisions_table(result.decisions))
    console.print(f"measured {len(result.trials)} settings in {result.elapsed_s:.1f} s"
                  f" ({'with a training step' if result.end_to_end else 'loading only'})")
    console.print(result.line, highlight=False, markup=False)
    _write(args, result.to_dict(), console)
    return 0


def run_batch(args: argparse.Namespace) -> int:
    from looptune.tune.batch import tune_batch_size

    dataset, model, loss_fn = _targets(args, need_model=True)
    result = tune_batch_size(model, dataset, loss_fn=loss_fn, device=args.device,
                             max_memory_fraction=args.max_memory_fraction,
                             keep_effective=args.keep_effective, budget_s=args.budget_s)
    console = _console()
    console.print(_decisions_table(result.decisions))
    console.print(f"recommended: {result.recommended}", highlight=False, markup=False)
    _write(args, result.to_dict(), console)
    return 0


def _console():
    """stdout, silent on ranks other than 0 when launched per rank (torchrun): every rank
    measures (the ranks compete for the machine as they will in training), rank 0 reports."""
    console = wide_console()
    console.quiet = os.environ.get("RANK", "0") != "0"
    return console


def _decisions_table(decisions) -> Table:
    table = Table(title="decisions", title_justify="left")
    for col in ("setting", "value", "reason"):
        table.add_column(col)
    for d in decisions:
        table.add_row(d.name, repr(d.value), d.reason)
    return table


def _write(args: argparse.Namespace, data: dict, console) -> None:
    """--json PATH and --report DIR (rank 0 only): the JSON, with where it was measured."""
    if os.environ.get("RANK", "0") != "0" or (args.json is None and args.report is None):
        return
    from looptune.engine.device import resolve_device
    from looptune.measure.provenance import provenance

    data = {**data, "provenance": provenance(resolve_device(args.device))}
    text = json.dumps(data, indent=2, default=_plain) + "\n"
    if args.json is not None:
        atomic_write_text(args.json, text)
    if args.report is not None:  # data first: saved, then rendered from the file
        print_written(save_and_render(text, args.report), console)


def _plain(value):
    return value.__dict__ if hasattr(value, "__dict__") else str(value)
