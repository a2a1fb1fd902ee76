"""Every benchmark's full goal, one after another on this machine; exits 1 if any goal failed.

Each benchmark runs in its own process, in full mode (no --smoke), with nothing else of ours
running beside it: they time things, so run this on a quiet machine. Printed per benchmark: its
exit code, its wall time and its goal lines; written (--json, atomically): the same, with the
machine and torch version, for docs/results.md.

    python benchmarks/run_goals.py --data ../shared/data/mnist              # all (about an hour on 2 cores)
    python benchmarks/run_goals.py --data ../shared/data/mnist --only verdict_check,floor
    make bench                                                              # the same as the first line
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

# (benchmark, extra arguments; "{data}" is the MNIST folder). Order: quick ones first.
BENCHMARKS: list[tuple[str, list[str]]] = [
    ("step_parts", []),
    ("diagnose_overhead", ["--data", "{data}"]),
    ("seed_ladder", ["--data", "{data}", "--device", "cpu"]),
    ("floor", ["--data", "{data}", "--device", "cpu"]),
    ("switches", ["--data", "{data}", "--device", "cpu"]),
    ("tune_quality", ["--data", "{data}"]),
    ("pack_gain", []),
    ("data_anatomy", []),
    ("scaling", ["--data", "{data}", "--device", "cpu"]),
    ("threads", ["--data", "{data}"]),
    ("cnn_aug", ["--data", "{data}", "--device", "cpu"]),
    ("char_lm", ["--device", "cpu"]),
    ("diagnose_fidelity", ["--data", "{data}"]),
    ("verdict_check", ["--data", "{data}"]),
    ("engine_goals", ["--data", "{data}", "--device", "cpu"]),
    ("tta_search", ["--data", "{data}"]),
    ("images", ["--data", "{data}"]),
]
GOAL_WORDS = ("goal", "PASS", "FAIL", "INCONCLUSIVE", "NOT met", "fastest:")


def _goal_lines(text: str) -> list[str]:
    return [ln.strip() for ln in text.splitlines() if any(w in ln for w in GOAL_WORDS)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", default=os.environ.get("LOOPTUNE_DATA"),
                   help="MNIST folder (default: $LOOPTUNE_DATA)")
    p.add_argument("--only", default=None, help="comma-separated benchmark names (default: all)")
    p.add_argument("--json", default=None, help="write every benchmark's result here")
    p.add_argument("--logs", default=None, help="keep each benchmark's full output in this folder")
    args = p.parse_args(argv)
    names = [name for name, _ in BENCHMARKS]
    todo = BENCHMARKS
    if args.only:
        wanted = [w.strip() for w in args.only.split(",") if w.strip()]
        bad = [w for w in wanted if w not in names]
        if bad:
            p.error(f"--only {','.join(bad)} is invalid: the benchmarks are {', '.join(names)}")
        todo = [b for b in BENCHMARKS if b[0] in wanted]
    if args.data is None or not Path(args.data).is_dir():
        p.error(f"--data {args.data!r} is invalid: give the MNIST folder (or set LOOPTUNE_DATA)")
    logs = Path(args.logs) if args.logs else None
    if logs:
        logs.mkdir(parents=True, exist_ok=True)
    results = []
    for name, extra in todo:
        cmd = [sys.executable, str(HERE / f"{name}.py"), *(a.format(data=args.data) for a in extra)]
        print(f"== {name}: {' '.join(cmd[1:])}", flush=True)
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        wall = time.perf_counter() - t0
        if logs:
            (logs / f"{name}.log").write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
        lines = _goal_lines(proc.stdout)
        for ln in lines:
            print(f"   {ln}")
        if proc.returncode not in (0, 1):
            print(f"   error (exit {proc.returncode}): {proc.stderr.strip()[-600:]}")
        print(f"   {name}: exit {proc.returncode} in {wall:.0f} s: "
              f"{'PASS' if proc.returncode == 0 else 'FAIL'}", flush=True)
        results.append({"benchmark": name, "command": " ".join(cmd[1:]), "exit": proc.returncode,
                        "wall_s": round(wall, 1), "goal_lines": lines})
    failed = [r["benchmark"] for r in results if r["exit"] != 0]
    print(f"\n{len(results) - len(failed)}/{len(results)} benchmark goals met"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    if args.json:
        import torch

        from looptune._io import atomic_write_text
        from looptune.measure.provenance import cpu_name

        record = {"date": time.strftime("%Y-%m-%d"), "cpu": cpu_name(), "cpu_count": os.cpu_count(),
                  "platform": platform.platform(), "torch": torch.__version__,
                  "threads": torch.get_num_threads(), "results": results}
        atomic_write_text(args.json, json.dumps(record, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
