"""Reports of ``looptune tune loader``, ``tune batch-size`` and ``pack --bench`` results."""

from __future__ import annotations

from typing import Any

from looptune._format import format_bytes
from looptune.report import plots
from looptune.report._sections import decisions_table, fmt, provenance_section
from looptune.report.document import Callout, Document, Figure, Section, Table

__all__ = ["build_batch", "build_loader", "build_pack"]

# what a trial measured, not the settings it tried (tune loader's trials also carry the mean
# training loss and its parity with the first trial's: they are columns, not settings)
_RESULT_KEYS = {"samples_per_s", "status", "reason", "phase", "loss", "loss_parity"}
_MEM_KIND = {"cpu_tensor_estimate": "tensor bytes of one step (params, grads, batch, saved "
                                    "activations; an estimate)",
             "cuda_max_allocated": "peak CUDA memory allocated by tensors"}


def _rate(value: float | None) -> str:
    return "failed" if value is None else f"{value:,.0f}"


def _settings(trial: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in trial.items() if k not in _RESULT_KEYS}


def _label(settings: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in settings.items())


# --------------------------------------------------------------------------------- tune loader

def build_loader(data: dict[str, Any]) -> Document:
    trials, recommended = data["trials"], data["recommended"]
    mode = "with a training step" if data.get("end_to_end") else "loading only"
    blocks: list[Any] = [Callout(f"use: {data['line']}"), decisions_table(data["decisions"])]
    blocks += _workers_figure(trials, recommended, mode)
    final = {**recommended, **({"intra_op_threads": data["threads"]} if data.get("threads")
                               else {})}
    blocks += _trials_figure(trials, final, mode)
    losses = any("loss" in t for t in trials)
    rows = [[_label(_settings(t)), _rate(t["samples_per_s"])]
            + ([fmt(t.get("loss")), _parity(t)] if losses else [])
            + [t["status"], t.get("reason", "")] for t in trials]
    header = ["settings", "samples/s"] + (["loss", "loss parity"] if losses else []) + [
        "status", "reason"]
    subtitle = (f"{len(trials)} settings measured in {data.get('elapsed_s', 0.0):.1f} s, {mode}"
                + (f", batch {data['batch_size']}" if data.get("batch_size") else ""))
    return Document("looptune tune loader", subtitle, [
        Section("Recommendation and decisions", blocks),
        Section("Every trial", [Table(header, rows, right={1, 2} if losses else {1})]),
        provenance_section(data.get("provenance"))])


def _parity(trial: dict[str, Any]) -> str:
    """The loss parity cell: the first trial is the baseline the others are held to."""
    if "loss_parity" not in trial:
        return "baseline" if "loss" in trial else "n/a"
    return fmt(trial["loss_parity"])


def _workers_figure(trials: list[dict], recommended: dict, mode: str) -> list[Any]:
    search = [t for t in trials if set(_settings(t)) == {"num_workers"}]
    ok = [t for t in search if t["samples_per_s"] is not None]
    if not ok:
        return []
    chosen = next((t for t in ok if t["num_workers"] == recommended.get("num_workers")), None)
    marks = [] if chosen is None else [(chosen["num_workers"], chosen["samples_per_s"],
                                        f"chosen: {chosen['num_workers']} workers")]
    series = plots.Series(label="samples/s", x=[t["num_workers"] for t in ok],
                          y=[t["samples_per_s"] for t in ok], marks=marks)
    png = plots.lines([series], title=f"Throughput against num_workers ({mode})",
                      xlabel="DataLoader num_workers", ylabel="samples/s", integer_x=True)
    failed = [t for t in search if t["samples_per_s"] is None]
    caption = ("Workers grow from 0 while each step up gains at least the threshold; the star is "
               "the chosen count." + "".join(f" {t['num_workers']} workers failed: {t['reason']}."
                                             for t in failed))
    return [Figure(name="workers.png", alt="samples per second against num_workers", caption=caption, png=png)]


def _trials_figure(trials: list[dict], final: dict, mode: str) -> list[Any]:
    if all(set(_settings(t)) == {"num_workers"} for t in trials):
        return []  # the workers plot shows them all
    bars = [plots.Bar(label=_label(_settings(t)), value=t["samples_per_s"] or 0.0, note=_rate(t["samples_per_s"]),
                      highlight=_is_final(_settings(t), final)) for t in trials]
    png = plots.hbars(bars, title=f"Throughput of every setting tried ({mode})",
                      xlabel="samples/s (median of repeats)", highlight_label="recommended")
    return [Figure(name="trials.png", alt="samples per second of every DataLoader setting tried",
                   caption="Every trial in the order measured; failed ones show 0.", png=png)]


# what a trial that does not name a setting ran with (looptune.tune.loader's defaults): a
# recommendation of pin_memory=False (no GPU) is the trial that left it out
_LOADER_DEFAULTS = {"prefetch_factor": 2, "persistent_workers": False, "pin_memory": False,
                    "batched": True}


def _is_final(settings: dict[str, Any], final: dict[str, Any]) -> bool:
    """Whether the trial of these settings ran what was recommended (``final``: the
    recommendation, with its intra-op threads when it has some)."""
    defaults = _LOADER_DEFAULTS
    return all(settings.get(k, defaults.get(k)) == v for k, v in final.items()) and \
        all(final.get(k, defaults.get(k)) == v for k, v in settings.items())


# ----------------------------------------------------------------------------- tune batch-size

