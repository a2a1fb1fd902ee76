import pytest
import torch

import looptune.engine.optim as optim
from looptune.engine.optim import build_optimizer, optimizer_kind
from looptune.engine.schedule import build_scheduler
from looptune.errors import ConfigError
from looptune.recipe import OptimConfig, ScheduleConfig

CPU = torch.device("cpu")
NAMES = ["sgd", "adam", "adamw"]
IMPLS = ["auto", "foreach", "fused", "for-loop"]
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))


def _train(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x, y = torch.randn(8, 6, generator=gen), torch.randint(0, 3, (8,), generator=gen)
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


def _cfg(name: str, impl: str = "auto") -> OptimConfig:
    # weight decay and nesterov exercise more of each update than the defaults
    return OptimConfig(name=name, impl=impl, lr=1e-2, weight_decay=1e-2,
                       nesterov=name == "sgd")


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name", NAMES)
def test_each_name_and_impl_builds_and_steps_on_cpu(name, impl):
    model = _model()
    before = [p.detach().clone() for p in model.parameters()]
    opt, decisions = build_optimizer(model.parameters(), _cfg(name, impl), device=CPU)
    assert isinstance(opt, optim._CLASSES[name])
    assert decisions == []  # torch 2.13 has CPU fused kernels for all three
    assert len(opt.param_groups[0]["params"]) == 4  # the generator was read completely
    _train(model, opt, 1)
    assert all(not torch.equal(b, p) for b, p in zip(before, model.parameters()))


def test_hyperparameters_reach_torch():
    sgd, _ = build_optimizer(_model().parameters(), _cfg("sgd"), device=CPU)
    group = sgd.param_groups[0]
    assert (group["lr"], group["momentum"], group["nesterov"], group["weight_decay"]) == (
        1e-2, 0.9, True, 1e-2)
    cfg = OptimConfig(name="adamw", betas=(0.8, 0.99))
    adamw, _ = build_optimizer(_model().parameters(), cfg, device=CPU)
    assert adamw.param_groups[0]["betas"] == (0.8, 0.99)
    assert adamw.param_groups[0]["weight_decay"] == 0.0  # not AdamW's torch default 1e-2


@pytest.mark.parametrize("name", NAMES)
def test_impls_reach_nearly_the_same_weights(name):
    weights = {}
    for impl in ["fused", "foreach", "for-loop"]:
        model = _model()
        opt, _ = build_optimizer(model.parameters(), _cfg(name, impl), device=CPU)
        _train(model, opt, 5)
        weights[impl] = [p.detach() for p in model.parameters()]
    # float32 updates reordered by the kernels: differences stay at rounding level
    for impl in ["fused", "foreach"]:
        for got, ref in zip(weights[impl], weights["for-loop"]):
            torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("impl, kind", [("auto", "for-loop"), ("foreach", "foreach"),
                                        ("fused", "fused"), ("for-loop", "for-loop")])
@pytest.mark.parametrize("name", NAMES)
def test_optimizer_kind_reports_the_impl_in_use(name, impl, kind):
    # "auto" on CPU: torch's default picks foreach only for foreach devices (CUDA, ...)
    opt, _ = build_optimizer(_model().parameters(), _cfg(name, impl), device=CPU)
    assert optimizer_kind(opt) == kind


def test_optimizer_kind_mixed_groups():
    model = _model()
    opt = torch.optim.Adam([{"params": model[0].parameters(), "foreach": True},
                            {"params": model[2].parameters(), "foreach": False}])
    assert optimizer_kind(opt) == "mixed"


def test_fused_falls_back_to_foreach_when_torch_lacks_kernels(monkeypatch):
    import torch.optim.optimizer as torch_optimizer

    monkeypatch.setattr(torch_optimizer, "_get_fused_kernels_supported_devices", lambda: ["cuda"])
    model = _model()
    opt, decisions = build_optimizer(model.parameters(), _cfg("adam", "fused"), device=CPU)
    assert optimizer_kind(opt) == "foreach"
    assert [(d.name, d.value) for d in decisions] == [("optim.impl", "foreach")]
    assert "'cpu'" in decisions[0].reason and "fused" in decisions[0].reason
    assert len(opt.param_groups[0]["params"]) == 4  # the fallback still got every parameter
    _train(model, opt, 1)


def test_fused_falls_back_for_non_float_params():
    reason = optim._fused_unsupported([torch.zeros(3, dtype=torch.int64)], CPU)
    assert reason is not None and "int64" in reason
    assert optim._fused_unsupported([torch.zeros(3, dtype=torch.float16)], CPU) is None


def test_fused_falls_back_when_the_constructor_refuses(monkeypatch):
    def refusing_adam(params, **kwargs):
        if kwargs.get("fused"):
            raise RuntimeError("fused is not supported here")
        return torch.optim.Adam(params, **kwargs)

    monkeypatch.setitem(optim._CLASSES, "adam", refusing_adam)
    opt, decisions = build_optimizer(_model().parameters(), _cfg("adam", "fused"), device=CPU)
    assert optimizer_kind(opt) == "foreach"
    assert "RuntimeError: fused is not supported here" in decisions[0].reason


def test_capturable_on_cpu_raises_with_the_fix():
    with pytest.raises(ConfigError) as err:
        build_optimizer(_model().parameters(), _cfg("adam"), device=CPU, capturable=True)
    message = str(err.value)
    assert "capturable=True is invalid on device 'cpu'" in message
    assert "needs a CUDA device" in message and "Use capturable=False" in message


def test_invalid_config_raises_every_problem():
    cfg = OptimConfig(name="adam", lr=0.0, betas=(0.9, 1.5))
    with pytest.raises(ConfigError) as err:
        build_optimizer(_model().parameters(), cfg, device=CPU)
    assert len(err.value.problems) == 2 and "lr=0.0 is invalid" in str(err.value)


@pytest.mark.parametrize("name, impl, tensor_lr", [
    ("adam", "foreach", True), ("adamw", "fused", True), ("sgd", "fused", True),
    ("sgd", "foreach", False), ("sgd", "for-loop", False)])
def test_capturable_lr_is_a_device_tensor_where_torch_reads_it_without_a_sync(name, impl,
                                                                              tensor_lr):
    # built directly (a CPU device would be refused by build_optimizer); checks the arguments
    opt = optim._construct(list(_model().parameters()), _cfg(name, impl), impl, CPU, True)
    assert isinstance(opt.param_groups[0]["lr"], torch.Tensor) == tensor_lr
    assert opt.param_groups[0].get("capturable", name != "sgd") == (name != "sgd")
    decision = optim._lr_decisions(_cfg(name, impl), impl, True)[0]
    assert decision.name == "optim.lr" and (("ignores the schedule" in decision.reason)
                                            != tensor_lr)


def test_capturable_adam_for_loop_is_switched_to_foreach():
    impl, decisions = optim._impl_for_capture(_cfg("adam", "for-loop"), capturable=True)
    assert impl == "foreach" and decisions[0].name == "optim.impl"
    assert "NaN" in decisions[0].reason
    assert optim._impl_for_capture(_cfg("sgd", "for-loop"), capturable=True) == ("for-loop", [])
    assert optim._impl_for_capture(_cfg("adam", "for-loop"), capturable=False) == ("for-loop", [])


def test_scheduler_updates_a_tensor_lr_in_place():
    opt = optim._construct(list(_model().parameters()), _cfg("adam", "foreach"), "foreach",
                           CPU, True)
    lr = opt.param_groups[0]["lr"]
    sched = build_scheduler(opt, ScheduleConfig(name="step", step_size=1, gamma=0.5),
                            total_steps=4)
    opt.step()
    sched.step()
    assert opt.param_groups[0]["lr"] is lr  # the same tensor a captured graph would read
    torch.testing.assert_close(lr, torch.tensor(5e-3))


def test_device_may_be_a_string_and_params_named_or_grouped():
    model = _model()
    opt, decisions = build_optimizer(model.named_parameters(), _cfg("adam", "fused"),
                                     device="cpu")
    assert decisions == [] and optimizer_kind(opt) == "fused"
    groups = [{"params": model[0].parameters()}, {"params": model[2].parameters(), "lr": 0.1}]
    opt, _ = build_optimizer(groups, _cfg("sgd", "fused"), device="cpu")
    assert [len(g["params"]) for g in opt.param_groups] == [2, 2]


@needs_cuda
@pytest.mark.parametrize("name, impl", [("adam", "foreach"), ("adamw", "fused"), ("sgd", "fused")])
def test_cuda_graph_replay_follows_the_schedule(name, impl):
    device = torch.device("cuda")
    model = _model().to(device)
    opt, _ = build_optimizer(model.parameters(), _cfg(name, impl), device=device, capturable=True)
    # factor 1 for steps 0-1, then 0: a replay at lr 0 must leave the weights unchanged
    sched = build_scheduler(opt, ScheduleConfig(name="step", step_size=2, gamma=0.0),
                            total_steps=10)
    x = torch.randn(8, 6, device=device)
    y = torch.randint(0, 3, (8,), device=device)

    def step():
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # warm-up before capture, as the CUDA graphs docs require
            opt.zero_grad(set_to_none=True)
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        step()
    for _ in range(2):
        before = [p.detach().clone() for p in model.parameters()]
        graph.replay()
        assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))
        sched.step()
    before = [p.detach().clone() for p in model.parameters()]
    graph.replay()
    for b, p in zip(before, model.parameters()):
        torch.testing.assert_close(p, b, rtol=0, atol=0)


@needs_cuda
def test_auto_on_cuda_is_foreach():
    opt, _ = build_optimizer(_model().cuda().parameters(), _cfg("adam"),
                             device=torch.device("cuda"))
    assert optimizer_kind(opt) == "foreach"
