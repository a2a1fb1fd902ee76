"""Loss parity: does a rerun with a remedy still train as the unmodified run did?

Pure functions of the per-step losses the probes saw (the scalar each step's backward started
from) and the steps' wall times; no torch.

* :func:`loss_parity` compares two runs over the same steps: the mean loss of the last window of
  steps, against a tolerance from the runs' own noise (the spread of the per-step loss in those
  windows: 3 standard errors of the difference of the two means) or a tenth of the progress the
  unmodified run made over the compared steps, whichever is larger. A rerun that stopped learning
  (its loss where the original's was at the start) fails it; one that trains the same passes,
  seeded or not.
* :func:`epoch_loss_parity` compares two runs' last-epoch mean losses (a bench recipe against
  the baseline recipe; each an average over every batch of the epoch, so its noise is small): a
  gap within a tenth of the baseline's progress from its first step, or 2% of its loss.
* :func:`mean_loss_parity` compares the mean loss of two sets of batches under the same fixed
  model (a ``looptune tune`` loader trial at lr 0): the same data gives the same mean, within 3
  standard errors of the difference.
* :func:`time_to_loss` judges a remedy that changes the training (a larger batch): the loss each
  run reached against wall-clock time, and the time each took to the loss the original ended at.
  Per-sample throughput is no gain when more samples are needed for the same loss.
"""

from __future__ import annotations

import math
from statistics import mean, median, stdev
from typing import Any

__all__ = ["MIN_STEPS", "PROGRESS_FRACTION", "epoch_loss_parity", "loss_parity", "mean_loss_parity",
           "time_to_loss"]

MIN_STEPS = 8  # fewer common steps with a loss: parity is not judged (None)
PROGRESS_FRACTION = 0.1  # a gap under this share of the original's progress is still parity
NOISE_SE = 3.0  # standard errors of the difference of the window means
# time to the same loss needs the original to have fallen this share of its starting loss: a
# smaller fall is below the resolution at which two runs' losses compare (a bf16 loss near 2.3
# moves in steps of 0.016; random labels fall 2.315 -> 2.298 in 26 steps)
MIN_PROGRESS = 0.05
EPOCH_RELATIVE = 0.02  # epoch means: a gap within 2% of the baseline's loss is still parity


