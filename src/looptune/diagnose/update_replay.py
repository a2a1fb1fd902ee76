"""The script's optimizer step, replayed under each implementation torch offers for it.

An optimizer update streams every parameter, its gradient and its state (Adam: two moments) once
per step; torch runs it as a Python loop over the parameters (``foreach=False``, the default on a
CPU), as multi-tensor ``_foreach_*`` kernels (``foreach=True``, the default on CUDA) or as one
fused kernel (``fused=True``; Adam, AdamW, SGD, Adagrad on CPU and CUDA). They compute the same
update. Which is fastest depends on the parameter count and sizes and on the device, so diagnose
measures it: after the script stopped, :func:`measure_update` builds the script's optimizer class
with the script's own constructor arguments on copies of its parameters and gradients (the script's
tensors are not touched), once per implementation, and times their steps interleaved, the fastest
of a few rounds each (as :mod:`looptune.diagnose.scaling` times the model).
"""

from __future__ import annotations

import inspect
import os
import time
from typing import Any

import torch

from looptune.measure.records import UpdateReplay

__all__ = ["IMPLS", "current_impl", "described_update", "impl_kwargs", "measure_update"]

IMPLS = ("for-loop", "foreach", "fused")
MIN_TIME_S = 0.05  # each timing runs at least this long
ROUNDS = 3  # interleaved rounds, the fastest of each implementation
BUDGET_S = 2.0  # about the most the replay may take
MEMORY_FRACTION = 0.5  # copies may take at most this share of the free memory


def impl_kwargs(impl: str) -> dict[str, Any]:
    """The constructor keyword arguments that select ``impl``."""
    return {"for-loop": {"foreach": False, "fused": None},
            "foreach": {"foreach": True, "fused": None},
            "fused": {"foreach": None, "fused": True}}[impl]


def current_impl(optimizer: torch.optim.Optimizer) -> str:
    """The implementation ``optimizer.step()`` runs: its own setting, else torch's default for
    its parameters (foreach for CUDA tensors, the for-loop otherwise)."""
    group = optimizer.param_groups[0] if optimizer.param_groups else {}
    if group.get("fused"):
        return "fused"
    foreach = group.get("foreach")
    if foreach is None:
        params = [p for g in optimizer.param_groups for p in g["params"]]
        try:
            from torch.optim.optimizer import _default_to_fused_or_foreach

            _, foreach = _default_to_fused_or_foreach(params, bool(group.get("differentiable")),
                                                      use_fused=False)
        except Exception:  # noqa: BLE001 - a private helper: if it moves, decide as it does
            foreach = bool(params) and all(p.is_cuda for p in params)
    return "foreach" if foreach else "for-loop"


def _offered(cls: type) -> list[str]:
    try:
        names = inspect.signature(cls.__init__).parameters
    except (TypeError, ValueError):
        return []
    return [i for i in IMPLS if ("fused" if i == "fused" else "foreach") in names]


def _free_bytes(device: torch.device) -> int | None:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _build(optimizer: torch.optim.Optimizer, impl: str, *,
           tiny: bool = False) -> torch.optim.Optimizer:
    """The same optimizer class and arguments on copies of the parameters that have gradients
    (``tiny``: on as many 1-element tensors, for the update's per-op cost alone)."""
    cls = type(optimizer)
    names = inspect.signature(cls.__init__).parameters
    kwargs = {k: v for k, v in optimizer.defaults.items() if k in names}
    kwargs.update({k: v for k, v in impl_kwargs(impl).items() if k in names})
    groups = []
    for group in optimizer.param_groups:
        copies = []
        for p in group["params"]:
            if p.grad is None:
                continue
            if tiny:
                q = p.detach().reshape(-1)[:1].clone().requires_grad_(True)
                q.grad = p.grad.detach().reshape(-1)[:1].clone()
            else:
                q = p.detach().clone().requires_grad_(True)
                q.grad = p.grad.detach().clone()
            copies.append(q)
        if copies:
            hp = {k: v for k, v in group.items() if k not in ("params", "foreach", "fused")}
            groups.append({**hp, "params": copies})
    return cls(groups, **kwargs)


def _time(opt: torch.optim.Optimizer, device: torch.device) -> float:
    n, t0 = 0, time.perf_counter()
    while True:
        opt.step()
        n += 1
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # sync: the update's kernels must finish
        elapsed = time.perf_counter() - t0
        if elapsed >= MIN_TIME_S:
            return elapsed / n


def described_update(optimizer: Any) -> UpdateReplay | None:
    """Which optimizer and implementation ran, without replaying it (a --verify rerun)."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        return None
    return UpdateReplay(optimizer=type(optimizer).__name__, impl=current_impl(optimizer),
                        note="not replayed")


def measure_update(optimizer: Any, device: torch.device) -> UpdateReplay | None:
    """Seconds per step of ``optimizer``'s update under each implementation its class offers,
    on copies; None when ``optimizer`` is no torch.optim optimizer."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        return None
    name, impl = type(optimizer).__name__, current_impl(optimizer)
    params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
    base = UpdateReplay(optimizer=name, impl=impl, params=len(params),
                        elements=sum(p.numel() for p in params))
    offered = _offered(type(optimizer))
    if impl not in offered:
        return _note(base, f"{name} takes no foreach/fused argument: one implementation only")
    if not params:
        return _note(base, "no parameter had a gradient at the last step")
    size = sum(p.numel() * p.element_size() for p in params)
    free = _free_bytes(device)
    # per implementation: parameters, gradients and up to two state tensors each
    if free is not None and 4 * size * len(offered) > MEMORY_FRACTION * free:
        return _note(base, f"copies of {size / 2**20:.0f} MiB of parameters per implementation "
                           f"would not fit in the free memory ({free / 2**20:.0f} MiB)")
    built, skipped = {}, {}
    for i in offered:
        try:
            built[i] = _build(optimizer, i)
            built[i].step()  # its state (moments, step counters) and first-call costs
        except (RuntimeError, TypeError, ValueError) as err:
            skipped[i] = _first_line(err)
            built.pop(i, None)
    if impl not in built:
        return _note(base, f"replaying its own implementation failed: {skipped.get(impl)}",
                     skipped)
    try:
        built["tiny"] = _build(optimizer, impl, tiny=True)
        built["tiny"].step()
        t0 = time.perf_counter()
        times: dict[str, list[float]] = {i: [_time(o, device)] for i, o in built.items()}
        rounds = max(1, min(ROUNDS, int(BUDGET_S / max(time.perf_counter() - t0, MIN_TIME_S))))
        for _ in range(rounds - 1):
            for i, o in built.items():
                times[i].append(_time(o, device))
    except (RuntimeError, TypeError, ValueError) as err:
        return _note(base, f"replaying the update failed: {_first_line(err)}", skipped)
    finally:
        built.clear()
    # the fastest round of each: a slow phase of the machine only ever adds time
    tiny = min(times.pop("tiny"))
    return UpdateReplay(optimizer=name, impl=impl, params=base.params, elements=base.elements,
                        step_s={i: min(t) for i, t in times.items()}, skipped=skipped,
                        dispatch_s=tiny)


def _note(base: UpdateReplay, note: str, skipped: dict[str, str] | None = None) -> UpdateReplay:
    return UpdateReplay(optimizer=base.optimizer, impl=base.impl, params=base.params,
                        elements=base.elements, skipped=skipped or {}, note=note)


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0][:200] if text else ''}"
