"""The reference's per-sample pipeline (data.per_sample) with torchvision against looptune's
equivalent: the seed recipes must give the same samples either way (marker ``vision``: the
``.ci/vision`` job runs it where torchvision imports)."""

from __future__ import annotations

import pytest
import torch

from looptune.data import augment, per_sample
from looptune.data.augment import RandomAffine
from looptune.data.loaders import ImageData
from looptune.data.mnist import load


@pytest.mark.vision
@pytest.mark.integration
@pytest.mark.parametrize("aug", [None, RandomAffine()], ids=["plain", "affine"])
def test_seed_pipeline_is_the_same_with_torchvision_and_without(mnist_dir, torchvision_transforms,
                                                                monkeypatch, aug):
    images, labels = load("train", data_dir=mnist_dir)
    data = ImageData(images=images[:64], labels=labels[:64], mean=0.1307, std=0.3081, augment=aug)
    with_tv = per_sample.PerSampleImages(data)
    assert per_sample.transform_kind()[0] == "torchvision"
    monkeypatch.setattr(per_sample, "_torchvision_transforms", lambda: (None, "forced off"))
    monkeypatch.setattr(augment, "_torchvision_transforms", lambda: None)
    without = per_sample.PerSampleImages(data)
    assert per_sample.transform_kind()[0] == "equivalent"
    assert type(with_tv.transform) is not type(without.transform)
    for i in range(len(data.labels)):
        torch.manual_seed(i)
        x_tv, y_tv = with_tv[i]
        torch.manual_seed(i)
        x, y = without[i]
        assert y == y_tv and torch.equal(x, x_tv), f"sample {i} differs"
