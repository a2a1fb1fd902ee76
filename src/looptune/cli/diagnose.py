"""``looptune diagnose script.py [args...]``: where each step of an unmodified script goes."""

from __future__ import annotations

import argparse

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
    p.add_argument("--steps", type=int, default=None,
                   help="optimizer steps to measure (default 50, or unlimited with --seconds)")
    p.add_argument("--warmup", type=int, default=5, help="steps skipped first (default 5)")
    p.add_argument("--seconds", type=float, default=None, help="stop measuring after S seconds")
    p.add_argument("--json", metavar="PATH", default=None, help="write the diagnosis here (atomic)")
    p.add_argument("--trace", metavar="DIR", default=None,
                   help="also write a torch.profiler trace of a few steps (Chrome/Perfetto)")
    p.add_argument("--verify", action="store_true",
                   help="rerun with the top DataLoader remedy applied; report before -> after")
    p.add_argument("target", nargs=argparse.REMAINDER, metavar="script.py [args] | -m MODULE [args]",
                   help="the training script (or -m MODULE) and its own arguments: everything "
                        "from there on goes to the script, as with python")
    p.set_defaults(handler=run)


_VALUED = {"--steps", "--warmup", "--seconds", "--json", "--trace"}


def split_argv(argv: list[str]) -> list[str]:
    """Put a ``--`` before the script (or ``-m``) so argparse hands all that follows to it.

    ``looptune diagnose --steps 5 train.py --steps 9``: diagnose measures 5 steps and the script
    gets ``--steps 9``; ``-m pkg.train --lr 1`` passes ``--lr 1`` to the module, as python does.
    """
    i = argv.index("diagnose") + 1
    while i < len(argv):
        token = argv[i]
        if token == "-m" or token == "--" or not token.startswith("-"):
            break
        i += 2 if token in _VALUED else 1
    return argv if i >= len(argv) or argv[i] == "--" else argv[:i] + ["--"] + argv[i:]


def run(args: argparse.Namespace) -> int:
    target, script_args, module = _target(args)
    steps = args.steps if args.steps is not None or args.seconds is not None else 50
    problems = check_target(target, module=module, steps=steps, warmup=args.warmup,
                            seconds=args.seconds, trace_dir=args.trace)
    if args.json is not None:
        problems += [p for p in [writable_problem(args.json, "--json")] if p]
    if problems:
        raise ConfigError(problems)
    result = diagnose(target, script_args, module=module, steps=steps,
                      warmup=args.warmup, seconds=args.seconds, trace_dir=args.trace,
                      verify=args.verify)
    print_diagnosis(result, wide_console())
    if args.json is not None:
        result.write_json(args.json)
    return EXIT_SCRIPT_FAILED if result.error else 0


EXIT_SCRIPT_FAILED = 1  # the diagnosis was printed, but the script itself raised


def _target(args: argparse.Namespace) -> tuple[str, list[str], bool]:
    rest = [t for t in args.target]
    if rest[:1] == ["--"]:
        rest = rest[1:]
    if rest[:1] == ["-m"]:
        if len(rest) < 2:
            raise ConfigError("-m needs a module name: looptune diagnose -m package.train [args].")
        return rest[1], rest[2:], True
    if not rest:
        raise ConfigError("no script given: looptune diagnose [options] script.py [args...] "
                          "or looptune diagnose [options] -m module [args...].")
    return rest[0], rest[1:], False
