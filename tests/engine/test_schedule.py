import functools
import io
import math

import pytest
import torch

from looptune.engine import schedule
from looptune.engine.schedule import build_scheduler, lr_factor
from looptune.errors import ConfigError
from looptune.recipe import ScheduleConfig

NAMES = ["constant", "cosine", "onecycle", "cyclic", "step"]
TOTAL = 100


def _factors(cfg: ScheduleConfig, total: int = TOTAL, extra: int = 0) -> list[float]:
    return [lr_factor(s, total_steps=total, cfg=cfg) for s in range(total + 1 + extra)]


def _non_increasing(values: list[float]) -> bool:
    return all(b <= a + 1e-12 for a, b in zip(values, values[1:]))


def _non_decreasing(values: list[float]) -> bool:
    return _non_increasing([-v for v in values])


@pytest.mark.parametrize("warmup", [0, 10])
@pytest.mark.parametrize("name", NAMES)
def test_factors_stay_in_unit_interval_and_hold_after_the_end(name, warmup):
    cfg = ScheduleConfig(name=name, warmup_steps=warmup, min_lr_fraction=0.1, cycle_steps=20,
                         step_size=30, gamma=0.5)
    values = _factors(cfg, extra=20)
    assert all(0.0 <= v <= 1.0 for v in values)
    assert values[TOTAL:] == [values[TOTAL]] * 21  # past total_steps: the final value


@pytest.mark.parametrize("name", NAMES)
def test_warmup_ramps_linearly_to_where_the_schedule_starts(name):
    cfg = ScheduleConfig(name=name, warmup_steps=10, min_lr_fraction=0.1, cycle_steps=20)
    start = lr_factor(10, total_steps=TOTAL, cfg=cfg)  # the first post-warm-up step
    for step in range(10):
        assert lr_factor(step, total_steps=TOTAL, cfg=cfg) == pytest.approx((step + 1) / 10 * start)
    assert lr_factor(9, total_steps=TOTAL, cfg=cfg) == pytest.approx(start)  # no jump


def test_constant():
    assert set(_factors(ScheduleConfig(name="constant"))) == {1.0}
    assert lr_factor(0, total_steps=TOTAL, cfg=ScheduleConfig(warmup_steps=4)) == 0.25


def test_cosine_key_points_and_monotone():
    cfg = ScheduleConfig(name="cosine", warmup_steps=20, min_lr_fraction=0.1)
    values = _factors(cfg)
    assert values[19] == pytest.approx(1.0)  # end of warm-up: the peak
    assert values[20] == pytest.approx(1.0)  # t=0
    assert values[60] == pytest.approx(0.55)  # t=0.5: halfway between 1 and 0.1
    assert values[TOTAL] == pytest.approx(0.1)  # t=1: min_lr_fraction
    assert _non_decreasing(values[:20]) and _non_increasing(values[20:])
    assert lr_factor(TOTAL, total_steps=TOTAL, cfg=ScheduleConfig(name="cosine")) == 0.0


def test_onecycle_rises_to_the_peak_then_anneals():
    cfg = ScheduleConfig(name="onecycle", pct_start=0.3)
    values = _factors(cfg)
    assert values[0] == pytest.approx(1 / 25)  # torch OneCycleLR's div_factor=25
    assert values[30] == pytest.approx(1.0) and max(values) == values[30]
    assert values[TOTAL] == pytest.approx(1 / 25 / 1e4)  # floored, never exactly 0
    assert min(values) > 0
    assert _non_decreasing(values[:31]) and _non_increasing(values[30:])


def test_onecycle_respects_a_higher_min_and_edge_pct_start():
    values = _factors(ScheduleConfig(name="onecycle", min_lr_fraction=0.2))
    assert values[0] == pytest.approx(0.2) and values[TOTAL] == pytest.approx(0.2)
    assert _factors(ScheduleConfig(name="onecycle", pct_start=0.0))[0] == pytest.approx(1.0)
    rising = _factors(ScheduleConfig(name="onecycle", pct_start=1.0))
    assert _non_decreasing(rising) and rising[TOTAL] == 1.0


def test_onecycle_starts_and_ends_where_torch_does():
    # torch's OneCycleLR (cos) peaks at step pct*total - 1 and ends at step total - 1; ours
    # peaks at pct*total and ends at total (min reached after the last step), so only the
    # start, peak and end values are compared.
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    torch_sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1.0, total_steps=101,
                                                      pct_start=0.3, cycle_momentum=False)
    theirs = []
    for _ in range(101):
        theirs.append(opt.param_groups[0]["lr"])
        opt.step()
        torch_sched.step()
    ours = _factors(ScheduleConfig(name="onecycle", pct_start=0.3))
    assert ours[0] == pytest.approx(theirs[0]) and ours[-1] == pytest.approx(theirs[-1])
    assert max(ours) == pytest.approx(1.0) and max(theirs) == pytest.approx(1.0, abs=1e-3)


def test_cyclic_is_a_periodic_triangle_from_the_bottom():
    cfg = ScheduleConfig(name="cyclic", cycle_steps=20, min_lr_fraction=0.2)
    values = _factors(cfg)
    assert values[0] == pytest.approx(0.2)  # starts at the bottom
    assert values[10] == pytest.approx(1.0)  # half a period: the top
    assert values[5] == pytest.approx(0.6)  # linear in between
    assert values[20] == pytest.approx(0.2)
    assert values[:81] == pytest.approx(values[20:])  # period 20
    assert _non_decreasing(values[:11]) and _non_increasing(values[10:21])


