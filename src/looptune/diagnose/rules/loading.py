"""The loader bottlenecks (``data_loading``: the step waits for the next batch;
``host_to_device``: copies to the device dominate) and their remedies: pre-decoded or batched
data, DataLoader workers (:mod:`looptune.diagnose.rules.workers`), pinned or device-resident
batches."""

from __future__ import annotations

import dataclasses
from typing import Any

from looptune.diagnose.rules.profile import (
    REMEDY_SHARE, StepProfile, amdahl, amdahl_remedy, largest_phase, mib)
from looptune.diagnose.rules.records import Remedy
from looptune.diagnose.rules.workers import workers_remedy
from looptune.measure.records import Measurements

__all__ = ["BATCHED_AUG_REMOVED", "LOADER_SHARE", "PINNED_HIDDEN", "PREDECODED_REMOVED",
           "contested", "data_remedies", "h2d_remedies", "loader_bottleneck"]

# A loader phase must own this much of the step *and* be its largest phase to be the bottleneck:
# below that, the step's own work still sets the pace once the wait is hidden. Assumed, not
# measured.
LOADER_SHARE = 0.30
# the share of the data wait that augmenting whole batches on the device removes (~15% stays for
# the batched transform itself). Assumed, not measured.
BATCHED_AUG_REMOVED = 0.85
# the share of the data wait that indexing a pre-decoded tensor removes, when the gather of a
# pre-decoded batch was not measured (~10% stays). Assumed, not measured.
PREDECODED_REMOVED = 0.9
# the share of the copies pinned non_blocking copies hide behind compute. Assumed, not measured.
PINNED_HIDDEN = 0.7

_LOADER_PHASES = (("data_wait", "data_loading"), ("host_to_device", "host_to_device"))


def loader_bottleneck(p: StepProfile) -> tuple[str, dict[str, Any]] | None:
    """("data_loading" | "host_to_device", evidence) when that phase is at least LOADER_SHARE of
    the step and its largest phase; else None."""
    largest = largest_phase(p.shares)
    for phase, name in _LOADER_PHASES:
        if p.shares[phase] >= LOADER_SHARE and largest == phase:
            return name, _loader_evidence(p, phase, name)
    return None


def contested(p: StepProfile) -> str | None:
    """Why a loader phase of at least LOADER_SHARE is not the bottleneck (a larger phase);
    None when neither reaches it."""
    sh, largest = p.shares, largest_phase(p.shares)
    big = ", ".join(f"{k} {sh[k]:.1%}" for k in ("data_wait", "host_to_device")
                    if sh[k] >= LOADER_SHARE)
    return (f"{big} is >= {LOADER_SHARE:.0%} but {largest} ({sh[largest]:.1%}) is larger, "
            "so the largest phase decides") if big else None


def _loader_evidence(p: StepProfile, phase: str, name: str) -> dict[str, Any]:
    s = p.shares[phase]
    return {"rule": name, "reason": f"{phase} is {s:.1%} of the step (>= {LOADER_SHARE:.0%} and "
            f"the largest phase); removing it bounds the step at {amdahl(s):.2f}x",
            f"{phase}_share": s, "threshold": LOADER_SHARE,
            "speedup_if_removed": round(amdahl(s), 2)}


