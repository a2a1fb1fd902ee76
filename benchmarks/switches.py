"""Each engine switch's effect, one at a time, on the MNIST reference workload (batch 64).

Every row is the ``device`` recipe with one switch changed, all measured in one process, so the
ratios compare like with like. CUDA-only switches (fp16 + GradScaler, CUDA graphs, pinned memory)
run only on a GPU; on a CPU they are listed with the reason they were skipped.

    python benchmarks/switches.py --data ../shared/data/mnist             # 1 epoch per row
    python benchmarks/switches.py --data ../shared/data/mnist --smoke     # CI: same rows, each learns
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import warnings

import looptune
from _goals import exit_code, passfail, smoke_check
from looptune.engine.device import resolve_device
from looptune.presets import RECIPES
from looptune.recipe import Recipe, with_overrides
from looptune.report.render import bench_notes, bench_table, wide_console

GOAL_ACC_POINTS = 0.5
SMOKE_ACC = 0.9  # one epoch of the MLP reaches ~97%; a switch that broke training does not

# (row name, overrides applied to `device`, device types it runs on)
SWITCHES = [
    ("device", [], ("cpu", "cuda")),
    ("strategy=dataloader", ["loader.strategy=dataloader"], ("cpu", "cuda")),
    ("strategy=prefetch", ["loader.strategy=prefetch"], ("cpu", "cuda")),
    ("+pinned", ["loader.strategy=prefetch", "loader.pin_memory=true", "loader.non_blocking=true"], ("cuda",)),
    ("loss_sync=step", ["loss_sync=step"], ("cpu", "cuda")),
    ("precision=bf16", ["step.precision=bf16"], ("cpu", "cuda")),
    ("precision=fp16", ["step.precision=fp16"], ("cuda",)),
    ("impl=for-loop", ["optim.impl=for-loop"], ("cpu", "cuda")),
    ("impl=foreach", ["optim.impl=foreach"], ("cpu", "cuda")),
    ("impl=fused", ["optim.impl=fused"], ("cpu", "cuda")),
    ("impl=direct", ["optim.impl=direct"], ("cpu", "cuda")),
    ("normalize=once", ["loader.normalize=once"], ("cpu", "cuda")),
    ("backward=mlp", ["step.backward=mlp"], ("cpu", "cuda")),
    ("backward=mlp+bf16", ["step.backward=mlp", "step.precision=bf16"], ("cpu", "cuda")),
    ("backward=mlp-cpp", ["step.backward=mlp-cpp"], ("cpu", "cuda")),
    ("backward=mlp-cpp+bf16", ["step.backward=mlp-cpp", "step.precision=bf16"], ("cpu", "cuda")),
    ("cpu_threads=1", ["cpu_threads=1"], ("cpu",)),
    ("compile=default", ["step.compile=default"], ("cpu", "cuda")),
    ("compile=reduce-overhead", ["step.compile=reduce-overhead"], ("cuda",)),
    ("cuda_graphs", ["step.cuda_graphs=true", "optim.impl=fused"], ("cuda",)),
]


def rows_for(device_type: str) -> tuple[list[Recipe], list[str]]:
    base, chosen, skipped = RECIPES["device"], [], []
    for name, overrides, devices in SWITCHES:
        if device_type not in devices:
            skipped.append(f"{name}: needs {' or '.join(devices)}; this run is on {device_type}")
            continue
        chosen.append(dataclasses.replace(with_overrides(base, overrides), name=name))
    return chosen, skipped


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", default=None, help="MNIST folder (default: $LOOPTUNE_DATA)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--device", default="auto")
    p.add_argument("--repeats", type=int, default=3, help="runs per row; the median is shown")
    p.add_argument("--json", default=None)
    p.add_argument("--smoke", action="store_true", help="CI mode: every row once; each must learn")
    args = p.parse_args(argv)
    try:
        recipes, skipped = rows_for(resolve_device(args.device).type)
        # compiled rows run after all eager ones: inductor leaves OpenMP threads and caches
        # behind that slow the eager runs measured after them (seen here on a 2-core CPU)
        eager = [r for r in recipes if r.step.compile == "off"]
        compiled = [r for r in recipes if r.step.compile != "off"]
        repeats = 1 if args.smoke else args.repeats
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            results = looptune.bench(recipes=eager, epochs=args.epochs, device=args.device,
                                     data_dir=args.data, repeats=repeats)
            if compiled:
                more = looptune.bench(recipes=compiled, epochs=args.epochs, device=args.device,
                                      data_dir=args.data, repeats=repeats)
                results = dataclasses.replace(results, runs=results.runs + more.runs)
    except looptune.LooptuneError as err:
        print(f"switches: error: {err}", file=sys.stderr)
        return 2
    console = wide_console()
    console.print(bench_table(results))
    for line in bench_notes(results) + [f"skipped {s}" for s in skipped]:
        console.print(f"- {line}", highlight=False, markup=False)
    if args.json:
        results.write_json(args.json)
    for run, speedup in zip(results.runs, results.speedups()):
        print(f"{run.recipe:>24}: {speedup:5.2f}x vs device, {run.optimizer_impl or 'n/a'} optimizer,"
              f" accuracy {100 * (run.test_accuracy or 0):.2f}%")
    return _judge(results, args.smoke)


def _judge(results: looptune.BenchResults, smoke: bool) -> int:
    """A switch changes the speed, never what is learned: every row's test accuracy within
    GOAL_ACC_POINTS of ``device`` (same seed, same epochs); --smoke: every row still learned."""
    base = results.runs[0].test_accuracy or 0.0
    worst = max(results.runs, key=lambda r: abs((r.test_accuracy or 0.0) - base))
    gap = 100 * abs((worst.test_accuracy or 0.0) - base)
    if smoke:
        low = min(results.runs, key=lambda r: r.test_accuracy or 0.0)
        return exit_code(False, smoke_check(
            f"every row learned: lowest accuracy {100 * (low.test_accuracy or 0):.2f}% "
            f"({low.recipe}), >= {100 * SMOKE_ACC:g}%", (low.test_accuracy or 0) >= SMOKE_ACC),
            True)
    ok = gap <= GOAL_ACC_POINTS
    print(f"goal: every switch trains as device does, accuracy within {GOAL_ACC_POINTS} points "
          f"(widest: {worst.recipe}, {gap:.2f}): {passfail(ok)}")
    return exit_code(ok, False, False)


if __name__ == "__main__":
    sys.exit(main())
