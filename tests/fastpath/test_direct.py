"""impl='direct': Adam/AdamW calling the fused kernel directly; the same update as torch's
fused step bit for bit, and torch's own step whenever the fast path's assumptions break."""

import copy

import pytest
import torch
from torch.nn import functional as F

from looptune.engine import optim
from looptune.fastpath.direct import DirectAdam, DirectAdamW
from looptune.engine.optim import build_optimizer, optimizer_kind
from looptune.recipe import OptimConfig

CPU = torch.device("cpu")


def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def _batches(n, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(8, 12, generator=gen), torch.randint(0, 4, (8,), generator=gen))
            for _ in range(n)]


def _step(model, opt, x, y, sched=None):
    F.cross_entropy(model(x), y).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if sched is not None:
        sched.step()


def _pair(name, **kw):
    a = _model()
    b = copy.deepcopy(a)
    cfg = dict(name=name, lr=1e-2, weight_decay=1e-2, **kw)
    ref, _ = build_optimizer(a.parameters(), OptimConfig(impl="fused", **cfg), device=CPU)
    got, why = build_optimizer(b.parameters(), OptimConfig(impl="direct", **cfg), device=CPU)
    assert why == []
    return a, ref, b, got


def _same(a, b):
    return all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


@pytest.mark.parametrize("name, cls", [("adam", DirectAdam), ("adamw", DirectAdamW)])
def test_direct_is_torchs_fused_update_bit_for_bit_under_a_schedule(name, cls):
    a, ref, b, got = _pair(name)
    assert isinstance(got, cls) and isinstance(got, torch.optim.Adam)
    assert optimizer_kind(got) == "direct" and optimizer_kind(ref) == "fused"
    sa = torch.optim.lr_scheduler.OneCycleLR(ref, max_lr=3e-2, total_steps=40)
    sb = torch.optim.lr_scheduler.OneCycleLR(got, max_lr=3e-2, total_steps=40)
    for x, y in _batches(30):
        _step(a, ref, x, y, sa)
        _step(b, got, x, y, sb)
    assert got._plans is not None  # the direct path ran (planned after torch's first step)
    assert _same(a, b)
    assert all(p.grad is None for p in b.parameters())


def test_several_param_groups_each_with_its_own_lr():
    a, b = _model(), _model()
    groups = lambda m: [{"params": m[0].parameters(), "lr": 1e-2},  # noqa: E731
                        {"params": m[2].parameters(), "lr": 3e-3}]
    ref = torch.optim.Adam(groups(a), fused=True)
    got = DirectAdam(groups(b))
    for x, y in _batches(10):
        _step(a, ref, x, y)
        _step(b, got, x, y)
    assert len(got._plans) == 2 and _same(a, b)


def test_the_state_dict_loads_into_torchs_adam_and_back():
    a, ref, b, got = _pair("adam")
    data = _batches(20)
    for x, y in data[:10]:
        _step(a, ref, x, y)
        _step(b, got, x, y)
    saved = got.state_dict()
    steps = [s["step"] for s in saved["state"].values()]
    assert len({id(t) for t in steps}) == len(steps)  # one counter per parameter, as torch's
    plain = torch.optim.Adam(b.parameters(), lr=1e-2, weight_decay=1e-2, fused=True)
    plain.load_state_dict(saved)
    for x, y in data[10:15]:
        _step(a, ref, x, y)
        _step(b, plain, x, y)
    assert _same(a, b)
    again = DirectAdam(b.parameters(), lr=1e-2, weight_decay=1e-2)
    again.load_state_dict(plain.state_dict())
    for x, y in data[15:]:
        _step(a, ref, x, y)
        _step(b, again, x, y)
    assert _same(a, b) and again._plans is not None
    assert float(again.state[next(iter(b.parameters()))]["step"]) == 20


def test_saving_mid_run_leaves_the_counters_live_and_later_saves_right():
    a, ref, b, got = _pair("adam")
    data = _batches(12)
    for i, (x, y) in enumerate(data):
        _step(a, ref, x, y)
        _step(b, got, x, y)
        if i in (4, 8):
            saved = got.state_dict()  # a checkpoint every few steps, as the engine writes
    assert {float(s["step"]) for s in saved["state"].values()} == {9.0}
    assert {float(s["step"]) for s in got.state_dict()["state"].values()} == {12.0}
    assert got._plans[0].step is got.state[next(iter(b.parameters()))]["step"]  # still shared
    assert _same(a, b)


