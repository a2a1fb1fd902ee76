"""The optimizer's share of the step and its remedies (diagnose.rules.update), through analyze():
a memory-bound update is named as the update, not as overhead; a per-op-bound one stays overhead;
the same update faster is ranked above a larger batch that promises no more."""

from __future__ import annotations

import pytest

from looptune.measure.records import BatchScaling, Environment, LoaderInfo, Measurements, StepSample, UpdateReplay
from looptune.diagnose.rules.batch import BUSY_OVERHEAD_SHARE
from looptune.diagnose.rules.compute import BF16_GPU_SAVED, FUSABLE_FRACTION
from looptune.diagnose.rules.update import optimizer_s, update_memory_s, update_remedies
from looptune.diagnose.verdict import analyze

MS = 1e-3


def _m(*, update_ms=15.0, replay=None, zero_grad_kept=False, zero_ms=0.0,
       large_s=0.170) -> Measurements:
    # a 66 ms step: 1 ms data, forward 20 + backward 30 ms, the update 15 ms (+ zero_grad)
    parts = {"forward": 20 * MS, "backward": 30 * MS, "optimizer": update_ms * MS}
    if zero_ms:
        parts["zero_grad"] = zero_ms * MS
    step = 0.051 + update_ms * MS + zero_ms * MS
    steps = [StepSample(step_s=step, data_wait_s=0.001, parts_s=parts) for _ in range(5)]
    loader = LoaderInfo(batch_size=256, num_workers=0, pin_memory=False, prefetch_factor=None,
                        persistent_workers=False, dataset="TensorDataset")
    # the forward+backward grows a little less than linearly with the batch (256 -> 1024)
    scaling = BatchScaling(batch=256, factor=4, module="Sequential", small_s=0.050,
                           large_s=large_s, in_step_s=0.050)
    return Measurements(steps=steps, warmup_steps=0, loaders=[loader],
                        env=Environment(cpu_count=2, device_type="cpu", device_name="cpu"),
                        flops_per_step=1e9, matmul_flops_per_s=100e9, batch_scaling=scaling,
                        update=replay, zero_grad_kept=zero_grad_kept)


def _adamw(*, loop_ms=15.0, fused_ms=1.5, foreach_ms=6.0, dispatch_ms=0.3) -> UpdateReplay:
    return UpdateReplay(optimizer="AdamW", impl="for-loop", params=6, elements=5_800_000,
                        step_s={"for-loop": loop_ms * MS, "foreach": foreach_ms * MS,
                                "fused": fused_ms * MS}, dispatch_s=dispatch_ms * MS)


def test_a_memory_bound_update_is_the_update_not_overhead_and_its_fused_form_ranks_first():
    without = analyze(_m())  # no replay: its 15 ms count as a fixed cost per step
    assert without.bottleneck == "overhead"
    v = analyze(_m(replay=_adamw()))
    assert v.bottleneck == "compute", v.evidence
    # 15 ms x (1 - 0.3 / 15) = 14.7 ms of the busy 65 ms are the update's size
    assert v.evidence["update_ms"] == pytest.approx(14.7)
    assert "work, not overhead" in v.evidence["reason"]
    assert v.evidence["overhead_share"] < BUSY_OVERHEAD_SHARE <= v.evidence["fixed_share"]
    assert v.part_ms == {"forward": 20.0, "backward": 30.0, "optimizer": 15.0,
                         "optimizer.update": 15.0}
    assert v.part_shares["optimizer"] == pytest.approx(15 / 66, abs=1e-4)
    (opt,) = [r for r in v.remedies if r.kind == "optimizer"]
    assert opt.action == "torch.optim.AdamW(..., fused=True)"
    # fused takes 0.1x the for-loop's time: 13.5 ms of the 66 ms step go
    assert opt.expected_speedup == round(66 / (66 - 13.5), 2) == 1.26
    assert "for-loop 15.000 ms" in opt.reason and "same training" in opt.reason
    batch = [r for r in v.remedies if r.kind == "batch"]
    kinds = [r.kind for r in v.remedies]
    # the batch's per-sample bound (1.40x) is not enough more to rank above the same training
    assert batch and batch[0].expected_speedup > opt.expected_speedup
    assert kinds.index("optimizer") < kinds.index("batch")


