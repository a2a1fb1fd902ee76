"""The reference MLP's batch-64 step, part by part, each A/B measured side by side in one run.

* the update: torch's ``Adam(fused=True).step()`` + ``zero_grad()`` vs ``optim.impl='direct'``
  (the same fused kernel called directly; fastpath/direct.py);
* forward + backward: ``loss.backward()`` vs the engine's direct autograd call
  (``engine.step.direct_backward``);
* the batch: a per-step gather of uint8 rows + normalization vs a gather of rows normalized
  once (``loader.normalize='once'``);
* the whole step (forward, backward, update) through the engine's Stepper: autograd vs
  ``step.backward='mlp'`` (fastpath/mlp.py), in fp32 (the same weights bit for bit) and in bf16
  (autocast vs each layer in bf16 only where its matmuls measured faster; the input stored in
  bf16, as ``loader.store='autocast'`` keeps it);
* the written-out step from Python (``backward='mlp'``) vs as one C++ call
  (``backward='mlp-cpp'``, fastpath/mlp_step.cpp; the same kernels, bit for bit), fp32 and bf16.

Each pair runs interleaved, ``--rounds`` rounds of about ``--round-s`` seconds each; medians.

    python benchmarks/step_parts.py
    python benchmarks/step_parts.py --smoke     # CI: short rounds, none grossly slower
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
from _goals import exit_code, passfail, smoke_check
from torch.nn import functional as F

from looptune.bench.workloads import MNIST_MEAN, MNIST_STD, SimpleFeedForwardNN
from looptune.data.loaders import normalize_batch
from looptune.engine.optim import build_optimizer
from looptune.engine.step import direct_backward
from looptune.recipe import OptimConfig

GOAL = 1.0
# --smoke: 3 rounds of 50 ms; the direct update is 2x in full runs, the others 1.07-1.6x
SMOKE_FLOOR, SMOKE_UPDATE = 0.8, 1.3


def _timed(fn, round_s: float) -> float:
    for _ in range(3):
        fn()
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < round_s:
        fn()
        n += 1
    return (time.perf_counter() - t0) / n


def ab(pair: dict, rounds: int, round_s: float) -> dict[str, float]:
    """Median seconds per call of each callable in ``pair``, rounds interleaved."""
    times: dict[str, list[float]] = {name: [] for name in pair}
    for r in range(rounds):
        order = list(pair.items()) if r % 2 == 0 else list(pair.items())[::-1]
        for name, fn in order:
            times[name].append(_timed(fn, round_s))
    return {name: statistics.median(ts) for name, ts in times.items()}


def _update_pair():
    x, y = torch.randn(64, 784), torch.randint(0, 10, (64,))
    out = {}
    for impl in ("fused", "direct"):
        torch.manual_seed(0)
        model = SimpleFeedForwardNN()
        opt, _ = build_optimizer(model.parameters(), OptimConfig(impl=impl), device="cpu")
        F.cross_entropy(model(x), y).backward()
        grads = [torch.randn_like(p) for p in model.parameters()]
        params = list(model.parameters())

        def update(opt=opt, params=params, grads=grads):
            for p, g in zip(params, grads):  # what backward leaves: fresh gradients
                p.grad = g
            opt.step()
            opt.zero_grad(set_to_none=True)

        out[f"update: impl={impl}"] = update
    return out


def _backward_pair():
    x, y = torch.randn(64, 784), torch.randint(0, 10, (64,))
    torch.manual_seed(0)
    model = SimpleFeedForwardNN()
    params, direct = list(model.parameters()), direct_backward()

    def plain():
        F.cross_entropy(model(x), y).backward()
        for p in params:
            p.grad = None

    def engine():
        direct(F.cross_entropy(model(x), y))
        for p in params:
            p.grad = None

    return {"fwd+bwd: loss.backward()": plain, "fwd+bwd: direct engine call": engine}


def _mlp_pair(precision: str, backwards: tuple[str, str] = ("autograd", "mlp")):
    from looptune.engine.step import Stepper
    from looptune.recipe import StepConfig

    gen = torch.Generator().manual_seed(0)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    x, y = torch.randn(64, 1, 28, 28, generator=gen).to(dtype), torch.randint(0, 10, (64,))
    out, steps = {}, []
    for backward in backwards:
        torch.manual_seed(0)
        model = SimpleFeedForwardNN()
        opt, _ = build_optimizer(model.parameters(), OptimConfig(impl="direct"), device="cpu")
        step = Stepper(model=model, optimizer=opt, scheduler=None, loss_fn=F.cross_entropy,
                       cfg=StepConfig(precision=precision, backward=backward),
                       device=torch.device("cpu"))
        step.prepare(64, dtype)
        if step._fast is not None and steps and steps[0]._fast is not None:  # the same layers in
            for mine, theirs in zip(step._fast.layers, steps[0]._fast.layers):  # bf16 as the
                mine.bf16 = theirs.bf16  # first's (each prepare times its own choice)
        steps.append(step)
        out[f"step {precision}: backward={backward}"] = lambda step=step: step(x, y)
    return out


def _batch_pair():
    gen = torch.Generator().manual_seed(0)
    pixels = torch.randint(0, 256, (60000, 1, 28, 28), dtype=torch.uint8, generator=gen)
    ready = normalize_batch(pixels, MNIST_MEAN, MNIST_STD)
    chunks = torch.randperm(60000, generator=gen).split(64)[:-1]
    at = [0]

    def index():
        at[0] = (at[0] + 1) % len(chunks)
        return chunks[at[0]]

    return {"batch: uint8 gather + normalize": lambda: normalize_batch(
                pixels.index_select(0, index()), MNIST_MEAN, MNIST_STD),
            "batch: normalized-once gather": lambda: ready.index_select(0, index())}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--round-s", type=float, default=0.2)
    p.add_argument("--smoke", action="store_true", help="CI mode: 3 short rounds; none grossly slower")
    args = p.parse_args(argv)
    rounds, round_s = (3, 0.05) if args.smoke else (args.rounds, args.round_s)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; medians of {rounds} "
          "interleaved rounds")
    ok = smoke_ok = True
    for pair in (_update_pair(), _backward_pair(), _batch_pair(), _mlp_pair("fp32"),
                 _mlp_pair("bf16"), _mlp_pair("fp32", ("mlp", "mlp-cpp")),
                 _mlp_pair("bf16", ("mlp", "mlp-cpp"))):
        (a, ta), (b, tb) = ab(pair, rounds, round_s).items()
        print(f"  {a:<34} {ta * 1e6:8.1f} us")
        print(f"  {b:<34} {tb * 1e6:8.1f} us   ({ta / tb:.2f}x)")
        ok &= ta / tb >= GOAL  # each technique is in the engine because it is faster
        floor = SMOKE_UPDATE if b.startswith("update") else SMOKE_FLOOR
        smoke_ok &= ta / tb >= floor if args.smoke else True
    if args.smoke:
        smoke_check(f"every technique >= {SMOKE_FLOOR:g}x what it replaces, the direct update "
                    f">= {SMOKE_UPDATE:g}x", smoke_ok)
    else:
        print(f"goal: every technique faster than what it replaces (>= {GOAL:g}x, medians of "
              f"{rounds} interleaved rounds): {passfail(ok)}")
    return exit_code(ok, smoke_ok, args.smoke)


if __name__ == "__main__":
    sys.exit(main())
