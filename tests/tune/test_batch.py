"""Batch-size search: the knee on recorded curves, the real search on a tiny MLP, OOM on CPU."""

import copy
import random

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from looptune.errors import ConfigError, MeasurementError
from looptune.tune import batch
from looptune.tune.batch import BatchSizeResult, pick_knee, tune_batch_size

FAST = {"steps": 2, "warmup": 1, "repeats": 2}  # tiny, but every phase of a trial runs


def _mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 4))


def _data(n=64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, 8, generator=gen), torch.randint(0, 4, (n,), generator=gen))


def _fake_seconds(size):
    """A made-up step time: 1 ms overhead + 0.1 ms per sample (saturates at 10,000 samples/s)."""
    return 1e-3 + 1e-4 * size


@pytest.fixture
def fake_clock(monkeypatch):
    """Deterministic timings: the real steps still run, only the clock is replaced."""
    monkeypatch.setattr(batch, "_time_steps",
                        lambda run, inputs, targets: run.steps * _fake_seconds(len(inputs)))


def _rate(size):
    return size / _fake_seconds(size)


def _recorded(size, rate, peak, status="ok"):
    return {"batch_size": size, "samples_per_s": rate, "step_ms": 1.0, "peak_mem_bytes": peak,
            "status": status, "reason": "recorded"}


# ------------------------------------------------------------------------------- pick_knee (pure)

def test_pick_knee_takes_the_smallest_size_within_threshold_of_the_best():
    trials = [_recorded(64, 20_000, 1e6), _recorded(128, 38_000, 2e6),
              _recorded(256, 41_200, 4e6), _recorded(512, 42_100, 8e6),
              _recorded(1024, 60_000, 16e6, status="over_memory")]
    decision = pick_knee(trials, 0.05, None, 0.9)
    assert decision.name == "batch_size" and decision.value == 256
    assert decision.reason.startswith(
        "256: 41,200 samples/s, within 5% of the best (512: 42,100) at half the memory")
    assert "excluded: 1024 (over_memory)" in decision.reason


def test_pick_knee_rechecks_memory_against_the_limit_and_fraction():
    trials = [_recorded(64, 50.0, 100), _recorded(128, 90.0, 200), _recorded(256, 100.0, 400)]
    assert pick_knee(trials, 0.05, None, 0.9).value == 256
    # 400 bytes > 0.9 * 400: 256 is not eligible, so 128 is the best and the knee
    decision = pick_knee(trials, 0.05, memory_limit=400, max_fraction=0.9)
    assert decision.value == 128
    assert decision.reason.startswith("128: 90 samples/s, the best measured")
    assert pick_knee(trials, 0.2, None, 0.9).value == 128  # 90 is within 20% of 100; 50 is not
    assert pick_knee(trials, 0.5, None, 0.9).value == 64


def test_pick_knee_without_an_eligible_trial_says_what_happened():
    trials = [_recorded(1, None, None, status="oom")]
    with pytest.raises(MeasurementError, match=r"no batch size ran within the memory limit"
                       r".*tried 1 \(oom"):
        pick_knee(trials, 0.05, None, 0.9)



@pytest.mark.parametrize("small_rate, knee", [(95.1, 64), (94.9, 128), (100.0, 64), (30.0, 128)])
def test_pick_knee_threshold_just_above_and_just_below(small_rate, knee):
    # 128 is the best (100 samples/s); 64 is the knee only when within 5% of it (>= 95)
    trials = [_recorded(64, small_rate, 1e6), _recorded(128, 100.0, 2e6),
              _recorded(256, 99.0, 4e6)]
    decision = pick_knee(trials, 0.05, None, 0.9)
    assert decision.value == knee
    if knee == 64 and small_rate < 100.0:
        assert decision.reason.startswith(f"64: {small_rate:,.0f} samples/s, within 5% of the "
                                          "best (128: 100) at half the memory")
    elif knee == 128:
        assert decision.reason.startswith("128: 100 samples/s, the best measured")


