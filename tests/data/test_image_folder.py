"""A folder of JPEGs in the ImageFolder layout: written from real MNIST digits, scanned, checked
(issue 33)."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from PIL import Image

from looptune.data import image_folder
from looptune.errors import ConfigError, DataError


@pytest.fixture(scope="module")
def folder(mnist_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("jpegs") / "train"
    record = image_folder.write(root, samples=60, mnist_dir=mnist_dir, seed=3)
    return root, record


def test_the_folder_is_real_jpegs_in_class_folders_with_a_manifest(folder, mnist_dir):
    root, record = folder
    from looptune.data import mnist

    _, labels = mnist.load("train", data_dir=mnist_dir)
    samples = image_folder.scan(root, verify=True)
    assert samples.classes == [str(c) for c in range(10)] and len(samples) == 60
    assert record["count"] == 60 and record["bytes"] == samples.bytes
    on_disk = json.loads((root / image_folder.MANIFEST).read_text())
    assert on_disk == record
    for f in record["files"][:10]:
        data = (root / f["path"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == f["sha256"] and len(data) == f["bytes"]
        with Image.open(root / f["path"]) as img:  # a real RGB JPEG of the recorded size
            assert img.format == "JPEG" and img.mode == "RGB" and list(img.size) == f["size"]
            assert 128 <= min(img.size) and max(img.size) <= 256
        assert f["path"].split("/")[0] == str(f["label"])
    # each label is its digit's; every class has 6 of the 60, no digit twice
    assert all(int(labels[f["mnist_index"]]) == f["label"] for f in record["files"])
    assert np.bincount([f["label"] for f in record["files"]]).tolist() == [6] * 10
    assert len({f["mnist_index"] for f in record["files"]}) == 60
    assert samples.labels == [int(p.parent.name) for p in samples.paths]


def test_bad_settings_and_an_occupied_folder_are_refused_before_any_work(tmp_path, folder):
    with pytest.raises(ConfigError) as err:
        image_folder.write(tmp_path / "x", samples=5, min_size=300, max_size=200, quality=0)
    text = str(err.value)
    assert "samples=5" in text and "min_size=300" in text and "quality=0" in text
    assert not (tmp_path / "x").exists()
    with pytest.raises(ConfigError, match="exists and is not an empty folder"):
        image_folder.write(folder[0], samples=10)


def test_a_failed_write_leaves_nothing_behind(tmp_path):
    with pytest.raises(DataError):  # no MNIST there: nothing written, no partial folder
        image_folder.write(tmp_path / "out", samples=10, mnist_dir=tmp_path / "none")
    assert list(tmp_path.iterdir()) == []


def _copy(src, dst, n=3):
    for c in ("0", "1"):
        (dst / c).mkdir(parents=True)
        for p in sorted((src / c).iterdir())[:n]:
            (dst / c / p.name).write_bytes(p.read_bytes())


def test_bad_files_are_named_or_skipped_and_counted(folder, tmp_path):
    root = tmp_path / "bad"
    _copy(folder[0], root)
    good = sorted((root / "0").iterdir())[0]
    truncated = root / "0" / "cut.jpg"
    truncated.write_bytes(good.read_bytes()[:500])
    text = root / "1" / "notes.txt"
    text.write_text("not an image")
    fake = root / "1" / "fake.jpg"
    fake.write_bytes(b"GIF89a...")
    with pytest.raises(DataError, match=r"cut\.jpg: a truncated JPEG .*skip_bad=True"):
        image_folder.scan(root)
    truncated.unlink()
    with pytest.raises(DataError, match=r"fake\.jpg: not a JPEG or PNG"):
        image_folder.scan(root)
    truncated.write_bytes(good.read_bytes()[:500])
    s = image_folder.scan(root, skip_bad=True)
    assert len(s) == 6 and sorted(p.rsplit("/", 1)[1] for p in s.skipped) == [
        "cut.jpg", "fake.jpg", "notes.txt"]
    assert "not an image file" in s.skipped[str(text)]


def test_an_empty_class_and_an_empty_root_are_named(tmp_path, folder):
    with pytest.raises(DataError, match="no class folders"):
        image_folder.scan(tmp_path)
    _copy(folder[0], tmp_path / "r")
    (tmp_path / "r" / "2").mkdir()
    with pytest.raises(DataError, match=r"class '2' has no image files"):
        image_folder.scan(tmp_path / "r")
    with pytest.raises(DataError, match="no such folder"):
        image_folder.scan(tmp_path / "missing")


def test_a_file_changed_after_writing_fails_verification(folder, tmp_path):
    root = tmp_path / "v"
    root.mkdir()
    (root / image_folder.MANIFEST).write_text((folder[0] / image_folder.MANIFEST).read_text())
    _copy(folder[0], root, n=100)
    victim = sorted((root / "1").iterdir())[0]
    with Image.open(victim) as img:  # still a valid JPEG, other pixels
        img.rotate(90).save(victim, format="JPEG", quality=90)
    image_folder.scan(root)  # without verify: a valid file
    with pytest.raises(DataError, match="SHA-256 differs from the manifest"):
        image_folder.scan(root, verify=True)
