"""The report of ``looptune diagnose`` results: one Diagnosis, or a distributed job's ranks."""

from __future__ import annotations

from statistics import median
from typing import Any

from looptune._format import format_bytes
from looptune.measure.records import PHASES
from looptune.diagnose.result import Diagnosis
from looptune.diagnose.rules.records import Remedy
from looptune.report import plots
from looptune.report._sections import fmt, key_values, provenance_section
from looptune.report.document import Bullets, Callout, Document, Figure, Section, Table, Text

__all__ = ["build", "build_ranks", "part_rows"]

PHASE_TEXT = {"data_wait": "data wait", "host_to_device": "host-to-device copies",
              "sync": "host syncs", "compute": "compute", "other": "other host overhead",
              "collectives": "collectives (waiting for other ranks)"}
# the vocabulary of DESIGN.md: what each bottleneck means, in one clause
MEANING = {"data_loading": "the step waits for the next batch",
           "host_to_device": "copies to the device dominate",
           "overhead": "the step takes far longer than its arithmetic needs",
           "compute": "the arithmetic itself dominates",
           "memory": "near the device's memory limit"}
STALL = 2.0  # a step this many times the median is called a stall
PART_TEXT = {"forward": "forward (with the loss)", "backward": "backward",
             "optimizer": "optimizer (all its parts)", "optimizer.update": "update (optimizer.step)",
             "optimizer.zero_grad": "zero_grad", "optimizer.clip_grad": "gradient clipping",
             "optimizer.grad_scaler": "GradScaler (unscale, inf checks, step, update)",
             "optimizer.lr_scheduler": "LR scheduler step"}


def part_rows(d: Diagnosis) -> list[tuple[str, float, float]]:
    """(label, median ms, share) of the step's own parts, indented under compute: forward,
    backward, optimizer and the optimizer's parts below it (host time, timed exclusively)."""
    return [(("    " if k.startswith("optimizer.") else "  ") + "of which " + PART_TEXT[k]
             if not k.startswith("optimizer.") else "    " + PART_TEXT[k],
             d.part_ms[k], d.part_shares.get(k, 0.0)) for k in PART_TEXT if k in d.part_ms]


def build(data: dict[str, Any]) -> Document:
    d = Diagnosis.from_dict(data)
    return Document(f"looptune diagnose: {d.script}", _subtitle(d), sections(d))


def _subtitle(d: Diagnosis) -> str:
    p = d.provenance
    return (f"{d.steps_measured} steps measured after {d.warmup_steps} warm-up, median step "
            f"{d.step_ms:.2f} ms, on {p.get('device', 'n/a')} ({p.get('device_name', 'n/a')}), "
            f"{p.get('date', '')}")


def sections(d: Diagnosis, prefix: str = "", files: str = "") -> list[Section]:
    """The sections of one diagnosis; ``prefix`` heads them and ``files`` prefixes PNG names."""
    verdict = [Callout(f"bottleneck: {d.bottleneck} ({MEANING.get(d.bottleneck, '')})"),
               _breakdown_table(d), _breakdown_figure(d, files)]
    if d.error:
        verdict.append(Text(f"The script raised: {d.error}"))
    out = [Section(f"{prefix}Verdict", verdict), _steps(d, prefix, files),
           Section(f"{prefix}Evidence", [key_values({**d.evidence, "peak memory":
                                                     f"{format_bytes(d.peak_mem_bytes)} "
                                                     f"({d.peak_mem_kind})"})])]
    if d.input_chain:
        out.append(_input_chain(d, prefix))
    if d.findings:
        out.append(Section(f"{prefix}Findings",
                           [Bullets([f"[{f.severity}] {f.message}" for f in d.findings])]))
    out.append(_remedies(d, prefix, files))
    if d.verify:
        out.append(_verify(d.verify, prefix, files))
    if not prefix:
        out.append(provenance_section(d.provenance))
    return out


def _input_chain(d: Diagnosis, prefix: str) -> Section:
    """Inside the data wait: each link's ms per batch and share, the cause, what was not seen."""
    c = d.input_chain
    parts: list[Any] = []
    if c.get("links_ms"):
        head = (f"data cause: {d.data_cause}" if d.data_cause
                else f"not the bottleneck; largest link: {c['cause']}")
        parts.append(Callout(head))
        parts.append(Table(["link", "ms per batch", "share of the chain"],
                           [[k, f"{v:.3f}", f"{100 * c['shares'][k]:.1f}%"]
                            for k, v in c["links_ms"].items()], right={1, 2}))
        parts.append(Text(c["reason"]))
        if c.get("ceiling_reason"):
            parts.append(Text(c["ceiling_reason"]))
    if c.get("note"):
        parts.append(Text(f"Not seen: {c['note']}"))
    return Section(f"{prefix}Input chain", parts)


