import dataclasses
import json

import pytest
import torch

import looptune
from looptune.bench import workloads
from looptune.bench.results import SCHEMA_VERSION
from looptune.errors import ConfigError


@pytest.fixture
def tiny_workload(monkeypatch, make_image_data):
    """The reference workload on 256 synthetic samples, registered as 'tiny'."""
    data = (make_image_data(256, seed=1), make_image_data(128, seed=2))
    spec = dataclasses.replace(workloads.WORKLOADS["mnist-mlp"], name="tiny",
                               load=lambda data_dir=None: data)
    monkeypatch.setitem(workloads.WORKLOADS, "tiny", spec)
    return spec


def test_bench_runs_each_recipe_and_writes_json(tiny_workload, tmp_path):
    res = looptune.bench(workload="tiny", recipes=["tensorized", "device"], epochs=2, device="cpu")
    assert [r.recipe for r in res.runs] == ["tensorized", "device"]
    assert res.speedups()[0] == 1.0
    assert all(r.test_accuracy is not None and 0 <= r.test_accuracy <= 1 for r in res.runs)
    out = tmp_path / "r.json"
    res.write_json(out)
    data = json.loads(out.read_text())
    assert data["schema_version"] == SCHEMA_VERSION and data["epochs"] == 2
    assert data["runs"][1]["speedup"] == pytest.approx(res.runs[0].wall_s / res.runs[1].wall_s)
    assert not [p for p in tmp_path.iterdir() if p.name != "r.json"]  # no temp files left
    again = looptune.BenchResults.read_json(out)
    assert again.runs == res.runs and again.provenance == res.provenance


def test_reading_results_of_another_schema_version_names_both(tmp_path):
    out = tmp_path / "old.json"
    out.write_text(json.dumps({"schema_version": 99, "runs": []}))
    with pytest.raises(looptune.DataError, match="schema_version=99 .* reads version 1"):
        looptune.BenchResults.read_json(out)


def test_bench_refuses_bad_arguments_before_loading_data(tiny_workload, monkeypatch):
    def no_load(**_):
        raise AssertionError("data loaded despite bad arguments")

    monkeypatch.setitem(workloads.WORKLOADS, "tiny", dataclasses.replace(tiny_workload, load=no_load))
    with pytest.raises(ConfigError) as info:
        looptune.bench(workload="tiny", recipes=["device", "fast-please"], epochs=0, seed=-1)
    assert len(info.value.problems) == 3


def test_cuda_request_without_cuda_is_refused_with_the_fix(tiny_workload):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the refusal cannot be observed")
    with pytest.raises(ConfigError, match="--device cpu"):
        looptune.bench(workload="tiny", recipes=["device"], epochs=1, device="cuda")


def test_recipe_values_are_accepted(tiny_workload):
    custom = dataclasses.replace(looptune.RECIPES["device"], name="device-b128",
                                 loader=looptune.LoaderConfig(strategy="device", decode="tensorized",
                                                              batch_size=128))
    res = looptune.bench(workload="tiny", recipes=[custom], epochs=1, device="cpu")
    assert res.runs[0].batches_per_epoch == 2 and res.runs[0].recipe == "device-b128"


def test_normalize_once_on_augmented_data_is_refused_before_any_recipe_trains(
        monkeypatch, make_image_data):
    from looptune.bench import runner
    from looptune.data.augment import RandomAffine
    from looptune.data.loaders import ImageData
    from looptune.recipe import LoaderConfig, Recipe

    base = make_image_data(64, seed=1)
    augmented = ImageData(images=base.images, labels=base.labels, mean=base.mean, std=base.std, augment=RandomAffine())
    spec = dataclasses.replace(workloads.WORKLOADS["mnist-mlp"], name="tiny-aug",
                               load=lambda data_dir=None: (augmented, make_image_data(32)))
    monkeypatch.setitem(workloads.WORKLOADS, "tiny-aug", spec)
    trained = []

    def train(*_, recipe, **__):  # where bench looks the name up (runner imported it by name)
        trained.append(recipe.name)
        raise AssertionError(f"recipe {recipe.name!r} trained before the refusal")

    monkeypatch.setattr(runner, "train", train)
    once = Recipe(name="once", loader=LoaderConfig(strategy="device", decode="tensorized",
                                                   normalize="once"))
    with pytest.raises(ConfigError, match="recipe 'once': loader.normalize='once' with "
                                          "workload tiny-aug's augmented images"):
        looptune.bench(workload="tiny-aug", recipes=["device", once], epochs=1, device="cpu")
    assert trained == []  # refused before the first recipe ran



def _run_result(recipe, wall_s):
    from looptune.measure.results import RunResult

    return RunResult(recipe=recipe, config={}, decisions=[], device="cpu", epochs=1,
                     batches_per_epoch=4, samples_per_epoch=256, setup_s=0.0, wall_s=wall_s,
                     epoch_s=[wall_s], samples_per_s=256 / wall_s, epoch_loss=[1.0],
                     first_loss=2.3, data_wait_s=0.0, data_wait_fraction=0.0,
                     peak_mem_bytes=None, peak_mem_kind="none")


@pytest.mark.parametrize("walls, kept", [
    ({"tensorized": [3.0, 1.0, 2.0], "device": [5.0, 4.0, 6.0]},
     {"tensorized": 2.0, "device": 5.0}),  # the median of three
    ({"tensorized": [2.0, 1.0], "device": [4.0, 5.0]},
     {"tensorized": 1.0, "device": 4.0}),  # of two: the lower one
    ({"tensorized": [7.0], "device": [8.0]}, {"tensorized": 7.0, "device": 8.0}),
])
def test_repeats_are_interleaved_and_the_median_run_is_kept(tiny_workload, monkeypatch, walls,
                                                            kept):
    """bench(repeats=N) picks each recipe's run by its training time: planted here (run_recipe
    faked), so the test knows which run is the median."""
    from looptune.bench import runner

    order, pending = [], {name: list(w) for name, w in walls.items()}

    def run_recipe(workload, recipe, **_):
        order.append(recipe.name)
        return _run_result(recipe.name, pending[recipe.name].pop(0))

    monkeypatch.setattr(runner, "run_recipe", run_recipe)
    monkeypatch.setattr(runner, "_warm_up", lambda *a, **k: None)
    repeats = len(walls["device"])
    res = looptune.bench(workload="tiny", recipes=["tensorized", "device"], epochs=1,
                         device="cpu", repeats=repeats)
    assert order == ["tensorized", "device"] * repeats  # interleaved: drift hits both alike
    assert {r.recipe: r.wall_s for r in res.runs} == kept
    for run in res.runs:
        if repeats == 1:
            assert "repeat_wall_s" not in run.extra
        else:
            assert run.extra["repeat_wall_s"] == walls[run.recipe]  # every repeat, in run order
    assert res.speedups()[1] == pytest.approx(kept["tensorized"] / kept["device"])
