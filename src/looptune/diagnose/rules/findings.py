"""Pre-flight findings: settings and environment facts worth a word, each with its numbers and fix."""

from __future__ import annotations

import math

from looptune.diagnose.rules.batch import scaled_step
from looptune.diagnose.rules.overhead import overhead_share
from looptune.diagnose.rules.update import update_memory_s
from looptune.diagnose.rules.profile import REMEDY_SHARE, StepProfile, mib
from looptune.diagnose.rules.records import Finding
from looptune.measure.records import LoaderInfo, Measurements

__all__ = ["SHM_FRACTION", "SHM_HEADROOM", "TINY_BATCH", "TINY_BATCH_FACTOR", "findings"]

# in-flight batches above half of /dev/shm: a second loader or a spike fills it. Assumed, not
# measured.
SHM_FRACTION = 0.5
# the --shm-size suggested: this many times the bytes in flight. Assumed, not measured.
SHM_HEADROOM = 2
# below this batch size the fixed per-step cost is paid for very few samples. Assumed, not
# measured.
TINY_BATCH = 64
# the larger batch the tiny-batch finding suggests, as a multiple of the script's. Assumed, not
# measured.
TINY_BATCH_FACTOR = 4


def findings(m: Measurements, p: StepProfile, bottleneck: str) -> list[Finding]:
    out: list[Finding] = []
    for i, ld in enumerate(m.loaders):
        label = f"loader {i} ({ld.dataset})"
        out += _workers_finding(m, ld, label) + _shm_finding(m, ld, label)
        out += _pin_finding(p, ld, label)
        # on a compute-bound step a small batch is a modelling choice; only the loader that feeds
        # the training step (the most batches drawn: loaders[0]), never a validation loader
        if bottleneck == "overhead" and i == 0:
            out += _tiny_batch_finding(m, p, ld, label)
    return out + _no_loader_finding(m) + _tf32_finding(m, p) + _pageable_finding(p)


def _no_loader_finding(m: Measurements) -> list[Finding]:
    if m.loaders:
        return []
    return [Finding(name="no_dataloader", severity="warning", message=(
        "no torch DataLoader was iterated: the data-wait phase is measured on DataLoader "
        "batches, so whatever this script does to produce its batches (its own get_batch() or "
        "iterator) is counted inside compute here, not as data wait. Time that function alone "
        "to split it out, or feed the loop through a DataLoader."))]


def _workers_finding(m: Measurements, ld: LoaderInfo, label: str) -> list[Finding]:
    if m.env is None or m.env.cpu_count < 1 or ld.num_workers < m.env.cpu_count:
        return []
    n, w = m.env.cpu_count, ld.num_workers
    return [Finding(name="workers_vs_cores", severity="warning", message=(
        f"{label}: num_workers={w} on {n} CPU cores: {w} workers + the main process compete with "
        f"the training step itself. Use at most num_workers={max(0, n - 1)} (cpu_count - 1), or 0 "
        "(with a pre-decoded dataset); the DataLoader remedy, when listed, is sized from reads "
        "of this loader measured on this machine."))]


def _shm_finding(m: Measurements, ld: LoaderInfo, label: str) -> list[Finding]:
    shm = m.env.shm_bytes if m.env else None
    if not (shm and ld.batch_bytes and ld.num_workers > 0):
        return []
    prefetch = ld.prefetch_factor or 2  # torch's default with workers
    needed = ld.batch_bytes * ld.num_workers * prefetch
    if needed <= SHM_FRACTION * shm:
        return []
    return [Finding(name="shm", severity="warning", message=(
        f"{label}: up to {mib(needed)} of batches in flight ({mib(ld.batch_bytes)} x "
        f"{ld.num_workers} workers x prefetch_factor {prefetch}) vs /dev/shm of {mib(shm)} "
        f"(> {SHM_FRACTION:.0%}); workers hand batches over through /dev/shm and die with a bus "
        f"error when it fills. Docker's default is 64 MiB: run with "
        f"--shm-size={math.ceil(SHM_HEADROOM * needed / 2**30)}g, or lower num_workers / prefetch_factor."))]


def _pin_finding(p: StepProfile, ld: LoaderInfo, label: str) -> list[Finding]:
    """Only where this torch's DataLoader really pinned the batches (LoaderInfo.pinned, read from
    the script's iterator): torch 2.13's pins only when an accelerator is available (it warns
    and skips it), so there pin_memory=True on a CPU costs nothing (issue 32)."""
    if not ld.pin_memory or p.on_cuda or ld.pinned is not True:
        return []
    size = f" ({mib(ld.batch_bytes)} per batch)" if ld.batch_bytes else ""
    return [Finding(name="pin_without_gpu", severity="info", message=(
        f"{label}: pin_memory=True but the step runs on the CPU: pinning only speeds host-to-GPU "
        f"copies, and this torch's DataLoader pinned every batch: an extra copy of each{size}. "
        "Set pin_memory=False."))]


def _tiny_batch_finding(m: Measurements, p: StepProfile, ld: LoaderInfo, label: str) -> list[Finding]:
    if ld.batch_size is None or ld.batch_size >= TINY_BATCH:
        return []
    b = ld.batch_size
    # the verdict's own figure where the replay measured it (one report, one number: issue 32)
    scaled = scaled_step(m, p.phase_s, update_memory_s(m, p.part_s))
    share = (f"{scaled.fixed_share:.1%} of its busy time does not grow with the batch"
             if scaled is not None else f"{overhead_share(m, p):.1%} of it is fixed per-step cost")
    return [Finding(name="tiny_batch", severity="info", message=(
        f"{label}: batch_size={b} on an overhead-bound step ({share}, paid every {b} samples). "
        f"Try batch_size={TINY_BATCH_FACTOR * b} and scale the learning rate with it."))]


def _tf32_finding(m: Measurements, p: StepProfile) -> list[Finding]:
    env = m.env
    if not (p.on_cuda and env and env.tf32_supported and env.tf32_enabled is False):
        return []
    return [Finding(name="tf32_off", severity="warning", message=(
        f"TF32 is off on {env.device_name}, which has it: fp32 matmuls run at the full-fp32 rate "
        f"(compute is {p.shares['compute']:.1%} of the step). Set torch.backends.cuda.matmul."
        "allow_tf32 = True or torch.set_float32_matmul_precision(\"high\")."))]


def _pageable_finding(p: StepProfile) -> list[Finding]:
    h = p.shares["host_to_device"]
    if not (p.on_cuda and p.pageable_bytes_per_step > 0 and h >= REMEDY_SHARE):
        return []
    return [Finding(name="pageable_h2d", severity="warning", message=(
        f"{mib(p.pageable_bytes_per_step)} per step is copied to the GPU from pageable memory and "
        f"copies take {h:.1%} of the step: pageable copies go through a staging buffer and block "
        "the host. Use DataLoader(pin_memory=True) and .to(device, non_blocking=True)."))]