def _breakdown_table(d: Diagnosis) -> Table:
    rows = []
    for p in PHASES:
        rows.append([PHASE_TEXT[p], f"{d.phase_ms.get(p, 0.0):.3f}",
                     f"{100 * d.shares.get(p, 0.0):.1f}%"])
        if p == "compute":  # the step's own parts, timed inside it (host time)
            rows += [[label, f"{ms:.3f}", f"{100 * share:.1f}%"]
                     for label, ms, share in part_rows(d)]
    return Table(["phase", "median ms/step", "share"], rows, right={1, 2})


def _breakdown_figure(d: Diagnosis, files: str) -> Figure:
    segments = {f"{PHASE_TEXT[p]}: {d.phase_ms.get(p, 0.0):.2f} ms ({d.shares.get(p, 0.0):.0%})":
                [d.phase_ms.get(p, 0.0)] for p in PHASES}
    png = plots.stacked_hbars(["median step"], segments, title="Where a step's time goes",
                              xlabel="ms per optimizer step (median of each phase)",
                              notes=[f"{d.step_ms:.2f} ms/step"])
    return Figure(name=f"{files}breakdown.png", alt="median step split into phases",
                  caption="Each phase's median over the measured steps (the medians need not add up "
                  "exactly to the median step).", png=png)


def _steps(d: Diagnosis, prefix: str, files: str) -> Section:
    before = [1000 * s for s in d.warmup_step_s]
    first = len(before) + 1
    xs = list(range(first, first + len(d.step_s)))
    series = [plots.Series(label="step time", x=[*range(1, first), *xs],
                           y=[*before, *(1000 * s for s in d.step_s)])]
    areas = []
    if d.data_wait_step_s and len(d.data_wait_step_s) == len(d.step_s):
        areas.append(plots.Series(label="of which data wait", x=xs, y=[1000 * w for w in d.data_wait_step_s]))
    if d.wait_s and len(d.wait_s) == len(d.step_s):  # a rank: blocked on the others
        areas.append(plots.Series(label="of which waiting for other ranks", x=xs,
                                  y=[1000 * w for w in d.wait_s]))
    spans = [(0.5, first - 0.5, "warm-up (not measured)")] if before else []
    # start-up steps can be 10-100x the steady state: cut the axis so the measured steps show
    top = 1.25 * max(1000 * max(d.step_s, default=0.0), 2 * d.step_ms)
    png = plots.lines(series, title="Time of every step", xlabel="optimizer step",
                      ylabel="ms per step", hlines=[(d.step_ms, f"median {d.step_ms:.2f} ms")],
                      spans=spans, areas=areas, integer_x=True, yunit=" ms",
                      ymax=top if max(before, default=0.0) > top else None)
    figure = Figure(name=f"{files}steps.png", alt="time of every optimizer step", caption=_stalls(d), png=png)
    return Section(f"{prefix}Step times", [figure])


def _stalls(d: Diagnosis) -> str:
    if not d.step_s:
        return "No step was measured."
    mid = median(d.step_s)
    slow = [s for s in d.step_s if s > STALL * mid]
    text = (f"{len(slow)} of {len(d.step_s)} measured steps took more than {STALL:g}x the median"
            + (f" (the slowest {1000 * max(slow):.2f} ms)." if slow else "."))
    if d.warmup_step_s:
        text += (f" The {len(d.warmup_step_s)} steps before the measurement (warm-up, one "
                 "FLOP-counted step, any profiler window) are shaded and left out of every median.")
    return text


def bound_text(r: Remedy) -> str:
    """"up to 1.42x", or "up to 1.42x, estimated" where the bound rests on an assumed fraction
    (``Remedy.estimated``) rather than on the script's own work measured."""
    return f"up to {r.expected_speedup:.2f}x" + (", estimated" if r.estimated else "")


def _remedies(d: Diagnosis, prefix: str, files: str) -> Section:
    if not d.remedies:
        return Section(f"{prefix}Remedies", [Text("No remedy is expected to gain more than "
                                                  "run-to-run noise.")])
    rows = [[str(i), r.action, bound_text(r) + (
        "" if r.measured_speedup is None else f", measured {r.measured_speedup:.2f}x"), r.reason]
            for i, r in enumerate(d.remedies, 1)]
    bars = [plots.Bar(label=r.action, value=r.expected_speedup, note=bound_text(r))
            for r in d.remedies]
    png = plots.hbars(bars, title="Remedies (measured bounds first, then estimated)", base=1.0,
                      xlabel="expected whole-step speedup, upper bound (x; 1 = no gain)")
    caption = ("Upper bounds from the measured shares (Amdahl): what the step would gain if the "
               "remedy removed its phase's time as stated. An estimated bound rests on an "
               "assumed fraction (docs/diagnose.md names each), not on this script's work "
               "measured, and ranks after every measured one.")
    return Section(f"{prefix}Remedies", [Table(["#", "remedy", "expected gain", "why"], rows,
                                                right={0}),
                                          Figure(name=f"{files}remedies.png", alt="expected speedup per "
                                                 "remedy", caption=caption, png=png)])


