"""The seed ladder: every built-in recipe on the MNIST reference workload, side by side, one run.

Prints each recipe's time, speedup and accuracy against ``seed-baseline`` measured in the same
process, and checks the foundation's goal: ``tensorized`` and ``device`` at least 3x faster than
``seed-baseline`` with test accuracy within 0.5 points.

    python benchmarks/seed_ladder.py --data ../shared/data/mnist            # 1 epoch, all recipes
    python benchmarks/seed_ladder.py --data ../shared/data/mnist --smoke    # CI: quick, no verdict
"""

from __future__ import annotations

import argparse
import sys

import looptune
from looptune.report.render import bench_table, wide_console

GOAL_SPEEDUP, GOAL_ACC_POINTS = 3.0, 0.5
FAST = ("tensorized", "device")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", default=None, help="MNIST folder (default: $LOOPTUNE_DATA)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--device", default="auto")
    p.add_argument("--recipes", default="seed-baseline,seed-workers,seed-pinned,tensorized,device")
    p.add_argument("--json", default=None, help="also write the results JSON here")
    p.add_argument("--smoke", action="store_true",
                   help="CI mode: baseline + fast recipes only, report ratios, never fail on them")
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
    return 0 if ok or args.smoke else 1


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
