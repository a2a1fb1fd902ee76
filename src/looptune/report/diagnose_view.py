"""Terminal rendering of a Diagnosis: the breakdown, the verdict, findings, remedies."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from looptune.diagnose.model import PHASES
from looptune.diagnose.result import Diagnosis
from looptune.report.render import format_bytes

__all__ = ["print_diagnosis"]

_PHASE_TEXT = {"data_wait": "data wait", "host_to_device": "host-to-device", "sync": "host sync",
               "compute": "compute", "other": "other host overhead"}


def breakdown_table(d: Diagnosis) -> Table:
    table = Table()
    for col in ("phase", "median ms/step", "share"):
        table.add_column(col, justify="left" if col == "phase" else "right")
    for phase in PHASES:
        table.add_row(_PHASE_TEXT[phase], f"{d.phase_ms.get(phase, 0.0):.3f}",
                      f"{100 * d.shares.get(phase, 0.0):.1f}%")
    return table


def print_diagnosis(d: Diagnosis, console: Console) -> None:
    console.print(f"{d.script}: {d.steps_measured} steps measured after {d.warmup_steps} warm-up, "
                  f"median step {d.step_ms:.2f} ms", highlight=False, markup=False)
    console.print(breakdown_table(d))
    console.print(f"[bold]bottleneck: {d.bottleneck}[/bold]", highlight=False)
    for key, value in d.evidence.items():
        console.print(f"  {key}: {_fmt(value)}", highlight=False, markup=False)
    console.print(f"  peak memory: {format_bytes(d.peak_mem_bytes)} ({d.peak_mem_kind})",
                  highlight=False, markup=False)
    if d.error:
        console.print(f"[red]the script raised:[/red] {d.error}", highlight=False)
    if d.steps_measured < d.steps_requested:
        console.print(f"measured {d.steps_measured} of {d.steps_requested} steps: the script "
                      f"ended first ({d.stopped})", highlight=False)
    _print_list(console, "findings", [f"[{f.severity}] {f.message}" for f in d.findings])
    _print_list(console, "remedies, largest expected gain first",
                [f"{r.action}  (up to {r.expected_speedup:.2f}x: {r.reason})" for r in d.remedies])
    if d.verify:
        v = d.verify
        text = (f"{v['remedy']}: {v['before_step_ms']:.2f} -> {v['after_step_ms']:.2f} ms/step, "
                f"{v['speedup']:.2f}x measured (expected up to {v['expected_speedup']:.2f}x)"
                if v.get("remedy") else v.get("reason", ""))
        _print_list(console, "verify", [text])
    if d.trace:
        _print_list(console, "trace", [f"{d.trace['chrome_trace']} (open with {d.trace['open_with']})"])
        console.print(d.trace["top_ops"], highlight=False, markup=False)


def _print_list(console: Console, title: str, lines: list[str]) -> None:
    if not lines:
        return
    console.print(f"[bold]{title}:[/bold]")
    for i, line in enumerate(lines, 1):
        console.print(f"  {i}. {line}", highlight=False, markup=False)


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
