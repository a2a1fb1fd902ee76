"""backward='mlp': a Linear/ReLU chain's step written out; autograd's gradients and weights bit for
bit in fp32 (and in bf16 with every layer in bf16, against autocast), the same with gradient
accumulation, and every model, loss or setting it cannot compute refused with the reason."""

import copy

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from looptune.bench.workloads import SimpleFeedForwardNN
from looptune.fastpath import mlp
from looptune.engine.optim import build_optimizer
from looptune.engine.step import Stepper
from looptune.recipe import OptimConfig, StepConfig

CPU = torch.device("cpu")


def _batches(n, batch=16, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, 1, 28, 28, generator=gen),
             torch.randint(0, 10, (batch,), generator=gen)) for _ in range(n)]


def _stepper(model, backward, precision="fp32", accumulate=1, loss_fn=F.cross_entropy):
    opt, _ = build_optimizer(model.parameters(), OptimConfig(impl="direct", lr=1e-2), device=CPU)
    step = Stepper(model=model, optimizer=opt, scheduler=None, loss_fn=loss_fn, device=CPU,
                   cfg=StepConfig(backward=backward, precision=precision, accumulate=accumulate))
    return step, step.prepare(16, torch.float32)


def _pair(precision="fp32", accumulate=1):
    torch.manual_seed(0)
    a = SimpleFeedForwardNN()
    b = copy.deepcopy(a)
    auto, _ = _stepper(a, "autograd", precision, accumulate)
    hand, why = _stepper(b, "mlp", precision, accumulate)
    return (a, auto), (b, hand), why


def _same_weights(a, b):
    return all(torch.equal(p, q) for p, q in zip(a.state_dict().values(),
                                                 b.state_dict().values()))


def test_fp32_is_autograd_bit_for_bit():
    (a, auto), (b, hand), why = _pair()
    assert why[0].value == "mlp" and "fp32" in why[0].reason
    for x, y in _batches(12):
        la, lb = auto(x, y), hand(x, y)
        assert torch.equal(la, lb)
    assert _same_weights(a, b)
    assert hand.stats.optimizer_steps == 12



def test_gradients_are_autograd_before_the_update():
    torch.manual_seed(0)
    a = SimpleFeedForwardNN()
    b = copy.deepcopy(a)
    x, y = _batches(1)[0]
    F.cross_entropy(a(x), y).backward()
    mlp.MLPStep(mlp.plan(b, F.cross_entropy))(x, y, torch.ones(()), first=True)
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p.grad, q.grad)


def test_accumulation_matches_autograd():
    (a, auto), (b, hand), _ = _pair(accumulate=3)
    for x, y in _batches(9):
        auto(x, y)
        hand(x, y)
    assert hand.stats.optimizer_steps == 3 and _same_weights(a, b)


def test_bf16_every_layer_is_autocast_bit_for_bit(monkeypatch):
    monkeypatch.setattr(mlp, "choose_bf16", lambda layers, *a: [setattr(lay, "bf16", True)
                                                                for lay in layers] and "all")
    (a, auto), (b, hand), _ = _pair("bf16")
    assert all(layer.bf16 for layer in hand._fast.layers)
    for x, y in _batches(6):
        assert torch.equal(auto(x, y), hand(x, y))
    assert _same_weights(a, b)


def test_bf16_choice_is_timed_per_layer_and_trains():
    (a, _), (b, hand), why = _pair("bf16")
    reason = why[0].reason
    for name in ("fc1 784->128", "fc2 128->64", "fc3 64->10"):
        assert name in reason  # each layer's own timing, both ways
    assert reason.count(" us") == 6
    first = hand(*_batches(1)[0]).item()
    for x, y in _batches(1)[:1] * 30:
        last = hand(x, y).item()
    assert last < first  # it learns the batch, whichever layers run in bf16


@pytest.mark.parametrize("model, loss_fn, needle", [
    (nn.Sequential(nn.Flatten(), nn.Linear(784, 8), nn.Tanh(), nn.Linear(8, 10)),
     F.cross_entropy, "module '2' (Tanh)"),
    (nn.Sequential(nn.Flatten(), nn.Linear(784, 10)), F.mse_loss, "mse_loss, not cross-entropy"),
    (nn.Sequential(nn.Flatten(), nn.Linear(784, 10)), nn.CrossEntropyLoss(label_smoothing=0.1),
     "label smoothing"),
    (nn.Sequential(nn.Flatten(), nn.Linear(784, 10), nn.Dropout()), F.cross_entropy, "(Dropout)"),
])
def test_unsupported_models_step_with_autograd_and_say_why(model, loss_fn, needle):
    step, why = _stepper(model, "mlp", loss_fn=loss_fn)
    assert why[0].value == "autograd" and needle in why[0].reason
    assert step._fast is None
    x, y = _batches(1)[0]
    if loss_fn is F.mse_loss:
        y = torch.randn(16, 10)
    step(x, y)  # autograd steps it
    assert step.stats.optimizer_steps == 1


def test_sequential_with_relu_modules_is_planned():
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 32), nn.ReLU(), nn.Linear(32, 10))
    layers = mlp.plan(model, nn.CrossEntropyLoss())
    assert [(lay.name, lay.relu) for lay in layers] == [("1", True), ("3", False)]


