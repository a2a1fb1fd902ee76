"""backward='mlp-cpp': the written-out MLP step as one C++ call (fastpath/mlp_step.cpp), built at
setup; the loss and gradients bit for bit the Python step's, and without a compiler the Python
step with the reason."""

import copy

import pytest
import torch
from torch.nn import functional as F

from looptune.bench.workloads import SimpleFeedForwardNN
from looptune.fastpath import mlp, native
from looptune.engine.optim import build_optimizer
from looptune.engine.step import Stepper
from looptune.recipe import OptimConfig, StepConfig

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def op():
    got, how = native.load_mlp_step()
    if got is None:  # the machine has no C++ toolchain: the fallback tests below still run
        pytest.skip(how)
    return got


def _batches(n, batch=16, seed=1, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, 1, 28, 28, generator=gen).to(dtype),
             torch.randint(0, 10, (batch,), generator=gen)) for _ in range(n)]


@pytest.mark.parametrize("bf16", [(False, False, False), (True, False, False),
                                  (True, True, True), (False, True, True)])
def test_cpp_step_is_the_python_step_bit_for_bit(op, bf16):
    torch.manual_seed(0)
    a = SimpleFeedForwardNN()
    b = copy.deepcopy(a)
    steps = []
    for model, native_op in ((a, None), (b, op)):
        layers = mlp.plan(model, F.cross_entropy)
        for lay, low in zip(layers, bf16):
            lay.bf16 = low
        steps.append(mlp.MLPStep(layers, native=native_op))
    python, cpp = steps
    seed = torch.full((), 1 / 3)
    batches = _batches(3) + _batches(2, batch=5, seed=2, dtype=torch.bfloat16)
    for i, (x, y) in enumerate(batches):  # accumulation over 3, a short batch, a bf16 input
        first = i % 3 == 0
        assert torch.equal(python(x, y, seed, first), cpp(x, y, seed, first))
        assert all(torch.equal(p.grad, q.grad) for p, q in zip(a.parameters(), b.parameters()))
    assert isinstance(cpp.fn, mlp._Native) and not isinstance(python.fn, mlp._Native)


def _stepper(model, backward, precision="bf16", compile="off"):
    opt, _ = build_optimizer(model.parameters(), OptimConfig(impl="direct", lr=1e-2), device=CPU)
    step = Stepper(model=model, optimizer=opt, scheduler=None, loss_fn=F.cross_entropy,
                   device=CPU, cfg=StepConfig(backward=backward, precision=precision,
                                              compile=compile))
    return step, step.prepare(16, torch.bfloat16)


def test_the_engine_trains_the_same_weights_through_either_step(op, monkeypatch):
    monkeypatch.setattr(mlp, "choose_bf16", lambda layers, *a: [setattr(lay, "bf16", i == 0)
                                                                for i, lay in enumerate(layers)]
                        and "first layer bf16")
    torch.manual_seed(0)
    a = SimpleFeedForwardNN()
    b = copy.deepcopy(a)
    (python, _), (cpp, why) = _stepper(a, "mlp"), _stepper(b, "mlp-cpp")
    assert why[0].value == "mlp-cpp" and "one C++ call per step" in why[0].reason
    for x, y in _batches(6, dtype=torch.bfloat16):
        assert torch.equal(python(x, y), cpp(x, y))
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def test_a_batch_of_the_wrong_width_is_named(op):
    step = mlp.MLPStep(mlp.plan(SimpleFeedForwardNN(), F.cross_entropy), native=op)
    with pytest.raises(ValueError, match=r"flattens to \(4, 100\).*first layer takes 784"):
        step(torch.randn(4, 100), torch.zeros(4, dtype=torch.long), torch.ones(()), first=True)


def test_without_a_toolchain_the_python_step_runs_and_says_why(monkeypatch):
    from torch.utils import cpp_extension

    def no_compiler(**kwargs):
        raise RuntimeError("Ninja is required to load C++ extensions")

    monkeypatch.setattr(native, "_loaded", {})
    monkeypatch.setattr(cpp_extension, "load", no_compiler)
    step, why = _stepper(SimpleFeedForwardNN(), "mlp-cpp", precision="fp32")
    assert why[0].value == "mlp"
    assert "run from Python instead" in why[0].reason and "Ninja is required" in why[0].reason
    x, y = _batches(1)[0]
    step(x, y)
    assert step.stats.optimizer_steps == 1 and not isinstance(step._fast.fn, mlp._Native)


def test_the_build_folder_follows_torch_and_the_source(monkeypatch, tmp_path):
    monkeypatch.setenv("LOOPTUNE_NATIVE_DIR", str(tmp_path))
    where = native.build_dir()
    assert where.parent == tmp_path and torch.__version__.replace("+", "_") in where.name


def test_cpp_with_compile_or_fp16_is_refused_before_training():
    assert any("backward='mlp-cpp' with compile='default'" in p
               for p in StepConfig(backward="mlp-cpp", compile="default").problems())
    assert any("backward='mlp-cpp' with precision='fp16'" in p
               for p in StepConfig(backward="mlp-cpp", precision="fp16").problems())
    assert not StepConfig(backward="mlp-cpp", precision="bf16").problems()


def test_a_cached_library_that_does_not_load_is_built_again(op, monkeypatch, tmp_path):
    from torch.utils import cpp_extension

    monkeypatch.setenv("LOOPTUNE_NATIVE_DIR", str(tmp_path))
    monkeypatch.setattr(native, "_loaded", {})
    where = native.build_dir()
    where.mkdir(parents=True)
    (where / "looptune_mlp.so").write_bytes(b"cut short")  # a build killed mid-link
    calls = []

    def load(**kwargs):  # stands in for the compiler; the op is registered in this process
        calls.append((where / "looptune_mlp.so").exists())
        if calls[-1]:
            raise OSError(f"{where}/looptune_mlp.so: file too short")

    monkeypatch.setattr(cpp_extension, "load", load)
    got, how = native.load_mlp_step()
    assert got is op and calls == [True, False] and how.startswith("built in")
