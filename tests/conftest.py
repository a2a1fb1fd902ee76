"""Shared fixtures. Keep this small: fixtures used by one test module live in that module."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def mnist_dir() -> Path:
    """The folder with the real MNIST files, from env ``LOOPTUNE_DATA``.

    Skips with the reason when it is unset, unless ``LOOPTUNE_REQUIRE_MNIST=1`` (CI sets it),
    where a missing data set must fail the run rather than quietly skip the integration tests.
    """
    value = os.environ.get("LOOPTUNE_DATA")
    if value:
        return Path(value)
    reason = "real MNIST not available: set LOOPTUNE_DATA=DIR holding the four MNIST files"
    if os.environ.get("LOOPTUNE_REQUIRE_MNIST") == "1":
        pytest.fail(f"LOOPTUNE_REQUIRE_MNIST=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def torchvision_transforms():
    """``torchvision.transforms``, for the tests that hold looptune's equivalents to it.

    torchvision imports only beside the torch it was built for (PyPI's fails beside the CI's torch
    2.13.0), so these tests skip in the main CI job and run in ``.ci/vision`` (torch 2.14.1 +
    torchvision 0.29.1), which sets ``LOOPTUNE_REQUIRE_VISION=1``: there a skip is a failure.
    """
    from looptune.data.augment import torchvision_transforms as status

    transforms, error = status()
    if transforms is not None:
        return transforms
    reason = f"torchvision does not import here ({error}); .ci/vision runs these tests"
    if os.environ.get("LOOPTUNE_REQUIRE_VISION") == "1":
        pytest.fail(f"LOOPTUNE_REQUIRE_VISION=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture
def make_image_data():
    """Factory of small synthetic MNIST-shaped datasets: ``make_image_data(n, seed=0)``."""
    import torch

    from looptune.data.loaders import ImageData

    def make(n: int, seed: int = 0) -> ImageData:
        gen = torch.Generator().manual_seed(seed)
        images = torch.randint(0, 256, (n, 28, 28), dtype=torch.uint8, generator=gen)
        labels = torch.randint(0, 10, (n,), dtype=torch.int64, generator=gen)
        return ImageData(images=images, labels=labels, mean=0.1307, std=0.3081)

    return make


@pytest.fixture(scope="session", autouse=True)
def probe_cache(tmp_path_factory):
    """Presets probe this machine once per test session, into a file of the session's own (not
    the user's cache); subprocesses the tests start inherit it."""
    path = tmp_path_factory.mktemp("probe") / "probes.json"
    before = os.environ.get("LOOPTUNE_PROBE_CACHE")
    os.environ["LOOPTUNE_PROBE_CACHE"] = str(path)
    yield path
    if before is None:
        os.environ.pop("LOOPTUNE_PROBE_CACHE", None)
    else:
        os.environ["LOOPTUNE_PROBE_CACHE"] = before
