"""How many DataLoader workers, and what they gain: K workers overlap loading with the step.

The step becomes ``max(read / K, (rest + take) x slow, all CPU work / cores delivered)``:

* ``read``: the time one worker needs per batch, and ``take``: the main process's cost to take
  a ready batch from it (unpickling, the shared-memory hand-over: paid in the step's data wait,
  so never part of ``rest``), both measured after the script by a one-worker copy of the
  training loader (:mod:`looptune.diagnose.worker_read`); without it, the main process's own
  data wait and 0, and the reason says so. For a script without workers, ``read`` is the
  script's data wait times the worker's time over the main process's, both read back to back
  after the script: a machine that ran the script's few steps slower or faster than the
  measurement after it (a VM's neighbours) moves both alike, so the promise does not (a CI run
  promised 1 worker > 1.2x on a dataset one worker reads slower than the main process);
* ``slow``: what a busy worker's core costs the step's own threads, measured by replaying the
  step's model beside one busy process (:mod:`looptune.diagnose.scaling`); without a replay,
  threads / cores left;
* all of it together can go no faster than the cores the machine really delivers to that many
  busy processes (:func:`looptune.diagnose.env.cpu_capacity`, measured after the script: on a
  VM whose host lends its vCPUs to neighbours, fewer than ``os.cpu_count()``).
"""

from __future__ import annotations

from looptune.diagnose.rules.profile import StepProfile, amdahl
from looptune.diagnose.rules.records import Remedy
from looptune.measure.records import Measurements

__all__ = ["MAX_SPEEDUP", "MAX_WORKERS", "ONE_CORE_WAIT_REMOVED", "workers_remedy"]

# past ~8 workers decoding seldom scales and each costs RAM and /dev/shm. Assumed, not measured.
MAX_WORKERS = 8
# on one core, the share of the data wait that loading in the main process instead of workers
# removes: the gain can't be bounded from the numbers, so half. Assumed, not measured.
ONE_CORE_WAIT_REMOVED = 0.5
# the largest bound stated: 1 / (1 - MAX_REMOVED), as amdahl's cap; an int, so a capped bound
# reads 100 as before. Assumed, not measured.
MAX_SPEEDUP = 100