def build_batch(data: dict[str, Any]) -> Document:
    trials, recommended = data["trials"], data["recommended"]
    chosen = recommended["batch_size"]
    ok = sorted((t for t in trials if t["status"] == "ok"), key=lambda t: t["batch_size"])
    if not ok:
        raise ValueError("no trial with status 'ok'")
    evidence = next((d.get("evidence") for d in data["decisions"] if d.get("name") == "batch_size"
                     and isinstance(d.get("evidence"), dict)), {}) or {}
    blocks: list[Any] = [Callout("use: " + ", ".join(f"{k}={v}" for k, v in recommended.items())),
                         decisions_table(data["decisions"]), _throughput(ok, chosen, trials)]
    memory = _memory(ok, chosen, evidence)
    if memory is not None:
        blocks.append(memory)
    rows = [[str(t["batch_size"]), _rate(t["samples_per_s"]), fmt(t.get("step_ms")),
             format_bytes(t.get("peak_mem_bytes")), t["status"], t.get("phase", ""),
             t.get("reason", "")] for t in trials]
    table = Table(["batch size", "samples/s", "ms/step", "peak mem", "status", "phase", "reason"],
                  rows, right={0, 1, 2, 3})
    return Document("looptune tune batch-size", f"{len(trials)} batch sizes measured on "
                    f"{evidence.get('device', 'n/a')}; recommended {chosen}",
                    [Section("Recommendation and decisions", blocks),
                     Section("Every trial", [table]), provenance_section(data.get("provenance"))])


def _throughput(ok: list[dict], chosen: int, trials: list[dict]) -> Figure:
    knee = next((t for t in ok if t["batch_size"] == chosen), None)
    marks = [] if knee is None else [(chosen, knee["samples_per_s"], f"chosen: {chosen}")]
    series = plots.Series(label="samples/s", x=[t["batch_size"] for t in ok],
                          y=[t["samples_per_s"] for t in ok], marks=marks)
    png = plots.lines([series], title="Training throughput against batch size",
                      xlabel="batch size (log scale)", ylabel="samples/s", logx=2,
                      xticks=[t["batch_size"] for t in ok])
    bad = [t for t in trials if t["status"] != "ok"]
    caption = ("The star is the knee: the smallest batch within the threshold of the best. "
               + "".join(f"{t['batch_size']}: {t['status']}. " for t in bad))
    return Figure(name="batch_throughput.png", alt="samples per second against batch size",
                  caption=caption.strip(), png=png)


def _memory(ok: list[dict], chosen: int, evidence: dict[str, Any]) -> Figure | None:
    points = [t for t in ok if t.get("peak_mem_bytes")]
    if not points:
        return None
    limit, fraction = evidence.get("memory_limit_bytes"), evidence.get("max_memory_fraction")
    line = limit * fraction if limit and fraction else None  # the eligible-memory cap
    top = max([t["peak_mem_bytes"] for t in points] + [line or 0])
    unit, scale = ("MiB", 2.0 ** 20) if top >= 2 ** 20 else ("KiB", 2.0 ** 10)
    knee = next((t for t in points if t["batch_size"] == chosen), None)
    marks = [] if knee is None else [(chosen, knee["peak_mem_bytes"] / scale, f"chosen: {chosen}")]
    series = plots.Series(label="peak memory", x=[t["batch_size"] for t in points],
                          y=[t["peak_mem_bytes"] / scale for t in points], marks=marks)
    hlines = [(line / scale, f"{fraction:.0%} of the limit")] if line else []
    kind = points[0].get("peak_mem_kind", "")
    png = plots.lines([series], title="Peak memory against batch size",
                      xlabel="batch size (log scale)", ylabel=f"peak memory, {unit}", logx=2,
                      hlines=hlines, xticks=[t["batch_size"] for t in points])
    return Figure(name="batch_memory.png", alt="peak memory against batch size",
                  caption=f"Peak memory: {_MEM_KIND.get(kind, kind)}.", png=png)


# ------------------------------------------------------------------------------- pack --bench

def build_pack(data: dict[str, Any]) -> Document:
    rates = data["rates"]
    bars = [plots.Bar(label=r["name"], value=r["samples_per_s"], note=f"{r['samples_per_s']:,.0f}"
                      + ("" if r.get("speedup") is None else f"  ({r['speedup']:.2f}x)"))
            for r in rates]
    png = plots.hbars(bars, title="Samples per second of each way to read the data",
                      xlabel="samples/s (median of repeats; longer is faster)")
    rows = [[r["name"], f"{r['samples_per_s']:,.0f}", f"{r['bytes_per_s'] / 1e6:,.1f}",
             "n/a" if r.get("speedup") is None else f"{r['speedup']:.2f}x", r["how"]]
            for r in rates]
    table = Table(["way", "samples/s", "MB/s", "speedup", "how"], rows, right={1, 2, 3})
    best = max(rates, key=lambda r: r["samples_per_s"])
    head = f"fastest: {best['name']}, {best['samples_per_s']:,.0f} samples/s" + (
        "" if best.get("speedup") is None else f", {best['speedup']:.2f}x the original")
    subtitle = (f"{data['packed']} ({data['storage']}): batch {data['batch_size']}, "
                f"{data['workers']} workers, {data['batches']} batches x {data['repeats']} repeats")
    caption = ("Speedups against the original dataset read through the same DataLoader settings."
               if any(r.get("speedup") is not None for r in rates) else
               "No original dataset was measured, so there are no speedups.")
    return Document("looptune pack --bench", subtitle, [
        Section("Read throughput",
                [Callout(head), table, Figure(name="pack.png", alt="samples per second per way", caption=caption,
                                              png=png)]),
        provenance_section(data.get("provenance"))])

