"""``looptune diagnose script.py [args...]``: where each step of an unmodified script goes."""

from __future__ import annotations

import argparse
from pathlib import Path

from looptune._io import writable_problem
from looptune.diagnose.runner import check_target, diagnose
from looptune.errors import ConfigError
from looptune.report.diagnose_view import print_diagnosis
from looptune.report.render import wide_console


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "diagnose", help="run your training script unchanged and name its bottleneck",
        description="Run a training script as `python script.py args` would, measure where each "
                    "optimizer step's time goes, and print the bottleneck with ranked remedies.")
    p.add_argument("--steps", type=int, default=50, help="optimizer steps to measure (default 50)")
    p.add_argument("--warmup", type=int, default=5, help="steps skipped first (default 5)")
    p.add_argument("--seconds", type=float, default=None, help="stop measuring after S seconds")
    p.add_argument("--json", metavar="PATH", default=None, help="write the diagnosis here (atomic)")
    p.add_argument("--trace", metavar="DIR", default=None,
                   help="also write a torch.profiler trace of a few steps (Chrome/Perfetto)")
    p.add_argument("--verify", action="store_true",
                   help="rerun with the top DataLoader remedy applied; report before -> after")
    p.add_argument("-m", dest="module", metavar="MODULE", default=None,
                   help="run a module, as python -m MODULE")
    p.add_argument("script", nargs="?", help="the training script")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="the script's own arguments")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    target, script_args = _target(args)
    problems = check_target(target, module=args.module is not None, steps=args.steps,
                            warmup=args.warmup, seconds=args.seconds)
    if args.json is not None:
        problems += [p for p in [writable_problem(args.json, "--json")] if p]
    if args.trace is not None and Path(args.trace).is_file():
        problems.append(f"--trace {args.trace!r} is a file: give a folder for the trace.")
    if problems:
        raise ConfigError(problems)
    result = diagnose(target, script_args, module=args.module is not None, steps=args.steps,
                      warmup=args.warmup, seconds=args.seconds, trace_dir=args.trace,
                      verify=args.verify)
    print_diagnosis(result, wide_console())
    if args.json is not None:
        result.write_json(args.json)
    return 0


def _target(args: argparse.Namespace) -> tuple[str, list[str]]:
    if args.module is not None:  # with -m, everything after the module name is the script's
        rest = ([args.script] if args.script else []) + list(args.script_args)
        return args.module, rest
    if not args.script:
        raise ConfigError("no script given: looptune diagnose [options] script.py [args...] "
                          "or looptune diagnose -m module [args...].")
    return args.script, list(args.script_args)
