"""Text corpora: pystdlib, tinyshakespeare (downloads from a local server), files, splits, windows."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import http.server
import math
import pickle
import platform
import re
import sysconfig
import threading
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pytest
import torch

from looptune.data import text
from looptune.errors import ConfigError, DataError

OFFICIAL = text.REMOTE_CORPORA["tinyshakespeare"]
FAKE = b"First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n" * 40


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No test sees the user's LOOPTUNE_DATA or cache; relative paths resolve in a fresh folder."""
    monkeypatch.delenv("LOOPTUNE_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)


@pytest.fixture
def fake_registry(monkeypatch: pytest.MonkeyPatch) -> bytes:
    """Make FAKE the "official" tinyshakespeare: the registry is a plain dict for this purpose."""
    fake = dataclasses.replace(OFFICIAL, sha256=hashlib.sha256(FAKE).hexdigest(), num_bytes=len(FAKE))
    monkeypatch.setitem(text.REMOTE_CORPORA, "tinyshakespeare", fake)
    return FAKE


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[[dict[str, bytes]], str]]:
    """``serve({"name": body, ...})`` -> base URL (ending in /) of a local HTTP server of those files."""
    servers: list[http.server.ThreadingHTTPServer] = []
    hits: list[str] = []

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            hits.append(self.path)
            super().do_GET()

        def log_message(self, *args: object) -> None:  # keep pytest output clean
            pass

    def start(files: dict[str, bytes]) -> str:
        folder = tmp_path / f"served{len(servers)}"
        folder.mkdir()
        for name, body in files.items():
            (folder / name).write_bytes(body)
        server = http.server.ThreadingHTTPServer(
            ("127.0.0.1", 0), functools.partial(Quiet, directory=str(folder)))
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/"

    start.hits = hits  # type: ignore[attr-defined]
    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())  # hidden temp files included


# --- pystdlib ---------------------------------------------------------------------------------


def test_pystdlib_is_deterministic_and_capped() -> None:
    first, second = text.load_corpus(), text.load_corpus("pystdlib")
    assert first == second and first.sha256 == second.sha256
    assert first.name == "pystdlib" and first.sha256 == hashlib.sha256(first.data).hexdigest()
    assert 0 < first.num_bytes == len(first.data) <= text.DEFAULT_MAX_BYTES == 2_097_152
    assert f"Python {platform.python_version()} standard library sources" in first.source
    assert sysconfig.get_paths()["stdlib"] in first.source
    assert "data=" not in repr(first)  # 2 MiB of bytes never land in a log line


def test_pystdlib_files_are_top_level_sorted_with_headers() -> None:
    corpus = text.load_corpus(max_bytes=10**9)  # no cap: every file, whole
    names = re.findall(rb"^# ==== file: (\S+\.py) ====$", corpus.data, flags=re.M)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    expected = sorted(p.name for p in stdlib.glob("*.py"))
    assert [n.decode() for n in names] == expected
    assert corpus.data.startswith(f"# ==== file: {expected[0]} ====\n".encode())
    assert corpus.source.endswith(", whole files") and f"{len(expected)} of {len(expected)}" in corpus.source


def test_pystdlib_small_cap_cuts_exactly() -> None:
    whole = text.load_corpus()
    small = text.load_corpus(max_bytes=1000)
    assert small.num_bytes == 1000 and small.data == whole.data[:1000]
    assert "cut at the 1000-byte cap inside" in small.source and small.sha256 != whole.sha256


def test_pystdlib_cap_on_a_file_boundary_says_whole_files() -> None:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    first = sorted(stdlib.glob("*.py"), key=lambda p: p.name)[0]
    size = len(f"# ==== file: {first.name} ====\n".encode()) + first.stat().st_size
    corpus = text.load_corpus(max_bytes=size)
    assert corpus.num_bytes == size and corpus.data.endswith(first.read_bytes())
    assert " sources, 1 of " in corpus.source and corpus.source.endswith(", whole files")


