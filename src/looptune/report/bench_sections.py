"""The report of ``looptune bench`` results (the JSON of ``BenchResults.to_dict()``)."""

from __future__ import annotations

import textwrap
from typing import Any

from looptune._format import format_bytes
from looptune.bench.results import BenchResults
from looptune.measure.results import RunResult
from looptune.report import plots
from looptune.report._sections import provenance_section
from looptune.report.document import Bullets, Callout, Document, Figure, Section, Table, Text
from looptune.report.render import bench_notes, bench_rows, columns

__all__ = ["build"]

REST = "rest of step (transfer + compute + overhead, not split by bench)"


def build(data: dict[str, Any]) -> Document:
    """Results table, time per epoch, breakdown, loss, accuracy over time, ranks, provenance."""
    results = BenchResults.from_dict(data)
    if not results.runs:
        raise ValueError("no runs in the results")
    sections = [_summary(results), _breakdown(results)]
    sections += [s for s in (_loss(results), _accuracy(results), _ranks(results)) if s]
    sections.append(provenance_section(results.provenance))
    p = results.provenance
    subtitle = (f"{results.workload}, {results.epochs} epoch(s), seed {results.seed}, "
                f"{len(results.runs)} recipe(s) on {p.get('device', 'n/a')} "
                f"({p.get('device_name', 'n/a')}), torch {p.get('torch', 'n/a')}, "
                f"{p.get('date', '')}")
    return Document(f"looptune bench: {results.workload}", subtitle, sections)


def _summary(results: BenchResults) -> Section:
    runs, speedups = results.runs, results.speedups()
    base = runs[0]
    best = max(range(len(runs)), key=lambda i: speedups[i])
    headline = (f"fastest: {runs[best].recipe}, {speedups[best]:.2f}x {base.recipe}'s training "
                f"time ({runs[best].s_per_epoch:.3f} vs {base.s_per_epoch:.3f} s/epoch)"
                if len(runs) > 1 else f"{base.recipe}: {base.s_per_epoch:.3f} s/epoch")
    bars = [plots.Bar(label=r.recipe, value=r.s_per_epoch, note=f"{r.s_per_epoch:.3g} s  ({s:.2f}x)")
            for r, s in zip(runs, speedups)]
    png = plots.hbars(bars, title="Training time per epoch (shorter is faster)",
                      xlabel="seconds per epoch (training only; evaluation and setup excluded)")
    names = columns(results)
    table = Table(names, bench_rows(results), right=set(range(1, len(names))))
    figure = Figure(name="s_per_epoch.png", alt="seconds per epoch per recipe, with speedups",
                    caption=f"Seconds per epoch of training; the label gives the speedup against the first "
                    f"recipe, {base.recipe} (its training time / the recipe's).", png=png)
    return Section("Results", [Callout(headline), table, figure, Bullets(bench_notes(results))])


def _breakdown(results: BenchResults) -> Section:
    runs = results.runs
    wait = [r.data_wait_s / r.epochs for r in runs]
    rest = [max(0.0, r.s_per_epoch - w) for r, w in zip(runs, wait)]
    png = plots.stacked_hbars(
        [r.recipe for r in runs], {"data wait": wait, REST: rest},
        title="Where each epoch's training time goes", xlabel="seconds per epoch",
        notes=[f"{100 * r.data_wait_fraction:.0f}% waiting for data" for r in runs])
    caption = ("Data wait: time the loop was blocked on the next batch. The bench records only "
               "that and the total, so the rest of each step (host-to-device transfer, compute, "
               "overhead) is one segment here; looptune diagnose splits a step into all its "
               "phases.")
    return Section("Step-time breakdown", [Figure(name="breakdown.png", alt="data wait and the rest of "
                                                  "each epoch per recipe", caption=caption, png=png)])


def _loss(results: BenchResults) -> Section | None:
    runs = [r for r in results.runs if len(r.epoch_loss) >= 2]
    if not runs:
        return None  # one point per recipe is no curve; the table has the loss
    groups: dict[tuple[float, ...], list[RunResult]] = {}
    for r in runs:  # recipes that train the same model bit for bit: one line, named for all
        groups.setdefault(tuple(float(f"{x:.6g}") for x in r.epoch_loss), []).append(r)
    series = [plots.Series(label=_same(g), x=list(range(1, len(g[0].epoch_loss) + 1)), y=g[0].epoch_loss)
              for g in groups.values()]
    png = plots.lines(series, title="Training loss per epoch", xlabel="epoch",
                      ylabel="mean batch loss (training)", integer_x=True)
    caption = ("Mean of the batch losses over each epoch. Recipes with the same losses to 6 "
               "significant digits (same seed, order and arithmetic) share one line.")
    return Section("Loss", [Figure(name="loss.png", alt="training loss per epoch per recipe", caption=caption, png=png)])


