"""Recipes of the ``jpeg-folder`` workload: a folder of JPEGs decoded and augmented per sample.

The baseline is the pipeline as people write it (ImageFolder + PIL decode + RandomResizedCrop +
flip + ToTensor + Normalize in a plain DataLoader, ``loss.item()`` every step). looptune's
recipes, each one switch more: DataLoader workers on the cores left free, the JPEG decoded at a
reduced size (draft mode) or by libjpeg-turbo (simplejpeg), and every file decoded once into a
uint8 tensor at 48 x 48 with the random crops and flips applied to whole batches.
"""

from __future__ import annotations

import os

from looptune.presets.preset import Preset
from looptune.presets.probe import Candidate, classifier_settings
from looptune.recipe import (Decision, LoaderConfig, OptimConfig, Recipe, ScheduleConfig,
                             StepConfig)

__all__ = ["RECIPES", "DEFAULT_BENCH"]

_MEASURED = ("benchmarks/images.py (12000 training files, 6 epochs, median of 3) on a 2-core "
             "AMD EPYC (Zen 5) VM, torch 2.13 CPU, Pillow 13, 2026-12-07")
# every recipe: the same model, optimizer and one-cycle schedule, so they differ only in how the
# pixels reach the step
_OPTIM = OptimConfig(lr=4e-3)
_SCHEDULE = ScheduleConfig(name="onecycle", pct_start=0.15)
_BASE = ("ImageCNN at 32 x 32, per-sample PIL decode + RandomResizedCrop(35-100%) + flip + "
         "ToTensor + Normalize, Adam one-cycle peak 4e-3, batch 64")


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _workers(device_type: str, decoder: str = "pil") -> Recipe:
    cores = _cores()
    workers = max(1, cores - 1)
    threads = max(1, cores - workers)
    reasons = (
        Decision("loader.num_workers", workers, reason=(
            f"this process may use {cores} core(s) (sched_getaffinity, read where it runs): the "
            f"per-sample decode + crop in {workers} worker process(es), the step on the core(s) "
            "left; each JPEG decode takes longer than the step's share of a sample")),
        Decision("cpu_threads", threads, reason=(
            f"the step's intra-op threads on the {threads} core(s) the workers leave: more would "
            "contend with the decoding workers (looptune tune loader co-measures this)")),
        Decision("loss_sync", "epoch", reason="the loss stays on the device: no sync per step"),
    )
    if decoder != "pil":
        reasons += (Decision("loader.image_decoder", decoder, reason=(
            "JPEG draft mode: the crop is drawn from the header, then libjpeg decodes at the "
            "smallest 1/2, 1/4 or 1/8 scale that keeps it at 32 pixels a side (most of the "
            f"inverse DCT skipped; {_MEASURED})" if decoder == "draft" else
            "libjpeg-turbo through simplejpeg at the draft's scale, without Pillow's decoder "
            f"objects ({_MEASURED})")),)
    name = {"pil": "workers", "draft": "draft+workers", "simplejpeg": "simplejpeg+workers"}[decoder]
    return Recipe(
        name=name, description=f"{_BASE}; {workers} DataLoader worker(s), persistent"
        + ("" if decoder == "pil" else f"; decoded with {decoder}"),
        loader=LoaderConfig(num_workers=workers, persistent_workers=True, image_decoder=decoder),
        optim=_OPTIM, schedule=_SCHEDULE, cpu_threads=threads if device_type == "cpu" else None,
        loss_sync="epoch", reasons=reasons)


# packed's layout on a CPU, timed on this machine (presets/probe.py): oneDNN's NHWC convolutions
# win on some CPUs and lose on others (mnist-cnn: ~20% faster on a Zen 4 VM, ~25% slower on a
# Zen 5 one); fp32 first, the plain choice, kept unless channels_last is >= 3% faster
CPU_CANDIDATES = [Candidate(impl="auto", precision="fp32"),
                  Candidate(impl="auto", precision="fp32", channels_last=True)]


def cpu_layout(batch_size: int) -> tuple[Candidate, str]:
    """Whether ImageCNN's step runs faster channels_last at ``batch_size`` here, and why."""
    from looptune.models import ImageCNN

    return classifier_settings(workload="jpeg-folder", batch_size=batch_size,
                               candidates=CPU_CANDIDATES, build_model=ImageCNN, shape=(3, 32, 32))


def _packed(device_type: str) -> Recipe:
    cpu = device_type == "cpu"
    if cpu:
        chosen, evidence = cpu_layout(64)
        layout = Decision("step.channels_last", chosen.channels_last, reason=(
            f"the faster conv layout at batch 64 on this CPU; {evidence}"))
    else:
        chosen = CPU_CANDIDATES[0]
        layout = Decision("step.channels_last", False, reason=(
            "this net's 16-64 channels are too narrow for tensor cores to pay"))
    reasons = (
        Decision("loader", "decoded once + batched crops", reason=(
            "every file decoded once at 48 x 48 (the whole image resized; FFCV's raw mode), kept "
            "as uint8 on the training device; each batch's random resized crops and flips drawn "
            "in the originals' coordinates and applied with one affine_grid + grid_sample: no "
            f"file read or JPEG decode per sample ({_MEASURED}: 6.72x the baseline warm, 8.05x "
            "cold, accuracy -0.18 points)")),
        layout,
        Decision("loss_sync", "epoch", reason="the loss stays on the device: no sync per step"),
    )
    return Recipe(
        name="packed", description="every file decoded once (48 x 48 uint8, on the device); "
        "the same crops and flips on whole batches; batch 64",
        loader=LoaderConfig(strategy="device", decode="tensorized"),
        step=StepConfig(channels_last=chosen.channels_last), optim=_OPTIM, schedule=_SCHEDULE,
        loss_sync="epoch", reasons=reasons)


RECIPES: dict[str, Recipe | Preset] = {r.name: r for r in [
    Recipe(name="baseline", description=f"{_BASE}; DataLoader num_workers=0, loss.item() every "
           "step", optim=_OPTIM, schedule=_SCHEDULE),
    Preset("workers", "the baseline's dataset in DataLoader workers on the free cores, the step "
           "on the rest", _workers),
    Preset("draft+workers", "workers, each JPEG decoded at a reduced size (draft mode)",
           lambda device_type: _workers(device_type, "draft")),
    Preset("simplejpeg+workers", "workers, decoded by libjpeg-turbo (simplejpeg) at the reduced "
           "size (pip install 'looptune[jpeg]')",
           lambda device_type: _workers(device_type, "simplejpeg")),
    Preset("packed", "every file decoded once, crops and flips on whole batches", _packed),
]}
DEFAULT_BENCH = ("baseline", "workers", "draft+workers", "packed")
