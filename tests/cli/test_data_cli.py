"""``looptune data``: the text corpora (pystdlib, tinyshakespeare) and MNIST, end to end."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import http.server
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Iterator

import pytest

from looptune.cli.main import main
from looptune.data import text

FAKE = b"ROMEO:\nBut, soft! what light through yonder window breaks?\n" * 50


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOOPTUNE_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))


@pytest.fixture
def mirror(tmp_path: Path) -> Iterator[str]:
    """Base URL of a local HTTP server holding ``input.txt`` = FAKE."""
    served = tmp_path / "served"
    served.mkdir()
    (served / "input.txt").write_bytes(FAKE)

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:  # keep pytest output clean
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(served)))
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


@pytest.fixture
def fake_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make FAKE the expected tinyshakespeare (the registry is a plain dict for this)."""
    official = text.REMOTE_CORPORA["tinyshakespeare"]
    fake = dataclasses.replace(official, sha256=hashlib.sha256(FAKE).hexdigest(), num_bytes=len(FAKE))
    monkeypatch.setitem(text.REMOTE_CORPORA, "tinyshakespeare", fake)


def run_module(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "LOOPTUNE_DATA"}
    env["XDG_CACHE_HOME"] = str(tmp_path / "xdg")
    return subprocess.run([sys.executable, "-m", "looptune", "data", *argv], capture_output=True,
                          text=True, env=env, timeout=120)


def test_pystdlib_prints_source_size_and_sha256(tmp_path: Path) -> None:
    proc = run_module(tmp_path, "pystdlib")
    corpus = text.load_corpus()  # same interpreter, same standard library
    assert proc.returncode == 0, proc.stderr
    assert f"sha256: {corpus.sha256}" in proc.stdout
    assert f"bytes:  {corpus.num_bytes}" in proc.stdout and corpus.source in proc.stdout


def test_tinyshakespeare_missing_exits_2_with_the_download_hint(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = run_module(tmp_path, "tinyshakespeare", "--data", str(empty))
    assert proc.returncode == 2
    assert "looptune data: error: tinyshakespeare not found" in proc.stderr
    assert "`looptune data tinyshakespeare --download`" in proc.stderr
    assert str(empty / "tinyshakespeare.txt") in proc.stderr and "Traceback" not in proc.stderr


def test_download_then_verify(capsys, tmp_path: Path, mirror: str, fake_registry) -> None:
    dest = tmp_path / "dest"
    code = main(["data", "tinyshakespeare", "--download", "--data", str(dest),
                 "--mirror", mirror + "nothing-here.txt", "--mirror", mirror + "input.txt"])
    out = capsys.readouterr().out
    assert code == 0
    assert f"tinyshakespeare downloaded into {dest / 'tinyshakespeare.txt'}" in out
    assert "found and verified" in out and f"sha256: {hashlib.sha256(FAKE).hexdigest()}" in out
    assert sorted(p.name for p in dest.iterdir()) == ["tinyshakespeare.txt"]
    assert main(["data", "tinyshakespeare", "--data", str(dest)]) == 0  # found again, no download


def test_download_of_a_wrong_file_exits_2_and_leaves_nothing(capsys, tmp_path: Path, mirror: str) -> None:
    dest = tmp_path / "dest"
    code = main(["data", "tinyshakespeare", "--download", "--data", str(dest), "--mirror",
                 mirror + "input.txt", "--timeout", "5"])
    err = capsys.readouterr().err
    assert code == 2
    official = text.REMOTE_CORPORA["tinyshakespeare"].sha256
    assert f"expected {official}, got {hashlib.sha256(FAKE).hexdigest()}" in err
    assert list(dest.iterdir()) == []


def test_pystdlib_notes_options_it_does_not_use(capsys) -> None:
    assert main(["data", "pystdlib", "--download"]) == 0
    out = capsys.readouterr().out
    assert "note: --download not used" in out and "sha256: " in out


def test_unknown_dataset_is_a_usage_error(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["data", "shakespeare"])
    assert info.value.code == 2
    assert "invalid choice: 'shakespeare'" in capsys.readouterr().err


def test_mnist_missing_still_names_its_fix(capsys, tmp_path: Path) -> None:
    code = main(["data", "mnist", "--data", str(tmp_path / "nope")])
    err = capsys.readouterr().err
    assert code == 2 and "looptune data mnist --download" in err and "Traceback" not in err


@pytest.mark.integration
def test_mnist_still_verifies(capsys, mnist_dir: Path) -> None:
    assert main(["data", "mnist", "--data", str(mnist_dir)]) == 0
    assert "MNIST found and verified" in capsys.readouterr().out


@pytest.mark.integration
def test_images_writes_a_jpeg_folder_then_checks_it(capsys, mnist_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "jpegs"
    assert main(["data", "images", "--out", str(out), "--samples", "30", "--data",
                 str(mnist_dir), "--max-size", "160"]) == 0
    said = capsys.readouterr().out
    assert "wrote 30 JPEGs" in said and "10 class folders" in said and "manifest.json" in said
    assert len(list(out.glob("*/*.jpg"))) == 30
    (out / "3" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0" + b"\x00" * 100)
    code = main(["data", "images", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "broken.jpg: a truncated JPEG" in err and "--skip-bad" in err
    assert main(["data", "images", "--out", str(out), "--skip-bad"]) == 0
    said = capsys.readouterr().out
    assert "30 images in 10 classes" in said and "1 bad file(s) skipped" in said


def test_images_without_out_names_the_flag(capsys) -> None:
    assert main(["data", "images"]) == 2
    assert "needs --out DIR" in capsys.readouterr().err