def _same(group: list[RunResult]) -> str:
    if len(group) == 1:
        return group[0].recipe
    return textwrap.fill(", ".join(r.recipe for r in group) + " (same losses)", 32)


def _accuracy(results: BenchResults) -> Section | None:
    """The workload's metric at each evaluation against training time: accuracy in %, any other
    metric (char-gpt's val_loss) in its own units; the target line in the same units."""
    runs = [r for r in results.runs if r.evals]
    if not runs:
        return None
    spec = runs[0].metric_spec
    scale = 100 if spec.fraction else 1  # a fraction (accuracy) is shown in percent
    target = next((r.target for r in runs if r.target is not None), None)
    series = [_accuracy_series(r, scale) for r in runs]
    xs = [x for s in series for x in s.x if x > 0]
    log = 10 if xs and max(xs) / min(xs) > 20 else None
    if log:
        series = [plots.Series(label=s.label, x=x, y=y, marks=s.marks)
                  for s in series for x, y in [_positive(s.x, s.y)]]
    hlines = ([(scale * target, f"target {spec.format_target(target)}")]
              if target is not None else [])
    what, ylabel, heading, png_name = _metric_words(spec.name, spec.fraction)
    png = plots.lines(series, title=f"{what[0].upper()}{what[1:]} against training time",
                      xlabel="training time, s" + (" (log scale)" if log else ""),
                      ylabel=ylabel, hlines=hlines, logx=log, ylim0=False)
    direction = "above" if spec.higher_is_better else "below"
    caption = ("Each point is an evaluation (its time is not counted as training). "
               + (f"A star marks the first evaluation at or {direction} the target. "
                  if target is not None else ""))
    return Section(f"{heading} against training time",
                   [Figure(name=png_name, alt=f"{what} over training time per recipe", caption=caption.strip(),
                           png=png)])


def _metric_words(name: str, fraction: bool) -> tuple[str, str, str, str]:
    """(what, y label, section heading, PNG file name) for a metric."""
    if name == "accuracy":
        return "test accuracy", "test accuracy, %", "Accuracy", "accuracy.png"
    if name == "val_loss":
        return ("validation loss", "validation loss, nats per token (lower is better)",
                "Validation loss", "val_loss.png")
    return name, f"{name}, %" if fraction else name, name, f"{name}.png"


def _accuracy_series(run: RunResult, scale: float = 100) -> plots.Series:
    xs = [e["train_s"] for e in run.evals]
    ys = [scale * _value(e) for e in run.evals]
    marks = []
    if run.time_to_target_s is not None:
        hit = next((e for e in run.evals if e["train_s"] >= run.time_to_target_s - 1e-9), None)
        if hit is not None:
            marks.append((hit["train_s"], scale * _value(hit), ""))
    return plots.Series(label=run.recipe, x=xs, y=ys, marks=marks)


def _value(entry: dict[str, Any]) -> float:
    """An evaluation's metric value (results written before metrics had only "accuracy")."""
    return entry["metric"] if "metric" in entry else entry["accuracy"]


def _positive(xs, ys) -> tuple[list[float], list[float]]:
    kept = [(x, y) for x, y in zip(xs, ys) if x > 0]
    return [x for x, _ in kept], [y for _, y in kept]


def _ranks(results: BenchResults) -> Section | None:
    if results.world_size <= 1:
        return None
    labels, wait, rest, rows = [], [], [], []
    for run in results.runs:
        for r in run.extra.get("per_rank") or []:
            waited = r["step_ms"] * r["data_wait_fraction"]
            labels.append(f"{run.recipe} · rank {r['rank']}")
            wait.append(waited)
            rest.append(max(0.0, r["step_ms"] - waited))
            rows.append([run.recipe, str(r["rank"]), f"{r['step_ms']:.3f}",
                         f"{r['samples_per_s']:,.0f}", f"{100 * r['data_wait_fraction']:.0f}%",
                         format_bytes(r.get("peak_mem_bytes"))])
    if not labels:
        return Section("Ranks", [Text(f"{results.world_size} ranks ({results.backend}); the "
                                      "results hold no per-rank figures.")])
    png = plots.stacked_hbars(labels, {"data wait": wait, REST: rest},
                              title=f"Time per step on each of {results.world_size} ranks",
                              xlabel="ms per optimizer step (the rank's training time / its steps)",
                              notes=[f"{w + r:.2f} ms" for w, r in zip(wait, rest)])
    table = Table(["recipe", "rank", "ms/step", "samples/s", "data wait", "peak mem"], rows,
                  right={1, 2, 3, 4, 5})
    caption = (f"{results.world_size} ranks ({results.backend}), each training on its share of "
               "every global batch; the job's time is the slowest rank's.")
    return Section("Ranks", [Figure(name="ranks.png", alt="per-rank time per step", caption=caption, png=png), table])