@pytest.mark.parametrize("bad", [0, -5, 1.5, True, "2MB"])
def test_bad_max_bytes(bad: object) -> None:
    with pytest.raises(ConfigError, match=r"max_bytes=.* is invalid: must be an int >= 1"):
        text.load_corpus(max_bytes=bad)  # type: ignore[arg-type]


def test_unknown_name_lists_names_and_suggests() -> None:
    with pytest.raises(ConfigError) as info:
        text.load_corpus("tinyshakspeare")
    message = str(info.value)
    assert "'tinyshakspeare' is neither a corpus name (pystdlib, tinyshakespeare)" in message
    assert "path of a UTF-8 text file" in message and "Did you mean 'tinyshakespeare'?" in message


def test_a_path_spelled_like_a_name_is_a_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        text.load_corpus(Path("pystdlib"))
    Path("pystdlib").write_text("mine\n")
    assert text.load_corpus("./pystdlib").data == b"mine\n"
    assert text.load_corpus("pystdlib").num_bytes > 5  # the bare name is still the corpus


def test_bits_per_byte() -> None:
    assert text.bits_per_byte(math.log(2.0)) == pytest.approx(1.0)
    assert text.bits_per_byte(math.log(256.0)) == pytest.approx(8.0)  # uniform over the bytes


# --- tinyshakespeare --------------------------------------------------------------------------


def test_registry_holds_the_official_file() -> None:
    assert OFFICIAL.sha256 == "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
    assert OFFICIAL.num_bytes == 1_115_394 and OFFICIAL.file_name == "tinyshakespeare.txt"
    assert OFFICIAL.mirrors[0].startswith("https://raw.githubusercontent.com/karpathy/char-rnn/")


def test_download_of_a_fake_file_fails_and_leaves_nothing(tmp_path: Path, serve) -> None:
    url = serve({"input.txt": FAKE}) + "input.txt"
    dest = tmp_path / "dest"
    with pytest.raises(DataError) as info:
        text.download_corpus("tinyshakespeare", dest, mirrors=[url], timeout_s=5)
    message = str(info.value)
    assert f"SHA-256 mismatch: expected {OFFICIAL.sha256}, got {hashlib.sha256(FAKE).hexdigest()}" in message
    assert url in message and "Offline fix" in message and "--data DIR" in message
    assert listing(dest) == []  # no partial file, no temp file


def test_download_with_injected_hash_lands_and_loads(tmp_path: Path, serve, fake_registry) -> None:
    base = serve({"input.txt": FAKE})
    dest = tmp_path / "dest"
    path = text.download_corpus("tinyshakespeare", dest, mirrors=[base + "missing.txt", base + "input.txt"])
    assert path == dest / "tinyshakespeare.txt" and path.read_bytes() == FAKE
    assert listing(dest) == ["tinyshakespeare.txt"]
    corpus = text.load_corpus("tinyshakespeare", data_dir=dest)
    assert corpus.data == FAKE and corpus.sha256 == hashlib.sha256(FAKE).hexdigest()
    assert corpus.name == "tinyshakespeare" and str(path) in corpus.source
    hits = len(serve.hits)
    assert text.download_corpus("tinyshakespeare", dest, mirrors=[base + "input.txt"]) == path
    assert len(serve.hits) == hits  # present and valid: nothing fetched again


def test_download_folder_mirror_and_default_destination(tmp_path: Path, monkeypatch, serve,
                                                        fake_registry) -> None:
    base = serve({"tinyshakespeare.txt": FAKE})  # a URL ending in "/" names a folder
    assert text.download_corpus(mirrors=[base]) == text.cache_dir() / "tinyshakespeare.txt"
    assert text.cache_dir() == tmp_path / "xdg" / "looptune" / "text"
    monkeypatch.setenv("LOOPTUNE_DATA", str(tmp_path / "env"))
    assert text.download_corpus(mirrors=base) == tmp_path / "env" / "tinyshakespeare.txt"
    assert text.load_corpus("tinyshakespeare").data == FAKE


