import pytest
import torch

from looptune.data import loaders
from looptune.data.per_sample import _ToTensorNormalize
from looptune.data.loaders import (ImageData, PerSampleImages, epoch_permutation,
                                   make, normalize_batch)
from looptune.recipe import LoaderConfig

CPU = torch.device("cpu")


def test_epoch_permutation_is_a_deterministic_permutation_per_epoch():
    a = epoch_permutation(1000, seed=3, epoch=0)
    assert torch.equal(a, epoch_permutation(1000, seed=3, epoch=0))
    assert torch.equal(torch.sort(a).values, torch.arange(1000))
    assert not torch.equal(a, epoch_permutation(1000, seed=3, epoch=1))
    assert not torch.equal(a, epoch_permutation(1000, seed=4, epoch=0))


def test_equivalent_transform_matches_the_formula_and_batched_normalize(make_image_data):
    from PIL import Image

    data = make_image_data(8)
    img = data.images[0]
    per_sample = _ToTensorNormalize(data.mean, data.std)(Image.fromarray(img.numpy()))
    assert per_sample.shape == (1, 28, 28) and per_sample.dtype == torch.float32
    expected = (img.float() / 255 - data.mean) / data.std
    torch.testing.assert_close(per_sample[0], expected)
    # bit-identical to the batched path: same float ops in the same order
    assert torch.equal(per_sample[0], normalize_batch(img[None], data.mean, data.std)[0])


@pytest.mark.vision
def test_torchvision_transform_agrees_when_installed(make_image_data, torchvision_transforms):
    transforms = torchvision_transforms
    from PIL import Image

    data = make_image_data(4)
    ref = transforms.Compose([transforms.ToTensor(), transforms.Normalize((data.mean,), (data.std,))])
    ours = _ToTensorNormalize(data.mean, data.std)
    for img in data.images:
        pil = Image.fromarray(img.numpy())
        assert torch.equal(ref(pil), ours(pil))


def _first_epoch(cfg: LoaderConfig, data: ImageData, seed: int = 0):
    source = make(cfg, data, device=CPU, seed=seed)
    return [source.to_device(x, y) for x, y in source.epoch(0)]


CONFIGS = {
    "per_sample": LoaderConfig(batch_size=32),
    "tensorized": LoaderConfig(decode="tensorized", batch_size=32),
    "device": LoaderConfig(strategy="device", decode="tensorized", batch_size=32),
    "device-normalized-once": LoaderConfig(strategy="device", decode="tensorized", batch_size=32,
                                           normalize="once"),
}


def test_every_strategy_yields_identical_batches_for_the_same_seed(make_image_data):
    data = make_image_data(100)
    epochs = {name: _first_epoch(cfg, data) for name, cfg in CONFIGS.items()}
    reference = epochs["per_sample"]
    assert [len(y) for _, y in reference] == [32, 32, 32, 4]  # last partial batch kept
    for name, batches in epochs.items():
        assert len(batches) == len(reference), name
        for (x, y), (rx, ry) in zip(batches, reference):
            assert x.dtype == torch.float32 and x.shape[1:] in {(28, 28), (1, 28, 28)}
            assert torch.equal(x.reshape(len(x), -1), rx.reshape(len(rx), -1)), name
            assert torch.equal(y, ry), name


def test_normalized_once_gathers_ready_rows_per_step_and_resumes_mid_epoch(make_image_data):
    data = make_image_data(100)
    cfg = CONFIGS["device-normalized-once"]
    source = make(cfg, data, device=CPU, seed=3)
    assert source.images.dtype == torch.float32  # normalized at setup, not per batch
    batches = list(source.epoch(1))
    x, y = batches[0]
    assert source.to_device(x, y)[0] is x  # nothing left to do per step
    assert [len(b) for _, b in batches] == [32, 32, 32, 4]
    rest = list(source.epoch(1, start=2))
    assert all(torch.equal(a[0], b[0]) for a, b in zip(batches[2:], rest, strict=True))
    dropped = make(LoaderConfig(**{**cfg.__dict__, "drop_last": True}), data, device=CPU, seed=3)
    assert [len(b) for _, b in dropped.epoch(0)] == [32, 32, 32]


def test_normalize_once_is_refused_with_augmentation_and_off_the_device(make_image_data):
    from looptune.data.augment import RandomAffine
    from looptune.errors import ConfigError

    data = make_image_data(16)
    augmented = ImageData(images=data.images, labels=data.labels, mean=data.mean, std=data.std,
                          augment=RandomAffine(degrees=10))
    with pytest.raises(ConfigError, match="normalize='once' with an augmented dataset"):
        make(CONFIGS["device-normalized-once"], augmented, device=CPU, seed=0)
    problems = LoaderConfig(decode="tensorized", normalize="once").problems()
    assert any("normalize='once' needs strategy='device'" in p for p in problems)
    assert any("allowed values" in p for p in LoaderConfig(normalize="never").problems())


def test_batches_follow_epoch_permutation(make_image_data):
    data = make_image_data(50)
    cfg = LoaderConfig(strategy="device", decode="tensorized", batch_size=50)
    (x, y), = _first_epoch(cfg, data, seed=7)
    perm = epoch_permutation(50, seed=7, epoch=0)
    assert torch.equal(y, data.labels[perm])


def test_drop_last_drops_the_partial_batch(make_image_data):
    data = make_image_data(100)
    for cfg in CONFIGS.values():
        cfg = LoaderConfig(**{**cfg.__dict__, "drop_last": True})
        source = make(cfg, data, device=CPU, seed=0)
        assert len(source) == 3 and source.samples_per_epoch == 96
        assert [len(y) for _, y in source.epoch(0)] == [32, 32, 32]


@pytest.mark.parametrize("decode", ["per_sample", "tensorized"])
def test_worker_processes_yield_the_same_batches(make_image_data, decode):
    data = make_image_data(96)
    single = _first_epoch(LoaderConfig(decode=decode, batch_size=32), data)
    multi = _first_epoch(LoaderConfig(decode=decode, batch_size=32, num_workers=2,
                                      persistent_workers=True, prefetch_factor=3), data)
    for (x, y), (mx, my) in zip(single, multi, strict=True):
        assert torch.equal(x, mx) and torch.equal(y, my)


def test_each_epoch_reshuffles(make_image_data):
    data = make_image_data(64)
    source = make(CONFIGS["tensorized"], data, device=CPU, seed=0)
    first = torch.cat([y for _, y in source.epoch(0)])
    second = torch.cat([y for _, y in source.epoch(1)])
    assert torch.equal(first.sort().values, second.sort().values)
    assert not torch.equal(first, second)


def test_per_sample_dataset_returns_reference_items(make_image_data):
    data = make_image_data(3)
    ds = PerSampleImages(data)
    x, target = ds[1]
    assert x.shape == (1, 28, 28) and isinstance(target, int) and target == int(data.labels[1])


def test_num_batches():
    assert loaders.num_batches(60000, 64, False) == 938
    assert loaders.num_batches(60000, 64, True) == 937
