import dataclasses

import pytest
import torch

from looptune.engine.step import Stepper
from looptune.errors import ConfigError, MeasurementError
from looptune.presets import RECIPES
from looptune.recipe import StepConfig
from looptune.resolve import resolve

CPU = torch.device("cpu")


def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))


def _stepper(model, cfg: StepConfig, loss_fn=None, lr=0.1):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    return Stepper(model=model, optimizer=opt, scheduler=None, cfg=cfg, device=CPU,
                   loss_fn=loss_fn or torch.nn.functional.cross_entropy)


def _data(n=32, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, 6, generator=gen), torch.randint(0, 3, (n,), generator=gen)


def test_accumulation_equals_one_big_batch():
    x, y = _data(32)
    big, small = _model(), _model()
    _stepper(big, StepConfig())(x, y)
    step = _stepper(small, StepConfig(accumulate=4))
    for xs, ys in zip(x.split(8), y.split(8)):
        step(xs, ys)
    assert step.stats.optimizer_steps == 1
    for p, q in zip(big.parameters(), small.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_the_direct_backward_gives_torchs_gradients_bit_for_bit():
    from looptune.engine.step import direct_backward

    x, y = _data(32)
    a, b = _model(), _model()
    torch.nn.functional.cross_entropy(a(x), y).backward()
    backward = direct_backward()
    assert backward is not torch.Tensor.backward  # this torch has the engine entry point
    for _ in range(2):  # twice: gradients accumulate as with loss.backward()
        backward(torch.nn.functional.cross_entropy(b(x), y))
    torch.nn.functional.cross_entropy(a(x), y).backward()
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(a.parameters(), b.parameters()))
    with pytest.raises(RuntimeError, match="only for scalar outputs"):
        backward(b(x).sum(1))  # several elements: torch's own check and message
    with pytest.raises(RuntimeError, match="does not require grad"):
        backward(torch.tensor(1.0))


def test_an_eager_cpu_step_uses_the_direct_backward_a_compiled_one_does_not():
    assert _stepper(_model(), StepConfig())._backward is not torch.Tensor.backward
    compiled = _stepper(_model(), StepConfig(compile="default"))
    assert compiled._backward is torch.Tensor.backward


def test_epoch_boundary_steps_a_partial_accumulation():
    x, y = _data(24)
    step = _stepper(_model(), StepConfig(accumulate=4))
    for i, (xs, ys) in enumerate(zip(x.split(8), y.split(8))):
        step(xs, ys, boundary=i == 2)
    assert step.stats.optimizer_steps == 1  # 3 micro-batches, stepped at the boundary


def test_bf16_autocast_trains_on_cpu():
    model = _model()
    x, y = _data()
    before = [p.detach().clone() for p in model.parameters()]
    loss = _stepper(model, StepConfig(precision="bf16"))(x, y)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def _fp16_stepper_with_switchable_overflow():
    """An fp16 stepper whose loss becomes inf (so its grads overflow) while ``poisoned["on"]``."""
    poisoned = {"on": False}

    def loss_fn(out, y):
        loss = torch.nn.functional.cross_entropy(out, y)
        return loss * float("inf") if poisoned["on"] else loss

    return _stepper(_model(), StepConfig(precision="fp16", max_consecutive_skips=3), loss_fn), poisoned


def test_fp16_scaler_counts_skips_and_stops_after_k_in_a_row():
    step, poisoned = _fp16_stepper_with_switchable_overflow()
    x, y = _data()
    step(x, y)
    assert int(step.stats.skipped_steps) == 0
    poisoned["on"] = True
    with pytest.raises(MeasurementError) as info:
        for _ in range(10):
            step(x, y)
    text = str(info.value)
    assert "3 optimizer steps in a row were skipped" in text and "loss scale now" in text
    assert "precision='bf16'" in text
    assert int(step.stats.skipped_steps) == 3


def test_fp16_skip_streak_resets_on_a_good_step():
    step, poisoned = _fp16_stepper_with_switchable_overflow()
    x, y = _data()
    for i in range(8):
        poisoned["on"] = i % 2 == 0  # never two skips in a row
        step(x, y)
    assert int(step.stats.skipped_steps) == 4  # counted, but no stop


def test_compile_failure_falls_back_to_eager_with_the_reason(monkeypatch):
    from torch._dynamo.exc import InternalTorchDynamoError

    def broken_compile(model, mode=None):
        def fails(*args, **kwargs):
            raise InternalTorchDynamoError("no backend here")
        return fails

    monkeypatch.setattr(torch, "compile", broken_compile)
    model = _model()
    step = _stepper(model, StepConfig(compile="default"))
    x, y = _data()
    loss = step(x, y)
    assert torch.isfinite(loss) and step.stats.optimizer_steps == 1
    assert "InternalTorchDynamoError: no backend here" in step.stats.compile_fallback
    step(x, y)  # later steps stay eager
    assert step.stats.optimizer_steps == 2


