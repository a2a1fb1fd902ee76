"""Which models the written-out MLP step computes (``step.backward='mlp'``): the model traced
once with ``torch.fx`` must be reshapes of the input, then Linear layers, each optionally followed
by a ReLU, and nothing else, under plain cross-entropy (mean, no weights, no label smoothing).
:func:`plan` returns the model as a list of :class:`Layer` s, or raises
:class:`~looptune.errors.FastPathUnsupported` naming what is not a layer (the Stepper then runs
autograd and says why)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from looptune.errors import FastPathUnsupported as Unsupported

__all__ = ["Layer", "Unsupported", "plan"]

_RESHAPES = {"view", "reshape", "flatten"}
_RELUS = {torch.relu, F.relu, torch.nn.functional.relu}


@dataclass(kw_only=True)
class Layer:
    weight: torch.Tensor  # detached views of the parameters: updated in place by the optimizer
    bias: torch.Tensor | None
    relu: bool
    params: tuple[nn.Parameter, ...]
    name: str
    bf16: bool = False


def plan(model: nn.Module, loss_fn) -> list[Layer]:
    """The model as a list of layers, or :class:`Unsupported` naming what is not a layer."""
    if isinstance(model, nn.parallel.DistributedDataParallel):
        raise Unsupported("the model is wrapped in DDP, whose gradient all-reduce hooks into "
                          "autograd")
    _check_loss(loss_fn)
    try:
        graph = torch.fx.symbolic_trace(model).graph
    except Exception as err:  # data-dependent control flow and the like
        raise Unsupported(f"torch.fx could not trace the model ({type(err).__name__}: "
                          f"{str(err)[:120]})") from err
    modules = dict(model.named_modules())
    layers: list[Layer] = []
    last = None  # the node the chain ends in so far
    sizes: set[torch.fx.Node] = set()  # x.size(0) and the like, read for a reshape
    for node in graph.nodes:
        if node.op == "placeholder":
            if last is not None:
                raise Unsupported("the model takes more than one input")
            last = node
            continue
        if node.op == "output":
            if node.args[0] is not last or not layers:
                raise Unsupported("the model's output is not its last Linear layer's")
            break
        if not node.all_input_nodes or node.all_input_nodes[0] is not last:
            raise Unsupported(f"{_describe(node, modules)} does not continue the chain of layers")
        if node.op == "call_method" and node.target == "size" and not layers:
            sizes.add(node)  # not part of the chain: the reshape after it uses it
            continue
        kind = _kind(node, modules, sizes)
        if kind == "reshape" and not layers:
            pass  # flattens the input: checked against the first layer's width at run time
        elif kind == "linear":
            mod = modules[node.target]
            layers.append(Layer(weight=mod.weight.detach(), name=node.target, relu=False,
                                bias=None if mod.bias is None else mod.bias.detach(),
                                params=tuple(mod.parameters())))
        elif kind == "relu" and layers and not layers[-1].relu and last.op == "call_module":
            layers[-1].relu = True
        else:
            raise Unsupported(f"{_describe(node, modules)} is not a Linear layer, a ReLU after "
                              "one or a reshape of the input")
        last = node
    owned = {id(p) for layer in layers for p in layer.params}
    if len(owned) != sum(len(layer.params) for layer in layers):
        raise Unsupported("a Linear layer is used twice (shared weights)")
    if any(id(p) not in owned for p in model.parameters()):
        raise Unsupported("the model has parameters outside its Linear layers")
    return layers


def _describe(node: torch.fx.Node, modules: dict[str, nn.Module]) -> str:
    if node.op == "call_module":
        return f"module {node.target!r} ({type(modules[node.target]).__name__})"
    if node.op == "call_method":
        return f"the tensor method .{node.target}()"
    return f"{getattr(node.target, '__name__', node.target)}()"


def _kind(node: torch.fx.Node, modules: dict[str, nn.Module],
          sizes: set[torch.fx.Node]) -> str | None:
    extra = [a for a in list(node.args[1:]) + list(node.kwargs.values())
             if isinstance(a, torch.fx.Node) and not (a in sizes and node.target in _RESHAPES)]
    if node.op == "call_module":
        mod = modules[node.target]
        if type(mod) is nn.Linear:
            return "linear"
        if type(mod) is nn.ReLU:
            return "relu"
        if type(mod) is nn.Flatten and mod.start_dim == 1:
            return "reshape"
        return None
    if extra:  # an argument computed from another node (x.size(0) is fine for a reshape)
        return None
    if node.op == "call_function" and node.target in _RELUS:
        return "relu"
    if node.op == "call_function" and node.target is torch.flatten:
        return "reshape"
    if node.op == "call_method" and node.target in _RESHAPES:
        return "reshape"
    if node.op == "call_method" and node.target == "relu":
        return "relu"
    return None


def _check_loss(loss_fn) -> None:
    if loss_fn is F.cross_entropy:
        return
    if type(loss_fn) is nn.CrossEntropyLoss:
        if (loss_fn.weight is None and loss_fn.reduction == "mean"
                and loss_fn.label_smoothing == 0.0 and loss_fn.ignore_index == -100):
            return
        raise Unsupported("the CrossEntropyLoss has class weights, label smoothing, another "
                          "reduction or ignore_index")
    raise Unsupported(f"the loss is {getattr(loss_fn, '__name__', type(loss_fn).__name__)}, "
                      "not cross-entropy")