def data_remedies(m: Measurements, p: StepProfile) -> list[Remedy]:
    s = p.shares["data_wait"]
    if s < REMEDY_SHARE:
        return []
    head = (f"data wait is {s:.1%} of the step ({p.phase_s['data_wait'] * 1e3:.3f} ms); removing "
            f"all of it bounds the step at {amdahl(s):.2f}x; ")
    if m.loaders and m.loaders[0].random_per_sample:  # augmentation: nothing to pre-decode once
        action = ("augment whole batches on the device: keep the un-augmented images as one "
                  "uint8 tensor, gather batches by index and apply the same random transforms to "
                  "each batch with tensor ops (affine_grid + grid_sample, torchvision.transforms.v2 "
                  "on batched tensors, kornia or DALI); looptune recipe 'batched-aug'")
        reason = head + (f"{m.loaders[0].dataset}[0] read twice differed, so its per-sample "
                         "transform is random and cannot be pre-computed once; the batched "
                         f"transform itself is assumed to keep ~15% of the wait: 1/(1 - {s:.4f} "
                         f"x {BATCHED_AUG_REMOVED})")
        fraction, estimated = BATCHED_AUG_REMOVED, True  # assumed
    else:
        action = ("pre-decode the dataset into a tensor and gather batches by index (looptune "
                  "recipe 'tensorized' / 'device')")
        wait, g = p.phase_s["data_wait"], m.gather_s
        if g is not None and wait > 0:  # measured: a DataLoader over a pre-decoded copy
            fraction, estimated = max(0.0, 1 - g / wait), False
            reason = head + (f"a shuffled DataLoader over a pre-decoded dataset of the same "
                             f"batch bytes gathered a batch in {g * 1e3:.3f} ms here (measured "
                             f"after the script), which stays: 1/(1 - {s:.4f} x {fraction:.3f})")
        else:
            fraction, estimated = PREDECODED_REMOVED, True  # assumed
            reason = head + (f"indexing a pre-decoded tensor leaves ~10% of it (not measured: "
                             f"the batch's size is unknown): 1/(1 - {s:.4f} x "
                             f"{PREDECODED_REMOVED})")
    # kind "tensorized", not "loader": --verify applies only DataLoader(...) keyword arguments
    remedy = amdahl_remedy(action=action, share=s, fraction=fraction, reason=reason,
                           kind="tensorized", estimated=estimated)
    if not (m.loaders and m.loaders[0].random_per_sample):
        remedy = _warm_model(remedy, m, p, s * fraction * p.step_s)
    return [remedy, *workers_remedy(m, p, s)]


def _warm_model(remedy: Remedy, m: Measurements, p: StepProfile, removed_s: float) -> Remedy:
    """A pre-decoded step runs its model back to back, as the replay did: where the model's
    forward + backward timed inside the script's steps (between per-sample decodes in this
    process, its caches cold) took longer than the same replayed at the step's batch, the
    difference goes too (issue 32, verdict_check: a Linear step timed 0.32 ms between 4 ms of
    Python decoding ran 0.12 ms pre-decoded: 15x promised, 40-53x measured)."""
    sc = m.batch_scaling
    if sc is None or not sc.measured or not sc.in_step_s:
        return remedy
    warm = sc.calls_per_step * sc.small_s  # type: ignore[operator]
    cold = min(sc.in_step_s, p.phase_s["compute"])
    if warm >= cold:
        return remedy
    after = max(p.step_s - removed_s - (cold - warm), 1e-12)
    return dataclasses.replace(
        remedy, expected_speedup=round(p.step_s / after, 2),
        reason=remedy.reason + (
            f"; and the model's forward+backward, {cold * 1e3:.3f} ms per step between the "
            f"decodes, ran in {warm * 1e3:.3f} ms replayed back to back at the same batch (warm "
            f"caches): {p.step_s * 1e3:.3f} / ({p.step_s * 1e3:.3f} - {removed_s * 1e3:.3f} - "
            f"{(cold - warm) * 1e3:.3f}) ms"))


def h2d_remedies(p: StepProfile) -> list[Remedy]:
    h, d = p.shares["host_to_device"], p.shares["data_wait"]
    if h < REMEDY_SHARE or not p.on_cuda:
        return []
    out = [amdahl_remedy(
        action="keep the dataset on the device and gather batches there (looptune recipe "
               "'device')", share=h + d, fraction=1.0,
        reason=f"copies {h:.1%} + data wait {d:.1%} of the step go away: 1/(1 - {h + d:.4f}); "
               "needs the dataset to fit in device memory", kind="device_resident")]
    if p.pageable_bytes_per_step > 0 or p.h2d_bytes_per_step == 0:  # else already pinned
        out.append(amdahl_remedy(
            action="DataLoader(pin_memory=True) and .to(device, non_blocking=True)", share=h,
            fraction=PINNED_HIDDEN, reason=(
                f"copies are {h:.1%} of the step, {mib(p.pageable_bytes_per_step)} per step from "
                f"pageable memory; pinned non_blocking copies overlap compute, assumed "
                f"~{PINNED_HIDDEN:.0%} hidden: 1/(1 - {h:.4f} x {PINNED_HIDDEN})"),
            kind="transfer", estimated=True))
    return out
