"""``thread_policy='adaptive'``: the intra-op thread count follows the machine while training.

On a small CPU machine the fastest thread count changes under a run's feet. With every core free,
all of them win (a batch-64 MLP step on a 2-vCPU VM: 245 us on 2 threads, 290 on 1); when another
process or a noisy neighbour takes one core, OpenMP's threads wait at every barrier for the
descheduled one, and fewer threads win by far (the same step: 360-390 us on 2 threads against
~300 on 1 for tens of seconds at a time; beside one busy process, 1.2-1.6 s per epoch on 2 threads
against 0.30 on 1). A thread count chosen once, at setup, is wrong for part of the run.

The governor times the training loop in short windows (at least ``WINDOW_S`` and ``MIN_STEPS``
steps, wall clock: on a CPU the step is synchronous; the run's first window, with its first-step
allocations, is dropped) and now and then runs one window on another
thread count; it moves to that count when the window ran at least ``MARGIN`` faster per step than
the median of the last windows at the current one. Where the step has a call that changes
nothing the run keeps (the written-out MLP step on a zero batch), the start count is first timed
against the others at setup (:meth:`ThreadGovernor.calibrate`). It explores after the first two
windows (a short run must find a slow phase early), then after ``EXPLORE_EVERY`` windows, twice as many
after each exploration that did not pay (up to ``MAX_EVERY``), and at once when a window runs
``JUMP`` slower than the ones before it (the machine changed). An exploring window is short
(``EXPLORE_S``): in a quiet phase the cost is those windows only, each ~20% slower on that VM,
fewer and fewer of them (measured: ~2% of a 5-epoch run). A move is confirmed by the ``RECENT``
full windows after it: where their median is not faster than the count it left ran, one short
window was luck and the run goes back (a CI run beside a busy process moved 1 -> 2 threads on
one 206 us/step exploring window, then ran 2 threads at 405 us/step against 1 thread's 253 for
the rest of its epoch).

Thread counts change the blocking of the GEMMs, so the steps of an exploring window, and all
after a switch, differ in the last bits from the same steps at the first count: an adaptive run
is not bit-reproducible (what it measured and every switch are in the run's decisions); set
``thread_policy='fixed'`` for a bit-reproducible run. Off on CUDA (the GPU does the arithmetic) and
in a multi-process job (a rank's step time includes waiting for the others).
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from looptune.recipe import Decision

__all__ = ["ThreadGovernor", "candidates_for", "governor_for", "thread_summary"]

WINDOW_S = 0.03  # a window: at least this long ...
MIN_STEPS = 8  # ... and this many steps
EXPLORE_S = 0.005  # an exploring window: shorter (it runs at the count that is probably slower)
EXPLORE_EVERY = 10  # windows at the current count before the next exploration ...
MAX_EVERY = 80  # ... doubled after each one that did not pay, up to this
MARGIN = 0.05  # another count must be at least 5% faster per step to take over
JUMP = 1.25  # a window this much slower than the recent ones explores at once
RECENT = 3  # windows whose median stands for the current count
KEEP = 2000  # windows kept per count for the summary (a long run keeps its last ones)
CALIBRATE_ROUNDS, CALIBRATE_S = 3, 0.004  # set-up timing of the start count (calibrate())


def candidates_for(cores: int) -> list[int]:
    """Thread counts to choose from on ``cores`` usable cores: all, half, one (most first)."""
    return sorted({cores, max(1, cores // 2), 1}, reverse=True)


@dataclass(kw_only=True)
class ThreadGovernor:
    """Call :meth:`tick` after every training step and :meth:`new_window` whenever the clock was
    paused (evaluation, checkpoints); :meth:`decision` summarizes what it measured and did."""

    candidates: list[int]
    start: int
    set_threads: Callable[[int], None] = torch.set_num_threads
    clock: Callable[[], float] = time.perf_counter
    window_s: float = WINDOW_S
    explore_s: float = EXPLORE_S
    current: int = 0
    switches: list[str] = field(default_factory=list)
    per_step: dict[int, deque[float]] = field(default_factory=dict)  # windows' s/step by count
    windows: dict[int, int] = field(default_factory=dict)  # windows run at each count
    _exploring: int | None = None
    _explored_once: bool = False
    _jumped: bool = False  # a window ran JUMP slower than the recent ones: explore soon
    _warm: bool = False  # the run's first window (first-step allocations) was dropped
    _since: int = 0  # windows at the current count since the last exploration
    _left: tuple[int, float, int] | None = None  # a move to confirm: the count left, its
    # s/step and the exploration interval there
    _trial: list[float] = field(default_factory=list)  # full windows since that move
    _every: int = EXPLORE_EVERY
    _recent: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT))
    _next_alt: int = 0
    _steps: int = 0
    _total: int = 0  # steps since the start (for the switches' record)
    _t0: float = 0.0
    calibrated: dict[int, float] = field(default_factory=dict)  # set-up timing, s per call

    def __post_init__(self) -> None:
        self.current = self.start
        self.per_step = {c: deque(maxlen=KEEP) for c in self.candidates}
        self.windows = {c: 0 for c in self.candidates}
        self.set_threads(self.start)
        self.new_window()

    def calibrate(self, call: Callable[[], object], rounds: int = CALIBRATE_ROUNDS,
                  round_s: float = CALIBRATE_S) -> None:
        """Pick the starting count from ``call`` (a step's forward and backward that changes
        nothing the run keeps), timed at every candidate count in interleaved rounds at setup,
        before the clock starts: a run that begins in a slow phase starts at the count that
        is fast now instead of finding it after its first windows. The start moves only when
        another count is ``MARGIN`` faster."""
        times: dict[int, list[float]] = {c: [] for c in self.candidates}
        for _ in range(rounds):
            for c in self.candidates:
                self.set_threads(c)
                call()  # the first call after a change pays the thread pool's wake-up
                t0, n = self.clock(), 0
                while (elapsed := self.clock() - t0) < round_s or n < 2:
                    call()
                    n += 1
                times[c].append(elapsed / n)
        self.calibrated = {c: statistics.median(v) for c, v in times.items()}
        best = min(self.calibrated, key=self.calibrated.__getitem__)
        if self.calibrated[best] <= (1 - MARGIN) * self.calibrated[self.start]:
            self.current = best
            self.switches.append(f"{self.start} -> {best} threads at setup ("
                                 f"{self.calibrated[self.start] * 1e6:.0f} -> "
                                 f"{self.calibrated[best] * 1e6:.0f} us per forward+backward)")
        self.set_threads(self.current)
        self.new_window()

    def new_window(self) -> None:
        """Start timing afresh (time spent off the training clock is not a step's)."""
        self._steps, self._t0 = 0, self.clock()

    def tick(self) -> None:
        self._steps += 1
        self._total += 1
        if self._steps < MIN_STEPS:
            return
        now = self.clock()
        if now - self._t0 >= (self.window_s if self._exploring is None else self.explore_s):
            self._window_done((now - self._t0) / self._steps)
            self._steps, self._t0 = 0, self.clock()

    def _window_done(self, per_step: float) -> None:
        if not self._warm:
            self._warm = True
            return
        ran = self._exploring if self._exploring is not None else self.current
        self.per_step[ran].append(per_step)
        self.windows[ran] += 1
        if self._exploring is not None:
            self._explored(self._exploring, per_step)
            return
        if self._left is not None and self._confirm(per_step):
            return
        if len(self._recent) == RECENT and per_step > JUMP * statistics.median(self._recent):
            self._jumped = True  # explored as soon as RECENT windows passed since the last
        self._recent.append(per_step)
        self._since += 1
        due = self._since >= (self._every if self._explored_once else 2)
        if due or (self._jumped and self._since >= RECENT):
            self._explore()

    def _explore(self) -> None:
        others = [c for c in self.candidates if c != self.current]
        if not others:
            return
        self._exploring, self._explored_once = others[self._next_alt % len(others)], True
        self._jumped = False
        self._next_alt += 1
        self.set_threads(self._exploring)

    def _explored(self, alt: int, per_step: float) -> None:
        self._exploring, self._since = None, 0
        home = statistics.median(self._recent)
        if per_step <= (1 - MARGIN) * home:
            self.switches.append(f"{self.current} -> {alt} threads after step {self._total} "
                                 f"({home * 1e6:.0f} -> {per_step * 1e6:.0f} us/step)")
            self._left, self._trial = (self.current, home, self._every), []
            self.current, self._every = alt, EXPLORE_EVERY
            self._recent.clear()
            self._recent.append(per_step)
        else:  # the current count is still the faster: look again later, less often
            self._every = min(MAX_EVERY, 2 * self._every)
        self.set_threads(self.current)

    def _confirm(self, per_step: float) -> bool:
        """After a move: once ``RECENT`` full windows ran at the new count, go back where their
        median is not faster than the count left ran before it. True when it went back."""
        self._trial.append(per_step)
        if len(self._trial) < RECENT:
            return False
        back, before, every = self._left  # type: ignore[misc]
        trial = statistics.median(self._trial)
        self._left, self._trial = None, []
        if trial < before:
            return False
        self.switches.append(f"{self.current} -> {back} threads after step {self._total} (back: "
                             f"{trial * 1e6:.0f} us/step in the {RECENT} windows after the move, "
                             f"{before * 1e6:.0f} before it)")
        self.current, self._since = back, 0
        self._every = min(MAX_EVERY, 2 * every)  # as after an exploration that did not pay
        self._recent.clear()
        self._recent.append(before)
        self.set_threads(back)
        return True

    def decision(self) -> Decision:
        parts = []
        for c in self.candidates:
            got = self.per_step[c]
            if got:
                parts.append(f"{c} thread(s): {self.windows[c]} window(s), median "
                             f"{statistics.median(got) * 1e6:.0f} us/step")
        moves = ("; switched " + "; ".join(self.switches[:6])
                 + (f" and {len(self.switches) - 6} more" if len(self.switches) > 6 else "")
                 if self.switches else "; no switch paid")
        setup = (" (set-up timing per forward+backward: " + ", ".join(
            f"{c} thread(s) {t * 1e6:.0f} us" for c, t in self.calibrated.items()) + ")"
            if self.calibrated else "")
        return Decision("thread_policy", "adaptive", reason=(
            f"intra-op threads among {self.candidates}, started at {self.start}{setup}, timed in "
            f"windows of >= {self.window_s * 1e3:.0f} ms: " + ", ".join(parts or ["no window"])
            + moves + f"; ended at {self.current}"), evidence={
                "switches": len(self.switches), "ended_at": self.current, "windows": {
                    str(c): n for c, n in self.windows.items()},
                "median_us_per_step": {str(c): round(statistics.median(v) * 1e6, 1)
                                       for c, v in self.per_step.items() if v}})


def governor_for(policy: str, threads: int | None, device: torch.device, world_size: int,
                 calibrate: Callable[[], object] | None = None
                 ) -> tuple[ThreadGovernor | None, Decision | None]:
    """The governor for a run (None with the reason when adaptive threads cannot apply);
    with ``calibrate`` (see :meth:`ThreadGovernor.calibrate`) its start is timed at setup."""
    if policy != "adaptive":
        return None, None
    if device.type != "cpu":
        return None, Decision("thread_policy", "fixed", reason=(
            f"adaptive threads: off on {device.type} (the device does the arithmetic)"))
    if world_size > 1:
        return None, Decision("thread_policy", "fixed", reason=(
            "adaptive threads: off with several ranks (a rank's step time includes waiting for "
            "the others, so it cannot judge its own thread count)"))
    cores = _usable_cores()
    choices = candidates_for(cores)
    if len(choices) == 1:
        return None, Decision("thread_policy", "fixed", reason=(
            "adaptive threads: one usable core, nothing to choose from"))
    start = threads if threads is not None else torch.get_num_threads()
    if start not in choices:
        choices = sorted({*choices, start}, reverse=True)
    governor = ThreadGovernor(candidates=choices, start=start)
    if calibrate is not None:
        governor.calibrate(calibrate)
    return governor, None


def _usable_cores() -> int:
    import os

    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def thread_summary(decisions: list[dict]) -> str | None:
    """A run's adaptive-threads record in a few words (from its decisions), for benchmark
    rounds; None when the run had no governor."""
    for d in decisions:
        ev = d.get("evidence")
        if d.get("name") == "thread_policy" and isinstance(ev, dict) and "switches" in ev:
            return f"threads: {ev['switches']} switch(es), ended at {ev['ended_at']}"
    return None
