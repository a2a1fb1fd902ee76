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

import torch

from looptune.fastpath import native as native_step
from looptune.fastpath.mlp_plan import Layer, Unsupported, plan
from looptune.fastpath.mlp_precision import choose_bf16
from looptune.recipe import Decision, StepConfig

__all__ = ["Layer", "MLPStep", "Unsupported", "build", "choose_bf16", "plan"]

_aten = torch.ops.aten


def build(*, model: torch.nn.Module, loss_fn, cfg: StepConfig, batch_size: int,
          input_dtype: torch.dtype) -> tuple[MLPStep | None, list[Decision]]:
    """The written-out step for ``cfg.backward`` ('mlp' or 'mlp-cpp') on batches of
    ``batch_size`` arriving in ``input_dtype`` (set up off the clock: under bf16 it times each
    layer's matmuls both ways), with the decision saying what runs and why; ``(None, [why])``
    when the model or loss is not one it computes (autograd runs instead)."""
    asked = cfg.backward
    try:
        layers = plan(model, loss_fn)
    except Unsupported as why:
        return None, [Decision("step.backward", "autograd", reason=(
            f"backward={asked!r} needs a chain of Linear/ReLU layers under cross-entropy: "
            f"{why}; stepped with autograd"))]
    native, how = None, ""
    if asked == "mlp-cpp":
        native, how = native_step.load_mlp_step()
    step = MLPStep(layers, compile=cfg.compile, native=native)
    ran = asked if native is not None or asked == "mlp" else "mlp"
    how = (f"; one C++ call per step (fastpath/mlp_step.cpp, {how})" if native is not None
           else f"; run from Python instead: {how}" if how else "")
    if cfg.precision != "bf16":
        what = ("forward and backward written out in fp32 (the same kernels as autograd, "
                "no per-step graph)")
    else:
        what = ("written out; each in bf16 only where its matmuls ran faster that way at "
                f"batch {batch_size}, timed here: {choose_bf16(layers, batch_size, input_dtype)}")
    warm = step.warm_up(batch_size, input_dtype)
    warmed = (f"; its kernels created at setup ({warm * 1e3:.1f} ms, off the clock)"
              if warm else "")
    return step, [Decision("step.backward", ran, reason=(
        f"{len(layers)} Linear layers under cross-entropy, {what}{how}{warmed}"))]


class MLPStep:
    """``step(x, y, seed, first) -> loss``: forward, loss and backward of ``layers``; the
    gradients become the parameters' ``.grad`` (``first``) or are added to them, as autograd
    accumulates; ``seed`` is d(scaled loss)/d(loss) (1/accumulate).

    Eagerly (:class:`_InPlace`) the weight gradients are written straight into buffers that stay
    the parameters' ``.grad`` from step to step, and bf16 layers cast their weights into buffers
    of their own: no allocation per step for them, and the same values as a fresh tensor each
    step. With ``native`` (the C++ op of fastpath/native.py, ``backward='mlp-cpp'``) that eager
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
    """:class:`_InPlace`'s step as one call of the C++ op ``native`` (fastpath/mlp_step.cpp,
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
