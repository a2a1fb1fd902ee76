"""``looptune data DATASET``: find, verify or download a dataset (MNIST or a text corpus), or write
a folder of JPEG images (``images``) from MNIST digits."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

from looptune.data import image_folder, mnist, text
from looptune.errors import ConfigError

DATASETS = ("mnist", "images", *text.CORPUS_NAMES)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("data", help="find, verify or download a dataset",
                       description="Find and verify a dataset by SHA-256, or download it: MNIST "
                                   "(four files), tinyshakespeare (one text file), or show the "
                                   "offline pystdlib text corpus (built from this Python's "
                                   "standard library; nothing to download). `images --out DIR` "
                                   "writes a folder of JPEGs in the ImageFolder layout (class "
                                   "sub-folders) from the MNIST digits in --data, with a "
                                   "manifest; with --out DIR alone on an existing folder, it "
                                   "checks it.")
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
    g = p.add_argument_group("images")
    g.add_argument("--out", metavar="DIR", default=None,
                   help="images: the folder to write (must not exist, or be empty), or to check")
    g.add_argument("--samples", type=int, default=None,
                   help="images: files to write (default 2000; 100000 makes ~1.7 GB)")
    g.add_argument("--split", choices=("train", "test"), default="train",
                   help="images: the MNIST split the digits come from (default train)")
    g.add_argument("--min-size", type=int, default=128, help="images: smallest side (default 128)")
    g.add_argument("--max-size", type=int, default=256, help="images: largest side (default 256)")
    g.add_argument("--quality", type=int, default=90, help="images: JPEG quality (default 90)")
    g.add_argument("--seed", type=int, default=0, help="images: the draw's seed (default 0)")
    g.add_argument("--skip-bad", action="store_true",
                   help="images (checking): skip and count files that are not images or are "
                        "truncated, instead of stopping at the first")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    out = Console()
    if args.dataset == "mnist":
        return _run_mnist(args, out)
    if args.dataset == "images":
        return _run_images(args, out)
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


def _run_images(args: argparse.Namespace, out: Console) -> int:
    if args.out is None:
        raise ConfigError("looptune data images needs --out DIR: the folder to write (or an "
                          "existing one to check), e.g. looptune data images --out ./jpegs "
                          "--samples 2000 --data DIR")
    folder = Path(args.out)
    if args.samples is None and folder.is_dir() and any(folder.iterdir()):
        samples = image_folder.scan(folder, skip_bad=args.skip_bad, verify=True)
        skipped = f"; {len(samples.skipped)} bad file(s) skipped" if samples.skipped else ""
        _say(out, f"{folder}: {len(samples)} images in {len(samples.classes)} classes, "
                  f"{samples.bytes / 1e6:.1f} MB, checked (SHA-256 against its manifest where it "
                  f"has one){skipped}")
        for path, why in list(samples.skipped.items())[:10]:
            _say(out, f"  skipped {path}: {why}")
        return 0
    n = 2000 if args.samples is None else args.samples
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  console=Console(stderr=True)) as progress:
        task = progress.add_task("writing JPEGs", total=n)
        record = image_folder.write(folder, samples=n, mnist_dir=args.data, split=args.split,
                                    min_size=args.min_size, max_size=args.max_size,
                                    quality=args.quality, seed=args.seed,
                                    progress=lambda done, _: progress.update(task, completed=done))
    _say(out, f"wrote {record['count']} JPEGs ({record['bytes'] / 1e6:.1f} MB, "
              f"{args.min_size}-{args.max_size} px, quality {args.quality}) in "
              f"{len(record['classes'])} class folders under {folder}; manifest: "
              f"{folder / image_folder.MANIFEST}")
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
