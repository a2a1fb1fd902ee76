"""Loss parity and time to the same loss (measure.parity): pure functions on per-step losses."""

from __future__ import annotations

import math
import random

import pytest

from looptune.measure.parity import MIN_STEPS, loss_parity, time_to_loss


def _noisy(start, end, n, noise, seed):
    rng = random.Random(seed)
    return [start + (end - start) * i / (n - 1) + rng.gauss(0, noise) for i in range(n)]


def test_two_runs_that_train_alike_are_at_parity_seeded_or_not():
    before = _noisy(2.3, 0.3, 60, 0.05, 1)
    assert loss_parity(before, before)["parity"] is True
    other_seed = _noisy(2.3, 0.3, 60, 0.05, 2)
    out = loss_parity(before, other_seed)
    assert out["parity"] is True and out["window"] == 12 and out["at_step"] == 60
    assert "mean loss over steps 49-60" in out["reason"]


def test_a_rerun_that_stopped_learning_fails_parity():
    before = _noisy(2.3, 0.3, 60, 0.05, 1)
    stuck = _noisy(2.3, 2.25, 60, 0.05, 3)  # its loss stays near where it started
    out = loss_parity(before, stuck)
    assert out["parity"] is False and out["after_loss"] > 2.0 > 0.5 > out["before_loss"]
    # the tolerance is a tenth of the progress here, well under the gap
    assert out["tolerance"] == pytest.approx(0.2, abs=0.05)


def test_a_rerun_slightly_worse_within_a_tenth_of_the_progress_is_parity():
    before = [2.0 - 0.03 * i for i in range(50)]
    assert loss_parity(before, [v + 0.1 for v in before])["parity"] is True  # 0.1 < 0.147
    assert loss_parity(before, [v + 0.2 for v in before])["parity"] is False


def test_parity_is_not_judged_without_enough_finite_losses():
    short = [1.0] * (MIN_STEPS - 1)
    assert loss_parity(short, short)["parity"] is None
    with_none = [1.0] * 20
    with_none[5] = None
    out = loss_parity(with_none, [1.0] * 20)
    assert out["parity"] is None and "finite scalar loss" in out["reason"]
    assert loss_parity([1.0] * 20, [math.nan] * 20)["parity"] is None


def test_time_to_loss_of_a_faster_run_that_learns_alike():
    losses = [2.0 - 0.05 * i for i in range(20)]
    out = time_to_loss((losses, [0.01] * 20, 0), (losses, [0.005] * 20, 0))
    assert out["speedup"] == pytest.approx(2.0) and out["target_loss"] == pytest.approx(1.125)


def test_time_to_loss_of_a_run_that_never_gets_there_is_none():
    losses = [2.0 - 0.05 * i for i in range(20)]
    flat = [2.0 - 0.001 * i for i in range(40)]
    out = time_to_loss((losses, [0.01] * 20, 0), (flat, [0.005] * 40, 0))
    assert out["speedup"] is None and "did not reach" in out["reason"]


def test_warm_up_steps_count_the_median_measured_step():
    # the first 5 steps were slowed by instruments (10x): they count 10 ms each, not 100 ms
    losses = [2.0 - 0.05 * i for i in range(20)]
    step_s = [0.1] * 5 + [0.01] * 15
    out = time_to_loss((losses, step_s, 5), (losses, [0.01] * 20, 0))
    assert out["before_total_s"] == pytest.approx(0.2) and out["speedup"] == pytest.approx(1.0)


def test_epoch_loss_parity_uses_the_baselines_progress():
    from looptune.measure.parity import epoch_loss_parity

    assert epoch_loss_parity(2.3, [0.5, 0.3], [0.6, 0.35])["parity"] is True  # 0.05 <= 0.2
    out = epoch_loss_parity(2.3, [0.5, 0.3], [2.2, 2.25])
    assert out["parity"] is False and "epoch 2 mean loss 2.25 vs 0.3" in out["reason"]
    # no progress at all: 2% of the loss
    assert epoch_loss_parity(1.0, [1.0], [1.015])["parity"] is True
    assert epoch_loss_parity(1.0, [1.0], [1.03])["parity"] is False
    assert epoch_loss_parity(2.3, [0.5], [0.5, 0.4])["parity"] is None
    assert epoch_loss_parity(2.3, [0.5], [math.nan])["parity"] is None


def test_time_to_loss_is_not_judged_on_a_plateau():
    # random labels: the loss never falls, so whichever run dips to the final mean first is noise
    flat = _noisy(2.3, 2.3, 40, 0.05, 4)
    other = _noisy(2.3, 2.3, 80, 0.05, 5)
    out = time_to_loss((flat, [0.01] * 40, 0), (other, [0.005] * 80, 0))
    assert out["speedup"] is None and out["progress"] is False
    assert "did not fall beyond its noise" in out["reason"]


def test_a_fall_below_five_percent_of_the_loss_is_a_plateau_too():
    # compute_heavy.py (random labels): 2.315 -> 2.298 in 26 steps, steady but tiny; a bf16
    # rerun's loss moves in steps of 0.016 and "reached" it at its first step (51x, before)
    before = [2.315 - 0.00068 * i for i in range(26)]
    after = [2.297 if i % 3 else 2.3125 for i in range(46)]
    out = time_to_loss((before, [0.05] * 26, 0), (after, [0.027] * 46, 0))
    assert out["speedup"] is None and out["progress"] is False
    assert "5% of the loss" in out["reason"]


def test_mean_loss_parity_within_the_noise_of_two_samples():
    from looptune.measure.parity import mean_loss_parity

    a, b = _noisy(2.3, 2.3, 40, 0.2, 6), _noisy(2.3, 2.3, 40, 0.2, 7)
    assert mean_loss_parity(a, b)["parity"] is True
    out = mean_loss_parity(a, [v + 0.5 for v in b])
    assert out["parity"] is False and "on its 40 batches" in out["reason"]
    assert mean_loss_parity([1.0], b)["parity"] is None
