"""MNIST: locate order and layouts, load checks, verify, and download against a local server."""

from __future__ import annotations

import gzip
import hashlib
import http.server
import os
import socket
import threading
import time
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
import torch

from looptune.data import mnist
from looptune.data.idx import write_idx
from looptune.errors import ConfigError, DataError

NAMES = mnist.NAMES
TRAIN_IMAGES, TRAIN_LABELS = mnist.IMAGES["train"], mnist.LABELS["train"]
TEST_IMAGES, TEST_LABELS = mnist.IMAGES["test"], mnist.LABELS["test"]


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No test sees the user's LOOPTUNE_DATA or cache, and the load cache starts empty."""
    monkeypatch.delenv("LOOPTUNE_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    mnist.clear_cache()
    yield
    mnist.clear_cache()  # frees the tensors of synthetic files


def touch_all(folder: Path, *, gz: bool = True, skip: tuple[str, ...] = ()) -> Path:
    """Create empty stand-ins: locate only checks that the files exist."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in NAMES:
        if name not in skip:
            (folder / (f"{name}.gz" if gz else name)).touch()
    return folder


def images(n: int, side: tuple[int, int] = (28, 28)) -> np.ndarray:
    return (np.arange(n * side[0] * side[1]) % 251).astype(np.uint8).reshape(n, *side)


def labels(n: int) -> np.ndarray:
    return (np.arange(n) % 10).astype(np.uint8)


def write_split(folder: Path, split: str, image_array: np.ndarray, label_array: np.ndarray,
                *, gz: bool = False) -> Path:
    """Write one split as IDX files, plus empty stand-ins for the other split."""
    touch_all(folder, gz=False)
    suffix = ".gz" if gz else ""
    for name, array in ((mnist.IMAGES[split], image_array), (mnist.LABELS[split], label_array)):
        (folder / name).unlink()
        write_idx(folder / f"{name}{suffix}", array, compress=gz)
    return folder


# --- locate -----------------------------------------------------------------------------------


def test_locate_order_argument_then_env_then_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    arg, env = touch_all(tmp_path / "arg"), touch_all(tmp_path / "env")
    cache = touch_all(tmp_path / "xdg" / "looptune" / "mnist")
    monkeypatch.setenv("LOOPTUNE_DATA", str(env))
    assert mnist.locate(arg) == arg
    assert mnist.locate(str(arg)) == arg
    assert mnist.locate() == env
    monkeypatch.delenv("LOOPTUNE_DATA")
    assert mnist.locate() == cache == mnist.cache_dir()


def test_cache_dir_defaults_to_home_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    cache = touch_all(tmp_path / ".cache" / "looptune" / "mnist")
    assert mnist.cache_dir() == cache
    assert mnist.locate() == cache


def test_torchvision_layout(tmp_path: Path) -> None:
    raw = touch_all(tmp_path / "MNIST" / "raw")
    assert mnist.locate(tmp_path) == raw
    assert mnist.files(tmp_path)[TRAIN_IMAGES] == raw / f"{TRAIN_IMAGES}.gz"


@pytest.mark.parametrize("gz", [True, False], ids=["gz", "raw"])
def test_files_resolve_gz_or_raw(tmp_path: Path, gz: bool) -> None:
    touch_all(tmp_path, gz=gz)
    suffix = ".gz" if gz else ""
    assert mnist.files(tmp_path) == {name: tmp_path / f"{name}{suffix}" for name in NAMES}


def test_raw_file_wins_over_gz(tmp_path: Path) -> None:
    touch_all(tmp_path, gz=True)
    (tmp_path / TRAIN_LABELS).touch()
    found = mnist.files(tmp_path)
    assert found[TRAIN_LABELS] == tmp_path / TRAIN_LABELS
    assert found[TRAIN_IMAGES] == tmp_path / f"{TRAIN_IMAGES}.gz"


def test_missing_file_names_it_and_the_fix(tmp_path: Path) -> None:
    folder = touch_all(tmp_path / "data", skip=(TEST_LABELS,))
    with pytest.raises(DataError) as info:
        mnist.locate(folder)
    message = str(info.value)
    assert f"{folder} is missing {TEST_LABELS}" in message
    assert TRAIN_IMAGES + "," not in message.split("Fix:")[0]  # only the missing file is named
    assert "--data DIR" in message and "LOOPTUNE_DATA=DIR" in message
    assert "looptune data mnist --download" in message


def test_explicit_folder_never_falls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOPTUNE_DATA", str(touch_all(tmp_path / "env")))
    touch_all(tmp_path / "xdg" / "looptune" / "mnist")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError, match=f"MNIST folder {empty} .*is missing {TRAIN_IMAGES}"):
        mnist.locate(empty)
    with pytest.raises(DataError, match=f"{tmp_path / 'nope'} .*the folder does not exist"):
        mnist.locate(tmp_path / "nope")


def test_nothing_found_lists_every_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOPTUNE_DATA", str(tmp_path / "env"))
    with pytest.raises(DataError) as info:
        mnist.locate()
    message = str(info.value)
    assert f"LOOPTUNE_DATA={tmp_path / 'env'}: the folder does not exist" in message
    assert f"user cache {tmp_path / 'xdg' / 'looptune' / 'mnist'}: the folder does not exist" in message
    assert "--data DIR" in message and "looptune data mnist --download" in message
    monkeypatch.delenv("LOOPTUNE_DATA")
    with pytest.raises(DataError, match="LOOPTUNE_DATA: not set"):
        mnist.locate()


def test_bad_env_falls_back_to_cache_with_a_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOPTUNE_DATA", str(tmp_path / "env"))
    cache = touch_all(tmp_path / "xdg" / "looptune" / "mnist")
    with pytest.warns(UserWarning, match=f"LOOPTUNE_DATA={tmp_path / 'env'}.*using {cache} instead"):
        assert mnist.locate() == cache


# --- load and verify --------------------------------------------------------------------------


@pytest.mark.parametrize("gz", [False, True], ids=["raw", "gz"])
def test_load_shapes_and_dtypes(tmp_path: Path, gz: bool) -> None:
    write_split(tmp_path, "test", images(10000), labels(10000), gz=gz)
    x, y = mnist.load("test", data_dir=tmp_path, verify=False)
    assert x.shape == (10000, 28, 28) and x.dtype == torch.uint8
    assert y.shape == (10000,) and y.dtype == torch.int64
    assert torch.equal(x, torch.from_numpy(images(10000)))
    assert y[:12].tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1]


def test_load_is_cached_but_callers_cannot_corrupt_it(tmp_path: Path) -> None:
    write_split(tmp_path, "test", images(10000), labels(10000))
    x1, y1 = mnist.load("test", data_dir=tmp_path, verify=False)
    x1.zero_()
    y1.fill_(7)
    x2, y2 = mnist.load("test", data_dir=tmp_path, verify=False)
    assert x2.data_ptr() != x1.data_ptr()
    assert torch.equal(x2, torch.from_numpy(images(10000))) and y2[1].item() == 1
    assert mnist._load_cached.cache_info().hits == 1


def test_load_rereads_a_changed_file(tmp_path: Path) -> None:
    write_split(tmp_path, "test", images(10000), labels(10000))
    mnist.load("test", data_dir=tmp_path, verify=False)
    path = write_idx(tmp_path / TEST_LABELS, np.full(10000, 3, np.uint8))
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))  # coarse clocks: force a new mtime
    _, y = mnist.load("test", data_dir=tmp_path, verify=False)
    assert y.unique().tolist() == [3]


def test_load_rejects_unknown_split(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"split='val' is invalid: must be one of \('train', 'test'\)"):
        mnist.load("val", data_dir=tmp_path)  # type: ignore[arg-type]


def test_count_mismatch_names_both_counts(tmp_path: Path) -> None:
    write_split(tmp_path, "train", images(5), labels(4))
    with pytest.raises(DataError, match=f"{TRAIN_IMAGES} holds 5 images but .*{TRAIN_LABELS} holds 4 labels"):
        mnist.load("train", data_dir=tmp_path, verify=False)


def test_unexpected_count(tmp_path: Path) -> None:
    write_split(tmp_path, "test", images(100), labels(100))
    with pytest.raises(DataError, match="MNIST test split .* holds 100 examples, expected 10000"):
        mnist.load("test", data_dir=tmp_path, verify=False)


def test_label_out_of_range(tmp_path: Path) -> None:
    bad = labels(6)
    bad[4] = 10
    write_split(tmp_path, "train", images(6), bad)
    with pytest.raises(DataError, match=f"{TRAIN_LABELS}: 1 labels outside 0..9, the first at index 4 is 10"):
        mnist.load("train", data_dir=tmp_path, verify=False)


@pytest.mark.parametrize(
    ("array", "got"),
    [(images(3, (28, 27)), r"uint8 \(3, 28, 27\)"), (images(3).astype(np.int16), r"int16 \(3, 28, 28\)")],
    ids=["shape", "dtype"],
)
def test_wrong_image_shape_or_dtype(tmp_path: Path, array: np.ndarray, got: str) -> None:
    write_split(tmp_path, "train", array, labels(3))
    with pytest.raises(DataError, match=rf"expected uint8 images of shape \(N, 28, 28\), got {got}"):
        mnist.load("train", data_dir=tmp_path, verify=False)


def test_checksum_mismatch_names_file_and_both_hashes(tmp_path: Path) -> None:
    write_split(tmp_path, "test", images(10000), labels(10000), gz=True)
    actual = hashlib.sha256(gzip.decompress((tmp_path / f"{TEST_IMAGES}.gz").read_bytes())).hexdigest()
    with pytest.raises(DataError) as info:
        mnist.load("test", data_dir=tmp_path)
    message = str(info.value)
    assert f"{tmp_path / TEST_IMAGES}.gz: SHA-256" in message
    assert f"is {actual}, expected {mnist.SHA256[TEST_IMAGES]}" in message
    assert f"looptune data mnist --download --data {tmp_path}`" in message


def fake_files(folder: Path) -> dict[str, str]:
    """Write four tiny gzip IDX files; return their SHA-256 table (of the decompressed bytes)."""
    folder.mkdir(parents=True, exist_ok=True)
    table = {}
    for i, name in enumerate(NAMES):
        array = images(2 + i) if "images" in name else labels(2 + i)
        path = write_idx(folder / f"{name}.gz", array, compress=True)
        table[name] = hashlib.sha256(gzip.decompress(path.read_bytes())).hexdigest()
    return table


def test_verify_whole_folder(tmp_path: Path) -> None:
    table = fake_files(tmp_path / "data")
    assert mnist.verify(tmp_path / "data", sha256=table) == tmp_path / "data"
    with pytest.raises(DataError, match="4 of 4 MNIST files are bad") as info:
        mnist.verify(tmp_path / "data")
    assert str(info.value).count("SHA-256 of the decompressed contents") == 4
    (tmp_path / "data" / f"{TEST_LABELS}.gz").write_bytes(b"\x1f\x8b junk")
    with pytest.raises(DataError, match=f"(?s)1 of 4 .*{TEST_LABELS}.gz: corrupt gzip stream"):
        mnist.verify(tmp_path / "data", sha256=table)


# --- download ---------------------------------------------------------------------------------


class Server:
    """A local HTTP server: ``routes[path] = (body, declared Content-Length, delay_s)``."""

    def __init__(self) -> None:
        self.routes: dict[str, tuple[bytes, int, float]] = {}
        self.hits: list[str] = []
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                owner.hits.append(self.path)
                if self.path not in owner.routes:
                    self.send_error(404)
                    return
                body, length, delay_s = owner.routes[self.path]
                time.sleep(delay_s)
                self.send_response(200)
                self.send_header("Content-Length", str(length))
                self.end_headers()
                self.wfile.write(body)  # HTTP/1.0: the connection closes after this, cut or not

            def log_message(self, *args: object) -> None:  # keep pytest output clean
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.block_on_close = False  # a sleeping handler must not stall teardown
        # a client that gave up (timeout test) makes the handler hit a broken pipe: expected
        self.httpd.handle_error = lambda request, client_address: None  # type: ignore[method-assign]
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def serve(self, mirror: str, folder: Path, *, cut: bool = False, delay_s: float = 0.0,
              only: str | None = None) -> str:
        """Serve the files in ``folder`` (or only ``only``) under ``/mirror/``; return its URL."""
        for path in folder.glob(only or "*"):
            body = path.read_bytes()
            sent = body[: len(body) // 2] if cut else body
            self.routes[f"/{mirror}/{path.name}"] = (sent, len(body), delay_s)
        return f"{self.base}/{mirror}/"


@pytest.fixture
def server() -> Iterator[Server]:
    srv = Server()
    # a short poll interval: shutdown() waits up to one interval, and there is a server per test
    thread = threading.Thread(target=srv.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield srv
    srv.httpd.shutdown()
    srv.httpd.server_close()


@pytest.fixture
def fakes(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    """(good files, files with other contents, the good files' SHA-256 table)."""
    table = fake_files(tmp_path / "good")
    bad = tmp_path / "bad"
    bad.mkdir()
    for name in NAMES:
        write_idx(bad / f"{name}.gz", np.zeros(3, np.uint8), compress=True)
    return tmp_path / "good", bad, table


def listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def expected_listing() -> list[str]:
    return sorted(f"{name}.gz" for name in NAMES)


def test_download_good_mirror(tmp_path: Path, server: Server, fakes) -> None:
    good, _, table = fakes
    seen: list[tuple[str, int, int | None]] = []
    dest = mnist.download(tmp_path / "dest", mirrors=[server.serve("m", good)], sha256=table,
                          progress=lambda *args: seen.append(args))
    assert listing(dest) == expected_listing()  # and no temp file left
    assert mnist.verify(dest, sha256=table) == dest
    assert {name for name, _, _ in seen} == set(NAMES)
    assert all(done == total for name, done, total in seen if name == TRAIN_LABELS)
    hits = len(server.hits)
    mnist.download(dest, mirrors=[server.serve("m", good)], sha256=table)
    assert len(server.hits) == hits  # present and valid: nothing fetched again


def test_download_defaults_to_env_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         server: Server, fakes) -> None:
    good, _, table = fakes
    monkeypatch.setenv("LOOPTUNE_DATA", str(tmp_path / "env"))
    assert mnist.download(mirrors=server.serve("m", good), sha256=table) == tmp_path / "env"
    assert mnist.locate() == tmp_path / "env"


def test_bad_hash_then_good_mirror(tmp_path: Path, server: Server, fakes) -> None:
    good, bad, table = fakes
    mirrors = [server.serve("bad", bad), server.serve("good", good)]
    dest = mnist.download(tmp_path / "dest", mirrors=mirrors, sha256=table)
    assert listing(dest) == expected_listing()
    assert (dest / f"{TRAIN_IMAGES}.gz").read_bytes() == (good / f"{TRAIN_IMAGES}.gz").read_bytes()


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/"


@pytest.mark.parametrize("failure", ["refused", "404", "timeout", "cut"])
def test_failing_mirror_then_good_mirror(tmp_path: Path, server: Server, fakes, failure: str) -> None:
    good, _, table = fakes
    first = {
        "refused": closed_port_url,
        "404": lambda: f"{server.base}/nothing-here/",
        # one slow file (the rest 404 at once): the test pays one timeout, not four
        "timeout": lambda: server.serve("slow", good, delay_s=1.0, only=f"{TRAIN_IMAGES}.gz"),
        "cut": lambda: server.serve("cut", good, cut=True),
    }[failure]()
    dest = mnist.download(tmp_path / "dest", mirrors=[first, server.serve("good", good)],
                          sha256=table, timeout_s=0.3)
    assert listing(dest) == expected_listing()


def test_bad_hash_everywhere(tmp_path: Path, server: Server, fakes) -> None:
    _, bad, table = fakes
    actual = hashlib.sha256(gzip.decompress((bad / f"{TRAIN_IMAGES}.gz").read_bytes())).hexdigest()
    mirrors = [server.serve("a", bad), server.serve("b", bad)]
    with pytest.raises(DataError) as info:
        mnist.download(tmp_path / "dest", mirrors=mirrors, sha256=table)
    message = str(info.value)
    assert f"could not download {TRAIN_IMAGES}.gz into {tmp_path / 'dest'}" in message
    mismatch = f"SHA-256 mismatch: expected {table[TRAIN_IMAGES]}, got {actual}"
    assert f"{mirrors[0]}{TRAIN_IMAGES}.gz: {mismatch}" in message
    assert f"{mirrors[1]}{TRAIN_IMAGES}.gz: {mismatch}" in message
    assert "copy them into a folder DIR and pass --data DIR" in message
    assert listing(tmp_path / "dest") == []


def test_cut_connection_everywhere_leaves_nothing(tmp_path: Path, server: Server, fakes) -> None:
    good, _, table = fakes
    with pytest.raises(DataError, match=r"connection closed after \d+ of \d+ bytes|IncompleteRead"):
        mnist.download(tmp_path / "dest", mirrors=[server.serve("cut", good, cut=True)], sha256=table)
    assert listing(tmp_path / "dest") == []


def test_corrupt_gzip_from_mirror(tmp_path: Path, server: Server, fakes) -> None:
    _, _, table = fakes
    server.routes[f"/junk/{TRAIN_IMAGES}.gz"] = (b"\x1f\x8b\x08junk", 7, 0.0)
    with pytest.raises(DataError, match=f"junk/{TRAIN_IMAGES}.gz: bad download: "):
        mnist.download(tmp_path / "dest", mirrors=[f"{server.base}/junk"], sha256=table)
    assert listing(tmp_path / "dest") == []


def test_download_replaces_a_bad_raw_copy(tmp_path: Path, server: Server, fakes) -> None:
    good, _, table = fakes
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / TRAIN_LABELS).write_bytes(b"not idx")
    mnist.download(dest, mirrors=[server.serve("m", good)], sha256=table)
    assert listing(dest) == expected_listing()


def test_download_needs_a_mirror(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="mirrors=.* is empty"):
        mnist.download(tmp_path, mirrors=[])


# --- the real data set ------------------------------------------------------------------------


@pytest.mark.integration
def test_real_mnist(mnist_dir: Path) -> None:
    assert mnist.verify(mnist_dir) == mnist.locate(mnist_dir)
    for split, count in (("train", 60000), ("test", 10000)):
        x, y = mnist.load(split, data_dir=mnist_dir, verify=True)
        assert x.shape == (count, 28, 28) and x.dtype == torch.uint8
        assert y.shape == (count,) and y.dtype == torch.int64
        assert int(y.min()) == 0 and int(y.max()) == 9


@pytest.mark.integration
def test_verify_then_load_hashes_each_file_once(mnist_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mnist.clear_cache()
    calls: list[Path] = []
    original = mnist._check_sha256
    monkeypatch.setattr(mnist, "_check_sha256", lambda data, *, path, expected: calls.append(path) or original(data, path=path, expected=expected))
    mnist.verify(mnist_dir)
    mnist.load("train", data_dir=mnist_dir)
    mnist.load("test", data_dir=mnist_dir)
    assert len(calls) == 4  # the bench's up-front check already proved the files
    mnist.clear_cache()
