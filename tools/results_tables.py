"""Render the results table of every bench record in benchmarks/results/ (the JSON `looptune bench
--json` writes) as Markdown, as docs/results.md shows them: the tables there are copied from this
output, and tests/test_docs.py checks that they still match their records.

    python tools/results_tables.py                 # every record
    python tools/results_tables.py FILE.json ...   # some
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from looptune.report import bench_sections
from looptune.report.document import to_markdown

RECORDS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


def table(path: Path) -> str:
    """The first Markdown table of the record's bench report (its results table)."""
    markdown = to_markdown(bench_sections.build(json.loads(path.read_text())))
    lines, rows = markdown.splitlines(), []
    for line in lines:
        if line.startswith("|"):
            rows.append(line)
        elif rows:
            break
    return "\n".join(rows)


def bench_records() -> list[Path]:
    """The bench records (``"kind": "bench"``) among benchmarks/results/*.json."""
    return [p for p in sorted(RECORDS.glob("*.json"))
            if json.loads(p.read_text()).get("kind") == "bench"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("records", nargs="*", type=Path, metavar="FILE.json",
                   help="bench records to render (default: every one in benchmarks/results/)")
    paths = p.parse_args(argv).records or bench_records()
    for path in paths:
        print(f"<!-- {path.name} -->\n{table(path)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
