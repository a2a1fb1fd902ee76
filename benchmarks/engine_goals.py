"""The engine's goals, measured side by side in one run on the MNIST reference workload.

1. Speed at the reference's batch 64: ``fast`` vs ``seed-baseline``, same epochs; goal >= 5x
   with test accuracy within 0.5 points.
2. Time to accuracy: the training time ``seed-baseline`` (5 epochs, the reference) needs to reach
   97.5% test accuracy vs the time ``tta`` (2 epochs, what it is tuned for) needs; goal: tta takes
   at most 1/15 of it. Both evaluate every ``--eval-every`` batches; evaluation is off the clock.

    python benchmarks/engine_goals.py --data ../shared/data/mnist
    python benchmarks/engine_goals.py --data ../shared/data/mnist --smoke   # CI: short, no verdict
"""

from __future__ import annotations

import argparse
import sys
import warnings

import looptune
from looptune.report.render import bench_table, wide_console

TARGET = 0.975


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", default=None, help="MNIST folder (default: $LOOPTUNE_DATA)")
    p.add_argument("--device", default="auto")
    p.add_argument("--speed-epochs", type=int, default=1, help="epochs for the speed comparison")
    p.add_argument("--eval-every", type=int, default=100, help="batches between evaluations")
    p.add_argument("--repeats", type=int, default=3, help="speed comparison: median of N runs")
    p.add_argument("--smoke", action="store_true",
                   help="CI mode: 1 epoch everywhere, report the ratios, never fail on them")
    args = p.parse_args(argv)
    common = {"device": args.device, "data_dir": args.data}
    base_epochs, tta_epochs = (1, 1) if args.smoke else (5, 2)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            speed = looptune.bench(recipes=["seed-baseline", "fast"], epochs=args.speed_epochs,
                                   repeats=1 if args.smoke else args.repeats, **common)
            slow = looptune.bench(recipes=["seed-baseline"], epochs=base_epochs, target_accuracy=TARGET,
                                  eval_every=args.eval_every, **common)
            quick = looptune.bench(recipes=["tta"], epochs=tta_epochs, target_accuracy=TARGET,
                                   eval_every=max(1, args.eval_every // 4), **common)
    except looptune.LooptuneError as err:
        print(f"engine_goals: error: {err}", file=sys.stderr)
        return 2
    console = wide_console()
    for results in (speed, slow, quick):
        console.print(bench_table(results))
    ok = _speed_goal(speed) & _tta_goal(slow.runs[0], quick.runs[0])
    return 0 if ok or args.smoke else 1


def _speed_goal(results: looptune.BenchResults) -> bool:
    base, fast = results.runs
    ratio = base.wall_s / fast.wall_s
    d_acc = 100 * (fast.test_accuracy - base.test_accuracy)
    ok = ratio >= 5 and abs(d_acc) <= 0.5
    print(f"speed at batch 64: fast is {ratio:.2f}x seed-baseline ({base.s_per_epoch:.3f} -> "
          f"{fast.s_per_epoch:.3f} s/epoch), accuracy {d_acc:+.2f} points; goal >= 5x, "
          f"|acc| <= 0.5: {'PASS' if ok else 'FAIL'}")
    return ok


def _tta_goal(base: looptune.RunResult, tta: looptune.RunResult) -> bool:
    if base.time_to_target_s is None or tta.time_to_target_s is None:
        print(f"time to {100 * TARGET}%: seed-baseline {base.time_to_target_s}, tta "
              f"{tta.time_to_target_s} (None = not reached): FAIL")
        return False
    ratio = base.time_to_target_s / tta.time_to_target_s
    ok = ratio >= 15
    print(f"time to {100 * TARGET}%: seed-baseline {base.time_to_target_s:.2f} s, tta "
          f"{tta.time_to_target_s:.2f} s: {ratio:.1f}x less; goal >= 15x: {'PASS' if ok else 'FAIL'}")
    return ok


if __name__ == "__main__":
    sys.exit(main())