class _ViewBySize(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(784, 16), nn.Linear(16, 10)

    def forward(self, x):
        x = x.view(x.size(0), -1)
        return self.b(F.relu(self.a(x)))


def test_the_common_flatten_idioms_are_planned_and_match_autograd():
    for model in (_ViewBySize(), nn.Sequential(nn.Flatten(), nn.Linear(784, 10))):
        torch.manual_seed(0)
        twin = copy.deepcopy(model)
        x, y = _batches(1)[0]
        F.cross_entropy(model(x), y).backward()
        mlp.MLPStep(mlp.plan(twin, F.cross_entropy))(x, y, torch.ones(()), first=True)
        assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(),
                                                                 twin.parameters()))


def test_conflicting_settings_are_refused_before_training():
    problems = StepConfig(backward="mlp", precision="fp16").problems()
    assert any("backward='mlp' with precision='fp16'" in p for p in problems)
    assert any("cuda_graphs=True" in p for p in StepConfig(backward="mlp",
                                                            cuda_graphs=True).problems())
    assert not StepConfig(backward="mlp", compile="default").problems()
    assert any("'backward'" in p or "backward=" in p for p in StepConfig(backward="x").problems())


def test_a_batch_of_the_wrong_width_is_named():
    torch.manual_seed(0)
    step = mlp.MLPStep(mlp.plan(SimpleFeedForwardNN(), F.cross_entropy))
    with pytest.raises(ValueError, match="first layer takes 784"):
        step(torch.randn(4, 100), torch.zeros(4, dtype=torch.long), torch.ones(()), first=True)


def test_compiled_written_out_step_trains_like_the_eager_one():
    (a, auto), (b, hand), _ = _pair()
    compiled, _ = _stepper(copy.deepcopy(b), "mlp")
    compiled._fast.mode = "default"  # as StepConfig(compile="default") sets it
    for x, y in _batches(8):
        le, lc = hand(x, y), compiled(x, y)
        assert torch.allclose(le, lc, rtol=1e-4, atol=1e-5)
    for p, q in zip(b.parameters(), compiled.model.parameters()):
        assert torch.allclose(p, q, rtol=1e-3, atol=1e-5)


def test_a_compile_failure_falls_back_to_the_eager_written_out_step(monkeypatch):
    torch.manual_seed(0)
    model = SimpleFeedForwardNN()
    opt, _ = build_optimizer(model.parameters(), OptimConfig(impl="direct"), device=CPU)
    step = Stepper(model=model, optimizer=opt, scheduler=None, loss_fn=F.cross_entropy,
                   device=CPU, cfg=StepConfig(backward="mlp", compile="default"))
    step.prepare(16, torch.float32)

    def broken(fn, **kw):
        def run(*a):
            raise RuntimeError("inductor: no C++ compiler (compile failed)")
        return run

    monkeypatch.setattr(torch, "compile", broken)
    x, y = _batches(1)[0]
    step(x, y)
    assert step._fast.mode == "off" and "failed, ran eagerly" in step.stats.compile_fallback
    assert step.stats.optimizer_steps == 1


def _functional_grads(layers, x, y, seed):
    """The gradients of the functional written-out step (the compile path, run eagerly)."""
    fn = mlp._written_out([(lay.relu, lay.bf16, lay.bias is not None) for lay in layers],
                          layers[0].weight.shape[1])
    tensors = [t for lay in layers for t in (lay.weight, lay.bias) if t is not None]
    return fn(x, y, seed, *tensors)


@pytest.mark.parametrize("bf16", [(False, False, False), (True, False, False),
                                  (True, True, True), (False, True, False)])
def test_in_place_step_is_the_functional_one_bit_for_bit(bf16):
    """The eager step writes into persistent buffers (and casts bf16 weights into its own):
    the same loss and gradients as fresh tensors, for every mix of bf16 and fp32 layers, also
    accumulated over micro-batches of different sizes."""
    torch.manual_seed(0)
    model = SimpleFeedForwardNN()
    layers = mlp.plan(model, F.cross_entropy)
    for lay, low in zip(layers, bf16):
        lay.bf16 = low
    step, seed = mlp.MLPStep(layers), torch.full((), 1 / 3)
    total = None
    for i, (x, y) in enumerate(_batches(3, batch=16) + _batches(1, batch=5, seed=2)):
        first = i % 3 == 0
        loss = step(x, y, seed, first=first)
        want, *grads = _functional_grads(layers, x, y, seed)
        assert torch.equal(loss, want)
        total = grads if first else [t + g for t, g in zip(total, grads)]
        assert all(torch.equal(p.grad, t) for p, t in zip(model.parameters(), total))


def test_gradient_buffers_persist_and_come_back_after_zero_grad():
    torch.manual_seed(0)
    model = SimpleFeedForwardNN()
    twin = copy.deepcopy(model)
    step = mlp.MLPStep(mlp.plan(model, F.cross_entropy))
    (x, y), (x2, y2) = _batches(2)
    step(x, y, torch.ones(()), first=True)
    buffers = [p.grad for p in model.parameters()]
    step(x2, y2, torch.ones(()), first=True)
    assert all(p.grad is b for p, b in zip(model.parameters(), buffers))  # no new tensors
    model.zero_grad(set_to_none=True)
    step(x2, y2, torch.ones(()), first=True)
    F.cross_entropy(twin(x2), y2).backward()
    assert all(p.grad is b and torch.equal(p.grad, q.grad)
               for p, b, q in zip(model.parameters(), buffers, twin.parameters()))
    for p in model.parameters():
        p.grad = torch.full_like(p, 7.0)  # replaced by someone else: the next step takes it back
    step(x2, y2, torch.ones(()), first=True)
    assert all(p.grad is b and torch.equal(p.grad, q.grad)
               for p, b, q in zip(model.parameters(), buffers, twin.parameters()))
