"""``step.backward='mlp'``: the forward and backward of a chain of Linear and ReLU layers under a
cross-entropy loss, written out by hand instead of recorded and replayed by autograd.

For a small MLP the autograd machinery costs as much as some of its matmuls: every step builds a
graph of ~15 nodes, walks it back, creates a gradient tensor per parameter and frees it at
``zero_grad``. Here the model's graph (traced once with ``torch.fx``) must be: reshapes of the
input, then Linear layers, each optionally followed by a ReLU, and nothing else; the loss must
be plain cross-entropy (mean, no weights, no label smoothing). Each step then runs the same ATen
kernels autograd would (``addmm``, ``relu``, ``_log_softmax``, ``nll_loss``, their backward
kernels, ``mm`` with autograd's operand layouts) and writes the gradients into buffers that stay
the parameters' ``.grad`` from step to step (no allocation per step, as bf16 layers' weight
casts reuse theirs): in fp32 the gradients and the trained weights are bit for bit autograd's
(tested).

Under ``precision='bf16'`` each layer runs as autocast would run it (weights, bias and input
cast to bf16, the output in bf16, the loss in fp32, the weight gradients cast back to fp32), or
in fp32, whichever its own matmuls ran faster at the run's batch size on this machine
(:func:`choose_bf16`, timed at setup, off the clock): on a CPU, bf16's oneDNN kernels win on
wide layers and lose on narrow ones (per-call overhead), so autocast's all-or-nothing choice
costs time either way. With every layer in bf16 the gradients are bit for bit those of autocast
+ autograd (tested). The choice and its figures go into the run's decisions.

A dataset stored in bf16 (``loader.store='autocast'``, checked at setup against autocast's
first layer) keeps the first layer in bf16, as that check assumed.

A model or loss beyond this (other modules or ops, a loss other than plain cross-entropy) or
a model wrapped in DDP (whose gradient all-reduce hooks into autograd) is stepped by autograd,
with the reason in the run's decisions (:func:`plan`); fp16 (its GradScaler) and CUDA graphs
with ``backward='mlp'`` are refused before training (``StepConfig.problems``). With
``step.compile`` the written-out step (forward, loss, backward: no autograd in it) is compiled as
one graph; a failed compile falls back to the eager one with the reason.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from looptune.engine.mlp_precision import choose_bf16

__all__ = ["Layer", "MLPStep", "choose_bf16", "plan"]

_aten = torch.ops.aten
_RESHAPES = {"view", "reshape", "flatten"}
_RELUS = {torch.relu, F.relu, torch.nn.functional.relu}


class Unsupported(Exception):
    """The model, loss or run is not one the hand-written step computes (the message says why)."""


@dataclass
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


class MLPStep:
    """``step(x, y, seed, first) -> loss``: forward, loss and backward of ``layers``; the
    gradients become the parameters' ``.grad`` (``first``) or are added to them, as autograd
    accumulates; ``seed`` is d(scaled loss)/d(loss) (1/accumulate).

    Eagerly (:class:`_InPlace`) the weight gradients are written straight into buffers that stay
    the parameters' ``.grad`` from step to step, and bf16 layers cast their weights into buffers
    of their own: no allocation per step for them, and the same values as a fresh tensor each
    step. With ``native`` (the C++ op of engine/native.py, ``backward='mlp-cpp'``) that eager
    step is one C++ call (:class:`_Native`). ``compile`` (a ``torch.compile`` mode, or "off")
    compiles the written-out forward and backward as one functional graph instead (no autograd
    in it: Inductor fuses the elementwise ops and the loss around the matmuls); its numerics are
    Inductor's, not eager's bit for bit.
    """

    def __init__(self, layers: list[Layer], compile: str = "off",
                 native: Callable | None = None) -> None:
        self.layers, self.mode, self.native = layers, compile, native
        self.width = layers[0].weight.shape[1]
        self.params = [p for layer in layers for p in layer.params]
        self.fn: Callable | None = None  # built at the first call: choose_bf16 may set dtypes
        self.idle_call: Callable[[], object] | None = None  # warm_up's step on a zero batch

    def warm_up(self, batch_size: int, input_dtype: torch.dtype) -> float:
        """Run the eager step once on a zero batch (at setup, off the clock): oneDNN creates
        its bf16 kernels at their first call (~1.5-3 ms on a 2-core CPU). Only the gradient
        buffers are written, and the first training step overwrites them. Seconds taken."""
        if self.mode != "off":
            return 0.0  # a compiled step compiles at its first call, timed as compile time
        device = self.layers[0].weight.device
        batch = (torch.zeros(batch_size, self.width, dtype=input_dtype, device=device),
                 torch.zeros(batch_size, dtype=torch.long, device=device),
                 torch.ones((), device=device))
        self.idle_call = lambda: self(*batch, first=True)
        t0 = time.perf_counter()
        self.idle_call()
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # sync: once, at setup
        return time.perf_counter() - t0

    def use_eager(self) -> None:
        """Drop the compiled graph (it failed to compile): the eager function from now on."""
        self.mode, self.fn = "off", None

    def __call__(self, x: torch.Tensor, y: torch.Tensor, seed: torch.Tensor,
                 first: bool) -> torch.Tensor:
        if self.fn is None:
            if self.mode == "off" and self.native is not None:
                self.fn = _Native(self.layers, self.width, self.native)
            elif self.mode == "off":
                self.fn = _InPlace(self.layers, self.width)
            else:
                self.fn = torch.compile(
                    _written_out([(lay.relu, lay.bf16, lay.bias is not None)
                                  for lay in self.layers], self.width),
                    mode=None if self.mode == "default" else self.mode, dynamic=False)
        if isinstance(self.fn, _InPlace):
            return self.fn(x, y, seed, first)
        tensors = [t for lay in self.layers for t in (lay.weight, lay.bias) if t is not None]
        loss, *grads = self.fn(x, y, seed, *tensors)
        for p, g in zip(self.params, grads):
            if first:
                p.grad = g
            else:
                p.grad.add_(g)  # accumulation: autograd adds the new gradient in place
        return loss


class _InPlace:
    """The eager written-out step: :func:`_written_out`'s kernels and values, with the weight
    and bias gradients written into persistent buffers (``mm``/``sum`` with ``out=``, or a copy
    from a bf16 buffer) that are the parameters' ``.grad``. A ``.grad`` set to None or replaced
    in between (``zero_grad``, a checkpoint load) is pointed back at its buffer at the next
    ``first`` step, which overwrites it, as autograd's fresh gradient would."""

    def __init__(self, layers: list[Layer], width: int) -> None:
        self.width = width
        self.layers = []  # per layer: what its forward and backward read and write
        for lay in layers:
            low = torch.bfloat16 if lay.bf16 else None

            def buffer(t: torch.Tensor | None, dtype=low) -> torch.Tensor | None:
                return None if t is None or dtype is None else torch.empty_like(t, dtype=dtype)

            grads = tuple(torch.zeros_like(p, memory_format=torch.contiguous_format)
                          for p in lay.params)
            self.layers.append((lay, buffer(lay.weight), buffer(lay.bias), grads,
                                buffer(lay.weight)))
        self.pairs = [(p, g) for lay, *_, grads, _ in self.layers
                      for p, g in zip(lay.params, grads)]

    def begin(self, x: torch.Tensor, first: bool) -> None:
        """Check the batch's width; at a ``first`` step point every ``.grad`` at its buffer."""
        if x.numel() != x.shape[0] * self.width:
            raise ValueError(f"the batch flattens to {tuple(x.reshape(x.shape[0], -1).shape)}"
                             f", the first layer takes {self.width} features")
        if first:
            for p, g in self.pairs:
                if p.grad is not g:
                    p.grad = g

    def __call__(self, x: torch.Tensor, y: torch.Tensor, seed: torch.Tensor,
                 first: bool) -> torch.Tensor:
        self.begin(x, first)
        a = x.reshape(x.shape[0], -1)
        inputs, weights, acts = [], [], []  # what the backward reads
        for lay, w_low, b_low, _, _ in self.layers:
            w, b = lay.weight, lay.bias
            if w_low is not None:  # bf16, as autocast casts: weight, bias and input
                w, b = w_low.copy_(w), None if b is None else b_low.copy_(b)
                if a.dtype != torch.bfloat16:
                    a = a.to(torch.bfloat16)
            elif a.dtype != torch.float32:
                a = a.float()
            out = a.mm(w.t()) if b is None else torch.addmm(b, a, w.t())
            if lay.relu:
                out.relu_()  # its own fresh output: in place is relu's values
            inputs.append(a)
            weights.append(w)
            acts.append(out)
            a = out
        logp = torch._log_softmax(a if a.dtype == torch.float32 else a.float(), 1, False)
        loss, total = _aten.nll_loss_forward(logp, y, None, 1, -100)
        grad = _aten.nll_loss_backward(seed, logp, y, None, 1, -100, total)
        grad = torch._log_softmax_backward_data(grad, logp, 1, torch.float32)
        for i in range(len(self.layers) - 1, -1, -1):
            lay, _, _, grads, g_low = self.layers[i]
            if grad.dtype != acts[i].dtype:
                grad = grad.to(acts[i].dtype)  # a cast's backward: back to the output's dtype
            if lay.relu:
                grad = _aten.threshold_backward(grad, acts[i], 0)
            _weight_grad(grad, inputs[i], grads[0], g_low, first)
            if lay.bias is not None:
                _bias_grad(grad, grads[1], first)
            if i:
                grad = grad.mm(weights[i])
        return loss


