"""``looptune data mnist``: find, verify or download the MNIST files."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

from looptune.data import mnist


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("data", help="find, verify or download a dataset",
                       description="Find and verify MNIST (SHA-256 of every file), or download it.")
    p.add_argument("dataset", choices=["mnist"], help="the dataset")
    p.add_argument("--data", metavar="DIR", default=None,
                   help="folder to check or download into (default: $LOOPTUNE_DATA, then the "
                        "user cache folder)")
    p.add_argument("--download", action="store_true",
                   help="download the missing or bad files, each verified by SHA-256")
    p.add_argument("--mirror", metavar="URL", action="append", default=None,
                   help="base URL to download from, tried in the order given (repeatable; "
                        f"default: {', '.join(mnist.DEFAULT_MIRRORS)})")
    p.add_argument("--timeout", metavar="S", type=float, default=30.0,
                   help="seconds to wait on a connection or a read (default 30)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    out = Console()
    if args.download:
        columns = [TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                   TransferSpeedColumn()]
        with Progress(*columns, console=Console(stderr=True)) as progress:
            tasks: dict[str, int] = {}

            def report(name: str, done: int, total: int | None) -> None:
                if name not in tasks:
                    tasks[name] = progress.add_task(name, total=total)
                progress.update(tasks[name], completed=done, total=total)

            folder = mnist.download(args.data, mirrors=args.mirror or mnist.DEFAULT_MIRRORS,
                                    timeout_s=args.timeout, progress=report)
        out.print(f"MNIST downloaded into {folder}")
    folder = mnist.verify(args.data)
    out.print(f"MNIST found and verified (SHA-256 of all four files) in {folder}")
    return 0
