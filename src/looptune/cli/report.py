"""``looptune report RESULTS.json --out DIR``: render saved results again, measuring nothing."""

from __future__ import annotations

import argparse
from pathlib import Path

from looptune.errors import ConfigError

__all__ = ["add_parser", "add_report_option", "print_written", "run"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report", help="render saved results JSON as plots, report.md and report.html",
        description="Render the JSON written by looptune bench/diagnose/tune --json, looptune "
                    "pack --bench --json (or the results.json of a --report folder) into DIR: "
                    "PNG plots, report.md and a self-contained report.html. Runs nothing. "
                    "Needs matplotlib: pip install 'looptune[plot]'.")
    p.add_argument("results", metavar="RESULTS.json", help="a results file written by looptune")
    p.add_argument("--out", metavar="DIR", required=True,
                   help="folder for the report (created if missing; files in it are replaced)")
    p.set_defaults(handler=run)


def add_report_option(p: argparse.ArgumentParser) -> None:
    """``--report DIR`` for a command that measures."""
    p.add_argument("--report", metavar="DIR", default=None,
                   help="also write DIR/results.json and render it: PNG plots, report.md and a "
                        "self-contained report.html (needs pip install 'looptune[plot]')")


def report_problems(folder: str | None) -> list[str]:
    """Why ``--report folder`` cannot work (matplotlib missing, folder unwritable), or []."""
    if folder is None:
        return []
    from looptune.report.build import report_dir_problems

    return report_dir_problems(folder)


def print_written(paths: list[Path], console=None) -> None:
    html = next((p for p in paths if p.name == "report.html"), None)
    text = f"report written to {paths[0].parent}/ ({len(paths)} files)" + (
        f": open {html}" if html else "")
    if console is None:
        print(text)
    else:
        console.print(text, highlight=False, markup=False)


def run(args: argparse.Namespace) -> int:
    from looptune.report.build import report_dir_problems, write_report

    problems = report_dir_problems(args.out, "--out")
    if problems:
        raise ConfigError(problems)
    print_written(write_report(args.results, args.out))
    return 0
