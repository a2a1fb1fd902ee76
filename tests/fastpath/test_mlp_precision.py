"""The per-layer bf16 choice of the written-out MLP step (fastpath/mlp_precision.py), tested as a
choice: each layer's timings are planted (``_layer_costs`` faked), so the test knows the answer
the rule must give, just above and just below its 5% threshold."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from looptune.fastpath import mlp, mlp_precision
from looptune.fastpath.mlp_precision import WIN, choose_bf16

US = 1e-6


def _layers(*widths: int) -> list[mlp.Layer]:
    """Linear layers widths[0] -> widths[1] -> ..., as mlp.plan() returns them."""
    torch.manual_seed(0)
    mods = [nn.Linear(i, o) for i, o in zip(widths, widths[1:])]
    return [mlp.Layer(weight=m.weight.detach(), bias=m.bias.detach(), relu=k < len(mods) - 1,
                      params=(m.weight, m.bias), name=f"fc{k + 1}")
            for k, m in enumerate(mods)]


@pytest.fixture
def planted(monkeypatch):
    """``planted({(in, out): (fp32 s, bf16 s)})``: what each layer's matmuls "cost"; records
    every timing call (its layer, batch, input dtype, whether the input gradient was timed)."""
    calls = []

    def plant(costs: dict[tuple[int, int], tuple[float, float]]):
        def fake(layer, a, g, *, backward_input):
            out_f, in_f = layer.weight.shape
            assert (a.shape[1], g.shape[1]) == (in_f, out_f) and a.shape[0] == g.shape[0]
            calls.append({"layer": layer.name, "batch": a.shape[0], "in": in_f,
                          "dtype": a.dtype, "backward_input": backward_input})
            return costs[(in_f, out_f)]

        monkeypatch.setattr(mlp_precision, "_layer_costs", fake)
        return calls

    return plant


@pytest.mark.parametrize("bf16_us, chosen", [
    (94.9, True),   # 5.1% faster: bf16 pays
    (95.1, False),  # 4.9% faster: within the 5% a layer must win by, stays fp32
    (60.0, True),   # far faster
    (100.0, False),  # a tie
    (140.0, False),  # slower
])
def test_a_layer_runs_in_bf16_only_when_its_matmuls_are_5_percent_faster(planted, bf16_us,
                                                                         chosen):
    assert WIN == 0.05
    calls = planted({(32, 16): (100 * US, bf16_us * US), (16, 4): (100 * US, bf16_us * US)})
    layers = _layers(32, 16, 4)
    figures = choose_bf16(layers, 64, torch.float32)
    assert [layer.bf16 for layer in layers] == [chosen, chosen]
    want = "bf16" if chosen else "fp32"
    assert figures == (f"fc1 32->16: fp32 100 us, bf16 {bf16_us:.0f} us -> {want}; "
                       f"fc2 16->4: fp32 100 us, bf16 {bf16_us:.0f} us -> {want}")
    assert [c["batch"] for c in calls] == [64, 64]  # timed at the run's batch size


def test_each_layer_is_decided_by_its_own_timings(planted):
    # a wide layer where oneDNN's bf16 kernels win, a narrow one where per-call overhead loses
    calls = planted({(784, 512): (300 * US, 150 * US), (512, 64): (20 * US, 30 * US),
                     (64, 10): (10 * US, 9.6 * US)})
    layers = _layers(784, 512, 64, 10)
    figures = choose_bf16(layers, 128, torch.float32)
    assert [layer.bf16 for layer in layers] == [True, False, False]
    assert figures.split("; ") == ["fc1 784->512: fp32 300 us, bf16 150 us -> bf16",
                                   "fc2 512->64: fp32 20 us, bf16 30 us -> fp32",
                                   "fc3 64->10: fp32 10 us, bf16 10 us -> fp32"]
    # the first layer has no input gradient to time; the others do, from fp32 activations
    assert [(c["layer"], c["in"], c["backward_input"]) for c in calls] == [
        ("fc1", 784, False), ("fc2", 512, True), ("fc3", 64, True)]
    assert all(c["dtype"] == torch.float32 and c["batch"] == 128 for c in calls)


def test_a_first_layer_whose_input_is_stored_in_bf16_runs_in_bf16_untimed(planted):
    calls = planted({(16, 4): (100 * US, 200 * US)})  # fc1 has no planted cost: never timed
    layers = _layers(32, 16, 4)
    figures = choose_bf16(layers, 64, torch.bfloat16)
    assert [layer.bf16 for layer in layers] == [True, False]
    assert figures.startswith("fc1 32->16: bf16 (its input is stored in bf16)")
    assert [c["layer"] for c in calls] == ["fc2"]


def test_the_steppers_decision_reports_the_planted_choice(planted):
    """Through the engine's Stepper (step.backward='mlp', precision='bf16'), as a run sets up."""
    from looptune.engine.step import Stepper
    from looptune.recipe import StepConfig

    planted({(12, 8): (200 * US, 100 * US), (8, 3): (50 * US, 49 * US)})
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 8), nn.ReLU(), nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step = Stepper(model=model, optimizer=opt, scheduler=None,
                   loss_fn=nn.functional.cross_entropy,
                   cfg=StepConfig(precision="bf16", backward="mlp"), device=torch.device("cpu"))
    (decision,) = step.prepare(16, torch.float32)
    assert decision.value == "mlp"
    assert "fp32 200 us, bf16 100 us -> bf16" in decision.reason
    assert "fp32 50 us, bf16 49 us -> fp32" in decision.reason
    assert [layer.bf16 for layer in step._fast.layers] == [True, False]
