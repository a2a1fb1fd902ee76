"""How many DataLoader workers, and what they gain: K workers overlap loading with the step.

The step becomes ``max(data wait / K, rest x slow, all CPU work / cores delivered)``: on a CPU the
step's own threads lose the cores the busy workers take (``slow`` = threads / cores left), and
all of it together can go no faster than the cores the machine really delivers to that many busy
processes (:func:`looptune.diagnose.env.cpu_capacity`, measured after the script: on a VM whose
host lends its vCPUs to neighbours, fewer than ``os.cpu_count()``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from looptune.diagnose.model import Measurements, Remedy

if TYPE_CHECKING:
    from looptune.diagnose.verdict import _Profile

__all__ = ["MAX_WORKERS", "workers_remedy"]

MAX_WORKERS = 8  # past ~8 workers decoding seldom scales and each costs RAM and /dev/shm


def workers_remedy(m: Measurements, p: _Profile, s: float) -> list[Remedy]:
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
        from looptune.diagnose.verdict import amdahl  # here: verdict imports this module

        return [Remedy(action=_loader_action(0, p.on_cuda), expected_speedup=round(amdahl(s, 0.5), 2),
                       reason=reason, kind="loader")]
    t = m.env.threads or n  # the step's intra-op threads

    def slow(k: int) -> float:  # the GPU does a CUDA step's arithmetic: its host threads idle
        return 1.0 if p.on_cuda else t / max(min(t, n - k), 1)

    c = m.env.cpu_capacity if m.env.cpu_capacity and not p.on_cuda else None
    shared = (data + rest) / c if c else 0.0  # all the CPU work, on the cores really delivered

    def took(j: int) -> float:
        return max(data / j, rest * slow(j), shared)

    k = max(range(1, min(n - 1, MAX_WORKERS) + 1), key=lambda j: (p.step_s / took(j), -j))
    if w == k:
        return []
    bound = p.step_s / took(k)
    cap = (f", (data + rest) / {c:.2g} = {shared * 1e3:.2f}" if c else "")
    why = (f"max(data wait / {k}, rest x {slow(k):.2g}{', all / cores delivered' if c else ''})"
           f" = max({data * 1e3:.2f} / {k}, {rest * slow(k) * 1e3:.2f}{cap}) ms"
           + ("" if p.on_cuda else (
               f": the step's {t} thread(s) keep {max(min(t, n - k), 1)} of {n} cores beside {k} "
               "busy worker(s)" + (f"; this machine delivered {c:.2g} of {n} cores to {n} busy "
                                   "processes (measured after the script)" if c else "")
               + "; process hand-over and spinning threads are not modelled, --verify "
               "measures it")))
    head = (f"num_workers={w} on {n} cores: workers and the step compete for the CPU; {k} "
            "worker(s) leave cores to the step" if w > k else
            f"data wait is {s:.1%} of the step with num_workers={w}; {k} worker(s) overlap "
            "loading with the step")
    return [Remedy(action=_loader_action(k, p.on_cuda), expected_speedup=round(min(bound, 100), 2),
                   reason=f"{head}, which then takes {why}", kind="loader")]


def _loader_action(workers: int, on_cuda: bool) -> str:
    """A literal DataLoader(...) call (--verify applies its kwargs); persistent_workers=True
    without workers makes DataLoader raise."""
    kwargs = f"num_workers={workers}" + (", persistent_workers=True" if workers else "")
    return f"DataLoader({kwargs}{', pin_memory=True' if on_cuda else ''})"