def _verify(v: dict[str, Any], prefix: str, files: str) -> Section:
    title = f"{prefix}Verify: the top remedy that can be applied, rerun"
    if not v.get("remedy") or v.get("after_step_ms") is None:
        return Section(title, [Text(v.get("reason") or v.get("error") or "nothing was rerun")])
    before, after, bound = v["before_step_ms"], v["after_step_ms"], v["expected_speedup"]
    measured = "n/a" if v.get("speedup") is None else f"{v['speedup']:.2f}x"
    bars = [plots.Bar(label="before", value=before, note=f"{before:.2f} ms"),
            plots.Bar(label="after (measured)", value=after, note=f"{after:.2f} ms ({measured})", highlight=True),
            plots.Bar(label="after, if the bound held", value=before / bound, note=f"{before / bound:.2f} ms "
                      f"(up to {bound:.2f}x)")]
    png = plots.hbars(bars, title=f"Before and after {v['remedy']}", xlabel="median ms per step",
                      highlight_label="measured with the remedy")
    rows = [["remedy", v["remedy"]], ["before, ms/step", fmt(before)],
            ["after, ms/step", fmt(after)], ["speedup measured", measured],
            ["expected, up to", f"{bound:.2f}x"]]
    if v.get("per_sample_speedup") is not None:
        rows.append(["per sample (context)", f"{v['per_sample_speedup']:.2f}x"])
    if v.get("loss_parity") is not None:
        rows.append(["loss parity", "yes" if v["loss_parity"] else "no"])
    if v.get("of_promise") is not None:
        rows.append(["share of the promise", f"{v['of_promise']:.0%}"])
    rows += [[k.replace("_", " "), str(v[k])]
             for k in ("note", "partial", "not_comparable", "short", "changes_training") if v.get(k)]
    check = v.get("loss_check") or {}
    if check.get("reason"):
        rows.append(["losses compared", check["reason"]])
    if (v.get("time_to_loss") or {}).get("reason"):
        rows.append(["time to the same loss", v["time_to_loss"]["reason"]])
    blocks: list[Any] = [Table(["", "value"], rows),
                         Figure(name=f"{files}verify.png", alt="step time before and after the remedy",
                                caption="The same script rerun with the remedy applied from outside.",
                                png=png)]
    if v.get("reason"):
        blocks.append(Text(v["reason"]))
    return Section(title, blocks)


def build_ranks(data: dict[str, Any]) -> Document:
    """A distributed job's diagnosis: a row per rank, the slowest rank, its full diagnosis."""
    ranks = [Diagnosis.from_dict(r) for r in data["ranks"]]
    rows, slowest = data["rows"], data["slowest_rank"]
    d = next(r for r in ranks if r.rank == slowest) if any(r.rank == slowest for r in ranks) \
        else ranks[0]
    waits = any("collectives" in r["shares"] for r in rows)
    phases = [*PHASES, *(["collectives"] if waits else [])]
    segments = {PHASE_TEXT[p]: [r["step_ms"] * r["shares"].get(p, 0.0) for r in rows]
                for p in phases}
    png = plots.stacked_hbars([f"rank {r['rank']}" for r in rows], segments,
                              title=f"Where each rank's step goes ({data['world_size']} ranks)",
                              xlabel="ms per optimizer step (median step x phase share)",
                              notes=[f"{r['step_ms']:.2f} ms" + (" (slowest)" if r["rank"] ==
                                                                  slowest else "") for r in rows])
    table = Table(["rank", "steps", "step ms", "own ms", "wait ms", "peak mem", "bottleneck"],
                  [[str(r["rank"]), str(r["steps_measured"]), fmt(r["step_ms"]), fmt(r["own_ms"]),
                    fmt(r["wait_ms"]), format_bytes(r["peak_mem_bytes"]), r["bottleneck"]]
                   for r in rows], right={0, 1, 2, 3, 4})
    head = ("ranks balanced" if data["balanced"] else f"slowest rank: {slowest}") + \
        f" ({data['slowdown']:.2f}x rank {data['fastest_rank']}, the fastest)"
    blocks: list[Any] = [Callout(head), Text(data["reason"]), table,
                         Figure(name="ranks.png", alt="per-rank step breakdown", caption="Each rank's median step "
                                "split by its phase shares.", png=png)]
    if data.get("missing_ranks"):
        blocks.append(Text(f"Rank(s) {data['missing_ranks']} wrote no diagnosis (failed, stopped, "
                           "or on another node)."))
    return Document(f"looptune diagnose: {d.script} on {data['world_size']} ranks", _subtitle(d),
                    [Section("Ranks", blocks), *sections(d, f"Rank {d.rank}: ", f"rank{d.rank}-"),
                     provenance_section(d.provenance)])
