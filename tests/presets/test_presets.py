"""The recipe registries of every workload: valid on both device types, every preset choice with
its reason, and the time-to-target presets differing from ``fast`` only where they say."""

import dataclasses

import pytest

from looptune.presets import REGISTRIES, get_recipe, recipe_names
from looptune.presets.preset import Preset
from looptune.resolve import resolve


@pytest.mark.parametrize("workload", sorted(REGISTRIES))
@pytest.mark.parametrize("device_type", ["cpu", "cuda"])
def test_every_recipe_is_valid_and_every_preset_choice_has_a_reason(workload, device_type):
    registry = REGISTRIES[workload][0]
    for name in recipe_names(workload):
        recipe = get_recipe(name, device_type, workload)
        recipe.validate()
        if device_type == "cpu":
            resolve(recipe, "cpu")  # nothing CPU-impossible (e.g. CUDA graphs) in a CPU preset
        if isinstance(registry[name], Preset):
            assert recipe.reasons, f"{workload}/{name} has no reasons"
            assert all(d.reason.strip() for d in recipe.reasons), f"{workload}/{name}"


def _diff(a, b) -> dict:
    out = {}
    for part in ("loader", "step", "optim", "schedule"):
        x, y = dataclasses.asdict(getattr(a, part)), dataclasses.asdict(getattr(b, part))
        out |= {f"{part}.{k}": y[k] for k in x if x[k] != y[k]}
    return out


@pytest.fixture
def fake_probe(monkeypatch, tmp_path):
    """Fixed probe timings, in an empty probe cache: ``fake_probe(seconds)`` makes the probe
    measure ``seconds(candidates, batch_size)``, a dict of seconds per candidate name."""
    from looptune.presets import probe as probe_mod

    monkeypatch.setenv("LOOPTUNE_PROBE_CACHE", str(tmp_path / "probes.json"))
    monkeypatch.delenv("LOOPTUNE_PROBE", raising=False)

    def install(seconds):
        monkeypatch.setattr(probe_mod, "_measure", lambda candidates, build_model, loss_fn,
                            make_batch, batch_size, *a: (seconds(candidates, batch_size), []))
    return install


def test_cnn_tta_is_fast_with_batch_128_and_a_one_cycle_adamw(fake_probe):
    # fast probes its layout and dtype at batch 256, tta at 128: two measurements that may
    # legitimately disagree (a CI run: fp32 at one, bf16 at the other), so the timings are fixed
    batches = []
    fake_probe(lambda candidates, batch: batches.append(batch) or {
        c.name: 1.0 + i for i, c in enumerate(candidates)})
    fast, tta = get_recipe("fast", "cpu", "mnist-cnn"), get_recipe("tta", "cpu", "mnist-cnn")
    assert sorted(set(batches)) == [128, 256]  # each probed at its own batch
    diff = _diff(fast, tta)
    assert diff.pop("loader.batch_size") == 128
    assert diff.pop("optim.name") == "adamw" and diff.pop("optim.lr") == 1.6e-2
    assert diff.pop("optim.weight_decay") == 1e-4
    assert diff.pop("schedule.name") == "onecycle" and tta.schedule.pct_start == 0.25
    assert diff == {}
    named = {d.name for d in tta.reasons}
    assert {"loader.batch_size", "schedule", "epochs"} <= named


def test_lm_tta_is_fast_with_a_warmup_cosine_schedule_at_3e_3():
    fast, tta = get_recipe("fast", "cpu", "char-gpt"), get_recipe("tta", "cpu", "char-gpt")
    assert fast.schedule.name == "constant" and fast.optim.lr == 1e-3  # the baseline's
    assert _diff(fast, tta) == {"optim.lr": 3e-3, "schedule.name": "cosine",
                                "schedule.warmup_steps": 50, "schedule.min_lr_fraction": 0.1}
    (schedule,) = [d for d in tta.reasons if d.name == "schedule"]
    assert "2.092" in schedule.reason


@pytest.mark.parametrize("bf16_s, want", [(0.5, ("bf16", "math")), (0.98, ("fp32", "auto")),
                                          (19.0, ("fp32", "auto"))])
def test_lm_fast_takes_bf16_on_a_cpu_only_where_the_probe_found_it_faster(
        fake_probe, bf16_s, want):
    # bf16 ran the GPT step 2.1x faster on a Zen 4 (avx512_bf16) and 19x slower on a Zen 3
    from looptune.presets import lm

    plain, bf16 = (c.name for c in lm.CPU_CANDIDATES)
    fake_probe(lambda candidates, batch: {plain: 1.0, bf16: bf16_s})
    cpu, cuda = get_recipe("fast", "cpu", "char-gpt"), get_recipe("fast", "cuda", "char-gpt")
    assert (cpu.step.precision, cpu.step.attention) == want
    assert (cuda.step.precision, cuda.step.attention) == ("bf16", "auto")
    assert cpu.step.compile == cuda.step.compile == "default"
    (why,) = [d for d in cpu.reasons if d.name == "step.precision"]
    assert f"{bf16} {bf16_s * 1e6:.0f} us" in why.reason and "probe on this machine" in why.reason
    assert get_recipe("tta", "cpu", "char-gpt").step.precision == want[0]


@pytest.mark.parametrize("seconds, want", [
    ((1.0, 0.75, 0.9, 0.8), (True, "fp32")),    # channels_last 25% faster (a Zen 4 VM)
    ((1.0, 1.33, 0.95, 1.2), (False, "bf16")),  # NHWC 33% slower (a Zen 5 VM); bf16 5% faster
    ((1.0, 0.99, 0.98, 1.5), (False, "fp32")),  # within the probe's 3%: the plain layout kept
])
def test_cnn_fast_takes_the_layout_and_dtype_the_probe_measured_faster(fake_probe, seconds,
                                                                        want):
    from looptune.presets import cnn

    names = [c.name for c in cnn.CPU_CANDIDATES]
    assert "fused fp32 all threads channels_last" in names
    fake_probe(lambda candidates, batch: dict(zip([x.name for x in candidates], seconds)))
    fast, tta = get_recipe("fast", "cpu", "mnist-cnn"), get_recipe("tta", "cpu", "mnist-cnn")
    assert (fast.step.channels_last, fast.step.precision) == want
    assert (tta.step.channels_last, tta.step.precision) == want  # probed again at batch 128
    (why,) = [d for d in fast.reasons if d.name == "step.channels_last/precision"]
    assert "probe on this machine" in why.reason and "batch 256" in why.reason
    cuda = get_recipe("fast", "cuda", "mnist-cnn")
    assert (cuda.step.channels_last, cuda.step.precision) == (False, "fp32")


@pytest.mark.parametrize("nhwc_s, want", [(0.7, True), (1.3, False)])
def test_images_packed_takes_channels_last_only_where_the_probe_found_it_faster(
        fake_probe, nhwc_s, want):
    from looptune.presets import images

    plain, nhwc = (c.name for c in images.CPU_CANDIDATES)
    fake_probe(lambda candidates, batch: {plain: 1.0, nhwc: nhwc_s})
    assert get_recipe("packed", "cpu", "jpeg-folder").step.channels_last is want
    assert get_recipe("packed", "cuda", "jpeg-folder").step.channels_last is False