def _window(n: int) -> int:
    return max(3, n // 5)


def _finite(values: list[float | None]) -> bool:
    return all(v is not None and math.isfinite(v) for v in values)


def loss_parity(before: list[float | None], after: list[float | None]) -> dict[str, Any]:
    """``parity``: True / False, or None when it cannot be judged (``reason`` says why); the
    losses compared and the numbers behind the decision."""
    n = min(len(before), len(after))
    b, a = before[:n], after[:n]
    out: dict[str, Any] = {"steps_compared": n, "losses_before": b, "losses_after": a}
    if n < MIN_STEPS or not _finite(b) or not _finite(a):
        seen = sum(v is not None for v in b)
        return {**out, "parity": None, "reason": (
            f"{n} common steps, {seen} of them with a loss: needs {MIN_STEPS}+ steps whose "
            "backward started from a finite scalar loss")}
    w = _window(n)
    end_b, end_a, start_b = mean(b[n - w:]), mean(a[n - w:]), mean(b[:w])
    se = math.sqrt((stdev(b[n - w:]) ** 2 + stdev(a[n - w:]) ** 2) / w)
    progress = abs(start_b - end_b)
    tol = max(NOISE_SE * se, PROGRESS_FRACTION * progress, 1e-6 * max(1.0, abs(end_b)))
    gap = end_a - end_b
    same = abs(gap) <= tol
    why = (f"mean loss over steps {n - w + 1}-{n}: {end_a:.4g} vs {end_b:.4g} unmodified (gap "
           f"{gap:+.3g}; tolerance {tol:.3g} = max({NOISE_SE:g} x the noise {se:.3g}, "
           f"{PROGRESS_FRACTION:.0%} of the progress {start_b:.4g} -> {end_b:.4g}))")
    return {**out, "parity": same, "window": w, "before_loss": end_b, "after_loss": end_a,
            "at_step": n, "tolerance": tol, "reason": why}


def epoch_loss_parity(base_first: float, base_epochs: list[float],
                      epochs: list[float]) -> dict[str, Any]:
    """A run's last-epoch mean loss against the baseline's (``base_first``: the baseline's first
    step loss, where its progress is measured from). ``parity`` None when either is missing or
    not finite, or they ran a different number of epochs."""
    if (not base_epochs or len(base_epochs) != len(epochs)
            or not _finite([base_first, *base_epochs, *epochs])):
        return {"parity": None, "reason": f"{len(base_epochs)} vs {len(epochs)} finite epoch "
                "losses: needs the same epochs with a finite loss"}
    base, loss = base_epochs[-1], epochs[-1]
    progress = abs(base_first - base)
    tol = max(PROGRESS_FRACTION * progress, EPOCH_RELATIVE * abs(base), 1e-6)
    gap = loss - base
    return {"parity": abs(gap) <= tol, "before_loss": base, "after_loss": loss,
            "at_epoch": len(epochs), "tolerance": tol, "reason": (
                f"epoch {len(epochs)} mean loss {loss:.4g} vs {base:.4g} for the baseline (gap "
                f"{gap:+.3g}; tolerance {tol:.3g} = max({PROGRESS_FRACTION:.0%} of its progress "
                f"{base_first:.4g} -> {base:.4g}, {EPOCH_RELATIVE:.0%} of its loss))")}


def mean_loss_parity(before: list[float], after: list[float]) -> dict[str, Any]:
    """Do two sets of per-batch losses (the same fixed model) have the same mean? ``parity``
    None with fewer than 2 finite losses in either."""
    if len(before) < 2 or len(after) < 2 or not _finite(before) or not _finite(after):
        return {"parity": None, "reason": f"{len(before)} and {len(after)} losses: needs 2+ "
                "finite losses in each"}
    mb, ma = mean(before), mean(after)
    se = math.sqrt(stdev(before) ** 2 / len(before) + stdev(after) ** 2 / len(after))
    tol = max(NOISE_SE * se, 1e-6 * max(1.0, abs(mb)))
    return {"parity": abs(ma - mb) <= tol, "before_loss": mb, "after_loss": ma,
            "tolerance": tol, "reason": (
                f"the same model's mean loss on its {len(after)} batches is {ma:.4g} vs {mb:.4g} "
                f"on the first setting's {len(before)} (gap {ma - mb:+.3g}; tolerance {tol:.3g} = "
                f"{NOISE_SE:g} x the noise {se:.3g})")}


def _clock(step_s: list[float], measured_from: int) -> list[float]:
    """Elapsed seconds at the end of each step; the steps before the measured ones (warm-up,
    the FLOP-counted step, a profiler window: slowed by looptune's own instruments) each count
    the median measured step."""
    typical = median(step_s[measured_from:]) if step_s[measured_from:] else median(step_s)
    out, t = [], 0.0
    for i, s in enumerate(step_s):
        t += typical if i < measured_from else s
        out.append(t)
    return out


def _smoothed(losses: list[float], w: int) -> list[float]:
    return [mean(losses[max(0, i - w + 1):i + 1]) for i in range(len(losses))]


def time_to_loss(before: tuple[list[float | None], list[float], int],
                 after: tuple[list[float | None], list[float], int]) -> dict[str, Any]:
    """Each run as (losses, step seconds, index of the first measured step), over its own
    steps. ``speedup``: the original's time to its final loss (the mean of its last window) over
    the rerun's time to the same loss (a trailing mean of the same window), None when the rerun
    never got there (``reason`` says what it reached instead)."""
    (lb, sb, mb), (la, sa, ma) = before, after
    lb, la = lb[:len(sb)], la[:len(sa)]  # the steps with both a loss and a wall time
    sb, sa = sb[:len(lb)], sa[:len(la)]
    if len(lb) < MIN_STEPS or len(la) < MIN_STEPS or not _finite(lb) or not _finite(la):
        return {"speedup": None, "reason": f"needs {MIN_STEPS}+ steps with a finite loss in "
                f"each run (got {len(lb)} and {len(la)})"}
    w = _window(len(lb))
    start, end = mean(lb[:w]), mean(lb[-w:])  # type: ignore[arg-type]
    se = math.sqrt((stdev(lb[:w]) ** 2 + stdev(lb[-w:]) ** 2) / w)  # type: ignore[arg-type]
    need = max(NOISE_SE * se, MIN_PROGRESS * abs(start))
    if start - end <= need:  # a plateau: which run "gets there" first is noise
        return {"speedup": None, "progress": False, "window": w, "reason": (
            f"the original's loss did not fall beyond its noise over its {len(lb)} steps "
            f"({start:.4g} -> {end:.4g}; needs a fall of {need:.3g} = max({NOISE_SE:g} x the "
            f"noise {se:.3g}, {MIN_PROGRESS:.0%} of the loss)): the time to the same loss "
            "cannot be judged")}
    tb, ta = _clock(sb, mb), _clock(sa, ma)
    smooth_b, smooth_a = _smoothed(lb, w), _smoothed(la, w)  # type: ignore[arg-type]
    target = smooth_b[-1]
    t_before = next(t for t, v in zip(tb, smooth_b) if v <= target)
    reached = next((t for t, v in zip(ta, smooth_a) if v <= target), None)
    # the rerun's loss at the original's last moment (its last step by then)
    at_end = next((v for t, v in reversed(list(zip(ta, smooth_a))) if t <= tb[-1]), smooth_a[0])
    out = {"progress": True, "target_loss": target, "before_s": t_before, "before_total_s": tb[-1],
           "after_total_s": ta[-1], "after_loss_at_same_time": at_end, "window": w,
           "losses_before": lb, "losses_after": la}
    if reached is None:
        return {**out, "speedup": None, "reason": (
            f"the rerun did not reach the original's loss {target:.4g} (mean of its last {w} "
            f"steps, reached after {t_before:.2f} s) within {ta[-1]:.2f} s; at {tb[-1]:.2f} s its "
            f"loss was {at_end:.4g}")}
    return {**out, "after_s": reached, "speedup": t_before / reached, "reason": (
        f"to the original's loss {target:.4g} (mean of its last {w} steps): {t_before:.2f} s "
        f"unmodified vs {reached:.2f} s with the remedy; at {tb[-1]:.2f} s its loss was "
        f"{at_end:.4g}")}