class _Native(_InPlace):
    """:class:`_InPlace`'s step as one call of the C++ op ``native`` (engine/mlp_step.cpp,
    ``backward='mlp-cpp'``): the same ATen calls on the same buffers, without Python between
    them."""

    def __init__(self, layers: list[Layer], width: int, native: Callable) -> None:
        super().__init__(layers, width)
        self.op, none = native, torch.empty(0)
        self.spec, self.tensors = [], []
        for lay, w_low, b_low, grads, g_low in self.layers:
            self.spec += [int(lay.relu), int(w_low is not None), int(lay.bias is not None)]
            self.tensors += [lay.weight, none if lay.bias is None else lay.bias, grads[0],
                             grads[1] if len(grads) > 1 else none,
                             none if w_low is None else w_low, none if b_low is None else b_low,
                             none if g_low is None else g_low]

    def __call__(self, x: torch.Tensor, y: torch.Tensor, seed: torch.Tensor,
                 first: bool) -> torch.Tensor:
        self.begin(x, first)
        return self.op(x, y, seed, first, self.spec, self.tensors)


def _weight_grad(grad: torch.Tensor, a: torch.Tensor, into: torch.Tensor,
                 low: torch.Tensor | None, first: bool) -> None:
    """``into`` = (or +=) autograd's ``grad.t() @ a``, in fp32; through ``low`` for bf16."""
    if low is not None:
        torch.mm(grad.t(), a, out=low)
        into.copy_(low) if first else into.add_(low)  # the cast back to fp32, exact
    elif first:
        torch.mm(grad.t(), a, out=into)
    else:
        into.add_(grad.t().mm(a))