def test_download_replaces_a_corrupt_copy(tmp_path: Path, serve, fake_registry) -> None:
    (tmp_path / "tinyshakespeare.txt").write_bytes(b"junk")
    text.download_corpus("tinyshakespeare", tmp_path, mirrors=[serve({"a.txt": FAKE}) + "a.txt"])
    assert (tmp_path / "tinyshakespeare.txt").read_bytes() == FAKE


def test_download_problems_before_any_fetch(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="mirrors=.* is empty"):
        text.download_corpus("tinyshakespeare", tmp_path, mirrors=[])
    with pytest.raises(ConfigError, match="'pystdlib' cannot be downloaded"):
        text.download_corpus("pystdlib", tmp_path)
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(DataError, match=f"cannot download tinyshakespeare into {blocker / 'sub'}"):
        text.download_corpus("tinyshakespeare", blocker / "sub", mirrors=["http://127.0.0.1:9/x"])


def test_corrupted_cached_file_is_refused(fake_registry) -> None:
    path = text.cache_dir() / "tinyshakespeare.txt"
    path.parent.mkdir(parents=True)
    bad = FAKE[:-1] + b"?"
    path.write_bytes(bad)
    with pytest.raises(DataError) as info:
        text.load_corpus("tinyshakespeare")
    message = str(info.value)
    assert str(path) in message
    assert f"SHA-256 is {hashlib.sha256(bad).hexdigest()}" in message
    assert f"expected {hashlib.sha256(FAKE).hexdigest()}" in message
    assert f"looptune data tinyshakespeare --download --data {path.parent}" in message


def test_the_real_hash_refuses_any_other_text(tmp_path: Path) -> None:
    (tmp_path / "tinyshakespeare.txt").write_bytes(FAKE)
    with pytest.raises(DataError, match=f"expected {OFFICIAL.sha256} \\(1115394 bytes\\)"):
        text.load_corpus("tinyshakespeare", data_dir=tmp_path)


