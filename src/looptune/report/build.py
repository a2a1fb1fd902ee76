"""A saved results JSON -> a report folder: ``report.md``, a self-contained ``report.html`` and
the PNG plots. The renderer reads only the JSON; the measuring commands save theirs first
(``DIR/results.json``) and call the same function on it, so ``looptune report`` redraws any of them.

Kinds (``"kind"`` in the JSON; files written before it existed are recognised by their fields):
``bench``, ``diagnosis``, ``diagnose-ranks``, ``tune-loader``, ``tune-batch-size``, ``pack-bench``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from looptune._io import atomic_write_bytes, atomic_write_text
from looptune.errors import DataError, LooptuneError
from looptune.report.document import Document, to_html, to_markdown
from looptune.report.plots import matplotlib_problem, require_matplotlib

__all__ = ["KINDS", "RESULTS_NAME", "build_document", "detect_kind", "load_results",
           "report_dir_problems", "save_and_render", "write_report"]

RESULTS_NAME = "results.json"  # what --report DIR saves before rendering
KINDS = ("bench", "diagnosis", "diagnose-ranks", "tune-loader", "tune-batch-size", "pack-bench")
_WRITERS = ("looptune bench/diagnose/tune --json, looptune pack --bench --json, or the "
            f"{RESULTS_NAME} of a --report folder")


def report_dir_problems(folder: str | os.PathLike, flag: str = "--report") -> list[str]:
    """Why a report cannot be written into ``folder`` (checked before any measuring), or []."""
    problems = [p for p in [matplotlib_problem()] if p]
    path = Path(folder)
    if path.exists() and not path.is_dir():
        problems.append(f"{flag} {str(path)!r} is a file: give a folder (it is created if "
                        "missing), e.g. --report report/.")
        return problems
    existing = next((p for p in [path, *path.absolute().parents] if p.exists()), None)
    if existing is None or not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        problems.append(f"{flag} {str(path)!r} cannot be created or written: {str(existing)!r} is "
                        "not a writable folder. Choose another folder.")
    return problems


def load_results(path: str | os.PathLike) -> dict[str, Any]:
    """The JSON object in ``path``; DataError naming the file and the problem otherwise."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise DataError(f"cannot read {str(path)!r}: {err.strerror or err}. Give the path of a "
                        f"results JSON ({_WRITERS}).") from None
    try:
        data = json.loads(text)
    except ValueError as err:
        raise DataError(f"{str(path)!r} is not valid JSON ({err}): the file is corrupt or not a "
                        f"results file. Write it again ({_WRITERS}).") from None
    if not isinstance(data, dict):
        raise DataError(f"{str(path)!r} holds a JSON {type(data).__name__}, not an object: not a "
                        f"looptune results file ({_WRITERS}).")
    return data


def detect_kind(data: dict[str, Any]) -> str:
    """Which results these are: the ``kind`` key, or (older files) the fields they hold."""
    kind = data.get("kind")
    if kind is not None:
        if kind not in KINDS:
            raise DataError(f"kind={kind!r} is not a kind of results looptune can report: "
                            f"one of {', '.join(KINDS)}. Give a file written by {_WRITERS}.")
        return kind
    keys = set(data)
    guesses = [("bench", {"schema_version", "runs"}),
               ("diagnosis", {"bottleneck", "shares", "step_s"}),
               ("diagnose-ranks", {"ranks", "rows", "slowest_rank"}),
               ("tune-loader", {"line", "trials", "end_to_end"}),
               ("tune-batch-size", {"recommended", "trials", "decisions"})]
    for name, needs in guesses:
        if needs <= keys:
            return name
    raise DataError(f"not a looptune results file: no 'kind' key and the fields "
                    f"{sorted(keys)[:12]} match none of {', '.join(KINDS)} (bench results have "
                    f"'schema_version' and 'runs'). Give a file written by {_WRITERS}.")


def _builders() -> dict[str, Callable[[dict[str, Any]], Document]]:
    from looptune.report import bench_sections, diagnose_sections, tune_sections

    return {"bench": bench_sections.build, "diagnosis": diagnose_sections.build,
            "diagnose-ranks": diagnose_sections.build_ranks,
            "tune-loader": tune_sections.build_loader,
            "tune-batch-size": tune_sections.build_batch, "pack-bench": tune_sections.build_pack}


def build_document(data: dict[str, Any], kind: str | None = None) -> Document:
    """The report of ``data`` in memory (figures included); nothing is written.

    Raises:
        DataError: unknown kind, or a record of that kind with missing or malformed fields.
    """
    kind = kind or detect_kind(data)
    require_matplotlib()
    try:
        return _builders()[kind](data)
    except LooptuneError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, ZeroDivisionError) as err:
        what = (f"missing field {err}" if isinstance(err, KeyError)
                else f"{type(err).__name__}: {err}")
        raise DataError(f"these {kind} results are incomplete or corrupt ({what}). Write them "
                        f"again with this looptune version ({_WRITERS}); if the file is intact, "
                        "this is a looptune bug: please report it.") from None


def write_report(results: str | os.PathLike, out_dir: str | os.PathLike) -> list[Path]:
    """Render the results JSON at ``results`` into ``out_dir`` (created if missing).

    Everything is built in memory first: a bad file writes nothing. Files are written atomically.

    Returns:
        The paths written: the PNGs, ``report.md`` and ``report.html``.

    Raises:
        ConfigError: matplotlib is missing (``pip install 'looptune[plot]'``).
        DataError: the file is missing, not JSON, or not a looptune results record.

    Example:
        >>> write_report("results.json", "report")  # doctest: +SKIP
    """
    require_matplotlib()
    try:
        doc = build_document(load_results(results))
    except DataError as err:
        text = str(err)
        raise DataError(text if str(results) in text else f"{str(results)!r}: {text}") from None
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = [atomic_write_bytes(out / f.name, f.png) for f in doc.figures]
    written.append(atomic_write_text(out / "report.md", to_markdown(doc)))
    written.append(atomic_write_text(out / "report.html", to_html(doc)))
    return written


def save_and_render(json_text: str, out_dir: str | os.PathLike) -> list[Path]:
    """What ``--report DIR`` does: save ``DIR/results.json``, then render that file."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    saved = atomic_write_text(out / RESULTS_NAME, json_text)
    return [saved, *write_report(saved, out)]