def _bias_grad(grad: torch.Tensor, into: torch.Tensor, first: bool) -> None:
    if grad.dtype != into.dtype:
        into.copy_(grad.sum(0)) if first else into.add_(grad.sum(0))
    elif first:
        torch.sum(grad, 0, out=into)
    else:
        into.add_(grad.sum(0))


def _written_out(spec: list[tuple[bool, bool, bool]], width: int) -> Callable:
    """``fn(x, y, seed, *weights and biases) -> (loss, *their gradients)`` for layers whose
    (relu, bf16, has a bias) are ``spec``; eagerly, the kernels and layouts autograd (and
    autocast) use."""

    def fn(x: torch.Tensor, y: torch.Tensor, seed: torch.Tensor, *tensors: torch.Tensor):
        a = x.reshape(x.shape[0], -1)
        if a.shape[1] != width:
            raise ValueError(f"the batch flattens to {tuple(a.shape)}, the first layer takes "
                             f"{width} features")
        pairs, at = [], 0
        for _, _, has_bias in spec:  # (weight, bias or None)
            pairs.append((tensors[at], tensors[at + 1] if has_bias else None))
            at += 2 if has_bias else 1
        inputs, weights, acts = [], [], []  # what the backward reads
        for (relu, bf16, _), (w, b) in zip(spec, pairs):
            dtype = torch.bfloat16 if bf16 else torch.float32
            w, a = w.to(dtype), a.to(dtype)
            out = a.mm(w.t()) if b is None else torch.addmm(b.to(dtype), a, w.t())
            inputs.append(a)
            weights.append(w)
            a = out.relu() if relu else out
            acts.append(a)
        logp = _aten._log_softmax(a.float(), 1, False)  # the loss in fp32, as autocast's
        loss, total = _aten.nll_loss_forward(logp, y, None, 1, -100)
        grad = _aten.nll_loss_backward(seed, logp, y, None, 1, -100, total)
        grad = _aten._log_softmax_backward_data(grad, logp, 1, torch.float32)
        grads: list[torch.Tensor] = []
        for i in range(len(spec) - 1, -1, -1):
            grad = grad.to(acts[i].dtype)  # a cast's backward: back to the output's dtype
            if spec[i][0]:
                grad = _aten.threshold_backward(grad, acts[i], 0)
            # autograd's layouts: grad.t() @ input; a bf16 layer's cast back to fp32
            layer = [grad.t().mm(inputs[i]).float()]
            if pairs[i][1] is not None:
                layer.append(grad.sum(0).float())
            grads = layer + grads
            if i:
                grad = grad.mm(weights[i])
        return (loss, *grads)

    return fn
