"""Optimizer factory: the recipe's ``OptimConfig`` -> a torch optimizer, plus why it differs.

The update's kernel strategy (``impl``) is asked for explicitly; when torch cannot honour it
(fused kernels missing for a device or dtype) the factory falls back and records a
:class:`~looptune.recipe.Decision` naming the reason, never silently. :func:`optimizer_kind`
reads back which strategy the optimizer really runs, for results tables.

Torch 2.13 facts this module relies on (checked against its source):

* ``fused=True`` is checked lazily: a device or dtype without fused kernels raises at the
  *first step*, not in the constructor, so support is checked here before constructing.
* ``foreach=None, fused=None`` ("auto") resolves at each step: foreach when every param is a
  plain tensor on a foreach device (CUDA, XPU, ...), else the for-loop; CPU gets the for-loop.
* ``SGD`` has no ``capturable`` flag: its state (momentum buffers) lives on the params' device
  and it keeps no step counter on the host, so it is graph-capturable as it is.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

import torch
import torch.optim.optimizer as torch_optimizer

from looptune.fastpath.direct import DirectAdam, DirectAdamW, is_direct
from looptune.errors import ConfigError
from looptune.recipe import Decision, OptimConfig, OptimizerImpl, OptimizerName

__all__ = ["OptimizerKind", "build_optimizer", "optimizer_kind"]

# What an optimizer actually runs; "mixed" when its param groups differ.
OptimizerKind = Literal["direct", "fused", "foreach", "for-loop", "mixed"]

_CLASSES: dict[OptimizerName, type[torch.optim.Optimizer]] = {
    "sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW,
}
_DIRECT = {"adam": DirectAdam, "adamw": DirectAdamW}
# "auto" passes nothing so torch's own default (see the module docstring) decides per step.
_IMPL_KWARGS: dict[OptimizerImpl, dict[str, bool]] = {
    "auto": {}, "foreach": {"foreach": True}, "for-loop": {"foreach": False},
    "fused": {"fused": True}, "direct": {},  # direct: the class sets fused=True itself
}


def build_optimizer(params: Iterable[Any], cfg: OptimConfig, *, device: torch.device,
                    capturable: bool = False) -> tuple[torch.optim.Optimizer, list[Decision]]:
    """The optimizer ``cfg`` names over ``params``, and every automatic change made to it.

    Args:
        params: tensors (``model.parameters()``, read once), ``(name, tensor)`` pairs or
            param-group dicts, as torch optimizers accept.
        cfg: the optimizer settings; ``cfg.impl`` picks the kernel strategy.
        device: the training device (where the params live when stepping).
        capturable: build it for CUDA-graph capture: Adam/AdamW get ``capturable=True`` and
            the lr becomes a device tensor that schedules update in place, so a replayed graph
            sees the scheduled lr (a Python float would be baked into the capture).

    Returns:
        ``(optimizer, decisions)``; ``decisions`` is empty when ``cfg`` was honoured as is.

    Raises:
        ConfigError: ``cfg`` is invalid, or ``capturable`` on a device other than CUDA.
        ValueError: torch refused ``params`` (empty, or a non-leaf tensor).

    Example:
        >>> model = torch.nn.Linear(2, 2)
        >>> opt, why = build_optimizer(model.parameters(), OptimConfig(name="sgd", impl="fused"),
        ...                            device=torch.device("cpu"))
        >>> optimizer_kind(opt), why
        ('fused', [])
    """
    device = torch.device(device)
    problems = cfg.problems() + _capture_problems(device, capturable)
    if problems:
        raise ConfigError(problems)
    params = _materialize(params)
    impl, decisions = _impl_for_capture(cfg, capturable)
    if impl == "direct" and cfg.name == "sgd":
        decisions.append(Decision("optim.impl", "fused", reason=(
            "impl='direct' exists for Adam and AdamW; SGD uses torch's fused step.")))
        impl = "fused"
    if impl in ("fused", "direct"):
        opt, why_not = _try_fused(params, cfg, device, capturable, impl)
        if opt is not None:
            return opt, decisions + _lr_decisions(cfg, impl, capturable)
        decisions.append(Decision("optim.impl", "foreach", reason=f"fused=True is unavailable: "
                                  f"{why_not}; using foreach, the next fastest update."))
        impl = "foreach"
    opt = _construct(params, cfg, impl, device, capturable)
    return opt, decisions + _lr_decisions(cfg, impl, capturable)


def optimizer_kind(opt: torch.optim.Optimizer) -> OptimizerKind:
    """Which update ``opt`` runs: ``"fused"``, ``"foreach"`` or ``"for-loop"``.

    "auto" groups (``foreach=None``) are resolved with torch's own rule, on the params' current
    devices, so call it after the model is on its training device.

    Args:
        opt: any torch optimizer; groups without ``fused``/``foreach`` count as for-loop.

    Returns:
        The strategy, or ``"mixed"`` when param groups run different ones.

    Example:
        >>> opt = torch.optim.Adam(torch.nn.Linear(2, 2).parameters(), foreach=True)
        >>> optimizer_kind(opt)
        'foreach'
    """
    if is_direct(opt):
        return "direct"
    kinds = {_group_kind(group) for group in opt.param_groups}
    return kinds.pop() if len(kinds) == 1 else "mixed"


def _capture_problems(device: torch.device, capturable: bool) -> list[str]:
    if capturable and device.type != "cuda":
        return [f"capturable=True is invalid on device {str(device)!r}: it prepares the optimizer "
                "for CUDA-graph capture, which needs a CUDA device. Use capturable=False "
                "(cuda_graphs=False) here, or train on 'cuda'."]
    return []


def _impl_for_capture(cfg: OptimConfig, capturable: bool) -> tuple[OptimizerImpl, list[Decision]]:
    if capturable and cfg.impl == "direct":  # a captured graph replays the kernels already
        return "fused", [Decision("optim.impl", "fused", reason=(
            "impl='direct' saves host Python per step; a captured CUDA graph has none to save, "
            "and needs torch's capturable fused step."))]
    # torch 2.13's capturable for-loop Adam divides by lr before adding eps: at an lr of exactly 0
    # (a cyclic schedule's bottom, gamma=0) params with a zero second moment become NaN.
    # foreach and fused add eps first (verified on torch 2.13), so they are safe.
    if capturable and cfg.name != "sgd" and cfg.impl == "for-loop":
        return "foreach", [Decision("optim.impl", "foreach", reason=(
            f"capturable {cfg.name} with impl='for-loop' turns params NaN when the scheduled lr "
            f"is exactly 0 (torch {torch.__version__}); foreach computes the same update safely."))]
    return cfg.impl, []


def _try_fused(params: list[Any], cfg: OptimConfig, device: torch.device,
               capturable: bool, impl: OptimizerImpl = "fused"
               ) -> tuple[torch.optim.Optimizer | None, str]:
    why_not = _fused_unsupported(params, device)
    if why_not is not None:
        return None, why_not
    try:  # catches what the checks above miss; torch raises these for unsupported options
        return _construct(params, cfg, impl, device, capturable), ""
    except (RuntimeError, ValueError) as err:
        return None, f"torch {torch.__version__} refused it ({type(err).__name__}: {err})"


def _fused_unsupported(params: list[Any], device: torch.device) -> str | None:
    """Why fused kernels cannot run these params (torch's own rule), or None when they can."""
    # torch checks fused support only at the first step(); same rule, asked before building.
    supported = torch_optimizer._get_fused_kernels_supported_devices()
    tensors = _tensors(params)
    for device_type in sorted({device.type} | {t.device.type for t in tensors}):
        if device_type not in supported:
            return (f"torch {torch.__version__} has no fused optimizer kernels for device type "
                    f"{device_type!r} (it has them for {', '.join(supported)})")
    dtypes = sorted({str(t.dtype) for t in tensors if not torch.is_floating_point(t)})
    if dtypes:
        return f"fused kernels need floating-point params, got {', '.join(dtypes)}"
    return None


def _construct(params: list[Any], cfg: OptimConfig, impl: OptimizerImpl, device: torch.device,
               capturable: bool) -> torch.optim.Optimizer:
    kwargs = _hyper_kwargs(cfg) | _IMPL_KWARGS[impl]
    if capturable and cfg.name != "sgd":  # SGD has no such flag (module docstring)
        kwargs["capturable"] = True
    lr: float | torch.Tensor = cfg.lr
    if _tensor_lr(cfg, impl, capturable):
        # float32: fused kernels read lr as float; a float64 default dtype must not leak in.
        lr = torch.tensor(cfg.lr, dtype=torch.float32, device=device)
    if impl == "direct":
        return _DIRECT[cfg.name](params, lr=lr, **kwargs)
    return _CLASSES[cfg.name](params, lr=lr, **kwargs)


def _hyper_kwargs(cfg: OptimConfig) -> dict[str, Any]:
    # weight_decay is always passed: AdamW's torch default (1e-2) must not override the recipe.
    if cfg.name == "sgd":
        return {"momentum": cfg.momentum, "nesterov": cfg.nesterov,
                "weight_decay": cfg.weight_decay}
    return {"betas": tuple(cfg.betas), "weight_decay": cfg.weight_decay}


def _tensor_lr(cfg: OptimConfig, impl: OptimizerImpl, capturable: bool) -> bool:
    # SGD's foreach/for-loop update passes lr as a host scalar (alpha=-lr): a tensor lr would be
    # read with .item(), a sync that is illegal during capture. Its fused kernel takes a tensor.
    return capturable and (cfg.name != "sgd" or impl == "fused")


def _lr_decisions(cfg: OptimConfig, impl: OptimizerImpl, capturable: bool) -> list[Decision]:
    if not capturable:
        return []
    if _tensor_lr(cfg, impl, capturable):
        return [Decision("optim.lr", "device tensor", reason=(
            "a captured CUDA graph replays the lr it was captured with; a device tensor lr, "
            "updated in place by the schedule, lets replays follow the schedule."))]
    return [Decision("optim.lr", cfg.lr, reason=(
        f"SGD with impl={impl!r} reads lr as a host number, so a captured graph keeps "
        f"lr={cfg.lr:g} and ignores the schedule; use impl='fused' for a scheduled lr."))]


def _group_kind(group: dict[str, Any]) -> Literal["fused", "foreach", "for-loop"]:
    if group.get("fused"):
        return "fused"
    foreach = group.get("foreach")
    if foreach is None:  # "auto": the rule torch applies at each step
        _, foreach = torch_optimizer._default_to_fused_or_foreach(
            list(group["params"]), group.get("differentiable", False), use_fused=False)
        # Adam's extra rule: a tensor lr without capturable disables foreach. (SGD groups have
        # no "capturable" key and no such rule.)
        if "capturable" in group and isinstance(group["lr"], torch.Tensor):
            foreach = foreach and group["capturable"]
    return "foreach" if foreach else "for-loop"


def _materialize(params: Iterable[Any]) -> list[Any]:
    # model.parameters() (and a group's "params") may be generators: a fused fallback reads
    # them twice, and the second read of a generator would be empty.
    def listed(group_params: Any) -> list[Any]:
        return [group_params] if isinstance(group_params, torch.Tensor) else list(group_params)

    return [dict(item, params=listed(item["params"])) if isinstance(item, dict) else item
            for item in params]


def _tensors(params: list[Any]) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for item in params:
        if isinstance(item, dict):  # a param group
            out.extend(_tensors(item["params"]))
        elif isinstance(item, tuple):  # a (name, tensor) pair from named_parameters()
            out.append(item[1])
        else:
            out.append(item)
    return out
