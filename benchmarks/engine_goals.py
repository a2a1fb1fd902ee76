"""The engine's goals, measured side by side in one run on the MNIST reference workload.

1. Speed at the reference's batch 64: ``fast`` vs ``seed-baseline``, same epochs; goal >= 12x
   (median of ``--repeats`` interleaved runs) with test accuracy within 0.5 points.
   (benchmarks/floor.py compares ``fast`` with this machine's floor.)
2. Time to accuracy: the training time ``seed-baseline`` (5 epochs, the reference) needs to reach
   97.5% test accuracy vs the time ``tta`` (3 epochs, what it is tuned for) needs, over
   ``--seeds`` seeds; goal: the median tta takes at most 1/50 of it, and 97.5% is reached in at
   least 4 of 5 seeds. seed-baseline evaluates every ``--eval-every`` batches of 64, tta after as
   many samples (its batches are 12x larger); evaluation is off the clock.

    python benchmarks/engine_goals.py --data ../shared/data/mnist
    python benchmarks/engine_goals.py --data ../shared/data/mnist --smoke   # CI: see _smoke

The speed run also times ``device`` (the general engine step on the same device-resident data), so
the smoke can tell a working fast path from one that fell back to the general step.
"""

from __future__ import annotations

import argparse
import sys
import warnings

import looptune
from _goals import exit_code, smoke_check, smoke_speedups
from looptune.fastpath.threads import thread_summary
from looptune.presets.mnist import TTA_BATCH
from looptune.report.render import bench_table, wide_console

TARGET = 0.975
SPEED_GOAL, TTA_GOAL = 12.0, 50.0
SMOKE_ACC = 0.93
# smoke floors, measured side by side in one epoch. fast vs seed-baseline: 12.8x on a quiet 2-vCPU
# Zen 5 VM (2026-12-06), 5.97x on a loaded CI machine (seed-baseline 15.5 s/epoch there, 3.6 here):
# a third of the goal. fast vs device (the same data, the general step): 2.8x on that Zen 5 VM; a
# fast path that fell back to the general step is ~1.0x
SMOKE_VS_BASELINE, SMOKE_VS_GENERAL = SPEED_GOAL / 3, 1.5


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", default=None, help="MNIST folder (default: $LOOPTUNE_DATA)")
    p.add_argument("--device", default="auto")
    p.add_argument("--speed-epochs", type=int, default=1, help="epochs for the speed comparison")
    p.add_argument("--eval-every", type=int, default=50,
                   help="seed-baseline: batches between evaluations")
    p.add_argument("--repeats", type=int, default=3, help="speed comparison: median of N runs")
    p.add_argument("--seeds", type=int, default=5, help="tta: seeds 0..N-1, each its own run")
    p.add_argument("--smoke", action="store_true",
                   help="CI mode: 1 epoch everywhere; fast >= 4x seed-baseline and "
                   ">= 1.5x device, tta >= 93%%")
    args = p.parse_args(argv)
    common = {"device": args.device, "data_dir": args.data}
    base_epochs, tta_epochs = (1, 1) if args.smoke else (5, 3)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            speed = looptune.bench(recipes=["seed-baseline", "fast", "device"], epochs=args.speed_epochs,
                                   repeats=1 if args.smoke else args.repeats, **common)
            slow = looptune.bench(recipes=["seed-baseline"], epochs=base_epochs, target_accuracy=TARGET,
                                  eval_every=args.eval_every, **common)
            # as many samples between evaluations as the baseline's (50 x 64 ~ 4 x 768): the
            # same resolution of the time to the target, and as many cache-cold restarts
            tta_every = max(1, round(args.eval_every * 64 / TTA_BATCH))
            quick = [looptune.bench(recipes=["tta"], epochs=tta_epochs, target_accuracy=TARGET,
                                    eval_every=tta_every, seed=seed, **common)
                     for seed in range(1 if args.smoke else args.seeds)]
    except looptune.LooptuneError as err:
        print(f"engine_goals: error: {err}", file=sys.stderr)
        return 2
    console = wide_console()
    for results in (speed, slow, quick[0]):
        console.print(bench_table(results))
    ok = _speed_goal(speed) & _tta_goal(slow.runs[0], [q.runs[0] for q in quick])
    smoke_ok = args.smoke and _smoke(speed, quick[0].runs[0])
    return exit_code(ok, smoke_ok, args.smoke)


def _smoke(speed: looptune.BenchResults, tta: looptune.RunResult) -> bool:
    """fast well ahead of seed-baseline and of the general step (device) in the same run; tta,
    squeezed into one epoch (its schedule over 1 epoch instead of 3), still learns: 95.8% here, a
    broken step stays far below."""
    base, fast, general = speed.runs
    ok = smoke_speedups([("fast", base.wall_s / fast.wall_s)], floor=SMOKE_VS_BASELINE,
                        against="seed-baseline")
    ok &= smoke_speedups([("fast", general.wall_s / fast.wall_s)], floor=SMOKE_VS_GENERAL,
                         against="device (the general step on the same data)")
    return ok & smoke_check(f"tta's final accuracy after 1 epoch {100 * tta.test_accuracy:.2f}%, "
                            f">= {100 * SMOKE_ACC:g}%", tta.test_accuracy >= SMOKE_ACC)


def _speed_goal(results: looptune.BenchResults) -> bool:
    base, fast = results.runs[:2]
    ratio = base.wall_s / fast.wall_s
    d_acc = 100 * (fast.test_accuracy - base.test_accuracy)
    ok = ratio >= SPEED_GOAL and abs(d_acc) <= 0.5
    print(f"speed at batch 64: fast is {ratio:.2f}x seed-baseline ({base.s_per_epoch:.3f} -> "
          f"{fast.s_per_epoch:.3f} s/epoch), accuracy {d_acc:+.2f} points; goal >= "
          f"{SPEED_GOAL:.0f}x, |acc| <= 0.5: {'PASS' if ok else 'FAIL'}"
          + (f" (fast's median run: {threads})" if (threads := thread_summary(fast.decisions))
             else ""))
    return ok


def _tta_goal(base: looptune.RunResult, runs: list[looptune.RunResult]) -> bool:
    times = [r.time_to_target_s for r in runs]
    reached = sorted(t for t in times if t is not None)
    finals = ", ".join(f"{100 * r.test_accuracy:.2f}%" for r in runs)
    print(f"tta over {len(runs)} seed(s): time to {100 * TARGET}% "
          + ", ".join("not reached" if t is None else f"{t:.2f} s" for t in times)
          + f"; final accuracy {finals}")
    if base.time_to_target_s is None or not reached:
        print(f"time to {100 * TARGET}%: seed-baseline {base.time_to_target_s}, tta {times} "
              "(None = not reached): FAIL")
        return False
    median = reached[len(reached) // 2]
    ratio = base.time_to_target_s / median
    enough = len(reached) >= min(4, len(runs)) if len(runs) >= 5 else len(reached) == len(runs)
    ok = ratio >= TTA_GOAL and enough
    print(f"time to {100 * TARGET}%: seed-baseline {base.time_to_target_s:.2f} s, tta median "
          f"{median:.2f} s (spread {reached[0]:.2f}-{reached[-1]:.2f} s, reached in "
          f"{len(reached)}/{len(runs)} seeds): {ratio:.1f}x less; goal >= {TTA_GOAL:.0f}x and "
          f">= 4 of 5 seeds: {'PASS' if ok else 'FAIL'}")
    return ok


if __name__ == "__main__":
    sys.exit(main())
