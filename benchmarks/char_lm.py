"""Byte-level GPT (workload char-gpt): the nanoGPT-style fp32 eager baseline against looptune's
recipes, side by side in one run, at an equal token count; then `looptune diagnose` on the same
loop written as a user script (examples/char_lm.py), and its top remedy applied alone
(``baseline`` + ``step.precision=bf16``) to check what diagnose promised.

Goal (issue 12): looptune's fastest recipe >= 2x the baseline in tokens/s, validation loss
within 2% at an equal token count; diagnose names compute or overhead.

    python benchmarks/char_lm.py                       # pystdlib corpus (offline), 1 epoch
    python benchmarks/char_lm.py --corpus tinyshakespeare
    python benchmarks/char_lm.py --smoke               # CI: tiny corpus slice, no verdict
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import looptune
from looptune.presets import get_recipe
from looptune.recipe import with_overrides
from looptune.report.render import bench_table, wide_console

GOAL_SPEEDUP, GOAL_LOSS_REL = 2.0, 0.02
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "char_lm.py"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--corpus", default="pystdlib")
    p.add_argument("--max-bytes", type=int, default=1 << 19, help="pystdlib bytes (default 512 KiB)")
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--device", default="auto")
    p.add_argument("--json", default=None, help="also write the results JSON here")
    p.add_argument("--smoke", action="store_true", help="CI mode: 32 KiB, context 32, no verdict")
    args = p.parse_args(argv)
    size = {"max_bytes": 1 << 15, "context": 32} if args.smoke else {
        "max_bytes": args.max_bytes, "context": args.context}
    dev = "cuda" if args.device == "cuda" else "cpu" if args.device == "cpu" else None
    dev = dev or ("cuda" if _cuda() else "cpu")
    base = get_recipe("baseline", dev, "char-gpt")
    remedy = with_overrides(base, ["step.precision=bf16"])
    remedy = type(base)(**{**remedy.__dict__, "name": "baseline+bf16",
                           "description": "the baseline with diagnose's top remedy (bf16 autocast)"})
    recipes = [base, remedy, get_recipe("fast", dev, "char-gpt")]
    try:
        results = looptune.bench(workload="char-gpt", recipes=recipes, epochs=args.epochs,
                                 device=args.device, repeats=args.repeats, corpus=args.corpus,
                                 **size)
    except looptune.LooptuneError as err:
        print(f"char_lm: error: {err}", file=sys.stderr)
        return 2
    wide_console().print(bench_table(results))
    if args.json:
        results.write_json(args.json)
    ok = _goal(results, size["context"])
    ok &= _diagnose(args.corpus, size, steps=6 if args.smoke else 15)
    return 0 if ok or args.smoke else 1


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _goal(results: looptune.BenchResults, context: int) -> bool:
    base = results.runs[0]
    for run, speedup in zip(results.runs, results.speedups()):
        rel = run.metric / base.metric - 1
        print(f"{run.recipe:>14}: {run.samples_per_s * context:9,.0f} tokens/s, {speedup:5.2f}x "
              f"vs {base.recipe}, val_loss {run.metric:.4f} ({100 * rel:+.2f}%), "
              f"{run.metric / 0.6931471805599453:.3f} bits/byte")
    run, speedup = max(zip(results.runs[1:], results.speedups()[1:]), key=lambda rs: rs[1])
    rel = run.metric / base.metric - 1
    ok = speedup >= GOAL_SPEEDUP and abs(rel) <= GOAL_LOSS_REL
    print(f"fastest: {run.recipe} {speedup:.2f}x, val_loss {100 * rel:+.2f}%; goal >= "
          f"{GOAL_SPEEDUP}x and |loss| <= {100 * GOAL_LOSS_REL:g}% at "
          f"{results.runs[0].samples_per_epoch * results.epochs * context:,} tokens: "
          f"{'PASS' if ok else 'FAIL'}")
    return ok


def _diagnose(corpus: str, size: dict, steps: int) -> bool:
    args = ["--corpus", corpus, "--max-bytes", str(size["max_bytes"]), "--context",
            str(size["context"])]
    d = looptune.diagnose(str(EXAMPLE), args, steps=steps, warmup=2)
    print(f"diagnose {EXAMPLE.name}: verdict {d.bottleneck}, shares "
          + ", ".join(f"{k} {100 * v:.1f}%" for k, v in d.shares.items() if v > 0.005)
          + f" of a {d.step_ms:.2f} ms step; {d.evidence.get('reason', '')}")
    for i, r in enumerate(d.remedies[:2], 1):
        print(f"  remedy {i}: {r.action} (up to {r.expected_speedup:.2f}x)")
    print("  (remedy 1 applied alone is the 'baseline+bf16' row above)")
    return d.bottleneck in ("compute", "overhead")


if __name__ == "__main__":
    sys.exit(main())