def test_pick_knee_takes_the_best_not_the_largest_nor_the_first():
    # the best is in the middle; the knee is measured against it, not against the last size
    trials = [_recorded(32, 60.0, 1e6), _recorded(64, 96.0, 2e6), _recorded(128, 100.0, 4e6),
              _recorded(256, 70.0, 8e6)]
    assert pick_knee(trials, 0.05, None, 0.9).value == 64
    assert pick_knee(trials, 0.03, None, 0.9).value == 128
    # an excluded (over-memory) size is never the best, however fast
    trials.append(_recorded(512, 1000.0, 16e6, status="over_memory"))
    assert pick_knee(trials, 0.05, None, 0.9).value == 64


# ------------------------------------------------------------------------------------ the search

def test_real_search_on_a_tiny_mlp_grows_powers_of_two_and_picks_a_tried_size():
    result = tune_batch_size(_mlp(), _data(64), device="cpu", **FAST)
    assert isinstance(result, BatchSizeResult)
    sweep = [t["batch_size"] for t in result.trials if t["phase"] == "sweep"]
    assert sweep == [2 ** k for k in range(len(sweep))] and sweep[-1] <= 64
    ok = {t["batch_size"] for t in result.trials if t["status"] == "ok"}
    assert result.recommended == {"batch_size": result.decisions[0].value}
    assert result.recommended["batch_size"] in ok
    assert [d.name for d in result.decisions] == ["batch_size"]
    for trial in result.trials:
        assert trial["samples_per_s"] > 0 and trial["step_ms"] > 0
        assert trial["peak_mem_kind"] == "cpu_tensor_estimate" and trial["reason"]
    peaks = [t["peak_mem_bytes"] for t in result.trials if t["phase"] == "sweep"]
    assert peaks == sorted(peaks) and peaks[0] > 0  # bigger batches hold more tensor bytes
    assert result.decisions[0].evidence["trials"] is result.trials


def test_search_stops_at_the_plateau_then_refines_around_the_knee(fake_clock):
    result = tune_batch_size(_mlp(), _data(512), device="cpu", **FAST)
    # 256 gains 3.8% over 128 (<= 5%): growth stops; the knee 128 is refined at 96 and 192
    assert [t["batch_size"] for t in result.trials] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 96, 192]
    assert result.recommended == {"batch_size": 128}
    evidence = result.decisions[0].evidence
    assert evidence["search_ended"] == "plateau" and "256 gained <= 5%" in evidence["detail"]
    assert result.trials[0]["samples_per_s"] == pytest.approx(_rate(1))
    assert result.decisions[0].reason.startswith(f"128: {_rate(128):,.0f} samples/s, within 5% "
                                                 f"of the best (256: {_rate(256):,.0f})")


def test_candidates_replace_the_sweep_sorted_and_deduplicated(fake_clock):
    result = tune_batch_size(_mlp(), _data(16), device="cpu", candidates=[32, 4, 32], **FAST)
    assert [t["batch_size"] for t in result.trials] == [4, 32]  # 32 > len(dataset): cycled
    assert result.decisions[0].evidence["search_ended"] == "candidates"
    assert result.recommended == {"batch_size": 32}


def _plant_rates(monkeypatch, rates):
    """Each size's samples/s planted: ``_time_steps`` returns the seconds that rate gives."""
    monkeypatch.setattr(batch, "_time_steps",
                        lambda run, inputs, targets: run.steps * len(inputs) / rates[len(inputs)])


