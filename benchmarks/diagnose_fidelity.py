"""Does `looptune diagnose` tell the truth on loops it did not write? For each third-party-shaped
loop in tests/diagnose/loops/, diagnose runs the script unchanged; then the same loop's pieces
(its ``parts()``: the loader and one training step, the objects its main() builds) are timed
independently: the loader iterated alone, and the step run alone on one fixed batch. The
independent data share is loader time / (loader time + step time) per optimizer step.

Goal (issue 13): diagnose's data-wait share within 10 points of the independent one, every loop.

    python benchmarks/diagnose_fidelity.py --data ../shared/data/mnist
    python benchmarks/diagnose_fidelity.py --smoke          # CI: fewer steps, no verdict
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
from pathlib import Path

import looptune

LOOPS = Path(__file__).resolve().parents[1] / "tests" / "diagnose" / "loops"
GOAL_POINTS = 10.0


def fixtures(data: str | None, out_dir: str) -> list[tuple[str, list[str]]]:
    mnist = ["--data", data] if data else []
    return [("pytorch_examples_mnist.py", mnist),
            ("nanogpt_style.py", ["--out_dir", out_dir]),
            ("iterable_stream.py", ["--records", "100000"]),
            ("compiled_step.py", ["--samples", "16384", "--width", "512"]),
            ("lightning_mnist.py", ["--max-steps", "200"]),
            ("accelerate_loop.py", [])]


_NEEDS = {"lightning_mnist.py": "lightning", "accelerate_loop.py": "accelerate"}


def independent(script: str, argv: list[str], steps: int) -> dict[str, float]:
    """Median ms per optimizer step of the loader alone and of the step alone (fixed batch)."""
    spec = importlib.util.spec_from_file_location(Path(script).stem, LOOPS / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    got = module.parts(argv)
    batches, step = got[0], got[1]
    per_step = got[2] if len(got) > 2 else 1  # nanoGPT: a get_batch() per micro-step
    it = iter(batches)
    for _ in range(3):  # warm-up: worker start, first-touch of the data
        next(it)
    loader_ms = []
    for _ in range(steps):
        t0 = time.perf_counter()
        for _ in range(per_step):
            batch = next(it)
        loader_ms.append((time.perf_counter() - t0) * 1e3)
    for _ in range(3):  # warm-up: compilation, allocator
        step(batch)
    step_ms = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step(batch)  # its loss.item() ends the step: the time is the step's own
        step_ms.append((time.perf_counter() - t0) * 1e3)
    data, rest = statistics.median(loader_ms), statistics.median(step_ms)
    return {"data_ms": data, "step_ms": rest, "data_share": data / (data + rest)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", default=None, help="MNIST folder (default: $LOOPTUNE_DATA)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--smoke", action="store_true", help="CI mode: 6 steps each, no verdict")
    args = p.parse_args(argv)
    steps = 6 if args.smoke else args.steps
    ok = True
    with tempfile.TemporaryDirectory() as out_dir:
        print(f"{'loop':28} {'verdict':13} {'diagnose data':>13} {'independent':>11} "
              f"{'diff':>6}  step ms (diagnose / loader+step alone)")
        for script, extra in fixtures(args.data, out_dir):
            package = _NEEDS.get(script)
            if package and importlib.util.find_spec(package) is None:
                print(f"{script:28} skipped: {package} is not installed (looptune[{package}])")
                continue
            d = looptune.diagnose(str(LOOPS / script), extra, steps=steps, warmup=5)
            ind = independent(script, extra, steps)
            diag = 100 * d.shares["data_wait"]
            diff = diag - 100 * ind["data_share"]
            within = abs(diff) <= GOAL_POINTS
            ok &= within
            seen = "" if d.loaders else "  (no DataLoader seen: its batch making is in compute)"
            print(f"{script:28} {d.bottleneck:13} {diag:12.1f}% {100 * ind['data_share']:10.1f}% "
                  f"{diff:+6.1f}  {d.step_ms:7.2f} / {ind['data_ms'] + ind['step_ms']:7.2f}"
                  f"{'' if within else '  OUTSIDE'}{seen}")
    print(f"goal: every loop's data share within {GOAL_POINTS:g} points: {'PASS' if ok else 'FAIL'}")
    return 0 if ok or args.smoke else 1


if __name__ == "__main__":
    sys.exit(main())
