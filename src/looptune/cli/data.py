"""``looptune data DATASET``: find, verify or download a dataset (MNIST or a text corpus)."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

from looptune.data import mnist, text

DATASETS = ("mnist", *text.CORPUS_NAMES)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("data", help="find, verify or download a dataset",
                       description="Find and verify a dataset by SHA-256, or download it: MNIST "
                                   "(four files), tinyshakespeare (one text file), or show the "
                                   "offline pystdlib text corpus (built from this Python's "
                                   "standard library; nothing to download).")
    p.add_argument("dataset", choices=DATASETS, help="the dataset")
    p.add_argument("--data", metavar="DIR", default=None,
                   help="folder to check or download into (default: $LOOPTUNE_DATA, then the "
                        "user cache folder)")
    p.add_argument("--download", action="store_true",
                   help="download the missing or bad files, each verified by SHA-256")
    p.add_argument("--mirror", metavar="URL", action="append", default=None,
                   help="URL to download from, tried in the order given (repeatable). mnist: a "
                        f"base URL (default: {', '.join(mnist.DEFAULT_MIRRORS)}); tinyshakespeare: "
                        "the file's URL, or a folder URL ending in / that holds "
                        "tinyshakespeare.txt (default: the official mirrors)")
    p.add_argument("--timeout", metavar="S", type=float, default=30.0,
                   help="seconds to wait on a connection or a read (default 30)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    out = Console()
    if args.dataset == "mnist":
        return _run_mnist(args, out)
    if args.dataset == text.DEFAULT_CORPUS:
        return _run_pystdlib(args, out)
    return _run_remote(args, out)


@contextlib.contextmanager
def _progress_bars() -> Iterator[Callable[[str, int, int | None], None]]:
    """One download bar per file on stderr; yields the ``progress(name, done, total)`` callback."""
    columns = [TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn()]
    with Progress(*columns, console=Console(stderr=True)) as progress:
        tasks: dict[str, int] = {}

        def report(name: str, done: int, total: int | None) -> None:
            if name not in tasks:
                tasks[name] = progress.add_task(name, total=total)
            progress.update(tasks[name], completed=done, total=total)

        yield report


def _run_mnist(args: argparse.Namespace, out: Console) -> int:
    if args.download:
        with _progress_bars() as report:
            folder = mnist.download(args.data, mirrors=args.mirror or mnist.DEFAULT_MIRRORS,
                                    timeout_s=args.timeout, progress=report)
        out.print(f"MNIST downloaded into {folder}")
    folder = mnist.verify(args.data)
    out.print(f"MNIST found and verified (SHA-256 of all four files) in {folder}")
    return 0


def _run_remote(args: argparse.Namespace, out: Console) -> int:
    name = args.dataset
    if args.download:
        with _progress_bars() as report:
            path = text.download_corpus(name, args.data, mirrors=args.mirror,
                                        timeout_s=args.timeout, progress=report)
        _say(out, f"{name} downloaded into {path}")
    corpus = text.load_corpus(name, data_dir=args.data)  # finds it and checks its SHA-256
    _say(out, f"{name} found and verified (SHA-256): {corpus.source}")
    _describe(out, corpus)
    return 0


def _run_pystdlib(args: argparse.Namespace, out: Console) -> int:
    unused = [flag for flag, given in (("--data", args.data is not None),
                                       ("--download", args.download),
                                       ("--mirror", args.mirror is not None)) if given]
    if unused:  # harmless in a loop over every data set, so a note rather than an error
        _say(out, f"note: {', '.join(unused)} not used: pystdlib is built from this Python's "
                  "standard library and needs no file.")
    corpus = text.load_corpus(text.DEFAULT_CORPUS)
    _say(out, f"pystdlib (the offline default text corpus): {corpus.source}")
    _describe(out, corpus)
    return 0


def _describe(out: Console, corpus: text.Corpus) -> None:
    _say(out, f"  bytes:  {corpus.num_bytes} (byte-level tokens, vocabulary {text.VOCAB_SIZE})")
    _say(out, f"  sha256: {corpus.sha256}")


def _say(out: Console, line: str) -> None:
    # paths may hold "[...]" (rich markup) and run past 80 columns: print them as they are
    out.print(line, markup=False, highlight=False, soft_wrap=True)