def test_a_batch_bound_far_above_the_update_still_ranks_first():
    v = analyze(_m(replay=_adamw(), large_s=0.060))  # forward+backward nearly flat in the batch
    kinds = [r.kind for r in v.remedies]
    assert v.bottleneck == "overhead" and kinds.index("batch") < kinds.index("optimizer")


def test_an_update_that_costs_the_same_on_one_element_tensors_is_overhead():
    # the replay on 1-element tensors takes 14 of the 15 ms: per-op cost, not the parameters' size
    v = analyze(_m(replay=_adamw(dispatch_ms=14.0)))
    assert v.bottleneck == "overhead"
    assert v.evidence["update_ms"] == pytest.approx(1.0)
    assert any(r.kind == "optimizer" for r in v.remedies)


def test_no_remedy_when_the_script_runs_the_fastest_implementation_already():
    fastest = UpdateReplay(optimizer="AdamW", impl="fused", params=6, elements=10,
                           step_s={"for-loop": 0.015, "fused": 0.0015}, dispatch_s=0.0001)
    assert not [r for r in analyze(_m(replay=fastest)).remedies if r.kind == "optimizer"]
    # not replayed (an optimizer without foreach/fused): nothing to promise, all of it fixed cost
    noted = UpdateReplay(optimizer="LBFGS", impl="for-loop", note="one implementation only")
    m = _m(replay=noted)
    assert update_remedies(m, {"optimizer": 0.015}, 0.066) == []
    assert update_memory_s(m, {"optimizer": 0.015}) == 0.0


def test_zero_grad_in_place_is_named_with_its_measured_share():
    m = _m(replay=_adamw(), zero_grad_kept=True, zero_ms=4.0)
    v = analyze(m)
    (z,) = [r for r in v.remedies if r.kind == "zero_grad"]
    assert "set_to_none=True" in z.action and "4.000 ms" in z.reason
    assert z.expected_speedup == round(70 / 66, 2)
    assert v.part_ms["optimizer"] == 19.0 and v.part_ms["optimizer.zero_grad"] == 4.0
    # the default zero_grad (set_to_none=True) is never flagged
    assert not [r for r in analyze(_m(replay=_adamw(), zero_ms=4.0)).remedies
                if r.kind == "zero_grad"]


def test_the_update_parts_add_up():
    parts = {"forward": 1.0, "optimizer": 0.5, "zero_grad": 0.1, "clip_grad": 0.2,
             "grad_scaler": 0.05, "lr_scheduler": 0.01}
    assert optimizer_s(parts) == pytest.approx(0.86)


def test_compile_and_bf16_bounds_leave_the_update_out():
    # the forward and loss compiled, or run in bf16, leave the fp32 optimizer update as it was
    m = _m(replay=_adamw())
    v = analyze(m)
    (compile_,) = [r for r in v.remedies if r.kind == "compile"]
    matmul_ms = 1e9 / 100e9 * 1e3  # 10 ms of the 65 ms compute
    rest = 65 - matmul_ms - 15  # and 15 ms of it the update
    assert f"is {rest:.3f} ms" in compile_.reason and "optimizer's 15.000 ms left out" in compile_.reason
    assert compile_.expected_speedup == round(66 / (66 - rest * FUSABLE_FRACTION), 2)


def test_on_cuda_the_bf16_bound_halves_the_compute_but_not_the_update():
    parts = {"forward": 0.030, "backward": 0.040, "optimizer": 0.020}
    steps = [StepSample(step_s=0.100, data_wait_s=0.001, device_busy_s=0.095, parts_s=parts)
             for _ in range(5)]
    env = Environment(cpu_count=8, device_type="cuda", device_name="NVIDIA H100",
                      device_total_bytes=80 * 2**30, tf32_supported=True, tf32_enabled=True)
    v = analyze(Measurements(steps=steps, warmup_steps=0, env=env, flops_per_step=0.6 * 400e12
                             * 0.098, matmul_flops_per_s=400e12))
    (bf16,) = [r for r in v.remedies if r.kind == "precision"]
    c = v.shares["compute"] - 0.2  # the update's 20 ms of the 100 ms step stay fp32
    assert bf16.expected_speedup == round(1 / (1 - c * BF16_GPU_SAVED), 2)
    assert "less the optimizer's 20.0%" in bf16.reason
