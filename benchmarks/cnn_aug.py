"""Conv net + per-sample augmentation (workload mnist-cnn): the baseline pipeline against
looptune's batched on-device augmentation, side by side in one run; then `looptune diagnose` on
the same loop written as a user script (examples/cnn_augment.py), with --verify. The `tta`
recipe and the "s to 97.5%" column show the least training time to a test accuracy.

Goal (issue 12): looptune's fastest recipe >= 4x the plain-DataLoader baseline in samples/s,
test accuracy within 0.5 points at equal epochs; diagnose names data_loading.

    python benchmarks/cnn_aug.py --data ../shared/data/mnist             # 3 epochs, all recipes
    python benchmarks/cnn_aug.py --data ../shared/data/mnist --smoke     # CI: each >= 2x, data_loading
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import looptune
from _goals import exit_code, smoke_check, smoke_floor, smoke_speedups
from looptune.report.render import bench_table, wide_console

GOAL_SPEEDUP, GOAL_ACC_POINTS = 4.0, 0.5
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "cnn_augment.py"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", default=None, help="MNIST folder (default: $LOOPTUNE_DATA)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--device", default="auto")
    p.add_argument("--recipes", default="baseline,workers,batched-aug,fast,tta")
    p.add_argument("--target", type=float, default=0.975,
                   help="test accuracy whose training time each recipe reports (default 0.975)")
    p.add_argument("--json", default=None, help="also write the results JSON here")
    p.add_argument("--smoke", action="store_true",
                   help="CI mode: 1 epoch of baseline, batched-aug and fast (each >= 2x), a short diagnose")
    args = p.parse_args(argv)
    recipes = "baseline,batched-aug,fast" if args.smoke else args.recipes
    epochs = 1 if args.smoke else args.epochs
    try:
        results = looptune.bench(workload="mnist-cnn", recipes=recipes.split(","), epochs=epochs,
                                 device=args.device, data_dir=args.data, repeats=args.repeats,
                                 target=args.target)
    except looptune.LooptuneError as err:
        print(f"cnn_aug: error: {err}", file=sys.stderr)
        return 2
    wide_console().print(bench_table(results))
    if args.json:
        results.write_json(args.json)
    ok = _goal(results)
    named = _diagnose(args.data, steps=15 if args.smoke else 60, verify=not args.smoke)
    ok &= named
    smoke_ok = args.smoke and (
        smoke_speedups(list(zip((r.recipe for r in results.runs[1:]), results.speedups()[1:])),
                       floor=smoke_floor(GOAL_SPEEDUP))
        & smoke_check("diagnose names data_loading", named))
    return exit_code(ok, smoke_ok, args.smoke)


def _goal(results: looptune.BenchResults) -> bool:
    base = results.runs[0]
    best = max(zip(results.runs[1:], results.speedups()[1:]), key=lambda rs: rs[1])
    for run, speedup in zip(results.runs, results.speedups()):
        d_acc = 100 * (run.metric - base.metric)
        print(f"{run.recipe:>12}: {run.samples_per_s:9,.0f} samples/s, {speedup:5.2f}x vs "
              f"{base.recipe}, test accuracy {100 * run.metric:.2f}% ({d_acc:+.2f} points)")
    run, speedup = best
    d_acc = 100 * (run.metric - base.metric)
    ok = speedup >= GOAL_SPEEDUP and abs(d_acc) <= GOAL_ACC_POINTS
    print(f"fastest: {run.recipe} {speedup:.2f}x, {d_acc:+.2f} points; goal >= {GOAL_SPEEDUP}x "
          f"and |acc| <= {GOAL_ACC_POINTS} at {results.epochs} epoch(s): {'PASS' if ok else 'FAIL'}")
    return ok


def _diagnose(data: str | None, steps: int, verify: bool) -> bool:
    args = ["--epochs", "1"] + (["--data", data] if data else [])
    d = looptune.diagnose(str(EXAMPLE), args, steps=steps, warmup=3, verify=verify)
    print(f"diagnose {EXAMPLE.name}: verdict {d.bottleneck}, shares "
          + ", ".join(f"{k} {100 * v:.1f}%" for k, v in d.shares.items() if v > 0.005)
          + f" of a {d.step_ms:.2f} ms step")
    for i, r in enumerate(d.remedies[:2], 1):
        applied = ("; the 'batched-aug' row above applies it"
                   if "augment whole batches" in r.action else "")
        print(f"  remedy {i}: {r.action} (up to {r.expected_speedup:.2f}x){applied}")
    if d.verify is not None:
        print(f"  verify: {d.verify}")
    return d.bottleneck == "data_loading"


if __name__ == "__main__":
    sys.exit(main())
