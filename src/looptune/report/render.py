"""Tables for bench results: a rich table for the terminal, Markdown for READMEs and notes."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from looptune._format import format_bytes
from looptune.bench.results import BenchResults

__all__ = ["tokens_per_sample", "bench_markdown", "bench_notes", "bench_rows", "bench_table", "columns", "format_bytes", "wide_console"]

# "loss" is the last epoch's average batch loss, as the reference prints it per epoch
# "loss parity": the last epoch's loss within tolerance of the first (baseline) run's
COLUMNS = ["recipe", "total s", "s/epoch", "samples/s", "speedup", "loss", "loss parity",
           "test acc", "data wait", "peak mem"]


def wide_console() -> Console:
    """A stdout console; 140 columns when writing to a file or pipe, so tables are not squeezed."""
    console = Console()
    return console if console.is_terminal else Console(width=140)


def columns(results: BenchResults) -> list[str]:
    """:data:`COLUMNS` (the metric's column named after it), plus tokens/s for a language model,
    time to target and compile time when some run has them."""
    metric = results.runs[0].metric_spec if results.runs else None
    names = list(COLUMNS)
    if metric is not None and metric.name != "accuracy":
        names[names.index("test acc")] = metric.name
    if results.unit != "samples":
        names[names.index("samples/s")] = f"{results.unit}/s"
    if tokens_per_sample(results):
        names.insert(names.index(f"{results.unit}/s") + 1, "tokens/s")
    extra = []
    if any(r.target is not None for r in results.runs):
        run = next(r for r in results.runs if r.target is not None)
        extra.append(f"s to {run.metric_spec.format_target(run.target)}")
    if any(r.compile_s > 0 or r.compile_fallback for r in results.runs):
        extra.append("compile s")
    if results.world_size > 1:
        extra += ["ranks", "slowest rank", "scaling eff."]
    return names + extra


def tokens_per_sample(results: BenchResults) -> int | None:
    """Tokens in one sample (an LM's context), from the results' data provenance; else None."""
    data = results.provenance.get("data") or {}
    return data.get("context")


def bench_rows(results: BenchResults) -> list[list[str]]:
    """One row of formatted cells per run, in :func:`columns` order."""
    rows, names = [], columns(results)
    efficiency = results.scaling_efficiency()
    tokens = tokens_per_sample(results)
    for run, speedup, eff, parity in zip(results.runs, results.speedups(), efficiency,
                                         results.loss_parity()):
        row = [run.recipe, f"{run.wall_s:.2f}", f"{run.s_per_epoch:.3f}",
               f"{run.samples_per_s:,.0f}", f"{speedup:.2f}x", f"{run.epoch_loss[-1]:.4f}",
               _parity_cell(parity), run.metric_spec.format(run.metric), f"{100 * run.data_wait_fraction:.0f}%",
               format_bytes(run.peak_mem_bytes)]
        if tokens:
            row.insert(4, f"{run.samples_per_s * tokens:,.0f}")
        if any(n.startswith("s to ") for n in names):
            row.append("not reached" if run.time_to_target_s is None else f"{run.time_to_target_s:.2f}")
        if "compile s" in names:
            row.append("eager (failed)" if run.compile_fallback else f"{run.compile_s:.1f}")
        if "ranks" in names:
            row += [f"{results.world_size} ({results.backend})", _slowest(run),
                    "n/a" if eff is None else f"{100 * eff:.0f}%"]
        rows.append(row)
    return rows


def _parity_cell(parity: dict[str, Any] | None) -> str:
    if parity is None:
        return "baseline"
    return {True: "yes", False: f"NO ({parity.get('after_loss', 0) - parity.get('before_loss', 0):+.3g})",
            None: "n/a"}[parity["parity"]]


def _slowest(run) -> str:
    ranks = run.extra.get("per_rank") or []
    if not ranks:
        return "n/a"
    slow = max(ranks, key=lambda r: r["step_ms"])
    fast = min(ranks, key=lambda r: r["step_ms"])
    return f"{slow['rank']} (+{100 * (slow['step_ms'] / fast['step_ms'] - 1):.0f}%)"


def _title(results: BenchResults) -> str:
    p = results.provenance
    return (f"{results.workload}, {results.epochs} epoch(s), seed {results.seed} on "
            f"{p.get('device')} ({p.get('device_name')}, {p.get('cpu_count')} CPU cores), "
            f"torch {p.get('torch')}")


def bench_table(results: BenchResults) -> Table:
    table = Table(title=_title(results), title_justify="left")
    for i, col in enumerate(columns(results)):
        table.add_column(col, justify="left" if i == 0 else "right")
    for row in bench_rows(results):
        table.add_row(*row)
    return table


def bench_markdown(results: BenchResults) -> str:
    names = columns(results)
    lines = [f"_{_title(results)}_", "", "| " + " | ".join(names) + " |",
             "|" + "|".join(["---"] + ["---:"] * (len(names) - 1)) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in bench_rows(results)]
    return "\n".join(lines) + "\n"


def bench_notes(results: BenchResults) -> list[str]:
    """What the table cannot say: memory kind, automatic changes with their reasons."""
    kinds = {r.peak_mem_kind for r in results.runs}
    notes = [f"peak mem: {_KIND_TEXT.get(k, k)}" for k in sorted(kinds)]
    notes.append("loss: the last epoch's mean batch loss; loss parity: within a tenth of the "
                 "baseline's progress from its first step (or 2% of its loss) of the first "
                 "run's. data wait: share of training time the "
                 "loop spent blocked on the next batch. total s excludes evaluation, setup and "
                 "compilation.")
    for run, parity in zip(results.runs, results.loss_parity()):
        if parity is not None and parity["parity"] is False:
            notes.append(f"{run.recipe}: changes the training, its speedup is not the same "
                         f"training's: {parity['reason']}")
    if results.world_size > 1:
        notes.append(
            f"{results.world_size} ranks ({results.backend}), each training on its share of "
            "every global batch: loss, accuracy and samples/s are for the whole job; total s is "
            "the slowest rank's. scaling eff. = samples/s / (ranks x one process's samples/s)"
            + ("" if results.single_process else
               " (n/a: no one-process run in this command; use looptune bench --nproc N)"))
    for run in results.runs:
        if run.compile_fallback:
            notes.append(f"{run.recipe}: {run.compile_fallback}")
        notes += [f"{run.recipe}: {d['name']}={d['value']!r}: {d['reason']}" for d in run.decisions]
    return notes


_KIND_TEXT: dict[str, Any] = {
    "cuda_max_allocated": "peak CUDA memory allocated by tensors (torch.cuda.max_memory_allocated)",
    "cpu_peak_rss": "peak resident memory of the training process during the run (VmHWM)",
    "cpu_peak_rss_since_start": "peak resident memory of the process since it started",
    "unavailable": "not measurable on this platform",
}
