"""The jpeg-folder workload (issue 33): its two pipelines over the same files, its data errors,
and a short bench of its recipes on real JPEGs."""

from __future__ import annotations

import pytest
import torch

from looptune.bench import image_workload
from looptune.bench.workloads import get_workload
from looptune.data.jpeg import FolderCrops, FolderReader, crop_batch, sizes_of, with_sizes
from looptune.errors import ConfigError
from looptune.presets import get_recipe, recipe_names
from looptune.recipe import LoaderConfig, Recipe


def test_the_sizes_plane_round_trips_and_leaves_the_pixels():
    images = torch.randint(0, 256, (5, 3, 8, 8), dtype=torch.uint8)
    sizes = torch.tensor([[128, 256], [255, 1], [4095, 300], [65535, 7], [1, 1]])
    x = with_sizes(images, sizes)
    assert x.shape == (5, 4, 8, 8) and torch.equal(x[:, :3], images)
    assert torch.equal(sizes_of(x), sizes) and torch.equal(sizes_of(x.float()), sizes)
    with pytest.raises(ConfigError, match="65535"):
        with_sizes(images, torch.tensor([[70000, 1]] * 5))


def test_batched_crops_are_crop_batch_in_the_originals_coordinates():
    images = torch.randint(0, 256, (6, 3, 48, 48), dtype=torch.uint8)
    sizes = torch.tensor([[128, 256], [256, 128], [200, 200], [130, 250], [160, 140], [256, 256]])
    crops = FolderCrops(32, (0.35, 1.0), generator=torch.Generator().manual_seed(3))
    got = crops.batch(with_sizes(images, sizes).float())
    want = crop_batch(images, sizes, 32, scale=(0.35, 1.0),
                      generator=torch.Generator().manual_seed(3))
    assert got.shape == (6, 3, 32, 32) and torch.allclose(got, want)
    # the sizes matter: drawn as if every original were square, the crops differ
    square = crop_batch(images, torch.full((6, 2), 48), 32, scale=(0.35, 1.0),
                        generator=torch.Generator().manual_seed(3))
    assert not torch.allclose(got, square)


def test_the_recipe_decoder_picks_the_per_sample_decode(tmp_path):
    from looptune.data.image_folder import Samples

    samples = Samples(root=tmp_path, classes=["0"], paths=[], labels=[])
    reader = FolderReader(samples, 32, (0.35, 1.0))
    assert (reader(None, "pil").draft, reader(None, "pil").decoder) == (False, "pil")
    assert (reader(None, "draft").draft, reader(None, "draft").decoder) == (True, "pil")
    with pytest.raises(ConfigError, match="allowed pil, draft, simplejpeg"):
        reader(None, "nvjpeg")


def test_image_decoder_is_checked_with_the_recipe():
    assert LoaderConfig(image_decoder="draft").problems() == []
    assert any("image_decoder='bogus'" in p for p in LoaderConfig(image_decoder="bogus").problems())
    problems = LoaderConfig(image_decoder="draft", strategy="device", decode="tensorized").problems()
    assert any("needs decode='per_sample'" in p for p in problems)


def test_missing_folders_are_named_with_the_commands_that_make_them(tmp_path):
    with pytest.raises(ConfigError, match="needs --data DIR.*looptune data images --out DIR/train"):
        image_workload.check_folders(data_dir=None)
    (tmp_path / "train").mkdir()
    with pytest.raises(ConfigError, match=r"no .*test\. jpeg-folder reads DIR/train and DIR/test"):
        image_workload.check_folders(data_dir=str(tmp_path))


def test_the_workload_and_its_recipes_are_registered():
    assert get_workload("images").name == get_workload("jpeg").name == "jpeg-folder"
    assert recipe_names("jpeg-folder") == ["baseline", "workers", "draft+workers",
                                           "simplejpeg+workers", "packed"]
    workers = get_recipe("workers", "cpu", "jpeg-folder")
    assert workers.loader.num_workers >= 1 and workers.loss_sync == "epoch"
    draft = get_recipe("draft+workers", "cpu", "jpeg-folder")
    assert draft.loader.image_decoder == "draft" and draft.optim == workers.optim
    packed = get_recipe("packed", "cpu", "jpeg-folder")
    assert packed.loader.decode == "tensorized" and packed.schedule == workers.schedule


@pytest.fixture(scope="module")
def folders(mnist_dir, tmp_path_factory):
    from looptune.data import image_folder

    root = tmp_path_factory.mktemp("jf")
    image_folder.write(root / "train", samples=192, mnist_dir=mnist_dir, min_size=64, max_size=96)
    image_folder.write(root / "test", samples=60, mnist_dir=mnist_dir, split="test",
                       min_size=64, max_size=96)
    return root


@pytest.mark.integration
def test_a_short_bench_trains_every_default_recipe_on_the_files(folders):
    from looptune.bench.runner import bench

    results = bench(workload="images", epochs=1, data_dir=str(folders),
                    recipes=["baseline", "draft+workers", "packed"])
    runs = {r.recipe: r for r in results.runs}
    assert list(runs) == ["baseline", "draft+workers", "packed"]
    for run in runs.values():
        assert run.samples_per_s > 0 and run.metric is not None and 0 <= run.metric <= 1
        assert torch.isfinite(torch.tensor(run.epoch_loss)).all()
    data = results.provenance["data"]
    assert data["train"]["files"] == 192 and data["test"]["files"] == 60
    assert data["decode_once_s"] > 0 and "decoded once" in data["decode_once"]


@pytest.mark.integration
def test_a_file_decoder_on_in_memory_data_is_refused_before_training(mnist_dir):
    from looptune.bench.runner import bench

    recipe = Recipe(name="odd", description="x", loader=LoaderConfig(image_decoder="draft"))
    with pytest.raises(ConfigError, match="no image files to decode"):
        bench(workload="mnist", epochs=1, data_dir=str(mnist_dir), recipes=[recipe])
