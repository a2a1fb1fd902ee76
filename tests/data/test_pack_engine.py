"""Packed datasets through the engine: every strategy reads whole batches (no per-sample Python)
and trains exactly as the same data held as tensors."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import looptune
from looptune.bench.workloads import MNIST_MEAN, MNIST_STD, SimpleFeedForwardNN
from looptune.data.loaders import BatchedData, ImageData
from looptune.data.pack import reader
from looptune.presets import get_recipe


def _train(data, recipe, epochs=2):
    torch.manual_seed(0)
    model = SimpleFeedForwardNN()
    return looptune.train(model, data, recipe=recipe, loss_fn=torch.nn.CrossEntropyLoss(),
                          device="cpu", epochs=epochs, seed=3)


def _recipes():
    tensorized = get_recipe("tensorized")
    workers = dataclasses.replace(tensorized, name="tensorized-w2", loader=dataclasses.replace(
        tensorized.loader, num_workers=2, persistent_workers=True))
    prefetch = dataclasses.replace(tensorized, name="prefetch", loader=dataclasses.replace(
        tensorized.loader, strategy="prefetch"))
    return [tensorized, workers, prefetch, get_recipe("device")]


@pytest.fixture
def packed(make_image_data, tmp_path):
    data = make_image_data(300)
    ds = torch.utils.data.TensorDataset(data.images, data.labels)
    return data, looptune.open_packed(looptune.pack(ds, tmp_path / "p", shard_bytes=100 * 784))


@pytest.mark.parametrize("recipe", _recipes(), ids=lambda r: r.name)
def test_every_strategy_trains_like_tensors_without_per_sample_reads(packed, recipe, monkeypatch):
    data, ds = packed
    assert len(ds.header.shards) == 6  # 3 image shards + 3 label shards: batches cross shards
    expected = _train(data, recipe)

    def per_sample(*args, **kwargs):
        raise AssertionError("a packed dataset was read one sample at a time")

    monkeypatch.setattr(reader.PackedDataset, "_check_index", per_sample)  # ds[int] path only
    got = _train(BatchedData(ds, MNIST_MEAN, MNIST_STD), recipe)
    assert got.epoch_loss == expected.epoch_loss  # same batches, same order, same arithmetic


def test_train_accepts_an_open_packed_dataset_as_is(packed):
    data, ds = packed
    raw = ImageData(images=data.images.float(), labels=data.labels)  # no normalization: inputs used as they are
    expected = _train(raw, get_recipe("tensorized"), epochs=1)
    float_ds = torch.utils.data.TensorDataset(data.images.float(), data.labels)
    back = looptune.open_packed(looptune.pack(float_ds, ds.path.parent / "f"))
    calls = []
    real = back.get_batch
    back.get_batch = lambda idx: (calls.append(len(idx)), real(idx))[1]
    got = _train(back, get_recipe("tensorized"), epochs=1)
    assert got.epoch_loss == expected.epoch_loss
    # one 1-sample read checks the pair up front, then one get_batch call per batch of 64
    assert calls == [1, 64, 64, 64, 64, 44]


@pytest.mark.integration
def test_packed_mnist_trains_exactly_like_tensorized(mnist_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("LOOPTUNE_DATA", str(mnist_dir))
    from looptune.bench.workloads import mnist_train

    train = mnist_train()
    out = looptune.pack(train, tmp_path / "mnist.pack")
    assert looptune.verify_packed(out) == []
    images, labels = train.tensors
    recipe = get_recipe("tensorized")
    expected = _train(ImageData(images=images, labels=labels, mean=MNIST_MEAN, std=MNIST_STD), recipe, epochs=1)
    got = _train(BatchedData(looptune.open_packed(out), MNIST_MEAN, MNIST_STD), recipe, epochs=1)
    assert got.epoch_loss == expected.epoch_loss
    assert expected.epoch_loss[0] < 0.35  # it learned (the reference's first epoch: ~0.27)


def test_per_sample_recipe_on_packed_data_is_normalized_like_the_others(packed):
    data, ds = packed
    expected = _train(data, get_recipe("tensorized"), epochs=1)
    got = _train(BatchedData(ds, MNIST_MEAN, MNIST_STD), get_recipe("seed-baseline"), epochs=1)
    # uint8 samples, normalized on the device (unnormalized pixels would give a loss far off);
    # seed-baseline sums .item() values on the host, tensorized on the device: last-bit rounding
    assert got.epoch_loss == pytest.approx(expected.epoch_loss, rel=1e-6)


def test_a_packed_dataset_that_is_not_input_target_pairs_is_refused_up_front(tmp_path):
    ds = [{"image": torch.zeros(2, 2), "label": i} for i in range(4)]
    back = looptune.open_packed(looptune.pack(ds, tmp_path / "d"))
    with pytest.raises(looptune.ConfigError, match=r"get_batch returned a dict.*dict samples.*two tensors"):
        BatchedData(back)
    with pytest.raises(looptune.ConfigError, match="two tensors"):
        _train(back, get_recipe("device"), epochs=1)