def workers_remedy(m: Measurements, p: StepProfile, s: float) -> list[Remedy]:
    """The DataLoader worker count with the best estimate (module docstring), at most cores - 1,
    as a remedy; none when the script already uses it."""
    if not m.loaders or m.env is None:  # no DataLoader seen, or unknown core count
        return []
    n, w = m.env.cpu_count, m.loaders[0].num_workers
    data, rest = p.phase_s["data_wait"], max(p.step_s - p.phase_s["data_wait"], 1e-9)
    if n - 1 < 1:  # one core: workers can only take turns with the step; load in the main process
        if w == 0:
            return []
        reason = (f"num_workers={w} on 1 core: the workers and the step take turns on it, plus "
                  "process hand-over costs; the gain can't be bounded from these numbers (half "
                  f"the {s:.1%} data wait assumed)")
        return [Remedy(action=_loader_action(0, p.on_cuda),
                       expected_speedup=round(amdahl(s, ONE_CORE_WAIT_REMOVED), 2),
                       reason=reason, kind="loader", estimated=True)]
    t = m.env.threads or n  # the step's intra-op threads

    bs = m.batch_scaling  # the model's replay beside one busy process: a worker's cost, measured
    crowded = (max(1.0, bs.beside_busy_s / bs.small_s) if bs is not None and bs.measured
               and bs.beside_busy_s and not p.on_cuda else None)

    def slow(k: int) -> float:  # the GPU does a CUDA step's arithmetic: its host threads idle
        if p.on_cuda:
            return 1.0
        model = t / max(min(t, n - k), 1)  # the step's threads share the cores left
        if crowded is None:
            return model
        return crowded if k == 1 else max(model, crowded)  # more workers leave no more room

    c = m.env.cpu_capacity if m.env.cpu_capacity and not p.on_cuda else None
    wr = m.worker_read
    read, take = (wr.batch_s, wr.receive_s) if wr is not None and wr.measured else (data, 0.0)
    relative = w == 0 and wr is not None and wr.measured and bool(wr.main_s)
    if relative:  # the script's own read, scaled by the worker's pace against the main process's
        read = data * wr.batch_s / wr.main_s  # type: ignore[operator]

    # the script has workers: reading in the main process instead is a candidate too (measured)
    main = wr.main_s if w > 0 and wr is not None and wr.measured and wr.main_s else None
    # the rest was measured beside the script's own workers, busy read / step of the time: alone
    # it is shorter (each candidate below slows it again by its own workers)
    busy = min(1.0, read / p.step_s) if w > 0 else 0.0
    measured_rest, rest = rest, rest / (1 + (slow(w) - 1) * busy)
    shared = (read + take + rest) / c if c else 0.0  # all the CPU work, on the cores delivered

    def took(j: int) -> float:
        if j == 0:
            return main + rest  # type: ignore[operator] - only a candidate when measured
        return max(read / j, (rest + take) * slow(j), shared)

    counts = ([0] if main is not None else []) + list(range(1, min(n - 1, MAX_WORKERS) + 1))
    k = max(counts, key=lambda j: (p.step_s / took(j), -j))
    if w == k:
        return []
    bound = p.step_s / took(k)
    if k == 0:
        best = max(counts[1:], key=lambda j: (p.step_s / took(j), -j), default=None)
        other = "" if best is None else (
            f"; {best} worker(s) would take {took(best) * 1e3:.2f} ms by the same model (one reads "
            f"a batch in {read * 1e3:.2f} ms, {take * 1e3:.3f} ms to take it, the step slowed "
            f"{slow(best):.2g}x beside it)")
        return [Remedy(action=_loader_action(0, p.on_cuda), kind="loader",
                       expected_speedup=round(min(bound, MAX_SPEEDUP), 2), reason=(
            f"num_workers={w} on {n} cores: the main process reads a batch in {main * 1e3:.2f} ms "
            f"(measured alone after the script), so without workers the step takes "
            f"{main * 1e3:.2f} + {rest * 1e3:.2f} ms of the rest = {took(0) * 1e3:.2f} ms against "
            f"{p.step_s * 1e3:.2f} ms now (the rest took {measured_rest * 1e3:.2f} ms beside "
            f"{w} worker(s) busy {busy:.0%} of the time; {slow(w):.2g}x slower beside busy ones)"
            f"{other}"))]
    cap = (f", (read + take + rest) / {c:.2g} = {shared * 1e3:.2f}" if c else "")
    why = (f"max(read / {k}, (rest + take) x {slow(k):.2g}"
           f"{', all / cores delivered' if c else ''}) = max({read * 1e3:.2f} / {k}, "
           f"{(rest + take) * slow(k) * 1e3:.2f}{cap}) ms, {_read_evidence(wr, data, relative)}"
           + ("" if p.on_cuda else (
               f"; slow = {slow(k):.2g}: " + (
                   f"the step's model ({bs.module}) replayed beside one busy process took "
                   f"{crowded:.2f}x as long as alone" + (
                       "" if k == 1 else f", at least the {t} thread(s) sharing {n - k} core(s)")
                   if crowded is not None else
                   f"the step's {t} thread(s) keep {max(min(t, n - k), 1)} of {n} cores beside "
                   f"{k} busy worker(s) (not measured: no replay of the model)")
               + (f"; this machine delivered {c:.2g} of {n} cores to {n} busy processes "
                  "(measured after the script)" if c else ""))))
    head = (f"num_workers={w} on {n} cores: workers and the step compete for the CPU; {k} "
            "worker(s) leave cores to the step" if w > k else
            f"data wait is {s:.1%} of the step with num_workers={w}; {k} worker(s) overlap "
            "loading with the step")
    return [Remedy(action=_loader_action(k, p.on_cuda), expected_speedup=round(min(bound, MAX_SPEEDUP), 2),
                   reason=f"{head}, which then takes {why}", kind="loader")]


def _read_evidence(wr, data: float, relative: bool = False) -> str:
    """Where ``read`` and ``take`` came from."""
    if relative:
        return (f"read = the script's data wait {data * 1e3:.2f} ms x {wr.batch_s * 1e3:.2f} / "
                f"{wr.main_s * 1e3:.2f} ms (one worker's time per batch against the main "
                f"process's, {wr.batches} batches of this loader read back to back after the "
                f"script), take = {wr.receive_s * 1e3:.3f} ms")
    if wr is not None and wr.measured:
        return (f"read = {wr.batch_s * 1e3:.2f} ms per batch from one worker and take = "
                f"{wr.receive_s * 1e3:.3f} ms (one worker read {wr.batches} batches of this "
                f"loader after the script; the main process's data wait was {data * 1e3:.2f} ms)")
    why = wr.note if wr is not None and wr.note else "not measured"
    return (f"read = the main process's data wait, take = 0 (one worker's rate: {why}; "
            "a worker also pickles each batch, so this may promise too much)")


def _loader_action(workers: int, on_cuda: bool) -> str:
    """A literal DataLoader(...) call (--verify applies its kwargs); persistent_workers=True
    without workers makes DataLoader raise."""
    kwargs = f"num_workers={workers}" + (", persistent_workers=True" if workers else "")
    return f"DataLoader({kwargs}{', pin_memory=True' if on_cuda else ''})"
