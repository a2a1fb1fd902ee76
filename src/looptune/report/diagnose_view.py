"""Terminal rendering of a Diagnosis (the breakdown, the verdict, findings, remedies), and of a
distributed job's RankReport (a row per rank, the slowest rank, then its full diagnosis)."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from looptune.measure.records import PHASES
from looptune.diagnose.ranks import RankReport
from looptune.diagnose.result import Diagnosis
from looptune.diagnose.verify import RERUNNABLE
from looptune.report.diagnose_sections import bound_text, part_rows
from looptune.report.render import format_bytes

__all__ = ["plan_lines", "print_diagnosis", "print_plan", "print_rank_report", "rank_table"]

_PHASE_TEXT = {"data_wait": "data wait", "host_to_device": "host-to-device", "sync": "host sync",
               "compute": "compute", "other": "other host overhead"}


def breakdown_table(d: Diagnosis) -> Table:
    table = Table()
    for col in ("phase", "median ms/step", "share"):
        table.add_column(col, justify="left" if col == "phase" else "right")
    for phase in PHASES:
        table.add_row(_PHASE_TEXT[phase], f"{d.phase_ms.get(phase, 0.0):.3f}",
                      f"{100 * d.shares.get(phase, 0.0):.1f}%")
        if phase == "compute":  # the step's own parts, timed inside it (host time)
            for label, ms, share in part_rows(d):
                table.add_row(escape(label), f"{ms:.3f}", f"{100 * share:.1f}%")
    return table


def print_diagnosis(d: Diagnosis, console: Console) -> None:
    console.print(f"{d.script}: {d.steps_measured} steps measured after {d.warmup_steps} warm-up, "
                  f"median step {d.step_ms:.2f} ms", highlight=False, markup=False)
    if d.step_signal != "optimizer.step":
        what = ("update of the parameters (in-place ops on them after a backward)"
                if d.step_signal == "parameter update" else "backward call")
        console.print(f"  steps: one per {what}; the script built no torch.optim optimizer",
                      highlight=False, markup=False)
    console.print(breakdown_table(d))
    console.print(f"[bold]bottleneck: {d.bottleneck}[/bold]", highlight=False)
    for key, value in d.evidence.items():
        console.print(f"  {key}: {_fmt(value)}", highlight=False, markup=False)
    console.print(f"  peak memory: {format_bytes(d.peak_mem_bytes)} ({d.peak_mem_kind})",
                  highlight=False, markup=False)
    for line in chain_lines(d):
        console.print(line, highlight=False, markup=False)
    if d.error:
        console.print(f"[red]the script raised:[/red] {escape(d.error)}", highlight=False)
    if d.steps_requested is not None and d.steps_measured < d.steps_requested:
        console.print(f"measured {d.steps_measured} of {d.steps_requested} steps: the script "
                      f"ended first ({d.stopped})", highlight=False)
    _print_list(console, "findings", [f"[{f.severity}] {f.message}" for f in d.findings])
    _print_list(console, "remedies: measured bounds first, then estimated; the largest gain first",
                [f"{r.action}  ({bound_text(r)}"
                 + ("" if r.measured_speedup is None else f", measured {r.measured_speedup:.2f}x")
                 + (", changes the training" if r.loss_parity is False else "")
                 + f": {r.reason})" for r in d.remedies])
    if d.verify:
        _print_list(console, "verify", verify_lines(d.verify))
    if d.trace:
        _print_list(console, "trace", [f"{d.trace['chrome_trace']} (open with {d.trace['open_with']})"])
        console.print(d.trace["top_ops"], highlight=False, markup=False)


def chain_lines(d: Diagnosis) -> list[str]:
    """The input chain inside the data wait: the cause (when the step waits for data) and each
    link's ms per batch; what was not seen."""
    c = d.input_chain
    if not c:
        return []
    lines = []
    if c.get("links_ms"):
        head = (f"data cause: {d.data_cause}" if d.data_cause
                else f"input chain (not the bottleneck; largest link {c['cause']})")
        lines.append(f"  {head}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in c["links_ms"].items())
                     + " per batch")
        lines.append(f"    {c['reason']}")
        if c.get("ceiling_reason"):
            lines.append(f"    {c['ceiling_reason']}")
    if c.get("note"):
        lines.append(f"    not seen: {c['note']}")
    return lines


def plan_lines(d: Diagnosis) -> list[str]:
    """--plan's path: each round's verdict, the remedy rerun on top of those kept, promised and
    measured, kept or why the path stopped; then where the step stands with all kept."""
    lines, total = [], 1.0
    for r in d.plan or []:
        measured = "-" if r["measured"] is None else f"{r['measured']:.2f}x"
        promised = "-" if r["promised"] is None else f"{r['promised']:.2f}x"
        parity = {True: "loss parity yes", False: "loss parity NO", None: "parity n/a"}[r["loss_parity"]]
        head = f"round {r['round']}: {r['bottleneck']} ({r['step_ms']:.2f} ms/step)"
        if r["remedy"] is None:
            lines.append(f"{head}: nothing to rerun: {r['why']}")
            continue
        lines.append(f"{head}: {r['remedy']}: promised {promised}, measured {measured}, {parity}: "
                     + ("kept" if r["kept"] else f"not kept: {r['why']}"))
        if r["kept"]:
            total *= r["measured"]
    kept = d.plan_applied
    if kept:
        lines.append(f"with {len(kept)} remedy(ies) kept ({'; '.join(kept)}): {d.bottleneck}, "
                     f"{d.step_ms:.2f} ms/step; {total:.2f}x in all (each round's measured gain "
                     "multiplied)")
    else:
        lines.append("no remedy paid from outside the script: the path stops at round 1")
    code = [r for r in d.remedies if r.kind not in RERUNNABLE]
    if code:
        lines.append("needs a change to the script's code: "
                     + "; ".join(f"{r.action} (up to {r.expected_speedup:.2f}x)" for r in code[:3]))
    return lines


