"""The benchmarks' judges as choices (issue 29): fed made-up measurements, each must reach the
verdict its goal states, on both sides of its threshold."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield lambda name: importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_exit_code_follows_the_mode_s_own_check(bench):
    goals = bench("_goals")
    assert goals.exit_code(goal_ok=True, smoke_ok=False, smoke=False) == 0
    assert goals.exit_code(goal_ok=False, smoke_ok=True, smoke=False) == 1
    assert goals.exit_code(goal_ok=False, smoke_ok=True, smoke=True) == 0
    assert goals.exit_code(goal_ok=True, smoke_ok=False, smoke=True) == 1


def test_smoke_speedups_needs_every_recipe_at_the_floor(bench, capsys):
    goals = bench("_goals")
    assert goals.smoke_speedups([("a", 1.5), ("b", 9.0)], floor=1.5)
    assert not goals.smoke_speedups([("a", 1.49), ("b", 9.0)], floor=1.5)
    assert not goals.smoke_speedups([], floor=1.5)  # nothing measured is not a pass
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith(": PASS") and lines[1].endswith(": FAIL") and "a 1.49x" in lines[1]


def _verified(promised, measured, **kw):
    return {"remedy": "bf16 autocast around each forward", "expected_speedup": promised,
            "speedup": measured, "top": True, **kw}


def test_verdict_check_judges_a_remedy_against_its_own_promise_whatever_its_rank(bench):
    judge = bench("verdict_check").judge
    # issue 29's case: promised 2.15x, measured 0.46x, re-ranked last by --verify: broken
    ok, note = judge(_verified(2.15, 0.46, top=False))
    assert ok is False and note.startswith("fell short: 21%")
    assert judge(_verified(2.0, 1.41))[0] is True  # 70.5%
    assert judge(_verified(2.0, 1.39))[0] is False  # 69.5%
    assert judge(_verified(2.0, 3.0))[0] is True  # 150%
    ok, note = judge(_verified(2.0, 3.02))
    assert ok is False and "too low" in note


def test_verdict_check_a_rerun_that_lost_loss_parity_is_never_a_kept_promise(bench):
    judge = bench("verdict_check").judge
    ok, note = judge(_verified(1.5, 1.6, loss_parity=False, changes_training="loss 0.3 -> 2.3"))
    assert ok is False and note == "changes the training: loss 0.3 -> 2.3"


def test_verdict_check_counts_nothing_when_nothing_comparable_was_measured(bench):
    judge = bench("verdict_check").judge
    assert judge({"remedy": None, "reason": "no remedy"}) == (None, "no remedy")
    ok, note = judge(_verified(2.0, None, reason="not judged: the loss did not fall"))
    assert ok is None and note.startswith("not judged")


def _feed(values):
    it = iter(values)
    return lambda: next(it)


def test_median_ci_takes_the_order_statistics_of_the_binomial_tail(bench):
    median_ci = bench("diagnose_overhead").median_ci
    assert median_ci([1, 2, 3, 4, 5]) == (float("-inf"), float("inf"))  # n=5: 2/32 > 5%
    assert median_ci([6, 1, 5, 2, 4, 3]) == (1, 6)  # n=6: 2/64 = 3.1% <= 5%: min and max
    assert median_ci(list(range(1, 13))) == (3, 10)  # n=12: P(X <= 2) = 1.9%


def test_overhead_ab_passes_once_the_interval_is_under_the_goal(bench):
    ab_rounds = bench("diagnose_overhead").ab_rounds
    bare = [10.0, 13.0, 10.1, 10.0, 10.2, 10.1, 10.0]
    probed = [10.2, 13.26, 10.3, 10.2, 10.4, 10.3, 10.2]  # +2% each round, whatever the drift
    got = ab_rounds([], 30, least=6, most=20, run_bare=_feed(bare), run_probed=_feed(probed))
    assert got["rounds"] == 6 and got["ok"] and not got["inconclusive"]
    assert got["overhead"] == pytest.approx(0.02, abs=0.001) and got["ci"][1] < 0.03


def test_overhead_ab_fails_above_the_goal_and_when_the_interval_straddles_it(bench):
    ab_rounds = bench("diagnose_overhead").ab_rounds
    over = ab_rounds([], 30, least=6, most=20, run_bare=_feed([10.0] * 6),
                     run_probed=_feed([10.35, 10.4, 10.45, 10.4, 10.5, 10.4]))  # +3.5-5%
    assert over["rounds"] == 6 and not over["ok"] and not over["inconclusive"]
    noisy = ab_rounds([], 30, least=6, most=8, run_bare=_feed([10.0] * 8),
                      run_probed=_feed([9.5, 11.0] * 4))  # -5% / +10%: the interval holds 3%
    assert noisy["rounds"] == 8 and noisy["inconclusive"] and not noisy["ok"]


def test_run_goals_names_a_bad_benchmark_before_running_anything(bench, capsys):
    run_goals = bench("run_goals")
    with pytest.raises(SystemExit) as stop:
        run_goals.main(["--data", str(BENCHMARKS), "--only", "floor,nope"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "--only nope is invalid" in err and "verdict_check" in err


def test_run_goals_lists_every_benchmark_with_a_goal(bench):
    run_goals = bench("run_goals")
    scripts = {p.stem for p in BENCHMARKS.glob("*.py")} - {"_goals", "run_goals"}
    assert {name for name, _ in run_goals.BENCHMARKS} == scripts


def test_smoke_floor_is_half_the_goal_and_never_under_1_2(bench):
    floor = bench("_goals").smoke_floor
    assert floor(12.0) == 6.0 and floor(3.0) == 1.5 and floor(2.0) == 1.2 and floor(1.0) == 1.2


def test_tune_quality_reads_the_tuned_loader_from_the_grid(bench):
    same = bench("tune_quality")._same_point
    point = {"num_workers": 0, "samples_per_s": 9e4, "status": "ok", "reason": "", "loss": 2.3}
    assert same(point, {"num_workers": 0})  # the loss the grid records is not a setting
    assert not same({**point, "num_workers": 2, "prefetch_factor": 2}, {"num_workers": 2})
    assert same({**point, "num_workers": 2, "prefetch_factor": 2, "loss_parity": True},
                {"num_workers": 2, "prefetch_factor": 2})