def test_missing_names_every_place_and_the_fix(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("LOOPTUNE_DATA", str(tmp_path / "env"))
    with pytest.raises(DataError) as info:
        text.load_corpus("tinyshakespeare")
    message = str(info.value)
    assert f"LOOPTUNE_DATA={tmp_path / 'env'}: no {tmp_path / 'env' / 'tinyshakespeare.txt'}" in message
    assert f"user cache: no {text.cache_dir() / 'tinyshakespeare.txt'}" in message
    assert "`looptune data tinyshakespeare --download`" in message and "--corpus FILE" in message
    monkeypatch.delenv("LOOPTUNE_DATA")
    with pytest.raises(DataError, match=r"LOOPTUNE_DATA \(not set\)"):
        text.locate_corpus()


def test_locate_order_argument_then_env_then_cache(tmp_path: Path, monkeypatch) -> None:
    places = {key: tmp_path / key for key in ("arg", "env")}
    places["cache"] = text.cache_dir()
    for folder in places.values():
        folder.mkdir(parents=True)
        (folder / "tinyshakespeare.txt").write_bytes(FAKE)
    monkeypatch.setenv("LOOPTUNE_DATA", str(places["env"]))
    assert text.locate_corpus("tinyshakespeare", places["arg"]).parent == places["arg"]
    assert text.locate_corpus().parent == places["env"]
    monkeypatch.delenv("LOOPTUNE_DATA")
    assert text.locate_corpus().parent == places["cache"]
    with pytest.raises(DataError, match="--data / data_dir: no"):  # given: the only place looked
        text.locate_corpus("tinyshakespeare", tmp_path / "empty")


# --- file corpora -----------------------------------------------------------------------------


@pytest.mark.parametrize("content, needle", [
    (None, "does not exist"),
    ("folder", "is a folder, not a file"),
    (b"", "is empty (0 bytes)"),
    (b"abc\x00def", "is not text: it holds a NUL byte at offset 3"),
    (b"hello \xff world", "is not valid UTF-8: byte 0xff at offset 6"),
    ("caf\u00e9".encode("latin-1"), "is not valid UTF-8: byte 0xe9 at offset 3"),
], ids=["missing", "folder", "empty", "nul", "invalid-utf8", "latin1"])
def test_bad_file_names_the_path_and_the_fix(tmp_path: Path, content: object, needle: str) -> None:
    path = tmp_path / "corpus.txt"
    if content == "folder":
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    with pytest.raises(DataError) as info:
        text.load_corpus(path)
    message = str(info.value)
    assert f"corpus file {path} {needle}" in message
    assert "Fix: give the path of a non-empty UTF-8 text file (--corpus FILE)" in message


def test_utf8_file_with_non_ascii_loads(tmp_path: Path) -> None:
    raw = "Ça va? Grüße, ✓ 日本語\n".encode()
    (tmp_path / "note.txt").write_bytes(raw)
    for spec in (tmp_path / "note.txt", str(tmp_path / "note.txt")):
        corpus = text.load_corpus(spec)
        assert corpus.data == raw and corpus.num_bytes == len(raw) > len(raw.decode())
        assert corpus.name == str(tmp_path / "note.txt") and corpus.sha256 == hashlib.sha256(raw).hexdigest()
    Path("local.txt").write_bytes(raw)  # a bare name that exists in the working folder is a file
    assert text.load_corpus("local.txt").name == str(Path.cwd() / "local.txt")
    assert text.load_corpus("local.txt").tokens().tolist() == list(raw)


# --- splits and windows -----------------------------------------------------------------------


def corpus_of(data: bytes) -> text.Corpus:
    return text.Corpus.of("test", "test bytes", data)


def test_split_is_nanogpt_90_10() -> None:
    data = bytes(range(250)) * 4  # 1000 bytes
    train, val = text.split_tokens(corpus_of(data))
    assert (len(train), len(val)) == (900, 100)
    assert train.dtype == val.dtype == torch.uint8 and train.dim() == val.dim() == 1
    assert bytes(torch.cat([train, val]).tolist()) == data
    corpus = text.load_corpus()
    train, val = text.split_tokens(corpus)
    assert len(train) == int(corpus.num_bytes * 0.9) and len(train) + len(val) == corpus.num_bytes


@pytest.mark.parametrize("bad", [0.0, 1.0, -0.1, "0.1"])
def test_bad_val_fraction(bad: object) -> None:
    with pytest.raises(ConfigError, match="val_fraction=.* is invalid"):
        text.split_tokens(corpus_of(b"abc" * 10), bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("length, context", [(103, 10), (101, 10), (100, 10), (11, 2), (3, 2)])
def test_windows_match_a_python_loop(length: int, context: int) -> None:
    tokens = torch.randint(0, 256, (length,), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    x, y = text.token_windows(tokens, context)
    n = (length - 1) // context
    assert x.shape == y.shape == (n, context) and x.dtype == y.dtype == torch.uint8
    stream = tokens.tolist()
    for i in range(n):
        o = i * context
        assert x[i].tolist() == stream[o:o + context]
        assert y[i].tolist() == stream[o + 1:o + context + 1]
    assert torch.equal(x[:, 1:], y[:, :-1])  # y is x shifted by one
    assert x.data_ptr() == tokens.data_ptr()  # views, no copy


def test_windows_of_a_strided_stream() -> None:
    tokens = torch.arange(60, dtype=torch.uint8)[::2]  # non-contiguous: view() would fail
    x, y = text.token_windows(tokens, 4)
    assert x[1].tolist() == [8, 10, 12, 14] and y[1].tolist() == [10, 12, 14, 16]


def test_check_context_errors() -> None:
    assert text.check_context(10, 101, "train") == 10
    with pytest.raises(ConfigError, match="context=1 is invalid: must be an int >= 2"):
        text.check_context(1, 1000, "train")
    with pytest.raises(ConfigError) as info:
        text.check_context(100, 50, "val")
    message = str(info.value)
    assert "context=100 is longer than the val split (50 tokens" in message
    assert "shorter --context (at most 49) or a larger corpus" in message
    with pytest.raises(ConfigError, match="needs context \\+ 1 = 51"):
        text.check_context(50, 50, "train")  # 50 tokens make 49 (x, y) pairs, not 50
    with pytest.raises(ConfigError, match="context=True is invalid"):
        text.check_context(True, 50, "train")  # type: ignore[arg-type]


def test_val_split_too_short_for_the_context_is_named() -> None:
    train, val = text.split_tokens(corpus_of(b"abcdefghij" * 3))  # 27 / 3 tokens
    assert text.token_windows(train, 4, which="train")[0].shape == (6, 4)
    with pytest.raises(ConfigError, match=r"context=4 is longer than the val split \(3 tokens"):
        text.token_windows(val, 4, which="val")


def test_windows_reject_a_2d_tensor() -> None:
    with pytest.raises(ConfigError, match=r"tokens of shape \(2, 5\) are invalid: must be 1-D"):
        text.token_windows(torch.zeros(2, 5, dtype=torch.uint8), 2)


# --- the per-sample dataset -------------------------------------------------------------------


def test_dataset_agrees_with_windows(tmp_path: Path) -> None:
    tokens = text.load_corpus(max_bytes=5000).tokens()
    x, y = text.token_windows(tokens, 64)
    path = tmp_path / "train.bin"
    path.write_bytes(bytes(tokens.tolist()))
    for arr in (tokens.numpy(), np.memmap(path, dtype=np.uint8, mode="r")):
        ds = text.TokenWindowDataset(arr, 64)
        assert len(ds) == len(x) == (5000 - 1) // 64
        for i in range(len(ds)):
            xi, yi = ds[i]
            assert xi.dtype == yi.dtype == torch.int64
            assert torch.equal(xi, x[i].long()) and torch.equal(yi, y[i].long())
        assert torch.equal(ds[-1][0], x[-1].long())


def test_dataset_index_out_of_range() -> None:
    ds = text.TokenWindowDataset(np.arange(21, dtype=np.uint8), 4)
    assert len(ds) == 5
    for bad in (5, 100, -6):
        with pytest.raises(IndexError, match=f"window index {bad} is out of range: .* 5 windows"):
            ds[bad]


def test_dataset_pickles_and_batches() -> None:
    arr = np.frombuffer(FAKE, dtype=np.uint8)
    ds = pickle.loads(pickle.dumps(text.TokenWindowDataset(arr, 16)))
    x, y = text.token_windows(torch.from_numpy(arr.copy()), 16)
    xb, yb = next(iter(torch.utils.data.DataLoader(ds, batch_size=8)))
    assert torch.equal(xb, x[:8].long()) and torch.equal(yb, y[:8].long())


@pytest.mark.parametrize("arr", [torch.zeros(10, dtype=torch.uint8), np.zeros(10, dtype=np.int64),
                                 np.zeros((2, 10), dtype=np.uint8)], ids=["tensor", "int64", "2d"])
def test_dataset_rejects_other_arrays(arr: object) -> None:
    with pytest.raises(ConfigError, match="must be a 1-D uint8 numpy array"):
        text.TokenWindowDataset(arr, 2)  # type: ignore[arg-type]


def test_dataset_checks_the_context_up_front() -> None:
    with pytest.raises(ConfigError, match=r"context=20 is longer than the train split \(10 tokens"):
        text.TokenWindowDataset(np.zeros(10, dtype=np.uint8), 20, which="train")
