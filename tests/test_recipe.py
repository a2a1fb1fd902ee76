import dataclasses

import pytest

from looptune.errors import ConfigError
from looptune.presets import RECIPES, get_recipe, parse_recipes
from looptune.recipe import LoaderConfig, OptimConfig, Recipe, StepConfig
from looptune.resolve import resolve


def test_builtin_recipes_are_valid_and_named_consistently():
    assert list(RECIPES) == ["seed-baseline", "seed-workers", "seed-pinned", "tensorized", "device", "fast", "tta"]
    for name in RECIPES:
        for device_type in ("cpu", "cuda"):
            recipe = get_recipe(name, device_type)
            assert recipe.name == name
            assert recipe.validate() is recipe


def test_seed_recipes_match_the_reference_configurations():
    base, workers, pinned = (RECIPES[n].loader for n in ("seed-baseline", "seed-workers", "seed-pinned"))
    assert (base.num_workers, base.pin_memory, base.non_blocking) == (0, False, False)
    assert (workers.num_workers, workers.pin_memory, workers.non_blocking) == (8, False, False)
    assert (pinned.num_workers, pinned.pin_memory, pinned.non_blocking) == (8, True, True)
    for name in ("seed-baseline", "seed-workers", "seed-pinned"):
        r = RECIPES[name]
        assert (r.loader.decode, r.loader.batch_size, r.loss_sync) == ("per_sample", 64, "step")
        assert (r.optim.name, r.optim.lr) == ("adam", 1e-3)


def test_validation_collects_every_problem_at_once():
    bad = Recipe(name="bad", loss_sync="never",
                 loader=LoaderConfig(batch_size=0, num_workers=-1, strategy="gpu"),
                 optim=OptimConfig(lr=-1.0))
    with pytest.raises(ConfigError) as info:
        bad.validate()
    text = str(info.value)
    assert len(info.value.problems) == 5
    for needle in ("batch_size=0", "num_workers=-1", "strategy='gpu'", "lr=-1.0", "loss_sync='never'",
                   "Use 0 to load in the main process", "'dataloader', 'prefetch', 'device'"):
        assert needle in text


def test_worker_only_settings_without_workers_are_refused():
    cfg = LoaderConfig(num_workers=0, persistent_workers=True)
    assert any("needs DataLoader workers" in p for p in cfg.problems())


def test_device_strategy_requires_tensorized_decode():
    cfg = LoaderConfig(strategy="device", decode="per_sample")
    assert any("decode='tensorized'" in p for p in cfg.problems())


def test_unknown_recipe_lists_valid_names_and_suggests_closest():
    with pytest.raises(ConfigError) as info:
        get_recipe("seed-pined")
    text = str(info.value)
    assert "'seed-pined'" in text and "Did you mean 'seed-pinned'?" in text
    assert all(name in text for name in RECIPES)


def test_presets_record_a_reason_for_each_choice():
    for name in ("fast", "tta"):
        for device_type in ("cpu", "cuda"):
            recipe = get_recipe(name, device_type)
            assert recipe.reasons and all(d.reason for d in recipe.reasons)
    assert get_recipe("fast", "cuda").step.cuda_graphs is True
    assert get_recipe("fast", "cpu").step.cuda_graphs is False


def test_parse_recipes_reports_all_unknown_and_duplicates():
    with pytest.raises(ConfigError) as info:
        parse_recipes("device,nope,device,tensorised")
    assert len(info.value.problems) == 3
    assert "listed twice" in str(info.value) and "'tensorized'" in str(info.value)
    assert [r.name for r in parse_recipes(" device , tensorized")] == ["device", "tensorized"]


def test_resolve_drops_pin_memory_on_cpu_with_a_reason():
    resolved, decisions = resolve(RECIPES["seed-pinned"], "cpu")
    assert resolved.loader.pin_memory is False
    pin = [d for d in decisions if d.name == "pin_memory"]
    assert pin and "cpu" in pin[0].reason
    kept, none = resolve(RECIPES["seed-pinned"], "cuda")
    assert kept.loader.pin_memory is True and not [d for d in none if d.name == "pin_memory"]


def test_resolve_warns_when_workers_outnumber_cores(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    resolved, decisions = resolve(RECIPES["seed-workers"], "cpu")
    assert resolved.loader.num_workers == 8  # faithful: kept, but explained
    assert any(d.name == "num_workers" and "compete" in d.reason for d in decisions)


def test_recipe_is_frozen_and_serializable():
    r = RECIPES["device"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.name = "x"  # type: ignore[misc]
    d = r.to_dict()
    assert d["loader"]["strategy"] == "device" and d["optim"]["lr"] == 1e-3


def test_a_bad_choice_names_the_allowed_values_and_the_fix():
    close = StepConfig(backward="mlpcpp").problems()
    assert any("backward='mlpcpp' is invalid: allowed values are 'autograd', 'mlp', 'mlp-cpp'; "
               "did you mean backward='mlp-cpp'?" in p for p in close)
    far = StepConfig(precision="int8").problems()
    assert any("precision='int8' is invalid" in p and "set precision to one of them" in p
               for p in far)
