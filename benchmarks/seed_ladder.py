"""The seed ladder: every built-in recipe on the MNIST reference workload, side by side, one run.

Prints each recipe's time, speedup and accuracy against ``seed-baseline`` measured in the same
process, and checks the foundation's goal: ``tensorized`` and ``device`` at least 3x faster than
``seed-baseline`` with test accuracy within 0.5 points.

    python benchmarks/seed_ladder.py --data ../shared/data/mnist            # 1 epoch, all recipes
    python benchmarks/seed_ladder.py --data ../shared/data/mnist --smoke    # CI: >= 1.5x each
"""

from __future__ import annotations

import argparse
import sys

import looptune
from _goals import exit_code, smoke_check, smoke_floor, smoke_speedups
from looptune.report.render import bench_table, wide_console

GOAL_SPEEDUP, GOAL_ACC_POINTS = 3.0, 0.5
FAST = ("tensorized", "device")
SMOKE_ACC_POINTS = 1.0  # one epoch, same seed: the recipes learn alike


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", default=None, help="MNIST folder (default: $LOOPTUNE_DATA)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--device", default="auto")
    p.add_argument("--recipes", default="seed-baseline,seed-workers,seed-pinned,tensorized,device")
    p.add_argument("--json", default=None, help="also write the results JSON here")
    p.add_argument("--smoke", action="store_true",
                   help="CI mode: baseline + fast recipes; each >= 1.5x, accuracy within 1 point")
    args = p.parse_args(argv)
    recipes = "seed-baseline,tensorized,device" if args.smoke else args.recipes
    try:
        results = looptune.bench(recipes=recipes.split(","), epochs=args.epochs, device=args.device,
                                 data_dir=args.data)
    except looptune.LooptuneError as err:
        print(f"seed_ladder: error: {err}", file=sys.stderr)
        return 2
    wide_console().print(bench_table(results))
    if args.json:
        results.write_json(args.json)
    ok = _report(results)
    smoke_ok = args.smoke and _smoke(results)
    return exit_code(ok, smoke_ok, args.smoke)


def _smoke(results: looptune.BenchResults) -> bool:
    """tensorized and device faster than seed-baseline in the same run, and still learning."""
    speed = dict(zip((r.recipe for r in results.runs), results.speedups()))
    ok = smoke_speedups([(n, speed[n]) for n in FAST if n in speed],
                        floor=smoke_floor(GOAL_SPEEDUP), against="seed-baseline")
    base = results.runs[0].test_accuracy
    d = max(abs(r.test_accuracy - base) for r in results.runs) * 100
    return ok & smoke_check(f"test accuracy within {SMOKE_ACC_POINTS} points of seed-baseline "
                            f"(widest {d:.2f})", d <= SMOKE_ACC_POINTS)


def _report(results: looptune.BenchResults) -> bool:
    base, names = results.runs[0], [r.recipe for r in results.runs]
    if base.recipe != "seed-baseline" or not set(FAST) <= set(names):
        print(f"the goal check needs seed-baseline first and {', '.join(FAST)} in --recipes: "
              "ratios only, no verdict")
        return False
    ok = True
    for run, speedup in zip(results.runs, results.speedups()):
        d_acc = 100 * (run.test_accuracy - base.test_accuracy)
        line = f"{run.recipe:>14}: {speedup:5.2f}x vs seed-baseline, accuracy {d_acc:+.2f} points"
        if run.recipe in FAST:
            passed = speedup >= GOAL_SPEEDUP and abs(d_acc) <= GOAL_ACC_POINTS
            ok &= passed
            line += f"  goal >= {GOAL_SPEEDUP}x, |acc| <= {GOAL_ACC_POINTS}: " + ("PASS" if passed else "FAIL")
        print(line)
    return ok


if __name__ == "__main__":
    sys.exit(main())
