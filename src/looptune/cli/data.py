"""``looptune data mnist``: find, verify or download the MNIST files."""

from __future__ import annotations

import argparse

from rich.console import Console

from looptune.data import mnist


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("data", help="find, verify or download a dataset",
                       description="Find and verify MNIST (SHA-256 of every file), or download it.")
    p.add_argument("dataset", choices=["mnist"], help="the dataset")
    p.add_argument("--data", metavar="DIR", default=None,
                   help="folder to check (default: $LOOPTUNE_DATA, then the cache)")
    p.add_argument("--download", action="store_true",
                   help="download the missing files (verified by SHA-256) into --data DIR, or "
                        "into the user cache folder")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    out = Console()
    if args.download:
        folder = mnist.download(args.data)
        out.print(f"MNIST downloaded and verified in {folder}")
    folder = mnist.verify(args.data)
    out.print(f"MNIST found and verified (SHA-256 of all four files) in {folder}")
    return 0
