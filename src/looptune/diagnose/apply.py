"""Apply a remedy to an unmodified script from outside, for ``--verify``'s rerun.

* bf16 autocast **per forward**: entered at the start of the outermost ``nn.Module`` call of the
  training thread and left at its end, as people write ``with torch.autocast(...): out =
  model(x)``. One autocast context held open across steps would keep its cache of bf16 weight
  casts, so every forward would use the weights of the first step and the run would stop
  learning (and run faster for it); leaving the context at each forward's end clears the cache.
  Its floating-point outputs come back as float32, as autocast's documentation asks of outputs
  used outside the autocast region: a loss computed outside it (``F.binary_cross_entropy(out,
  x)`` in the pytorch/examples VAE) refuses a bf16 input against a float32 target.
* a framework's own precision switch, where the step runs inside one (the framework then casts,
  scales and handles the loss as it does for its users): ``TrainingArguments(bf16=True)``,
  Lightning ``Trainer(precision="bf16-mixed")`` and ``Fabric(precision="bf16-mixed")``,
  Accelerate ``Accelerator(mixed_precision="bf16")``;
* the optimizer's constructor arguments (``fused=True`` / ``foreach=True``): every construction
  of that torch.optim class (and its subclasses) gets them;
* a larger batch's learning rate: every construction of that torch.optim class (and its
  subclasses) has each parameter group's ``lr`` multiplied by the batch's scaling rule
  (:func:`looptune.diagnose.rules.batch.lr_rule`) once it is built, so a scheduler built on it
  starts from the scaled rate.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["FRAMEWORK_SWITCH", "as_float32", "framework_precision",
           "overridden_optimizer", "per_forward_autocast", "remedies_applied", "scaled_lr"]


def as_float32(out: Any) -> Any:
    """``out`` with its bf16 / fp16 tensors (nested in tuples, lists, dicts) cast to float32."""
    if isinstance(out, torch.Tensor):
        return out.float() if out.dtype in (torch.bfloat16, torch.float16) else out
    if isinstance(out, tuple) and hasattr(out, "_fields"):  # a namedtuple
        return type(out)(*(as_float32(v) for v in out))
    if isinstance(out, (list, tuple)):
        return type(out)(as_float32(v) for v in out)
    if isinstance(out, dict):  # a copy of its own type (Hugging Face's ModelOutput included)
        import copy

        new = copy.copy(out)
        for k, v in out.items():
            new[k] = as_float32(v)
        return new
    return out

# framework (the top package of the code that called optimizer.step) -> (module, class, keyword
# arguments that turn bf16 on, how a user writes it)
FRAMEWORK_SWITCH: dict[str, tuple[str, str, dict[str, Any], str]] = {
    "transformers": ("transformers", "TrainingArguments", {"bf16": True, "fp16": False},
                     "TrainingArguments(bf16=True)"),
    "lightning.pytorch": ("lightning.pytorch", "Trainer", {"precision": "bf16-mixed"},
                          "Trainer(precision=\"bf16-mixed\")"),
    "lightning.fabric": ("lightning.fabric", "Fabric", {"precision": "bf16-mixed"},
                         "Fabric(precision=\"bf16-mixed\")"),
    "accelerate": ("accelerate", "Accelerator", {"mixed_precision": "bf16"},
                   "Accelerator(mixed_precision=\"bf16\")"),
}
@contextlib.contextmanager
def per_forward_autocast(device_type: str, *, math_sdpa: bool = False,
                         hits: list[int] | None = None) -> Iterator[None]:
    """bf16 autocast around each outermost module call of this thread (see the module doc);
    ``hits[0]`` counts those calls."""
    hits = [0] if hits is None else hits
    from torch.nn.modules.module import (
        register_module_forward_hook, register_module_forward_pre_hook)

    thread, state = threading.get_ident(), {"depth": 0, "stack": None}

    def enter(module, args):
        if threading.get_ident() != thread:
            return
        if state["depth"] == 0:
            stack = contextlib.ExitStack()
            stack.enter_context(torch.autocast(device_type, dtype=torch.bfloat16))
            if math_sdpa:
                from torch.nn.attention import SDPBackend, sdpa_kernel

                stack.enter_context(sdpa_kernel(SDPBackend.MATH))
            state["stack"] = stack
            hits[0] += 1
        state["depth"] += 1

    def leave(module, args, out):
        if threading.get_ident() != thread or state["depth"] == 0:
            return None
        state["depth"] -= 1
        if state["depth"] == 0 and state["stack"] is not None:
            state["stack"].close()  # leaves autocast: its cache of weight casts is cleared
            state["stack"] = None
            return as_float32(out)  # the outputs, as the code after the forward expects them
        return None

    handles = [register_module_forward_pre_hook(enter),
               register_module_forward_hook(leave, always_call=True)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()
        if state["stack"] is not None:
            state["stack"].close()


@contextlib.contextmanager
def framework_precision(framework: str, *, hits: list[int] | None = None) -> Iterator[None]:
    """Every construction of the framework's entry class gets its bf16 switch; a framework that
    keeps its precision in process-wide state has it reset before and after the rerun (the
    script's first run set it without bf16)."""
    module, cls_name, switch, _ = FRAMEWORK_SWITCH[framework]
    cls = getattr(importlib.import_module(module), cls_name)
    fresh = _FRESH_STATE.get(framework)
    if fresh is not None:
        fresh()
    try:
        with _patched_init(cls, switch, [0] if hits is None else hits):
            yield
    finally:
        if fresh is not None:
            fresh()


def _fresh_accelerate() -> None:
    """Accelerate's AcceleratorState is a singleton that refuses another mixed_precision in the
    same process ("AcceleratorState has already been initialized and cannot be changed"): the
    bf16 rerun after the script's own run raised before its first step."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state()


_FRESH_STATE = {"accelerate": _fresh_accelerate}


@contextlib.contextmanager
def overridden_optimizer(name: str, kwargs: dict[str, Any], *,
                         hits: list[int] | None = None) -> Iterator[None]:
    """Every ``torch.optim.<name>`` (and subclass) built with ``kwargs`` on top of its own."""
    cls = getattr(torch.optim, name)
    with _patched_init(cls, kwargs, [0] if hits is None else hits):
        yield


@contextlib.contextmanager
def _patched_init(cls: type, kwargs: dict[str, Any], hits: list[int]) -> Iterator[None]:
    original = cls.__dict__["__init__"]

    def __init__(self, *args, **kw):
        hits[0] += 1
        original(self, *args, **{**kw, **kwargs})

    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    cls.__init__ = __init__
    try:
        yield
    finally:
        cls.__init__ = original


@contextlib.contextmanager
def scaled_lr(name: str, factor: float, *, hits: list[int] | None = None) -> Iterator[None]:
    """Every ``torch.optim.<name>`` (and subclass) built with its learning rate times ``factor``
    (each parameter group's, and the defaults a later ``add_param_group`` reads)."""
    if not factor > 0:
        raise ValueError(f"learning-rate factor {factor!r}: must be > 0")
    cls = getattr(torch.optim, name)
    hits = [0] if hits is None else hits
    original = cls.__dict__.get("__init__")
    if original is None:  # inherits its constructor: patch a wrapper on the class itself
        original = cls.__init__

    def __init__(self, *args, **kw):
        original(self, *args, **kw)
        hits[0] += 1
        for group in self.param_groups:
            group["lr"] = group["lr"] * factor
        if "lr" in self.defaults:
            self.defaults["lr"] = self.defaults["lr"] * factor

    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    had = "__init__" in cls.__dict__
    cls.__init__ = __init__
    try:
        yield
    finally:
        if had:
            cls.__init__ = original
        else:
            del cls.__init__


@contextlib.contextmanager
def remedies_applied(device: torch.device, autocast: str | None, framework: str | None,
                    optimizer: tuple[str, dict] | None,
                    lr_scale: tuple[str, float] | None = None):
    """--verify: the remedy's switch on for the rerun; yields a one-item list that counts the
    times the switch was used (model forwards under autocast, constructions patched)."""
    hits = [0]
    with contextlib.ExitStack() as stack:
        if autocast:  # per forward: one context across steps would freeze the weight casts
            stack.enter_context(per_forward_autocast(
                device.type, math_sdpa=autocast == "bf16+math-sdpa", hits=hits))
        if framework:
            stack.enter_context(framework_precision(framework, hits=hits))
        if optimizer:
            stack.enter_context(overridden_optimizer(*optimizer, hits=hits))
        if lr_scale:  # a larger batch's learning rate: counts as applied with its batch size
            stack.enter_context(scaled_lr(*lr_scale))
        yield hits
