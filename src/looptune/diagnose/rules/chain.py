"""Which link of the input chain starves the step, when the step waits for data
(``data_cause``), and each cause's own remedies; and contention inside the step.

The links, per batch, from :class:`looptune.measure.records.ChainTotals`: **storage** (time in
the dataset neither on a CPU nor waiting for one: blocked on reads), **decode** (the dataset on a
CPU: decoding, transforms), **collate**, **transfer** (the worker pickling the batch, the main
process receiving and unpickling it, pinning) and **contention** (fetch and collate runnable but
waiting for a CPU: more busy processes than cores). The largest names the cause. Contention also
wins when the workers wait for a CPU at least as long as they run (CONTENTION_RATIO): the other
links are then slowed by it, not the other way round.
"""

from __future__ import annotations

from typing import Any

from looptune.diagnose.rules.profile import REMEDY_SHARE, StepProfile, amdahl_remedy, mib
from looptune.diagnose.rules.records import Finding, Remedy
from looptune.measure.records import Measurements

__all__ = ["CAUSES", "CONTENTION_RATIO", "STEP_CONTENTION_SHARE", "chain_remedies",
           "data_cause", "step_contention"]

CAUSES = ("storage", "decode", "collate", "transfer", "contention")
# workers that wait for a CPU at least this many times as long as they run on one are starved
# by contention whatever else is slow: there are more busy threads than cores. Assumed, not
# measured (1.0: waiting as long as running).
CONTENTION_RATIO = 1.0
# the training step's own threads waiting for a CPU this share of their run time, while workers
# run beside them, is worth a finding even when the data wait is small: the cost shows inside
# the step, not in the wait. Assumed, not measured.
STEP_CONTENTION_SHARE = 0.2


def data_cause(m: Measurements, p: StepProfile | None = None
               ) -> tuple[str, dict[str, Any]] | None:
    """(cause, evidence) for the chain measured in the window; None when nothing was fetched
    (the chain was not seen: ``m.input_chain_note`` says why). With the step's profile, the
    ceiling: the step with a free input pipeline (its other phases, measured in the same
    steps)."""
    c = m.input_chain
    if c is None or c.batches == 0:
        return None
    links = c.links_s
    total = sum(links.values())
    if total <= 0:
        return None
    running = (links["decode"] + links["collate"] + links["transfer"]) * c.batches  # CPU work
    waiting = links["contention"] * c.batches
    starved = c.proc and running > 0 and waiting >= CONTENTION_RATIO * running
    cause = "contention" if starved else max(CAUSES, key=lambda k: links[k])
    per_ms = {k: round(v * 1e3, 4) for k, v in links.items()}
    shares = {k: round(v / total, 4) for k, v in links.items()}
    who = (f"{c.workers} worker process(es)" if c.workers else "the main process (num_workers=0)")
    read = (f"; storage delivered {mib(c.per_batch(c.read_bytes))} per batch of "
            f"{mib(c.per_batch(c.rchar))} read (the rest from the page cache)"
            if c.proc else "; /proc is not readable here: storage and the waits for a CPU are "
                           "not split out (they count as storage)")
    why = ("waiting for a CPU at least as long as running on one "
           f"({waiting * 1e3 / c.batches:.3f} vs {running * 1e3 / c.batches:.3f} ms per batch: "
           f">= {CONTENTION_RATIO:g}x)" if starved else f"the largest link ({shares[cause]:.0%})")
    reason = (f"{c.batches} batches fetched by {who} in the measured steps; per batch: "
              + ", ".join(f"{k} {per_ms[k]:.3f} ms" for k in CAUSES)
              + f"{read}; {cause}: {why}")
    ceiling = {}
    if p is not None and p.step_s > p.phase_s["data_wait"] > 0:
        rest = p.step_s - p.phase_s["data_wait"]
        ceiling = {"ceiling": round(p.step_s / rest, 2), "ceiling_reason": (
            f"with a free input pipeline the step would run {p.step_s / rest:.2f}x faster: "
            f"{p.step_s * 1e3:.3f} ms -> {rest * 1e3:.3f} ms, its other phases as measured in the "
            "same steps (contention inside the step not removed)")}
    return cause, {"cause": cause, "reason": reason, "links_ms": per_ms, "shares": shares,
                   **ceiling,
                   "batches": c.batches, "workers": c.workers,
                   "read_mib_per_batch": round(c.per_batch(c.read_bytes) / 2**20, 4),
                   "cached_mib_per_batch": round(
                       c.per_batch(max(0.0, c.rchar - c.read_bytes)) / 2**20, 4),
                   "receive_ms": round(c.per_batch(c.receive_s) * 1e3, 4),
                   "pin_ms": round(c.per_batch(c.pin_s) * 1e3, 4),
                   "worker_pickle_ms": round(c.per_batch(c.other_cpu_s) * 1e3, 4),
                   "proc": c.proc}


