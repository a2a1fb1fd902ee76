import dataclasses

import pytest
import torch

from looptune.bench.workloads import SimpleFeedForwardNN
from looptune.data.loaders import make
from looptune.engine.loop import RunOptions, train
from looptune.errors import MeasurementError
from looptune.presets import RECIPES
from looptune.recipe import LoaderConfig, Recipe
from looptune.resolve import resolve

CPU = torch.device("cpu")


def _run(recipe: Recipe, data, *, epochs=1, seed=0, progress=None):
    recipe, decisions = resolve(recipe, "cpu")
    torch.manual_seed(seed)
    model = SimpleFeedForwardNN()
    source = make(recipe.loader, data, device=CPU, seed=seed)
    result = train(model=model, source=source, recipe=recipe, loss_fn=torch.nn.CrossEntropyLoss(),
                   device=CPU, options=RunOptions(epochs=epochs, seed=seed), decisions=decisions,
                   progress=progress)
    return result, model


def _small(recipe: Recipe) -> Recipe:
    workers = min(recipe.loader.num_workers, 2)
    return dataclasses.replace(recipe, loader=dataclasses.replace(recipe.loader, num_workers=workers))


def test_all_recipes_agree_on_first_loss_and_weights(make_image_data):
    data = make_image_data(256)
    names = ["seed-baseline", "seed-workers", "seed-pinned", "tensorized", "device"]
    results = {name: _run(_small(RECIPES[name]), data) for name in names}
    first = {name: res.first_loss for name, (res, _) in results.items()}
    assert len(set(first.values())) == 1, first  # same seed: bit-identical first step
    ref_model = results["seed-baseline"][1]
    for name, (res, model) in results.items():
        for p, q in zip(model.parameters(), ref_model.parameters()):
            torch.testing.assert_close(p, q, msg=name)  # same batches, same math


def test_result_fields_are_measured_and_consistent(make_image_data):
    data = make_image_data(200)
    res, _ = _run(RECIPES["device"], data, epochs=2)
    assert res.epochs == 2 and len(res.epoch_s) == 2 and len(res.epoch_loss) == 2
    assert res.batches_per_epoch == 4 and res.samples_per_epoch == 200
    assert res.wall_s == pytest.approx(sum(res.epoch_s))
    assert res.samples_per_s == pytest.approx(400 / res.wall_s)
    assert 0 <= res.data_wait_fraction <= 1
    assert res.peak_mem_bytes is None or res.peak_mem_bytes > 0
    assert res.config["loader"]["strategy"] == "device"
    assert res.epoch_loss[1] < res.epoch_loss[0] + 0.5


def test_step_and_epoch_loss_reads_give_the_same_epoch_loss(make_image_data):
    data = make_image_data(192)
    base = Recipe(name="a", loader=LoaderConfig(decode="tensorized"), loss_sync="step")
    res_step, _ = _run(base, data)
    res_epoch, _ = _run(dataclasses.replace(base, loss_sync="epoch"), data)
    assert res_step.epoch_loss[0] == pytest.approx(res_epoch.epoch_loss[0], rel=1e-5)


def test_decisions_are_recorded(make_image_data):
    res, _ = _run(_small(RECIPES["seed-pinned"]), make_image_data(64))
    assert any(d["name"] == "pin_memory" and d["value"] is False for d in res.decisions)
    assert res.config["loader"]["pin_memory"] is False


def test_progress_sees_every_step(make_image_data):
    seen = {"steps": 0, "epochs": []}

    class Sink:
        def advance(self, steps):
            seen["steps"] += steps

        def epoch_done(self, epoch, loss, seconds):
            seen["epochs"].append(epoch)

    _run(RECIPES["device"], make_image_data(640), epochs=2, progress=Sink())
    assert seen == {"steps": 20, "epochs": [0, 1]}


def test_an_empty_epoch_is_a_clear_error(make_image_data):
    recipe = Recipe(name="x", loader=LoaderConfig(strategy="device", decode="tensorized",
                                                  batch_size=64, drop_last=True))
    with pytest.raises(MeasurementError, match="no batches"):
        _run(recipe, make_image_data(10))