@pytest.mark.parametrize("gain_at_8, sweep, chosen", [
    (0.051, [1, 2, 4, 8, 16], 8),  # 8 gains 5.1% (> 5%): growth goes on; 16 gains 4.9%: stop
    (0.049, [1, 2, 4, 8], 4),  # 8 gains 4.9% (<= 5%): growth stops at 8
])
def test_the_sweep_grows_while_a_size_gains_more_than_the_threshold(monkeypatch, gain_at_8,
                                                                    sweep, chosen):
    at_8 = 400 * (1 + gain_at_8)
    rates = {1: 100.0, 2: 200.0, 3: 250.0, 4: 400.0, 6: 390.0, 8: at_8, 12: at_8,
             16: at_8 * 1.049, 32: at_8 * 2, 64: at_8 * 4}
    _plant_rates(monkeypatch, rates)
    result = tune_batch_size(_mlp(), _data(64), device="cpu", **FAST)
    trials = result.trials
    assert [t["batch_size"] for t in trials if t["phase"] == "sweep"] == sweep
    assert [t["samples_per_s"] for t in trials] == pytest.approx([rates[t["batch_size"]]
                                                                  for t in trials])
    ended = result.decisions[0].evidence
    assert ended["search_ended"] == "plateau"
    assert ended["detail"].startswith(f"{sweep[-1]} gained <= 5% over the best so far")
    # the knee (within 5% of the best), refined at 0.75x and 1.5x of it
    assert [t["batch_size"] for t in trials if t["phase"] == "refine"] == [
        chosen * 3 // 4, chosen * 3 // 2]
    assert result.recommended == {"batch_size": chosen}


def test_a_knee_at_2_is_not_refined_below_what_batch_norm_can_train(monkeypatch):
    # 4 gains 4% over 2 (<= 5%): growth stops and the knee is 2; 0.75x of it would be 1
    _plant_rates(monkeypatch, {2: 100.0, 3: 101.0, 4: 104.0})
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Linear(16, 4))
    result = tune_batch_size(model, _data(64), device="cpu", **FAST)
    assert [t["batch_size"] for t in result.trials] == [2, 4, 3]
    assert result.recommended == {"batch_size": 2}


def test_allocate_cycles_a_small_dataset():
    inputs, targets = batch._allocate(_data(4), 10, torch.device("cpu"))
    assert inputs.shape == (10, 8) and targets.shape == (10,)
    assert torch.equal(inputs[4], inputs[0]) and torch.equal(targets[9], targets[1])


# --------------------------------------------------------------------------------------- memory

def test_oom_is_caught_recorded_and_the_search_backs_off(fake_clock, monkeypatch):
    real_allocate = batch._allocate

    def allocate(dataset, size, device):
        if size > 16:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real_allocate(dataset, size, device)

    monkeypatch.setattr(batch, "_allocate", allocate)
    result = tune_batch_size(_mlp(), _data(512), device="cpu", **FAST)
    sizes = [t["batch_size"] for t in result.trials]
    assert sizes == [1, 2, 4, 8, 16, 32, 12, 24]  # stops growing at 32, refines below and above
    statuses = {t["batch_size"]: t["status"] for t in result.trials}
    assert statuses[32] == "oom" and statuses[24] == "oom" and statuses[16] == "ok"
    oom = result.trials[5]
    assert oom["samples_per_s"] is None and "Tried to allocate 2.00 GiB" in oom["reason"]
    assert result.recommended == {"batch_size": 16}
    assert result.decisions[0].evidence["search_ended"] == "oom"
    assert "excluded: 32 (oom), 24 (oom)" in result.decisions[0].reason


def _estimates(sizes):
    result = tune_batch_size(_mlp(), _data(64), device="cpu", candidates=sizes, **FAST)
    return {t["batch_size"]: t["peak_mem_bytes"] for t in result.trials}


def test_cpu_peak_estimate_is_deterministic():
    assert _estimates([4, 8, 16, 32]) == _estimates([4, 8, 16, 32])


def test_memory_limit_on_cpu_acts_as_the_allocator_capacity(fake_clock):
    peaks = _estimates([4, 8, 16, 32])
    result = tune_batch_size(_mlp(), _data(64), device="cpu", candidates=[4, 8, 16, 32],
                             memory_limit_bytes=peaks[16] - 1, max_memory_fraction=1.0, **FAST)
    assert [(t["batch_size"], t["status"]) for t in result.trials] == [(4, "ok"), (8, "ok"),
                                                                        (16, "oom")]
    assert f"over memory_limit_bytes={peaks[16] - 1}" in result.trials[-1]["reason"]
    assert result.recommended == {"batch_size": 8}


