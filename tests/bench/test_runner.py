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
    from looptune.data.augment import RandomAffine
    from looptune.data.loaders import ImageData
    from looptune.engine import loop
    from looptune.recipe import LoaderConfig, Recipe

    base = make_image_data(64, seed=1)
    augmented = ImageData(base.images, base.labels, base.mean, base.std, augment=RandomAffine())
    spec = dataclasses.replace(workloads.WORKLOADS["mnist-mlp"], name="tiny-aug",
                               load=lambda data_dir=None: (augmented, make_image_data(32)))
    monkeypatch.setitem(workloads.WORKLOADS, "tiny-aug", spec)
    trained = []
    monkeypatch.setattr(loop, "train", lambda *a, **k: trained.append(1))
    once = Recipe(name="once", loader=LoaderConfig(strategy="device", decode="tensorized",
                                                   normalize="once"))
    with pytest.raises(ConfigError, match="recipe 'once': loader.normalize='once' with "
                                          "workload tiny-aug's augmented images"):
        looptune.bench(workload="tiny-aug", recipes=["device", once], epochs=1, device="cpu")
    assert trained == []  # refused before the first recipe ran
