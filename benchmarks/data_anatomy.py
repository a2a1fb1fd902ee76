"""Inside the data wait (issue 31): for each planted input-chain cause, diagnose's split of the
chain against an independent one, measured apart in this process.

The planted cases are tests/diagnose/scripts/input_chain.py (each correct by construction):
decode (0 and 2 workers), storage (cold reads, 2 workers), collate, transfer (numpy batches from
2 workers) and contention (more busy workers than cores). Independently, per batch: the dataset's
samples timed alone (on-CPU time is decode, the rest of their wall time storage), the collate
function alone, and for workers a batch's pickle round trip through a pipe (ForkingPickler, as the DataLoader's
queue). Goal: the cause named right in every case, and each link's share of
storage + decode + collate + transfer within 10 points of the independent share. Contention has
no independent split: the chain must name it, as the data cause when the step waits for data,
else beside a finding that the step's own threads waited for a CPU (its cost shows inside the
step, not in the wait).

    python benchmarks/data_anatomy.py            # 12 measured steps per case
    python benchmarks/data_anatomy.py --smoke    # CI: 8 steps, shares within 20 points
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import sys
import tempfile
import threading
import time
from multiprocessing.reduction import ForkingPickler
from pathlib import Path

import looptune
from _goals import judged, passfail
from looptune.measure.input_chain import proc_available

SCRIPT = Path(__file__).resolve().parents[1] / "tests" / "diagnose" / "scripts" / "input_chain.py"
BATCH = 8
LINKS = ("storage", "decode", "collate", "transfer")
GOAL_POINTS, SMOKE_POINTS = 0.10, 0.20


def _planted():
    spec = importlib.util.spec_from_file_location("input_chain_planted", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # defines the datasets; main() runs only as a script
    return module


def _cases() -> list[tuple[str, int]]:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    out = [("decode", 0), ("decode", 2), ("collate", 0), ("transfer", 2)]
    if proc_available():  # storage and the waits for a CPU are read from /proc
        out[2:2] = [("storage", 2)]
        out.append(("contention", 2 * (cores or 1) + 1))
    return out


def independent(planted, cause: str, workers: int, root: str) -> dict[str, float]:
    """Seconds per batch of each link, measured apart: samples alone, collate alone, the pickle
    round trip alone (workers only)."""
    from torch.utils.data import default_collate

    dataset, collate, _ = planted.build(cause, root)
    collate = collate or default_collate
    walls, cpus, samples = [], [], []
    for i in range(3 * BATCH):
        t0, c0 = time.perf_counter(), time.thread_time()
        samples.append(dataset[i])
        walls.append(time.perf_counter() - t0)
        cpus.append(time.thread_time() - c0)
    wall, cpu = BATCH * _median(walls), BATCH * _median(cpus)
    spent = []
    for _ in range(5):  # the first call pays fresh pages; a running loader reuses them
        c0 = time.thread_time()
        batch = collate(samples[:BATCH])
        spent.append(time.thread_time() - c0)
    collate_s = _median(spent)
    transfer_s = _round_trip(batch) if workers else 0.0
    return {"storage": max(0.0, wall - cpu), "decode": cpu, "collate": collate_s,
            "transfer": transfer_s}


def _round_trip(batch) -> float:
    """Pickle (ForkingPickler, as the worker's queue: a tensor's storage moves to shared memory),
    a pipe, unpickle: seconds in this process, median of 5. (From a forked child instead, each
    fresh child's first shared tensor starts its resource-sharer thread, a cost a running
    worker paid once, long before.)"""
    times = []
    for _ in range(5):
        r, w = os.pipe()
        t0 = time.perf_counter()
        data = bytes(ForkingPickler.dumps(batch))

        def write():
            with os.fdopen(w, "wb") as f:
                f.write(data)

        writer = threading.Thread(target=write)
        writer.start()
        with os.fdopen(r, "rb") as f:
            got = f.read()
        writer.join()
        ForkingPickler.loads(got)
        times.append(time.perf_counter() - t0)
    return _median(times)


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def _shares(links: dict[str, float]) -> dict[str, float]:
    total = sum(links[k] for k in LINKS)
    return {k: links[k] / total if total else 0.0 for k in LINKS}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="CI: fewer steps, shares within 20 points")
    args = p.parse_args(argv)
    steps, points = (8, SMOKE_POINTS) if args.smoke else (12, GOAL_POINTS)
    planted = _planted()
    root = tempfile.mkdtemp()
    rows, ok = [], True
    try:
        for cause, workers in _cases():
            d = looptune.diagnose(str(SCRIPT), ["--cause", cause, "--workers", str(workers)],
                                  steps=steps, warmup=3)
            c = d.input_chain
            if cause == "contention":  # in the wait, or inside the step
                named = c.get("cause") == cause and (d.data_cause == cause or any(
                    f.name == "step_contention" for f in d.findings))
            else:
                named = d.bottleneck == "data_loading" and d.data_cause == cause
            theirs = _shares({k: c.get("links_ms", {}).get(k, 0.0) for k in LINKS})
            alone = independent(planted, cause, workers, root)
            ours = _shares(alone)
            gap = 0.0 if cause == "contention" else max(abs(theirs[k] - ours[k]) for k in LINKS)
            case_ok = named and gap <= points
            ok &= case_ok
            rows.append((cause, workers, d.bottleneck, d.data_cause, theirs, ours, gap, case_ok))
            print("  ms per batch: diagnose " + ", ".join(
                f"{k} {c.get('links_ms', {}).get(k, 0.0):.3f}" for k in LINKS) + "; alone "
                + ", ".join(f"{k} {1e3 * alone[k]:.3f}" for k in LINKS), flush=True)
            print(f"{cause} ({workers} workers): verdict {d.bottleneck}, data cause "
                  f"{d.data_cause} (chain: {c.get('cause')}); diagnose " + ", ".join(f"{k} {100 * theirs[k]:.0f}%" for k in LINKS)
                  + "; alone " + ", ".join(f"{k} {100 * ours[k]:.0f}%" for k in LINKS)
                  + (f"; largest gap {100 * gap:.0f} points" if cause != "contention" else "")
                  + f": {passfail(case_ok)}", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print()
    print("| case | workers | verdict | data cause | diagnose: storage/decode/collate/transfer | "
          "alone | largest gap |")
    print("|---|---|---|---|---|---|---|")
    for cause, workers, verdict, found, theirs, ours, gap, _ in rows:
        print(f"| {cause} | {workers} | {verdict} | {found} | "
              + " / ".join(f"{100 * theirs[k]:.0f}%" for k in LINKS) + " | "
              + " / ".join(f"{100 * ours[k]:.0f}%" for k in LINKS) + " | "
              + ("n/a" if cause == "contention" else f"{100 * gap:.0f} pts") + " |")
    label = (f"every cause named right and every share within {100 * points:.0f} points of the "
             "independent split")
    return judged(label, ok, args.smoke)


if __name__ == "__main__":
    sys.exit(main())