def test_a_parameter_without_a_gradient_steps_through_torch_with_its_own_counter():
    a, ref, b, got = _pair("adam")
    for i, (x, y) in enumerate(_batches(12)):
        for model, opt in ((a, ref), (b, got)):
            F.cross_entropy(model(x), y).backward()
            if i in (4, 5):  # the first layer's bias gets no update on these steps
                model[0].bias.grad = None
            opt.step()
            opt.zero_grad(set_to_none=True)
    assert _same(a, b)
    steps = {float(got.state[p]["step"]) for p in b.parameters()}
    assert steps == {10.0, 12.0}  # counters diverged, as torch's do
    assert got._torch_only and got._plans is None  # torch's step from then on, no re-checks


def test_a_missing_gradient_in_a_later_group_never_updates_an_earlier_group_twice():
    a, b = _model(), _model()
    groups = lambda m: [{"params": m[0].parameters()}, {"params": m[2].parameters()}]  # noqa: E731
    ref = torch.optim.Adam(groups(a), lr=1e-2, fused=True)
    got = DirectAdam(groups(b), lr=1e-2)
    for i, (x, y) in enumerate(_batches(8)):
        for model, opt in ((a, ref), (b, got)):
            F.cross_entropy(model(x), y).backward()
            if i == 5:
                model[2].bias.grad = None  # the second group falls back to torch's step
            opt.step()
            opt.zero_grad(set_to_none=True)
    assert _same(a, b)


def test_parameters_replaced_in_a_group_are_planned_again():
    a, ref, b, got = _pair("adam")
    for x, y in _batches(3):
        _step(a, ref, x, y)
        _step(b, got, x, y)
    c, d = _model(seed=3), _model(seed=3)  # other tensors of the same shapes
    ref.param_groups[0]["params"] = list(c.parameters())
    got.param_groups[0]["params"] = list(d.parameters())
    for x, y in _batches(3, seed=9):
        _step(c, ref, x, y)
        _step(d, got, x, y)  # compares by identity: no elementwise tensor == in a bool
    assert _same(c, d)


def test_step_hooks_a_closure_and_a_grad_scaler_are_honoured():
    a, ref, b, got = _pair("adam")
    seen = []
    for x, y in _batches(3):
        _step(a, ref, x, y)
        _step(b, got, x, y)
    handle = got.register_step_post_hook(lambda opt, args, kwargs: seen.append(1))
    x, y = _batches(1, seed=5)[0]
    _step(a, ref, x, y)
    _step(b, got, x, y)
    handle.remove()
    assert seen == [1] and _same(a, b)

    def closure():
        got.zero_grad()
        loss = F.cross_entropy(b(x), y)
        loss.backward()
        return loss

    assert isinstance(got.step(closure), torch.Tensor)  # torch's step evaluated the closure
    got.grad_scale = torch.tensor(2.0)  # what GradScaler sets on a fused optimizer
    assert got._scaled()
    del got.grad_scale


def test_zero_grad_without_set_to_none_zeroes_in_place():
    model = _model()
    opt, _ = build_optimizer(model.parameters(), OptimConfig(impl="direct"), device=CPU)
    F.cross_entropy(model(torch.randn(2, 12)), torch.tensor([0, 1])).backward()
    grads = [p.grad for p in model.parameters()]
    opt.zero_grad(set_to_none=False)
    assert all(g is p.grad and not g.any() for g, p in zip(grads, model.parameters()))


def test_sgd_with_direct_gets_torchs_fused_step_and_says_why():
    opt, why = build_optimizer(_model().parameters(), OptimConfig(name="sgd", impl="direct"),
                               device=CPU)
    assert optimizer_kind(opt) == "fused"
    assert why and "Adam and AdamW" in why[0].reason


def test_a_captured_graph_gets_torchs_capturable_fused_step():
    impl, why = optim._impl_for_capture(OptimConfig(impl="direct"), capturable=True)
    assert impl == "fused" and "captured CUDA graph" in why[0].reason


def test_direct_falls_back_to_foreach_when_torch_lacks_fused_kernels(monkeypatch):
    import torch.optim.optimizer as torch_optimizer

    monkeypatch.setattr(torch_optimizer, "_get_fused_kernels_supported_devices", lambda: ["cuda"])
    opt, why = build_optimizer(_model().parameters(), OptimConfig(impl="direct"), device=CPU)
    assert optimizer_kind(opt) == "foreach" and "fused=True is unavailable" in why[0].reason