def chain_remedies(m: Measurements, p: StepProfile, cause: str,
                   evidence: dict[str, Any]) -> list[Remedy]:
    """The cause's own remedies, each bounded by removing that link's share of the data wait
    (assumed proportional: with workers, the wait shrinks with the chain's cost per batch)."""
    s = p.shares["data_wait"]
    link = evidence["shares"][cause]
    if s * link < REMEDY_SHARE / 2:
        return []
    head = (f"data wait {s:.1%} of the step, {cause} {link:.0%} of the chain per batch "
            f"({evidence['links_ms'][cause]:.3f} ms): 1/(1 - {s:.4f} x {link:.4f}); the wait "
            "assumed to shrink with the link")
    info = m.loaders[0] if m.loaders else None
    workers = info.num_workers if info else 0
    cores = m.env.cpu_count if m.env else None
    actions = {
        "storage": ("pack the dataset into contiguous shards (`looptune pack`: memmap, LMDB) and "
                    "read whole batches; more reads in flight (more workers, prefetch_factor) cost "
                    "no CPU while they wait on the device"),
        "collate": ("make collate_fn cheaper: return tensors stacked once (torch.stack of "
                    "per-sample tensors, not Python lists or per-field loops), or collate in the "
                    "dataset's __getitems__ over whole batches"),
        "transfer": ("return tensors (not numpy arrays or Python objects) from collate_fn: "
                     "tensors travel through shared memory, others are pickled through a pipe; "
                     "ship uint8 and normalize on the device"),
        # a DataLoader call, so that --verify can rerun it (diagnose/verify.py)
        "contention": f"DataLoader(num_workers={max(0, min(workers, cores or 1) - 1)})",
    }
    if cause not in actions:  # decode: the pre-decode / batched augmentation / workers remedies
        return []
    if cause == "contention":
        head += (f"; {workers} worker(s) and the step on {cores} core(s): one core left to the "
                 "step (or fewer intra-op threads: torch.set_num_threads)")
    out = [amdahl_remedy(action=actions[cause], share=s, fraction=link, reason=head,
                         kind=f"chain_{cause}")]
    links, total = evidence["links_ms"], sum(evidence["links_ms"].values())
    inline = links["transfer"] - links["decode"] - links["collate"]
    if cause == "transfer" and workers and total > 0 and inline > 0:
        out.append(amdahl_remedy(
            action="DataLoader(num_workers=0)", share=s, fraction=inline / total, reason=(
                f"fetch + collate cost {links['decode'] + links['collate']:.3f} ms per batch, "
                f"moving the batch from a worker {links['transfer']:.3f} ms: in the main process "
                f"the difference is saved, 1/(1 - {s:.4f} x {inline / total:.4f})"),
            kind="chain_no_workers"))
    return out


def step_contention(m: Measurements) -> Finding | None:
    """The step's threads waiting for a CPU while workers run beside them."""
    c = m.input_chain
    if c is None or not c.proc or not c.workers or c.main_run_s <= 0:
        return None
    share = c.main_runq_s / c.main_run_s
    if share < STEP_CONTENTION_SHARE:
        return None
    cores = m.env.cpu_count if m.env else None
    return Finding(name="step_contention", severity="warning", message=(
        f"the training process's threads waited for a CPU {share:.0%} as long as they ran "
        f"({c.main_runq_s:.3f} s vs {c.main_run_s:.3f} s in the measured steps) beside "
        f"{c.workers} DataLoader worker(s) on {cores} core(s): the cost shows inside the step, "
        f"not in the data wait (>= {STEP_CONTENTION_SHARE:.0%}); try fewer workers"))
