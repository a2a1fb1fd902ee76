"""data/store.py: loader.store='autocast' keeps a dataset normalized once in the autocast dtype
only where the model computes the same numbers that way."""

import dataclasses

import pytest
import torch

import looptune
from looptune.data.loaders import make
from looptune.data.store import store_in_autocast_dtype
from looptune.recipe import LoaderConfig, Recipe, StepConfig

CPU = torch.device("cpu")
ONCE = LoaderConfig(strategy="device", decode="tensorized", batch_size=32, normalize="once")


class _Scaled(torch.nn.Module):
    """Scales its input first: an op autocast keeps in the input's dtype."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(784, 10)

    def forward(self, x):
        return self.fc((x * 1.37).flatten(1))


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 16), torch.nn.ReLU(),
                               torch.nn.Dropout(0.5), torch.nn.Linear(16, 10))


def test_a_linear_first_model_gets_its_dataset_in_bf16(make_image_data):
    source = make(ONCE, make_image_data(300), device=CPU, seed=0)
    before = source.images.clone()
    model = _mlp().train()
    d = store_in_autocast_dtype(source, model, "bf16", CPU)
    assert d.name == "loader.store" and d.value == "bfloat16", d.reason
    assert "bit-identical outputs for 256 samples" in d.reason
    assert source.images.dtype == torch.bfloat16
    assert torch.equal(source.images, before.to(torch.bfloat16))
    assert model.training  # the check ran in eval mode and left the mode as it was
    x, _ = next(iter(source.epoch(0)))
    assert x.dtype == torch.bfloat16


def test_a_model_that_scales_its_input_first_keeps_float32(make_image_data):
    source = make(ONCE, make_image_data(64), device=CPU, seed=0)
    d = store_in_autocast_dtype(source, _Scaled(), "bf16", CPU)
    assert d.value == "float32" and "gave different outputs for 64 samples" in d.reason
    assert source.images.dtype == torch.float32
    fp32 = store_in_autocast_dtype(source, _mlp(), "fp32", CPU)
    assert fp32.value == "float32" and "needs precision bf16/fp16 (got 'fp32')" in fp32.reason
    per_batch = make(dataclasses.replace(ONCE, normalize="batch"), make_image_data(64),
                     device=CPU, seed=0)
    assert store_in_autocast_dtype(per_batch, _mlp(), "bf16", CPU).value == "float32"


def test_store_autocast_needs_normalize_once_and_an_autocast_precision():
    problems = dataclasses.replace(ONCE, normalize="batch", store="autocast").problems()
    assert any("store='autocast' needs normalize='once'" in p for p in problems)
    assert any("allowed values" in p for p in dataclasses.replace(ONCE, store="half").problems())
    fp32 = Recipe(name="r", loader=dataclasses.replace(ONCE, store="autocast"))
    (problem,) = fp32.problems()
    assert "loader.store='autocast' needs step.precision bf16 or fp16 (got 'fp32')" in problem
    assert "Set step.precision=bf16, or loader.store=float32" in problem
    assert not dataclasses.replace(fp32, step=StepConfig(precision="bf16")).problems()


@pytest.mark.integration
def test_training_is_bit_identical_with_the_dataset_stored_in_bf16():
    base = Recipe(name="f32", loader=LoaderConfig(strategy="device", decode="tensorized",
                                                 batch_size=512, normalize="once"),
                  step=StepConfig(precision="bf16"), loss_sync="epoch")
    stored = dataclasses.replace(base, name="bf16-stored",
                                 loader=dataclasses.replace(base.loader, store="autocast"))
    a, b = looptune.bench(recipes=[base, stored], epochs=1, device="cpu").runs
    assert a.epoch_loss == b.epoch_loss and a.test_accuracy == b.test_accuracy
    (store,) = [d for d in b.decisions if d["name"] == "loader.store"]
    assert store["value"] == "bfloat16"
