"""The step floor: every FLOP-counted op recorded with its real shapes, timed alone, summed;
the update's and the input's bytes at a measured streaming rate."""

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from looptune.measure.floor import measure_floor, time_alone, update_bytes


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 64),
                         nn.ReLU(), nn.Linear(64, 10))


def test_the_floor_counts_the_same_flops_as_flop_counter_mode_for_forward_and_backward():
    model, x, y = _mlp(), torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))
    with FlopCounterMode(display=False) as counter:
        nn.functional.cross_entropy(model(x), y).backward()
    model.zero_grad(set_to_none=True)
    floor = measure_floor(model, nn.functional.cross_entropy, x, y, input_bytes=64 * 784)
    assert floor.flops == counter.get_total_flops()
    ops = {o.op for o in floor.ops}
    assert "aten.addmm.default" in ops and "aten.mm.default" in ops
    # forward: 3 addmm (bias + x @ W.T); backward: weight grads of 3 layers, input grads of 2
    assert sum(o.calls for o in floor.ops if o.op == "aten.addmm.default") == 3
    assert sum(o.calls for o in floor.ops if o.op == "aten.mm.default") == 5
    assert all(o.seconds > 0 for o in floor.ops)
    assert floor.arithmetic_s == sum(o.seconds * o.calls for o in floor.ops)
    assert floor.step_s > floor.arithmetic_s > 0 and floor.batch_size == 64


def test_the_step_leaves_no_gradient_and_the_weights_unchanged():
    model = _mlp()
    before = [p.detach().clone() for p in model.parameters()]
    measure_floor(model, nn.functional.cross_entropy, torch.randn(8, 784),
                  torch.randint(0, 10, (8,)))
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))


def test_identical_ops_are_timed_once_and_counted_per_call():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 32), nn.Linear(32, 32))
    floor = measure_floor(model, lambda out, y: (out - y).pow(2).mean(), torch.randn(16, 32),
                          torch.randn(16, 32))
    forward = [o for o in floor.ops if o.op == "aten.addmm.default"]
    assert len(forward) == 1 and forward[0].calls == 3 and forward[0].shapes == "[32] [16, 32] [32, 32]"


def test_the_update_moves_each_parameter_and_its_state_once():
    params = [torch.zeros(100), torch.zeros(10, 10)]
    assert update_bytes(params, "adam") == 200 * 4 * 7  # read p g m v, write p m v
    assert update_bytes(params, "adamw") == 200 * 4 * 7
    assert update_bytes(params, "sgd") == 200 * 4 * 5  # momentum: read p g buf, write p buf
    assert update_bytes([torch.zeros(10, dtype=torch.float64)], "sgd") == 10 * 8 * 5


def test_the_memory_part_counts_the_input_as_stored_and_the_labels():
    model = nn.Linear(4, 2)
    x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
    floor = measure_floor(model, nn.functional.cross_entropy, x, y, input_bytes=32)
    assert floor.memory_bytes == update_bytes(list(model.parameters()), "adam") + 32 + 8 * 8
    assert floor.stream_bytes_per_s > 0 and floor.memory_s > 0


def test_time_alone_keeps_the_fastest_round():
    import time

    seconds = time_alone(lambda: time.sleep(0.002), torch.device("cpu"), round_s=0.01, rounds=2)
    assert 0.002 <= seconds < 0.05


def test_under_autocast_each_op_is_timed_in_its_dtype_and_in_float32_the_faster_kept(monkeypatch):
    from looptune.measure import floor as floor_mod

    timed = []

    def fake_time(fn, device, **kw):  # bf16 "costs" 2, float32 1: the float32 variant must win
        if fn.__defaults__ is None:  # the streaming kernel
            return 1.0
        _, args, _ = fn.__defaults__  # the op, its arguments, its keyword arguments
        dtypes = {a.dtype for a in args if isinstance(a, torch.Tensor)}
        timed.append(dtypes)
        return 2.0 if torch.bfloat16 in dtypes else 1.0

    monkeypatch.setattr(floor_mod, "time_alone", fake_time)
    model, x, y = _mlp(), torch.randn(16, 784), torch.randint(0, 10, (16,))
    bf16 = measure_floor(model, nn.functional.cross_entropy, x, y, threads=(1,),
                         context=lambda: torch.autocast("cpu", dtype=torch.bfloat16))
    assert {o.dtype for o in bf16.ops} == {"float32"} and all(o.seconds == 1.0 for o in bf16.ops)
    assert sum(torch.bfloat16 in d for d in timed) == len(bf16.ops)  # each bf16 op timed too
    timed.clear()
    fp32 = measure_floor(model, nn.functional.cross_entropy, x, y, threads=(1,))
    assert {o.dtype for o in fp32.ops} == {"float32"}
    assert len(timed) == len(fp32.ops)  # an fp32 step's ops: one variant each, never bf16


@pytest.mark.parametrize("cost, kept", [({1: 1.0, 2: 2.0}, 1), ({1: 2.0, 2: 1.0}, 2),
                                        ({1: 1.0, 2: 0.99}, 2), ({1: 1.0, 2: 1.0}, 1)])
def test_each_op_keeps_the_thread_count_that_ran_it_fastest(monkeypatch, cost, kept):
    """The per-op choice of thread count, on planted timings (``time_alone`` faked): the
    fastest is kept, a tie keeps the first count timed."""
    from looptune.measure import floor as floor_mod

    def fake_time(fn, device, **kw):
        return cost[torch.get_num_threads()]

    monkeypatch.setattr(floor_mod, "time_alone", fake_time)
    before = torch.get_num_threads()
    model, x, y = _mlp(), torch.randn(16, 784), torch.randint(0, 10, (16,))
    floor = measure_floor(model, nn.functional.cross_entropy, x, y, threads=(2, 1))
    assert floor.threads == (1, 2) and torch.get_num_threads() == before
    assert floor.ops and {o.threads for o in floor.ops} == {kept}
    assert all(o.seconds == min(cost.values()) for o in floor.ops)
    assert floor.arithmetic_s == pytest.approx(min(cost.values()) * sum(o.calls for o in floor.ops))
