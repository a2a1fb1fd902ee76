"""``looptune diagnose script.py [args...]``: where each step of an unmodified script goes.

Distributed scripts: ``--nproc N`` launches N ranks (torch's elastic agent, as torchrun does);
each rank diagnoses itself and writes ``rank-{RANK}.json`` into ``--rank-dir``, and this process
prints a row per rank, the slowest rank and its full diagnosis. Under a bare ``torchrun`` the
ranks share a folder named after the run and rank 0 prints the same report.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

from looptune._io import atomic_write_text, writable_problem
from looptune.cli.report import add_report_option, print_written, report_problems
from looptune.diagnose import rank_files
from looptune.diagnose.collectives import launched_rank
from looptune.diagnose.ranks import merge_ranks
from looptune.diagnose.result import Diagnosis
from looptune.diagnose.plan import plan
from looptune.diagnose.runner import FIRST_STEP_TIMEOUT_S, check_target, diagnose
from looptune.diagnose.verify import RERUNNABLE
from looptune.dist.launch import LaunchFailed, launch, nproc_problem
from looptune.errors import ConfigError, ScriptFailed
from looptune.report.build import save_and_render
from looptune.report.diagnose_view import print_diagnosis, print_plan, print_rank_report
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
                   help="rerun with the top remedy that can be applied from outside the script "
                        "(DataLoader settings, batch size, pre-decoding, bf16, the optimizer's "
                        "implementation); report before -> after and whether it still trains "
                        "the same (loss parity)")
    p.add_argument("--verify-kind", metavar="KIND", default=None, choices=RERUNNABLE,
                   help="with --verify (implied): rerun the highest-ranked remedy of this kind "
                        f"instead of the top one ({', '.join(RERUNNABLE)})")
    p.add_argument("--plan", type=int, default=None, metavar="N",
                   help="apply the top remedy that can be applied from outside, keep it when "
                        "its rerun paid with the training intact, diagnose again, up to N "
                        "remedies; print the path (remedy, promised, measured, loss parity, "
                        "next verdict)")
    p.add_argument("--first-step-timeout", type=float, default=FIRST_STEP_TIMEOUT_S, metavar="S",
                   help="stop the script if no step boundary (optimizer step, or backward call "
                        f"without a torch.optim optimizer) came within S seconds (default "
                        f"{FIRST_STEP_TIMEOUT_S:g}); 0 waits for the script")
    p.add_argument("--nproc", type=int, default=None, metavar="N",
                   help="run the script as N ranks of a torch.distributed job (as torchrun "
                        "--standalone --nproc_per_node N); print a row per rank and the slowest")
    p.add_argument("--tensorboard", metavar="DIR", default=None,
                   help="also log the diagnosis to TensorBoard in DIR (needs looptune[tensorboard])")
    add_report_option(p)
    p.add_argument("--rank-dir", default=None, help=argparse.SUPPRESS)  # --nproc's ranks write here
    p.add_argument("target", nargs=argparse.REMAINDER, metavar="script.py [args] | -m MODULE [args]",
                   help="the training script (or -m MODULE) and its own arguments: everything "
                        "from there on goes to the script, as with python")
    p.set_defaults(handler=run)


_VALUED = {"--steps", "--warmup", "--seconds", "--json", "--trace", "--nproc", "--rank-dir", "--plan",
           "--report", "--tensorboard", "--first-step-timeout", "--verify-kind"}


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
    _check(args, target, module, steps)
    if args.nproc is not None:
        return _launch_ranks(args, target, script_args, module, steps)
    try:
        common = {"module": module, "steps": steps, "warmup": args.warmup,
                  "seconds": args.seconds, "trace_dir": _trace_dir(args),
                  "first_step_timeout": args.first_step_timeout or None}
        if args.plan is not None:
            result = plan(target, script_args, rounds=args.plan, **common)
        else:
            result = diagnose(target, script_args, verify=args.verify_kind or args.verify,
                              **common)
    except ScriptFailed as err:  # the script's own error first, its own exit status
        print(f"looptune diagnose: {err}", file=sys.stderr)
        if args.json is not None:
            atomic_write_text(args.json, json.dumps(err.record(), indent=2) + "\n")
        return err.exit_code or EXIT_SCRIPT_FAILED
    if args.rank_dir is not None:  # a rank of --nproc: the launching process reports
        rank_files.write_rank(args.rank_dir, result)
    elif result.world_size is not None and result.world_size > 1:  # a rank under torchrun
        return _torchrun_rank(args, result)
    else:
        console = wide_console()
        print_diagnosis(result, console)
        if result.plan is not None:
            print_plan(result, console)
        if args.json is not None:
            result.write_json(args.json)
        if args.tensorboard is not None:
            from looptune.report.tensorboard import write_diagnosis

            console.print(f"TensorBoard: {write_diagnosis(result, args.tensorboard)} "
                          f"(tensorboard --logdir {args.tensorboard})", highlight=False,
                          soft_wrap=True)
        _render(result.to_dict(), args.report, console)
    return result.exit_code or (EXIT_SCRIPT_FAILED if result.error else 0)  # the script's own


def _check(args: argparse.Namespace, target: str, module: bool, steps: int | None) -> None:
    """Every problem with the arguments, before anything runs or is launched."""
    problems = check_target(target, module=module, steps=steps, warmup=args.warmup,
                            seconds=args.seconds, trace_dir=args.trace)
    if not 0 <= args.first_step_timeout < float("inf"):
        problems.append(f"--first-step-timeout {args.first_step_timeout!r} is invalid: seconds "
                        ">= 0 (0 waits for the script), e.g. --first-step-timeout 120.")
    if args.json is not None:
        problems += [p for p in [writable_problem(args.json, "--json")] if p]
    if args.tensorboard is not None:
        from looptune.report.tensorboard import tensorboard_problem

        problems += [p for p in [tensorboard_problem(args.tensorboard)] if p]
    if args.rank_dir is None:  # a rank of --nproc does not render: the launching process does
        problems += report_problems(args.report)
    problems += _rank_problems(args, *launched_rank())
    if problems:
        raise ConfigError(problems)


def _trace_dir(args: argparse.Namespace) -> Path | None:
    """--trace DIR; a rank of a distributed job writes into DIR/rank-{RANK}."""
    rank = launched_rank()[0]
    if args.trace is None or rank is None:
        return None if args.trace is None else Path(args.trace)
    return Path(args.trace) / f"rank-{rank}"


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


def _rank_problems(args: argparse.Namespace, rank: int | None, world: int) -> list[str]:
    """What a distributed diagnosis cannot do, before anything is launched."""
    problems = []
    if world > 1 and rank is None:
        problems.append(f"WORLD_SIZE={world} but RANK is not set: launch with torchrun (or "
                        "looptune diagnose --nproc N), which sets both, or unset WORLD_SIZE.")
    if args.nproc is not None:
        problems += [p for p in [nproc_problem(args.nproc)] if p]
        if world > 1:
            problems.append(f"--nproc {args.nproc} inside a distributed job (WORLD_SIZE={world}): "
                            "this process is already a rank. Drop --nproc under torchrun.")
    if args.rank_dir is not None and (rank is None or not Path(args.rank_dir).is_dir()):
        problems.append(f"--rank-dir {args.rank_dir!r} is internal to --nproc (its ranks write "
                        "there; it needs RANK and an existing folder). Use --nproc N instead.")
    if args.plan is not None and not 1 <= args.plan <= 10:
        problems.append(f"--plan {args.plan} is invalid: 1 to 10 remedies to try in turn, e.g. "
                        "--plan 3.")
    if args.plan is not None and (args.verify or args.verify_kind):
        problems.append("--plan reruns every remedy it keeps itself: drop --verify / "
                        "--verify-kind (or drop --plan to verify one remedy).")
    if args.nproc is not None or args.rank_dir is not None or world > 1:
        if args.plan is not None:
            problems.append("--plan cannot rerun a distributed script (as --verify): drop "
                            "--nproc / torchrun.")
        if args.verify or args.verify_kind:
            problems.append("--verify cannot rerun a distributed script: its process group is "
                            "set up once per process. Verify on one process (drop --nproc / "
                            "torchrun), or apply the remedy and diagnose again.")
        if args.seconds is not None:
            problems.append(f"--seconds {args.seconds} would stop the ranks after different step "
                            "counts, leaving the others waiting in their all-reduce for a rank "
                            "that stopped. Use --steps N with --nproc / torchrun.")
    return problems


def _launch_ranks(args: argparse.Namespace, target: str, script_args: list[str], module: bool,
                  steps: int) -> int:
    """Run the script as ``args.nproc`` ranks, each diagnosing itself; report all of them."""
    folder = Path(tempfile.mkdtemp(prefix="looptune-diagnose-"))
    options = ["--steps", str(steps), "--warmup", str(args.warmup), "--rank-dir", str(folder),
               "--first-step-timeout", str(args.first_step_timeout)]
    if args.trace is not None:
        options += ["--trace", str(args.trace)]
    script = ["-m", target] if module else [target]
    try:
        try:
            launch(["diagnose", *options, "--", *script, *script_args], nproc=args.nproc)
        except LaunchFailed as err:  # the others were stopped: report what the ranks wrote
            found, _ = rank_files.read_ranks(folder, list(range(args.nproc)))
            if not found:
                raise
            _report(found, args.nproc, args.json, args.report)
            print(f"looptune diagnose: error: {err}", file=sys.stderr)
            return EXIT_SCRIPT_FAILED
        found, _ = rank_files.read_ranks(folder, list(range(args.nproc)))
        if not found:
            raise LaunchFailed(f"all {args.nproc} ranks exited without writing a diagnosis "
                               f"into {folder}: nothing to report. Rerun; if it happens again, "
                               "it is a looptune bug: please report it.", {})
        return _report(found, args.nproc, args.json, args.report)
    finally:
        shutil.rmtree(folder, ignore_errors=True)  # temporary rank files: nothing to keep


def _torchrun_rank(args: argparse.Namespace, result: Diagnosis) -> int:
    """Under torchrun: every rank writes its file; the node's first rank reports them all."""
    folder = rank_files.torchrun_folder()
    path = rank_files.write_rank(folder, result)
    ranks = rank_files.node_ranks()
    if result.rank != ranks[0]:
        print(f"looptune diagnose: rank {result.rank}: {result.steps_measured} steps, median "
              f"{result.step_ms:.2f} ms; rank {ranks[0]} reports every rank ({path})")
        return result.exit_code or (EXIT_SCRIPT_FAILED if result.error else 0)  # the script's own
    # if this rank's script raised, the others may be blocked in a collective waiting for it:
    # report at once what is there (they fail when this process exits)
    wait_s = 0.0 if result.error else rank_files.RANK_WAIT_S
    found, missing = rank_files.wait_for_ranks(folder, ranks, timeout_s=wait_s)
    code = _report(found, result.world_size or len(ranks), args.json, args.report)
    for rank in ranks:
        rank_files.rank_file(folder, rank).unlink(missing_ok=True)
    if missing:
        print(f"looptune diagnose: ranks {missing} wrote no diagnosis into {folder} within "
              f"{wait_s:.0f} s: the report above lacks them (a rank failed or hangs; see "
              "torchrun's output).", file=sys.stderr)
        return EXIT_SCRIPT_FAILED
    with contextlib.suppress(OSError):  # not empty: a late rank wrote after all; tmp is cleaned
        folder.rmdir()
    return code


def _report(found: list[Diagnosis], world_size: int, json_path: str | None,
            report_dir: str | None) -> int:
    report = merge_ranks(found, world_size=world_size)
    console = wide_console()
    print_rank_report(report, console)
    if json_path is not None:
        report.write_json(json_path)
    _render(report.to_dict(), report_dir, console)
    return EXIT_SCRIPT_FAILED if any(d.error for d in found) else 0


def _render(data: dict, report_dir: str | None, console) -> None:
    """--report DIR: save the JSON there, then render that file (data first, rendering second)."""
    if report_dir is not None:
        text = json.dumps(data, indent=2, allow_nan=False) + "\n"
        print_written(save_and_render(text, report_dir), console)