def print_plan(d: Diagnosis, console: Console) -> None:
    console.print("plan (--plan):", style="bold")
    for line in plan_lines(d):
        console.print(f"  {line}", highlight=False, soft_wrap=True)


def verify_lines(v: dict) -> list[str]:
    """--verify's outcome: the remedy rerun, before -> after, against its bound."""
    if not v.get("remedy"):
        return [v.get("reason", "nothing was rerun")]
    if v.get("after_step_ms") is None:
        return [f"{v['remedy']}: the rerun failed: {v.get('error', '?')}"]
    unit = " to the same loss" if v.get("per_sample") else ""
    measured = ("not counted" if v.get("speedup") is None
                else f"{v['speedup']:.2f}x{unit} measured")
    share = f", {v['of_promise']:.0%} of it" if v.get("of_promise") is not None else ""
    lines = [f"{v['remedy']}: {v['before_step_ms']:.2f} -> {v['after_step_ms']:.2f} ms/step, "
             f"{measured} (expected up to {v['expected_speedup']:.2f}x{share})"]
    lines += [v[k] for k in ("partial", "not_comparable") if v.get(k)]
    if v.get("per_sample_speedup") is not None:
        lines.append(f"per sample {v['per_sample_speedup']:.2f}x, "
                     f"{v['per_sample_speedup'] / v['expected_speedup']:.0%} of the promise "
                     "(context, not the gain: a larger batch changes the training)")
    if (v.get("time_to_loss") or {}).get("reason"):
        lines.append(v["time_to_loss"]["reason"])
    check = v.get("loss_check") or {}
    if v.get("loss_parity") is True:
        lines.append(f"loss parity: yes ({check.get('reason', '')})")
    elif v.get("loss_parity") is None and check.get("reason"):
        lines.append(f"loss parity not judged: {check['reason']}")
    lines += [v[k] for k in ("loss_summed", "changes_training", "note", "short", "reason") if v.get(k)]
    return lines


_RANK_PHASES = {"data_wait": "data wait", "host_to_device": "h2d", "sync": "host sync",
                "compute": "compute", "other": "other", "collectives": "collectives"}


def rank_table(report: RankReport) -> Table:
    """A row per rank: steps, median and own ms/step, phase shares, peak memory, bottleneck."""
    waits = any("collectives" in r.shares for r in report.rows)
    phases = [*PHASES, "collectives"] if waits else list(PHASES)
    table = Table()
    for col in ["rank", "steps", "step ms", *(["own ms"] if waits else []),
                *(_RANK_PHASES[p] for p in phases), "peak mem", "bottleneck"]:
        table.add_column(col, justify="left" if col == "bottleneck" else "right")
    for r in report.rows:
        mark = " (slowest)" if r.rank == report.slowest_rank and len(report.rows) > 1 else ""
        own = [] if not waits else ["n/a" if r.own_ms is None else f"{r.own_ms:.3f}"]
        shares = [f"{100 * r.shares[p]:.1f}%" if p in r.shares else "n/a" for p in phases]
        bottleneck = r.bottleneck + (" (raised)" if r.error else "")
        table.add_row(f"{r.rank}{mark}", str(r.steps_measured), f"{r.step_ms:.3f}", *own, *shares,
                      format_bytes(r.peak_mem_bytes), bottleneck)
    return table


def print_rank_report(report: RankReport, console: Console) -> None:
    """The per-rank table, the slowest rank and why, then the slowest rank's full diagnosis."""
    first = report.ranks[0]
    console.print(f"{first.script}: {len(report.rows)} of {report.world_size} rank(s) reported, "
                  f"{first.warmup_steps} warm-up step(s) each; shares of each rank's median step",
                  highlight=False, markup=False)
    console.print(rank_table(report))
    if report.missing_ranks:
        console.print(f"[yellow]missing:[/yellow] rank(s) {report.missing_ranks} wrote no "
                      "diagnosis (the rank failed or was stopped, or runs on another node)",
                      highlight=False)
    slow = report.slowest_rank
    if len(report.rows) > 1:
        head = "ranks balanced" if report.balanced else f"slowest rank: {slow}"
        console.print(f"[bold]{head}[/bold] ({report.slowdown:.2f}x rank {report.fastest_rank}, "
                      f"the fastest)", highlight=False)
        console.print(f"  {report.reason}", highlight=False, markup=False)
    for r in report.rows:
        if r.error:
            console.print(f"[red]rank {r.rank}'s script raised:[/red] {escape(r.error)}",
                          highlight=False)
    console.print()
    console.print(f"[bold]full diagnosis of rank {slow}"
                  f"{' (the slowest)' if len(report.rows) > 1 else ''}:[/bold]", highlight=False)
    print_diagnosis(report.slowest, console)


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