def test_real_compile_reports_compile_time_and_matches_eager():
    x, y = _data(16)
    eager, compiled = _model(), _model()
    s_eager, s_comp = _stepper(eager, StepConfig()), _stepper(compiled, StepConfig(compile="default"))
    for _ in range(3):
        s_eager(x, y)
        s_comp(x, y)
    if s_comp.stats.compile_fallback:
        pytest.skip(f"torch.compile unavailable here: {s_comp.stats.compile_fallback}")
    assert s_comp.stats.compile_s > 0 and s_comp.stats.compile_events >= 1
    for p, q in zip(eager.parameters(), compiled.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)


def test_cuda_graphs_are_refused_on_cpu_with_the_fix():
    recipe = dataclasses.replace(RECIPES["device"], step=StepConfig(cuda_graphs=True))
    with pytest.raises(ConfigError, match="cuda_graphs=True needs a CUDA device.*cuda_graphs=False"):
        resolve(recipe, "cpu")


def test_fp16_on_cpu_is_downgraded_with_a_reason():
    recipe = dataclasses.replace(RECIPES["device"], step=StepConfig(precision="fp16"))
    resolved, decisions = resolve(recipe, "cpu")
    assert resolved.step.precision == "fp32"
    assert any(d.name == "precision" and "bf16" in d.reason for d in decisions)


def test_step_config_conflicts_are_reported():
    problems = StepConfig(cuda_graphs=True, accumulate=2, compile="default", precision="fp8").problems()
    assert len(problems) == 3
    assert any("precision='fp8'" in p for p in problems)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_graphed_step_matches_eager_on_cuda():
    dev = torch.device("cuda")
    x, y = (t.to(dev) for t in _data(32))
    eager, graphed = _model().to(dev), _model().to(dev)
    opt_e = torch.optim.Adam(eager.parameters(), lr=1e-2)
    opt_g = torch.optim.Adam(graphed.parameters(), lr=torch.tensor(1e-2, device=dev), capturable=True)
    s_e = Stepper(model=eager, optimizer=opt_e, scheduler=None, cfg=StepConfig(), device=dev,
                  loss_fn=torch.nn.functional.cross_entropy)
    s_g = Stepper(model=graphed, optimizer=opt_g, scheduler=None, cfg=StepConfig(cuda_graphs=True),
                  device=dev, loss_fn=torch.nn.functional.cross_entropy)
    for xs, ys in [(x, y), (x, y), (x[:8], y[:8])]:  # the partial batch runs eagerly
        torch.testing.assert_close(s_e(xs, ys), s_g(xs, ys).clone(), rtol=1e-4, atol=1e-5)
    for p, q in zip(eager.parameters(), graphed.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)


class _Attn(torch.nn.Module):
    """Causal self-attention through F.scaled_dot_product_attention, then a linear read-out."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.qkv, self.out = torch.nn.Linear(8, 24), torch.nn.Linear(8, 3)

    def forward(self, x):
        q, k, v = (z.unsqueeze(1) for z in self.qkv(x).split(8, dim=-1))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.squeeze(1)[:, -1])


def _sdpa_ops(cfg: StepConfig) -> set[str]:
    step = Stepper(model=_Attn(), optimizer=torch.optim.SGD(_Attn().parameters(), lr=0.1),
                   scheduler=None, cfg=cfg, device=CPU, loss_fn=torch.nn.functional.cross_entropy)
    x, y = torch.randn(4, 16, 8), torch.randint(0, 3, (4,))
    with torch.profiler.profile() as prof:
        step(x, y)
    return {e.key for e in prof.key_averages() if "scaled_dot_product" in e.key}


def test_attention_switch_pins_the_sdpa_kernel():
    auto, math = _sdpa_ops(StepConfig(precision="bf16")), _sdpa_ops(
        StepConfig(precision="bf16", attention="math"))
    assert any("flash" in op for op in auto), auto  # PyTorch's own CPU choice
    assert any("math" in op for op in math) and not any("flash" in op for op in math), math


def test_cuda_only_attention_kernel_on_cpu_falls_back_with_the_reason():
    step = _stepper(_Attn(), StepConfig(attention="efficient"))
    loss = step(torch.randn(4, 16, 8), torch.randint(0, 3, (4,)))
    assert torch.isfinite(loss)
    assert any("attention='efficient' is a CUDA kernel" in n for n in step.stats.notes)


def test_unknown_attention_kernel_is_refused_with_the_allowed_values():
    problems = StepConfig(attention="fast").problems()
    assert any("attention='fast' is invalid" in p and "'math'" in p for p in problems)


def test_resolve_downgrades_a_cuda_attention_kernel_on_cpu_with_a_decision():
    recipe = dataclasses.replace(RECIPES["device"], step=StepConfig(attention="cudnn"))
    resolved, decisions = resolve(recipe, "cpu")
    assert resolved.step.attention == "auto"
    assert any(d.name == "attention" and "CUDA kernel" in d.reason for d in decisions)