def test_sizes_over_the_memory_fraction_are_measured_but_not_picked(fake_clock):
    peaks = _estimates([4, 8, 16, 32])
    limit = peaks[32] + 1  # nothing runs out of memory, but 16 is over the fraction
    result = tune_batch_size(_mlp(), _data(64), device="cpu", candidates=[4, 8, 16, 32],
                             memory_limit_bytes=limit, max_memory_fraction=(peaks[8] + 1) / limit,
                             **FAST)
    assert [t["status"] for t in result.trials] == ["ok", "ok", "over_memory"]
    assert result.trials[-1]["samples_per_s"] == pytest.approx(_rate(16))
    assert result.recommended == {"batch_size": 8}
    assert result.decisions[0].evidence["search_ended"] == "over_memory"


def test_nothing_fits_raises_a_measurement_error():
    with pytest.raises(MeasurementError, match="no batch size ran within the memory limit"):
        tune_batch_size(_mlp(), _data(8), device="cpu", memory_limit_bytes=1, **FAST)


# ----------------------------------------------------------------------- accumulation, budget

def test_keep_effective_recommends_accumulation_and_caps_the_sweep(fake_clock):
    result = tune_batch_size(_mlp(), _data(512), device="cpu", keep_effective=100, **FAST)
    assert max(t["batch_size"] for t in result.trials if t["phase"] == "sweep") == 64
    assert result.recommended == {"batch_size": 64, "accumulate": 2}
    accumulate = result.decisions[1]
    assert accumulate.name == "accumulate" and accumulate.value == 2
    assert "2 micro-batches of 64 = effective batch 128 (28 more than asked" in accumulate.reason
    exact = tune_batch_size(_mlp(), _data(64), device="cpu", candidates=[32],
                            keep_effective=512, **FAST)
    assert exact.recommended == {"batch_size": 32, "accumulate": 16}
    assert exact.decisions[1].reason == ("keep_effective=512: 16 micro-batches of 32 = "
                                         "effective batch 512")


def test_a_pick_at_the_cap_says_larger_sizes_were_not_tried(fake_clock):
    result = tune_batch_size(_mlp(), _data(8), device="cpu", **FAST)
    assert [t["batch_size"] for t in result.trials] == [1, 2, 4, 8, 6]
    assert result.recommended == {"batch_size": 8}
    assert ("larger sizes were not tried: reached the largest size allowed, 8 (min of 8192, "
            "len(dataset)=8, keep_effective=None)") in result.decisions[0].reason


def test_budget_ends_the_search_and_says_so(fake_clock):
    result = tune_batch_size(_mlp(), _data(64), device="cpu", budget_s=1e-9, **FAST)
    assert [t["batch_size"] for t in result.trials] == [1]  # the first size always runs
    assert result.decisions[0].evidence["search_ended"] == "budget"
    assert "the search stopped early: budget_s spent after 1 sizes" in result.decisions[0].reason


# --------------------------------------------------------------------------- caller untouched

def test_caller_model_optimizer_and_rng_are_bit_identical_afterwards():
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Dropout(0.5), nn.Linear(16, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    inputs, targets = _data(16).tensors
    nn.functional.cross_entropy(model(inputs), targets).backward()
    optimizer.step()  # momentum buffers and grads exist
    model.eval()
    weights = copy.deepcopy(model.state_dict())
    grads = [p.grad.clone() for p in model.parameters()]
    opt_state = copy.deepcopy(optimizer.state_dict())
    torch.manual_seed(123)
    random.seed(5)
    np.random.seed(7)
    rng = (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy())

    result = tune_batch_size(model, _data(32), device="cpu", **FAST)

    assert result.trials[0]["batch_size"] == 2  # batch norm cannot train on one sample
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters(), strict=True))
    assert not model.training
    after = optimizer.state_dict()
    assert after["param_groups"] == opt_state["param_groups"]
    for key, state in opt_state["state"].items():
        assert torch.equal(state["momentum_buffer"], after["state"][key]["momentum_buffer"])
    assert torch.equal(torch.get_rng_state(), rng[0])
    assert random.getstate() == rng[1] and np.array_equal(np.random.get_state()[1], rng[2])


# ----------------------------------------------------------------------------------- validation

