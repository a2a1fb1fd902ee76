"""How close ``fast`` trains to this machine's floor, measured side by side in one run.

The floor of an epoch: every FLOP-counted op of the step (matmuls, convolutions, attention)
timed alone at the step's own shapes, plus the unavoidable memory traffic (the optimizer update
reading and writing parameters, gradients and state once; the input batch read once) at a
measured streaming rate, summed over the epoch's steps (looptune.measure.floor). Then ``fast``
and the workload's baseline train one epoch each, interleaved, median of ``--repeats``.

Goals (mnist-mlp, batch 64): fast <= 2.5x the floor, and >= 12x seed-baseline.

    python benchmarks/floor.py --data ../shared/data/mnist
    python benchmarks/floor.py --data ../shared/data/mnist --workloads mnist-mlp,mnist-cnn,char-gpt
    python benchmarks/floor.py --data ../shared/data/mnist --smoke   # CI: short, no verdict
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import warnings
from typing import Any

import torch

import looptune
from looptune._io import atomic_write_text
from looptune.bench import workloads
from looptune.engine.device import resolve_device
from looptune.measure.floor import Floor, measure_floor
from looptune.presets import default_recipes, get_recipe

GOAL_FLOOR, GOAL_SPEEDUP = 2.5, 12.0


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _batch(train: Any, n: int, device: torch.device):
    """``n`` training samples as the step sees them (decoded, normalized, augmented) and their
    bytes as stored (what the step must read at least)."""
    from looptune.data.loaders import prepare_batch

    data = train.materialize() if hasattr(train, "materialize") else train
    images, labels = data.images[:n].to(device), data.labels[:n].to(device)
    x = prepare_batch(images, data.mean, data.std, getattr(data, "augment", None))
    return x, labels, images.numel() * images.element_size()


def epoch_floor(spec: workloads.Workload, train: Any, recipe: looptune.Recipe,
                device: torch.device, options: dict[str, Any]) -> tuple[float, Floor, int]:
    """(floor seconds per epoch, the floor at the recipe's batch size, steps per epoch)."""
    batch = recipe.loader.batch_size
    full, tail = divmod(len(train), batch)
    total, first = 0.0, None
    for size, count in ((batch, full), (tail, 1)):
        if size == 0 or count == 0:
            continue
        torch.manual_seed(0)
        model = spec.build_model(**options).to(device)
        x, y, stored = _batch(train, size, device)
        floor = measure_floor(model, spec.loss_fn, x, y, optimizer=recipe.optim.name,
                              input_bytes=stored)
        total += count * floor.step_s
        first = first or floor
    return total, first, full + (1 if tail else 0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", default=None, help="MNIST folder (default: $LOOPTUNE_DATA)")
    p.add_argument("--device", default="auto")
    p.add_argument("--workloads", default="mnist-mlp", help="comma-separated workload names")
    p.add_argument("--repeats", type=int, default=3, help="epochs per recipe, interleaved; median")
    p.add_argument("--json", default=None, help="write the figures here")
    p.add_argument("--smoke", action="store_true", help="CI mode: 1 repeat, report, never fail")
    args = p.parse_args(argv)
    device = resolve_device(args.device)
    names = [w.strip() for w in args.workloads.split(",") if w.strip()]
    print(f"machine: {cpu_name()}, {torch.get_num_threads()} torch threads, torch "
          f"{torch.__version__}, device {device}")
    rows, ok = [], True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        for name in names:
            row = _workload_row(name, args, device)
            rows.append(row)
            ok &= row.get("goal_met", True)
    if args.json:
        atomic_write_text(args.json, json.dumps(rows, indent=2))
    return 0 if ok or args.smoke else 1


def _workload_row(name: str, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    spec = workloads.get_workload(name)
    options = spec.check_options({})
    baseline_name = default_recipes(spec.recipe_set)[0]
    fast = get_recipe("fast", device.type, spec.recipe_set)
    train, _ = spec.load(data_dir=args.data, **options)
    floor_s, floor, steps = epoch_floor(spec, train, fast, device, options)
    results = looptune.bench(workload=spec.name, recipes=[baseline_name, fast], epochs=1,
                             repeats=1 if args.smoke else args.repeats, device=str(device),
                             data_dir=args.data)
    base, got = results.runs
    fast_s, base_s = got.s_per_epoch, base.s_per_epoch
    row = {"workload": spec.name, "batch_size": fast.loader.batch_size, "steps": steps,
           "floor_s": floor_s, "fast_s": fast_s, "baseline": baseline_name, "baseline_s": base_s,
           "fast_over_floor": fast_s / floor_s, "speedup": base_s / fast_s,
           "floor_step": floor.to_dict(), "fast_decisions": got.decisions,
           "fast_config": got.config, "cpu": cpu_name(), "torch": torch.__version__}
    print(f"\n{spec.name}: fast at batch {fast.loader.batch_size}, {steps} steps per epoch")
    print(f"  floor per step: {floor.flops / 1e6:.1f} MFLOP in {floor.arithmetic_s * 1e6:.0f} us "
          f"({floor.gflops:.1f} GFLOP/s at the step's shapes, fastest of "
          f"{'/'.join(map(str, floor.threads))} threads per op) + "
          f"{floor.memory_bytes / 1e6:.2f} MB at {floor.stream_bytes_per_s / 1e9:.1f} GB/s "
          f"({floor.memory_s * 1e6:.0f} us) = {floor.step_s * 1e6:.0f} us")
    for op in floor.ops[:6]:
        print(f"    {op.op:<22} {op.shapes:<30} x{op.calls} {op.seconds * 1e6:7.1f} us "
              f"{op.gflops:6.1f} GFLOP/s ({op.threads} thread{'s' if op.threads > 1 else ''})")
    print(f"  floor per epoch     {floor_s:8.3f} s")
    print(f"  fast                {fast_s:8.3f} s/epoch = {fast_s / floor_s:.2f}x the floor")
    print(f"  {baseline_name:<19} {base_s:8.3f} s/epoch: fast is {base_s / fast_s:.1f}x faster")
    if floor_s >= fast_s:  # the floor is parts of the same step, each alone: never above it
        print(f"  error: the floor ({floor_s:.3f} s) is not below the run ({fast_s:.3f} s): "
              "the measurement is wrong (a load burst during the op timings?); rerun")
        row["goal_met"] = False
    if spec.name == "mnist-mlp" and fast.loader.batch_size == 64:
        met = fast_s / floor_s <= GOAL_FLOOR and base_s / fast_s >= GOAL_SPEEDUP
        row["goal_met"] = met and row.get("goal_met", True)
        print(f"  goal: fast <= {GOAL_FLOOR}x floor and >= {GOAL_SPEEDUP:.0f}x {baseline_name}: "
              f"{'met' if met else 'NOT met'}")
    return row


if __name__ == "__main__":
    sys.exit(main())
