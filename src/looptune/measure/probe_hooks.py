"""What :class:`looptune.measure.probes.StepProbes` hooks in and walks: the timed module's
forward pre-hook, the autograd graph's leaves, a weak reference that tolerates objects without
one, and the target device of a ``Tensor.to`` call."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, Protocol

import torch


__all__ = ["ForwardListener", "ForwardStart", "framework_of_stack", "leaf_storages", "targets_cuda", "weak_ref"]


class ForwardListener(Protocol):
    """What the hook calls: :class:`looptune.measure.probes.StepProbes`, which imports this
    module (so this module names the method it calls, and never imports probes)."""

    def forward_started(self) -> None: ...


class ForwardStart:
    """The timed module's forward pre-hook. A deepcopy of the module (an EMA copy, the replay)
    shares it; pickled with the module (a script's ``torch.save(model)``) it becomes a hook that
    does nothing, so the script's checkpoint neither fails nor holds the probes."""

    def __init__(self, probes: ForwardListener | None) -> None:
        self._probes = None if probes is None else weakref.ref(probes)

    def __call__(self, module: Any, args: Any) -> None:
        probes = None if self._probes is None else self._probes()
        if probes is not None:
            probes.forward_started()

    def __deepcopy__(self, memo: dict) -> ForwardStart:
        return self

    def __reduce__(self) -> tuple:
        return (ForwardStart, (None,))


def leaf_storages(tensors: Any, limit: int = 100_000) -> set[int]:
    """Storage addresses of the leaf tensors (parameters) the backward of ``tensors`` reaches:
    the AccumulateGrad nodes of the autograd graph, walked once."""
    roots = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors or ())
    stack = [t.grad_fn for t in roots if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    seen, found = set(), set()
    while stack and len(seen) < limit:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        leaf = getattr(node, "variable", None)
        if isinstance(leaf, torch.Tensor):
            found.add(leaf.untyped_storage().data_ptr())
        stack.extend(n for n, _ in node.next_functions)
    return found


def weak_ref(obj: Any) -> Callable[[], Any]:
    try:
        return weakref.ref(obj)
    except TypeError:  # an object without weak references (__slots__): hold it
        return lambda: obj


def targets_cuda(name: str, args: tuple, kwargs: dict) -> bool:
    if name == "cuda":
        return True
    try:
        device = torch._C._nn._parse_to(*args, **kwargs)[0]
    except (TypeError, RuntimeError):
        return False
    return device is not None and device.type == "cuda"


# module prefixes of the frames under an optimizer step -> framework, the outermost that owns the
# loop first (the Trainer runs Accelerate inside)
_FRAMES = (("transformers.trainer", "transformers"), ("lightning.pytorch", "lightning.pytorch"),
           ("pytorch_lightning", "lightning.pytorch"), ("lightning.fabric", "lightning.fabric"),
           ("lightning_fabric", "lightning.fabric"), ("accelerate", "accelerate"))


def framework_of_stack(frame: Any) -> str | None:
    """The training framework whose code is on the call stack from ``frame`` up, if any."""
    names = set()
    while frame is not None:
        names.add(frame.f_globals.get("__name__", ""))
        frame = frame.f_back
    for prefix, framework in _FRAMES:
        if any(n == prefix or n.startswith(prefix + ".") for n in names):
            return framework
    return None