def test_every_bad_argument_is_reported_at_once_before_any_work(monkeypatch):
    monkeypatch.setattr(batch, "_private_copy", lambda *a: pytest.fail("ran before validating"))
    with pytest.raises(ConfigError) as info:
        tune_batch_size("a model", [], loss_fn=3, device="tpu", candidates=[0, 2],
                        max_memory_fraction=1.5, keep_effective=0, steps=0, warmup=-1,
                        repeats=0, threshold=1.0, memory_limit_bytes=0, budget_s=0)
    text = str(info.value)
    assert len(info.value.problems) == 13 and text.startswith("13 problems:")
    for expected in ["model=str is invalid: must be a torch.nn.Module",
                     "dataset is empty (len 0): nothing to measure",
                     "loss_fn=3 is invalid: must be callable",
                     "device='tpu' is invalid: allowed values are 'auto', 'cpu', 'cuda'",
                     "candidates=[0, 2] is invalid: must be a non-empty list of positive integers",
                     "max_memory_fraction=1.5 is invalid: must be in (0, 1]",
                     "keep_effective=0 is invalid: must be an integer >= 1",
                     "steps=0 is invalid: must be an integer >= 1",
                     "warmup=-1 is invalid: must be an integer >= 0",
                     "repeats=0 is invalid: must be an integer >= 1",
                     "threshold=1.0 is invalid: must be in [0, 1)",
                     "memory_limit_bytes=0 is invalid: must be an integer >= 1",
                     "budget_s=0 is invalid: must be a number of seconds > 0"]:
        assert expected in text


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"dataset": iter([1])}, "dataset=list_iterator is invalid: must be map-style"),
    ({"dataset": [torch.zeros(3)]}, "dataset[0] is a Tensor: must be an (input tensor, target)"),
    ({"candidates": []}, "candidates=[] is invalid"),
    ({"candidates": [True]}, "candidates=[True] is invalid"),
    ({"model": nn.ReLU()}, "model=ReLU has no trainable parameters"),
    ({"steps": 2.5}, "steps=2.5 is invalid: must be an integer >= 1"),
    ({"max_memory_fraction": 0}, "max_memory_fraction=0 is invalid"),
    ({"budget_s": float("inf")}, "budget_s=inf is invalid"),
])
def test_one_bad_argument_names_value_and_fix(kwargs, message):
    args = {"model": _mlp(), "dataset": _data(8), **kwargs}
    with pytest.raises(ConfigError) as info:
        tune_batch_size(args.pop("model"), args.pop("dataset"), **args)
    assert message in str(info.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a CPU-only machine")
def test_cuda_requested_without_a_gpu_says_so():
    with pytest.raises(ConfigError, match="device='cuda' was asked for but no CUDA device"):
        tune_batch_size(_mlp(), _data(8), device="cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_search_reads_the_allocator_peak():
    result = tune_batch_size(_mlp(), _data(256), device="cuda", candidates=[8, 64, 256], **FAST)
    assert [t["status"] for t in result.trials] == ["ok", "ok", "ok"]
    assert all(t["peak_mem_kind"] == "cuda_max_allocated" and t["peak_mem_bytes"] > 0
               for t in result.trials)
    assert result.decisions[0].evidence["memory_limit_bytes"] == (
        torch.cuda.get_device_properties(0).total_memory)


def test_pick_knee_defaults_are_the_documented_5_percent_and_90_percent_of_memory():
    # killed mutants (make mutation): the defaults 0.05 -> 1.05 and 0.9 -> 1.9 both survived,
    # every test passing them explicitly; a caller with the defaults gets them here
    trials = [_recorded(64, 95.1, 1e6), _recorded(128, 100.0, 2e6)]
    assert pick_knee(trials).value == 64
    assert pick_knee([_recorded(64, 94.9, 1e6), _recorded(128, 100.0, 2e6)]).value == 128
    # 128 uses 95% of the limit: over the default 90%, so never the best, however fast
    over = [_recorded(64, 50.0, 1e6), _recorded(128, 100.0, 9.5e6)]
    assert pick_knee(over, memory_limit=10_000_000).value == 64
