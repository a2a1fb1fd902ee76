"""A short measured probe that picks a preset's step settings on the machine it runs on.

A setting that was fastest on one machine can be slower on the next (a 2-core AMD VM and an
Intel Xeon with AMX disagree on bf16 and on threads), so presets do not hard-code them: the
probe trains the workload's model for a fraction of a second under each candidate (the engine's
own Stepper, so what is timed is what runs), in interleaved rounds, and the preset takes the
fastest. The result is cached per machine (CPU model, cores this process may use, device name)
and torch version in ``$XDG_CACHE_HOME/looptune/probes.json``, so it is paid once; the evidence
(every candidate's time per step, where and when it was measured) goes into the preset's
decisions.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from looptune._paths import cache_root
from looptune._io import atomic_write_text
from looptune.errors import ConfigError
from looptune.measure.provenance import cpu_name
from looptune.recipe import OptimConfig, StepConfig

__all__ = ["Candidate", "ProbeResult", "cache_path", "classifier_settings", "image_batch",
           "machine_key", "probe", "probed_settings"]

PROBE_VERSION = 1  # bump when what a probe measures changes: old cached results are ignored
ROUNDS = 9  # interleaved rounds; each candidate's median is compared (a burst of load on a
# shared VM hits one or two short rounds, not the median)
ROUND_S = 0.04  # seconds of steps per candidate per round
_MODES = ("", "1", "on", "yes", "true", "0", "off", "no", "false", "refresh")  # LOOPTUNE_PROBE
WIN = 0.03  # a candidate replaces the first (the plain choice) only when >= 3% faster
# a candidate whose warm-up steps took this many times the plain one's is not timed further:
# it cannot win, and some are very slow (bf16 autocast on a CPU without native bf16 ran a
# small GPT's step 20-100x slower than fp32 on a Zen 3 VM); its warm-up figure stands for it
HOPELESS = 2.0


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """One setting of the step to time: optimizer kernels, autocast dtype, intra-op threads."""

    impl: str = "fused"
    precision: str = "fp32"
    threads: int | None = None  # None: torch's default (one per core this process may use)
    backward: str = "autograd"  # StepConfig.backward ("mlp", "mlp-cpp": written-out MLP steps)
    attention: str = "auto"  # StepConfig.attention (the kernel behind sdpa)
    channels_last: bool = False  # StepConfig.channels_last (NHWC weights and 4-D inputs)

    @property
    def name(self) -> str:
        threads = "all threads" if self.threads is None else f"{self.threads} thread(s)"
        mlp = f" backward={self.backward}" if self.backward != "autograd" else ""
        sdpa = f" attention={self.attention}" if self.attention != "auto" else ""
        nhwc = " channels_last" if self.channels_last else ""
        return f"{self.impl} {self.precision} {threads}{mlp}{sdpa}{nhwc}"


@dataclass(frozen=True, kw_only=True)
class ProbeResult:
    """Seconds per step of each candidate (median of the rounds) and the one chosen."""

    key: str  # the machine, torch version and workload the figures belong to
    seconds: dict[str, float]  # candidate name -> seconds per step
    chosen: Candidate
    measured_at: str  # when (UTC), for the reader of a cached figure
    cached: bool  # read from the cache file rather than measured now
    warm_only: tuple[str, ...] = ()  # candidates timed in the warm-up round only (HOPELESS)

    def evidence(self) -> str:
        first = next(iter(self.seconds.values()))
        parts = [f"{name} {s * 1e6:.0f} us ({first / s:.2f}x"
                 + (f", its warm-up steps only: >= {HOPELESS:g}x the plain one's)"
                    if name in self.warm_only else ")") for name, s in self.seconds.items()]
        where = "cached from" if self.cached else "measured"
        return (f"probe on this machine ({self.key}; {where} {self.measured_at}, median of "
                f"{ROUNDS} interleaved rounds): " + ", ".join(parts))


def cache_path() -> Path:
    """``$LOOPTUNE_PROBE_CACHE`` if set, else ``$XDG_CACHE_HOME/looptune/probes.json``."""
    if os.environ.get("LOOPTUNE_PROBE_CACHE"):
        return Path(os.environ["LOOPTUNE_PROBE_CACHE"])
    return cache_root() / "probes.json"


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def machine_key(device: torch.device) -> str:
    where = (torch.cuda.get_device_name(device) if device.type == "cuda"
             else f"{cpu_name()}, {_usable_cores()} cores")
    return f"{where}, torch {torch.__version__}"


def _read_cache() -> dict[str, Any]:
    try:
        return json.loads(cache_path().read_text())
    except (OSError, ValueError):  # none yet, or unreadable: probe again and rewrite it
        return {}


def _write_cache(entries: dict[str, Any]) -> None:
    try:
        atomic_write_text(cache_path(), json.dumps(entries, indent=1))  # candidate order kept
    except OSError:  # a read-only home: the probe still decided, it is just not remembered
        pass


def probe(*, workload: str, batch_size: int, candidates: list[Candidate],
          build_model: Callable[[], torch.nn.Module], loss_fn: Callable[..., torch.Tensor],
          make_batch: Callable[[int, torch.device], tuple[torch.Tensor, torch.Tensor]],
          device: torch.device, refresh: bool = False) -> ProbeResult:
    """Time ``candidates`` (the first is the plain choice) on ``build_model()`` at
    ``batch_size`` and return the fastest; cached per machine, torch version, workload, batch
    size and candidate list unless ``refresh``."""
    key = f"{machine_key(device)}; {workload} batch {batch_size}"
    entry_key = _entry_key(key, candidates)
    entries = _read_cache()
    hit = entries.get(entry_key)
    if hit and not refresh:
        chosen = Candidate(**hit["chosen"])
        return ProbeResult(key=key, seconds=hit["seconds"], chosen=chosen,
                           measured_at=hit["measured_at"], cached=True,
                           warm_only=tuple(hit.get("warm_only", ())))
    seconds, warm_only = _measure(candidates, build_model, loss_fn, make_batch, batch_size,
                                  device)
    first = candidates[0]
    best = min(candidates, key=lambda c: seconds[c.name])
    chosen = best if seconds[best.name] <= (1 - WIN) * seconds[first.name] else first
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    entries[entry_key] = {"seconds": seconds, "chosen": chosen.__dict__, "measured_at": stamp,
                          "warm_only": list(warm_only)}
    _write_cache(entries)
    return ProbeResult(key=key, seconds=seconds, chosen=chosen, measured_at=stamp, cached=False,
                       warm_only=tuple(warm_only))


def probed_settings(*, workload: str, batch_size: int, candidates: list[Candidate],
                    build_model: Callable[[], torch.nn.Module],
                    loss_fn: Callable[..., torch.Tensor],
                    make_batch: Callable[[int, torch.device], tuple[torch.Tensor, torch.Tensor]]
                    ) -> tuple[Candidate, str]:
    """The CPU step settings a preset should use here, and the evidence for its decision.

    ``LOOPTUNE_PROBE=0`` skips the probe (the plain first candidate, said so);
    ``LOOPTUNE_PROBE=refresh`` measures again and replaces the cached result. Launched with
    several ranks (``WORLD_SIZE`` > 1) only a cached result is used: ranks probing at once would
    slow each other down and could pick different settings, so they take the plain one instead.
    """
    plain = candidates[0]
    mode = os.environ.get("LOOPTUNE_PROBE", "1").strip().lower()
    if mode not in _MODES:
        raise ConfigError(f"LOOPTUNE_PROBE={os.environ['LOOPTUNE_PROBE']!r} is invalid: use 1 "
                          "(probe once, then the cache), 0 (no probe: the plain setting) or "
                          "refresh (measure again). Unset it for the default.")
    if mode in ("0", "off", "no", "false"):
        return plain, "not probed (LOOPTUNE_PROBE=0): the plain setting, unmeasured here"
    kwargs = dict(workload=workload, batch_size=batch_size, candidates=candidates,
                  build_model=build_model, loss_fn=loss_fn, make_batch=make_batch,
                  device=torch.device("cpu"))
    if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
        cached = cached_probe(**kwargs)
        if cached is None:
            return plain, ("not probed: several ranks would time each other's load and could "
                           "disagree; run `looptune bench` once in one process to probe this "
                           "machine, later launches read the cached result")
        return cached.chosen, cached.evidence()
    result = probe(**kwargs, refresh=mode == "refresh")
    return result.chosen, result.evidence()


def image_batch(shape: tuple[int, ...], classes: int = 10
                ) -> Callable[[int, torch.device], tuple[torch.Tensor, torch.Tensor]]:
    """``make_batch`` for a classifier fed normalized float images of ``shape`` (C, H, W), as a
    batched augmentation hands them to the step: the same seeded batch for every candidate."""
    def make(n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(n, *shape, generator=gen)
        return x.to(device), torch.randint(0, classes, (n,), generator=gen).to(device)
    return make


def classifier_settings(*, workload: str, batch_size: int, candidates: list[Candidate],
                        build_model: Callable[[], torch.nn.Module], shape: tuple[int, ...]
                        ) -> tuple[Candidate, str]:
    """:func:`probed_settings` for an image classifier (cross-entropy over normalized float
    images of ``shape``, C x H x W)."""
    return probed_settings(workload=workload, batch_size=batch_size, candidates=candidates,
                           build_model=build_model, loss_fn=torch.nn.functional.cross_entropy,
                           make_batch=image_batch(shape))


def cached_probe(**kwargs: Any) -> ProbeResult | None:
    """The cached result :func:`probe` would return, or None: nothing is measured."""
    key = f"{machine_key(kwargs['device'])}; {kwargs['workload']} batch {kwargs['batch_size']}"
    hit = _read_cache().get(_entry_key(key, kwargs["candidates"]))
    if not hit:
        return None
    return ProbeResult(key=key, seconds=hit["seconds"], chosen=Candidate(**hit["chosen"]),
                       measured_at=hit["measured_at"], cached=True,
                       warm_only=tuple(hit.get("warm_only", ())))


def _entry_key(key: str, candidates: list[Candidate]) -> str:
    return f"v{PROBE_VERSION} {key}; " + " | ".join(c.name for c in candidates)


def _measure(candidates: list[Candidate], build_model, loss_fn, make_batch, batch_size: int,
             device: torch.device) -> tuple[dict[str, float], list[str]]:
    """Seconds per step of each candidate (the median of its rounds), and the names of those
    timed in the warm-up round only (>= HOPELESS x the plain one there)."""
    from looptune.engine.optim import build_optimizer
    from looptune.engine.step import Stepper

    x, y = make_batch(batch_size, device)
    steppers = []
    times: dict[str, list[float]] = {c.name: [] for c in candidates}
    default_threads = torch.get_num_threads()
    try:
        for c in candidates:
            torch.manual_seed(0)
            model = build_model().to(device)
            if c.channels_last:  # as the engine's loop does before building the optimizer
                model.to(memory_format=torch.channels_last)
            optimizer, _ = build_optimizer(model.parameters(), OptimConfig(impl=c.impl),
                                           device=device)
            step = Stepper(model=model, optimizer=optimizer, scheduler=None, loss_fn=loss_fn,
                           cfg=StepConfig(precision=c.precision, backward=c.backward,
                                          attention=c.attention, channels_last=c.channels_last),
                           device=device)
            torch.set_num_threads(c.threads or default_threads)
            step.prepare(batch_size, x.dtype)  # backward='mlp': its setup, as a run's
            steppers.append(step)
        warm: dict[str, float] = {}
        for round_ in range(ROUNDS + 1):  # round 0 warms every candidate up, untimed
            for c, step in zip(candidates, steppers):
                if round_ and warm[c.name] >= HOPELESS * warm[candidates[0].name]:
                    continue  # far slower than the plain one already: not worth the time
                torch.set_num_threads(c.threads or default_threads)
                if round_ == 0:  # one step for first-call costs, then >= 0.03 s or one step
                    seconds = _time_steps(step, x, y, device, 0.03, warm_steps=1)
                else:  # a heavy step (>= ROUND_S) needs no more than one step to warm up
                    seconds = _time_steps(step, x, y, device, ROUND_S,
                                          warm_steps=3 if warm[c.name] < ROUND_S else 1)
                if round_:
                    times[c.name].append(seconds)
                else:
                    warm[c.name] = seconds
    finally:
        torch.set_num_threads(default_threads)
    return ({name: statistics.median(ts) if ts else warm[name] for name, ts in times.items()},
            [name for name, ts in times.items() if not ts])


def _time_steps(step, x: torch.Tensor, y: torch.Tensor, device: torch.device,
                budget_s: float, *, warm_steps: int = 3) -> float:
    """Seconds per step: ``warm_steps`` untimed, then steps until ``budget_s`` have passed (on
    CUDA checked every 4 steps, so launches stay queued)."""
    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # sync: the timed steps must have finished

    for _ in range(warm_steps):
        step(x, y)
    sync()
    t0, n = time.perf_counter(), 0
    while True:
        step(x, y)
        n += 1
        if device.type != "cuda" or n % 4 == 0:
            sync()
            elapsed = time.perf_counter() - t0
            if elapsed >= budget_s:
                return elapsed / n
