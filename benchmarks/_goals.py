"""What decides a benchmark's exit code (issue 29), shared by the scripts in this folder.

A full run exits 1 when its goal is not met. ``--smoke`` (what CI runs) checks a weaker relation
that still cannot hold when the feature is broken: a speedup over the baseline measured in the same
run, by half the full goal (at least 1.2x: a margin above one recipe's run-to-run spread, which
stays well under 1.2x on a quiet machine); a verdict that agrees; a run that still learns.
Each check prints one ``smoke check:`` or ``goal:`` line ending in PASS or FAIL.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["SMOKE_SPEEDUP", "exit_code", "judged", "passfail", "smoke_check", "smoke_floor", "smoke_speedups"]

# a smoke run's speedup floor over the baseline of the same run, by default: no broken fast path
# reaches it, and no run-to-run spread of one recipe comes near it
SMOKE_SPEEDUP = 1.5


def smoke_floor(goal: float) -> float:
    """The smoke floor for a full goal of ``goal``x: half of it, never under 1.2x."""
    return max(1.2, goal / 2)


def passfail(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def smoke_check(what: str, ok: bool) -> bool:
    print(f"smoke check: {what}: {passfail(ok)}", flush=True)
    return ok


def smoke_speedups(pairs: Iterable[tuple[str, float]], floor: float = SMOKE_SPEEDUP,
                   against: str = "the baseline") -> bool:
    """Every (recipe, speedup vs the baseline of the same run) at least ``floor``."""
    pairs = list(pairs)
    ok = bool(pairs) and all(s >= floor for _, s in pairs)
    shown = ", ".join(f"{name} {s:.2f}x" for name, s in pairs) or "nothing measured"
    return smoke_check(f"{shown} vs {against}; each >= {floor:g}x", ok)


def judged(what: str, ok: bool, smoke: bool) -> int:
    """The exit code of a benchmark whose goal and smoke relation are the same check ``what``:
    printed as a ``smoke check:`` line under --smoke, else as a ``goal:`` line."""
    if smoke:
        return exit_code(False, smoke_check(what, ok), True)
    print(f"goal: {what}: {passfail(ok)}")
    return exit_code(ok, False, False)


def exit_code(goal_ok: bool, smoke_ok: bool, smoke: bool) -> int:
    """0 when the mode's check held: the goal in a full run, the smoke relation under --smoke."""
    return 0 if (smoke_ok if smoke else goal_ok) else 1