def test_step_decays_by_gamma_every_step_size():
    cfg = ScheduleConfig(name="step", step_size=30, gamma=0.5)
    values = _factors(cfg)
    assert values[:30] == [1.0] * 30
    assert values[30] == 0.5 and values[59] == 0.5 and values[60] == 0.25 and values[99] == 0.125
    assert _non_increasing(values)
    warm = ScheduleConfig(name="step", step_size=30, gamma=0.5, warmup_steps=10)
    assert lr_factor(39, total_steps=TOTAL, cfg=warm) == 1.0  # counted after warm-up
    assert lr_factor(40, total_steps=TOTAL, cfg=warm) == 0.5


def test_warmup_may_fill_the_whole_run():
    cfg = ScheduleConfig(name="cosine", warmup_steps=10)
    assert lr_factor(9, total_steps=10, cfg=cfg) == 1.0
    assert lr_factor(10, total_steps=10, cfg=cfg) == 0.0  # after the last step: cosine's end


def test_is_pure_so_resuming_gives_the_same_values():
    cfg = ScheduleConfig(name="cosine", warmup_steps=5)
    first = [lr_factor(s, total_steps=50, cfg=cfg) for s in range(50)]
    assert [lr_factor(s, total_steps=50, cfg=cfg) for s in range(20, 50)] == first[20:]


def _optimizer(lr: float = 0.1) -> torch.optim.Optimizer:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=lr)


@pytest.mark.parametrize("name", NAMES)
def test_scheduler_drives_lr_as_peak_times_factor(name):
    cfg = ScheduleConfig(name=name, warmup_steps=5, min_lr_fraction=0.1, cycle_steps=8,
                         step_size=7, gamma=0.5)
    opt = _optimizer(0.1)
    sched = build_scheduler(opt, cfg, total_steps=30)
    for step in range(35):  # stepped once per optimizer step, past the end too
        assert opt.param_groups[0]["lr"] == pytest.approx(
            0.1 * lr_factor(step, total_steps=30, cfg=cfg), abs=1e-15)
        opt.step()
        sched.step()


def test_state_dict_round_trip_resumes_at_the_same_lr():
    cfg = ScheduleConfig(name="cosine", warmup_steps=3)
    opt = _optimizer()
    sched = build_scheduler(opt, cfg, total_steps=20)
    for _ in range(7):
        opt.step()
        sched.step()
    buffer = io.BytesIO()
    torch.save({"opt": opt.state_dict(), "sched": sched.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)  # plain data only: no pickled function

    resumed_opt = _optimizer()  # the documented order: build both, then load both
    resumed = build_scheduler(resumed_opt, cfg, total_steps=20)
    resumed_opt.load_state_dict(saved["opt"])
    resumed.load_state_dict(saved["sched"])
    assert resumed.last_epoch == 7
    for _ in range(10):
        assert resumed_opt.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
        for o, s in ((opt, sched), (resumed_opt, resumed)):
            o.step()
            s.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1 * lr_factor(17, total_steps=20, cfg=cfg))


def test_invalid_total_steps_and_warmup_raise_with_the_fix():
    with pytest.raises(ConfigError, match=r"total_steps=0 is invalid: must be an integer >= 1"):
        build_scheduler(_optimizer(), ScheduleConfig(), total_steps=0)
    with pytest.raises(ConfigError) as err:
        build_scheduler(_optimizer(), ScheduleConfig(warmup_steps=500), total_steps=469)
    assert str(err.value) == ("warmup_steps=500 exceeds the run's 469 optimizer steps: "
                              "lower warmup_steps or train longer.")
    with pytest.raises(ConfigError, match="total_steps=1.5 is invalid"):
        lr_factor(0, total_steps=1.5, cfg=ScheduleConfig())
    with pytest.raises(ConfigError, match=r"step=-1 is invalid"):
        lr_factor(-1, total_steps=10, cfg=ScheduleConfig())


def test_every_problem_is_reported_together():
    cfg = ScheduleConfig(name="cyclic", warmup_steps=5, gamma=2.0)
    with pytest.raises(ConfigError) as err:
        build_scheduler(_optimizer(), cfg, total_steps=3)
    problems = err.value.problems
    assert len(problems) == 3
    assert any("gamma=2.0 is invalid" in p for p in problems)
    assert any("Set min_lr_fraction > 0" in p for p in problems)  # cyclic warm-up to lr 0


def test_cosine_formula():
    cfg = ScheduleConfig(name="cosine", min_lr_fraction=0.25)
    for step in (0, 13, 50, 77, 100):
        t = step / TOTAL
        expected = 0.25 + 0.75 * 0.5 * (1 + math.cos(math.pi * t))
        assert lr_factor(step, total_steps=TOTAL, cfg=cfg) == pytest.approx(expected)


@pytest.mark.parametrize("name", ["constant", "cosine", "onecycle", "cyclic", "step"])
def test_the_lean_step_sets_lambdalr_s_values(name):
    """FactorLR.step() skips LRScheduler's per-call machinery: the same lr, step by step."""
    cfg = ScheduleConfig(name=name, warmup_steps=3, min_lr_fraction=0.1, cycle_steps=8,
                         step_size=5, gamma=0.5)
    lrs = []
    for cls in (torch.optim.lr_scheduler.LambdaLR, None):
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.3)
        if cls is None:
            sched = build_scheduler(opt, cfg, total_steps=40)
        else:
            sched = cls(opt, lr_lambda=functools.partial(schedule._factor, total_steps=40,
                                                         cfg=cfg))
        seen = []
        for _ in range(45):
            opt.step()
            sched.step()
            seen.append((opt.param_groups[0]["lr"], sched.get_last_lr()[0], sched.last_epoch))
        lrs.append(seen)
    assert lrs[0] == lrs[1]
