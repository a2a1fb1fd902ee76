"""Entry point: ``looptune <command> ...``. Errors the user can fix exit with code 2."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from looptune._version import __version__
from looptune.cli import bench as bench_cmd
from looptune.cli import data as data_cmd
from looptune.cli import diagnose as diagnose_cmd
from looptune.cli import pack as pack_cmd
from looptune.cli import report as report_cmd
from looptune.cli import tune as tune_cmd
from looptune.engine.run_state import Interrupted
from looptune.errors import LooptuneError

__all__ = ["main", "build_parser"]

EXIT_USAGE = 2  # bad input: same code argparse uses
EXIT_INTERRUPTED = 130  # 128 + SIGINT


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="looptune", description="Make PyTorch training loops fast, and say why yours are slow.")
    parser.add_argument("--version", action="version", version=f"looptune {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    bench_cmd.add_parser(sub)
    data_cmd.add_parser(sub)
    diagnose_cmd.add_parser(sub)
    pack_cmd.add_parser(sub)
    report_cmd.add_parser(sub)
    tune_cmd.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "diagnose" in argv[:1] or (argv and argv[0].startswith("-") and "diagnose" in argv):
        argv = diagnose_cmd.split_argv(argv)  # the script's own options are not ours
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except Interrupted as err:  # SIGINT/SIGTERM: the run stopped cleanly after a whole step
        print(f"looptune {args.command}: {err}", file=sys.stderr)
        return err.exit_code
    except LooptuneError as err:
        print(f"looptune {args.command}: error: {err}", file=sys.stderr)
        _record_for_launcher(err)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"looptune {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _record_for_launcher(err: BaseException) -> None:
    """A rank started by torchrun / ``--nproc``: put the error where the launcher reads it, so the
    job's failure names this rank's reason (uncaught exceptions get there through ``record``)."""
    if not os.environ.get("TORCHELASTIC_ERROR_FILE"):
        return
    try:
        from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

        ErrorHandler().record_exception(err)
    except Exception:  # noqa: BLE001 - reporting the error must never hide it
        pass
