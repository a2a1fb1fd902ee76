"""``looptune pack``: write a dataset in a packed format, verify one, or measure the gain."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from looptune._format import format_bytes
from looptune._io import atomic_write_text, writable_problem
from looptune.cli.report import add_report_option, print_written, report_problems
from looptune.data.pack.format import STORAGES
from looptune.data.pack.records import RECORD_FORMATS, is_records
from looptune.errors import ConfigError, DataError
from looptune.report.build import save_and_render
from looptune.report.render import wide_console
from looptune.tune.factory import build_dataset, spec_problem

__all__ = ["add_parser", "parse_size", "run"]

_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "pack", help="convert a dataset to a fast format (memmap, LMDB), verify it, measure it",
        description="looptune pack --dataset MODULE:FACTORY OUT  writes a packed dataset; "
                    "--verify OUT checks every shard's SHA-256; --bench OUT --dataset ... measures "
                    "samples/s of the original against the packed dataset.")
    p.add_argument("out", nargs="?", metavar="OUT", help="the packed folder to write")
    p.add_argument("--dataset", metavar="MODULE:FACTORY", default=None,
                   help="a callable returning a map-style Dataset (e.g. "
                        "looptune.bench.workloads:mnist_train)")
    p.add_argument("--images", metavar="DIR", default=None,
                   help="instead of --dataset: an image folder (class sub-folders of JPEG/PNG "
                        "files, as ImageFolder reads), each file decoded once and resized whole "
                        "to --size x --size uint8 (with --bench: the folder decoded per sample is "
                        "the original)")
    p.add_argument("--size", type=int, default=None,
                   help="--images: pixels a side of the stored images (e.g. 1.5x the training "
                        "resolution, so random crops keep their detail)")
    p.add_argument("--cold", action="store_true",
                   help="--bench: also time every way with its files dropped from the page cache "
                        "before each pass (reads from storage)")
    p.add_argument("--format", choices=STORAGES + RECORD_FORMATS, default="memmap",
                   help="memmap: decoded arrays of fixed shapes, vectorized batch reads (default); "
                        "lmdb: decoded arrays, variable shapes allowed (pip install "
                        "'looptune[lmdb]'); tfrecord, webdataset: each file's encoded bytes and "
                        "label in shards, decoded when read (--images or a dataset of (bytes, "
                        "label); pip install 'looptune[tfrecord]' / 'looptune[webdataset]')")
    p.add_argument("--shard-bytes", metavar="N", default=None,
                   help="most bytes per shard file, e.g. 64M, 1G (default 256M; 64M for "
                        "tfrecord/webdataset)")
    p.add_argument("--workers", metavar="K", type=int, default=0,
                   help="processes reading the dataset while packing (default 0: this one); with "
                        "--bench, the DataLoader workers of every way measured")
    p.add_argument("--overwrite", action="store_true",
                   help="replace OUT if it is a packed dataset (the old one stays until the new "
                        "one is complete)")
    p.add_argument("--verify", metavar="OUT", default=None, help="check every shard's SHA-256")
    p.add_argument("--bench", metavar="OUT", default=None,
                   help="measure samples/s of --dataset against the packed OUT")
    p.add_argument("--batch-size", type=int, default=256, help="--bench: batch size (default 256)")
    p.add_argument("--batches", type=int, default=50, help="--bench: batches timed per pass")
    p.add_argument("--repeats", type=int, default=3, help="--bench: passes per way (median)")
    p.add_argument("--json", metavar="PATH", default=None, help="--bench: write results (atomic)")
    add_report_option(p)
    p.set_defaults(handler=run)


def parse_size(text: str) -> int:
    """``"256M"`` -> 268435456 (K/M/G/T are powers of 1024; an optional trailing ``B``/``iB``)."""
    m = re.fullmatch(r"\s*(\d+)\s*([kmgt]?)(i?b)?\s*", str(text).lower())
    if not m:
        raise ValueError(text)
    return int(m.group(1)) * _UNITS[m.group(2)]


def _mode(args: argparse.Namespace) -> str:
    problems = []
    modes = [m for m, v in (("verify", args.verify), ("bench", args.bench)) if v is not None]
    if len(modes) > 1:
        problems.append("give --verify OUT or --bench OUT, not both.")
    mode = modes[0] if modes else "pack"
    if args.images is not None and args.dataset is not None:
        problems.append("give --dataset MODULE:FACTORY or --images DIR, not both.")
    if args.images is not None and mode == "verify":
        problems.append("--verify reads only the packed folder: drop --images.")
    records = args.format in RECORD_FORMATS
    bench_records = mode == "bench" and is_records(args.bench)
    if records and mode == "pack" and args.size is not None:
        problems.append(f"--size {args.size}: --format {args.format} stores each file's bytes as "
                        "they are (decoded when read); drop --size, or use --format memmap.")
    elif ((args.images is not None and not (records and mode == "pack")) or bench_records) and (
            args.size is None or not 8 <= args.size <= 1024):
        what = "the records' decode" if bench_records else "--images"
        problems.append(f"{what} needs --size S, 8 to 1024 pixels a side (got {args.size}); "
                        "e.g. --size 48 for training at 32")
    if args.images is None and args.size is not None and not bench_records:
        problems.append("--size goes with --images DIR (the stored images' pixels a side).")
    if records and mode == "pack" and args.workers:
        problems.append(f"--workers {args.workers}: --format {args.format} copies bytes (nothing "
                        "to decode while packing); drop --workers.")
    if args.cold and mode != "bench":
        problems.append("--cold goes with --bench OUT (it measures reads from storage).")
    if mode == "pack":
        if args.out is None:
            problems.append("give the folder to write: looptune pack --dataset MODULE:FACTORY OUT "
                            "(or --verify OUT / --bench OUT --dataset MODULE:FACTORY).")
        if args.dataset is None and args.images is None:
            problems.append("give --dataset MODULE:FACTORY (or --images DIR --size S): the "
                            "dataset to pack.")
    elif args.out is not None:
        problems.append(f"OUT={args.out!r} is not used with --{mode} (it names its own folder).")
    if mode == "verify" and args.dataset is not None:
        problems.append("--verify reads only the packed folder: drop --dataset.")
    if args.dataset is not None and (problem := spec_problem(args.dataset, "--dataset")):
        problems.append(problem)
    if args.shard_bytes is None:
        args.shard_bytes = "64M" if records else "256M"
    try:
        args.shard_bytes = parse_size(args.shard_bytes)
        if args.shard_bytes < 1:
            raise ValueError
    except ValueError:
        problems.append(f"--shard-bytes {args.shard_bytes!r} is invalid: give a size >= 1 such as "
                        "268435456, 64M or 1G.")
    if args.workers < 0:
        problems.append(f"--workers {args.workers} is invalid: must be >= 0 (0: this process).")
    if args.json is not None:
        problems += [p for p in [writable_problem(args.json, "--json")] if p]
    if args.report is not None and mode != "bench":
        problems.append(f"--report {args.report!r} goes with --bench OUT (it renders measured "
                        "results); drop it, or add --bench.")
    problems += report_problems(args.report)
    if problems:
        raise ConfigError(problems)
    return mode


def run(args: argparse.Namespace) -> int:
    mode = _mode(args)
    if mode == "verify":
        return _verify(Path(args.verify))
    if mode == "bench":
        return _bench(args)
    return _pack(args)


def _pack(args: argparse.Namespace) -> int:
    from looptune.data.pack import pack

    if args.format in RECORD_FORMATS:
        return _pack_records(args)
    from looptune.data.pack.writer import _check_args

    # the cheap checks first (OUT exists, lmdb missing...), before the dataset factory runs
    _check_args([], Path(args.out), args.format, args.shard_bytes, args.workers, args.overwrite)
    dataset = _source(args)
    columns = [TextColumn("packing"), BarColumn(), MofNCompleteColumn(), TextColumn("samples"),
               TimeElapsedColumn(), TimeRemainingColumn()]
    with Progress(*columns, console=Console(stderr=True)) as progress:
        task = progress.add_task("pack", total=len(dataset))
        out = pack(dataset, args.out, format=args.format, shard_bytes=args.shard_bytes,
                   workers=args.workers, overwrite=args.overwrite,
                   progress=lambda done, total: progress.update(task, completed=done))
    header = json.loads((out / "header.json").read_text())
    size = sum(s["bytes"] for s in header["shards"])
    fields = ", ".join(f"{f['name']}: {f['dtype']} {f['shape']}" for f in header["fields"])
    wide_console().print(f"packed {header['num_samples']} samples ({fields}) into {out}: "
                         f"{header['storage']}, {len(header['shards'])} shard(s), "
                         f"{format_bytes(size)}", highlight=False, markup=False)
    return 0


def _pack_records(args: argparse.Namespace) -> int:
    from looptune.data import image_folder
    from looptune.data.pack.records import RECORDS_NAME, pack_records, records_missing
    from looptune.data.pack.writer import _existing_problem

    out = Path(args.out)
    problems = [m for m in [records_missing(args.format)] if m]
    if out.exists() or out.is_symlink():
        problems += _existing_problem(out, args.overwrite, marker=RECORDS_NAME)
    if problems:  # before the folder is scanned
        raise ConfigError(problems)
    source = (image_folder.scan(args.images) if args.images is not None
              else build_dataset(args.dataset))
    columns = [TextColumn("packing"), BarColumn(), MofNCompleteColumn(), TextColumn("samples"),
               TimeElapsedColumn(), TimeRemainingColumn()]
    with Progress(*columns, console=Console(stderr=True)) as progress:
        task = progress.add_task("pack", total=len(source))
        pack_records(source, out, format=args.format, shard_bytes=args.shard_bytes,
                     overwrite=args.overwrite,
                     progress=lambda done, total: progress.update(task, completed=done))
    meta = json.loads((out / RECORDS_NAME).read_text())
    size = sum(s["bytes"] for s in meta["shards"])
    wide_console().print(f"packed {meta['num_samples']} samples (encoded bytes + label) into {out}: "
                         f"{meta['format']}, {len(meta['shards'])} shard(s), {format_bytes(size)}",
                         highlight=False, markup=False)
    return 0


def _source(args: argparse.Namespace):
    """The dataset to pack (or to bench against): --dataset's factory, or --images DIR decoded
    and resized whole to --size (the folder scanned first: a bad file is named here)."""
    if args.images is None:
        return build_dataset(args.dataset)
    from looptune.data import image_folder
    from looptune.data.jpeg import ResizedFolder

    return ResizedFolder(image_folder.scan(args.images), args.size)


def _verify(folder: Path) -> int:
    from looptune.data.pack import verify_packed
    from looptune.data.pack.records import open_records, verify_records

    if is_records(folder):
        problems = verify_records(folder)
        if problems:
            raise DataError(f"{folder} failed verification: " + "; ".join(problems))
        meta = open_records(folder)
        wide_console().print(f"{folder}: all {len(meta['shards'])} shard(s) and their indexes "
                             f"match their SHA-256 ({meta['num_samples']} samples, "
                             f"{meta['format']})", highlight=False, markup=False)
        return 0
    problems = verify_packed(folder)
    if problems:
        raise DataError(f"{folder} failed verification: " + "; ".join(problems))
    header = json.loads((folder / "header.json").read_text())
    wide_console().print(f"{folder}: all {len(header['shards'])} shard(s) match their SHA-256 "
                         f"({header['num_samples']} samples, {header['storage']})",
                         highlight=False, markup=False)
    return 0


def _bench(args: argparse.Namespace) -> int:
    from looptune.data.pack import open_packed
    from looptune.data.pack.records import open_records
    from looptune.data.pack.throughput import bench_pack, bench_records

    if is_records(args.bench):
        open_records(args.bench)  # fails fast on a missing or damaged folder
        original = _source(args) if args.dataset or args.images else None
        result = bench_records(args.bench, original, size=args.size, batch_size=args.batch_size,
                               workers=args.workers, batches=args.batches, repeats=args.repeats,
                               cold=args.cold)
    else:
        packed = open_packed(args.bench)  # fails fast on a missing or damaged folder
        original = _source(args) if args.dataset or args.images else None
        result = bench_pack(packed, original, batch_size=args.batch_size, workers=args.workers,
                            batches=args.batches, repeats=args.repeats, cold=args.cold)
    console = wide_console()
    table = Table(title=f"{result.packed} ({result.storage}): batch {result.batch_size}, "
                        f"{result.workers} workers, {result.batches} batches x {result.repeats} "
                        "repeats (median)", title_justify="left")
    for col in ("way", "samples/s", "MB/s", "speedup", "how"):
        table.add_column(col, justify="left" if col in ("way", "how") else "right")
    for r in result.rates:
        speed = result.speedup(r.name)
        table.add_row(r.name, f"{r.samples_per_s:,.0f}", f"{r.bytes_per_s / 1e6:,.1f}",
                      "n/a" if speed is None else f"{speed:.2f}x", r.how)
    console.print(table)
    text = json.dumps(result.to_dict(), indent=2) + "\n"
    if args.json is not None:
        atomic_write_text(args.json, text)
    if args.report is not None:  # data first: saved, then rendered from the file
        print_written(save_and_render(text, args.report), console)
    return 0
