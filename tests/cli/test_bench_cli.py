"""Bad input to `looptune bench`: exit code 2, a message naming the value and the fix, no training."""

import os
import shutil
from pathlib import Path

import pytest

from looptune.cli import bench as bench_cmd
from looptune.cli.main import main
from looptune.data import mnist


@pytest.fixture(autouse=True)
def no_training(monkeypatch):
    """Any call into the bench runner fails the test: bad input must stop before training."""

    def forbidden(**kwargs):
        raise AssertionError("training started despite bad input")

    monkeypatch.setattr(bench_cmd, "bench", forbidden)


@pytest.fixture
def good_data(mnist_dir, tmp_path) -> Path:
    """A private copy of the real MNIST folder, safe to damage."""
    copy = tmp_path / "mnist"
    copy.mkdir()
    for path in mnist.files(mnist_dir).values():
        shutil.copy(path, copy / path.name)
    mnist.clear_cache()
    return copy


def _run(capsys, *argv) -> tuple[int, str]:
    code = main(["bench", "mnist", *argv])
    return code, capsys.readouterr().err


def test_unknown_recipe_lists_names_and_suggests_closest(capsys, tmp_path):
    code, err = _run(capsys, "--recipes", "seed-baseline,devise", "--data", str(tmp_path))
    assert code == 2
    assert "unknown recipe 'devise'" in err and "Did you mean 'device'?" in err
    assert "seed-baseline, seed-workers, seed-pinned, tensorized, device" in err


def test_every_problem_is_reported_at_once(capsys, tmp_path):
    code, err = _run(capsys, "--recipes", "nope", "--epochs", "0", "--device", "tpu",
                     "--data", str(tmp_path / "missing"))
    assert code == 2
    for needle in ("unknown recipe 'nope'", "epochs=0 is invalid: must be an integer >= 1",
                   "device='tpu' is invalid", str(tmp_path / "missing")):
        assert needle in err


def test_epochs_below_one(capsys, tmp_path):
    code, err = _run(capsys, "--epochs", "-3", "--data", str(tmp_path))
    assert code == 2 and "epochs=-3 is invalid" in err and "--epochs 5" in err


def test_non_integer_epochs_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        main(["bench", "mnist", "--epochs", "two"])
    assert info.value.code == 2
    assert "invalid int value: 'two'" in capsys.readouterr().err


def test_unknown_workload(capsys):
    code, err = _run_workload(capsys, "mnsit")
    assert code == 2 and "unknown workload 'mnsit'" in err and "Did you mean 'mnist'?" in err


def _run_workload(capsys, name):
    code = main(["bench", name])
    return code, capsys.readouterr().err


def test_missing_data_folder_names_it_and_the_fix(capsys, tmp_path):
    missing = tmp_path / "nowhere"
    code, err = _run(capsys, "--data", str(missing))
    assert code == 2 and str(missing) in err
    assert "--data DIR" in err and "looptune data mnist --download" in err


@pytest.mark.integration
def test_incomplete_data_folder_names_the_missing_file(capsys, good_data):
    (good_data / "t10k-labels-idx1-ubyte.gz").unlink()
    code, err = _run(capsys, "--data", str(good_data))
    assert code == 2 and "t10k-labels-idx1-ubyte" in err


@pytest.mark.integration
def test_truncated_data_file_is_refused(capsys, good_data):
    path = good_data / "train-labels-idx1-ubyte.gz"
    path.write_bytes(path.read_bytes()[:5000])
    code, err = _run(capsys, "--data", str(good_data))
    assert code == 2 and "train-labels-idx1-ubyte" in err


@pytest.mark.integration
def test_corrupt_data_file_is_refused_with_both_hashes(capsys, good_data):
    path = good_data / "t10k-images-idx3-ubyte.gz"
    raw = bytearray(mnist.idx.read_idx_bytes(path))
    raw[-1] ^= 0xFF  # one flipped pixel: a valid IDX file, the wrong content
    (good_data / "t10k-images-idx3-ubyte").write_bytes(bytes(raw))  # raw form wins over .gz
    code, err = _run(capsys, "--data", str(good_data))
    assert code == 2 and "t10k-images-idx3-ubyte" in err
    assert mnist.SHA256["t10k-images-idx3-ubyte"] in err


@pytest.mark.integration
def test_unwritable_json_folder(capsys, good_data, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    if os.geteuid() == 0:  # root writes through permission bits; /proc refuses new files to all
        locked = Path("/proc")
    code, err = _run(capsys, "--data", str(good_data), "--json", str(locked / "r.json"))
    assert code == 2 and "--json" in err and "cannot be written" in err


@pytest.mark.integration
def test_json_path_in_missing_folder_or_a_folder(capsys, good_data, tmp_path):
    code, err = _run(capsys, "--data", str(good_data), "--json", str(tmp_path / "no" / "r.json"))
    assert code == 2 and "does not exist" in err and "mkdir -p" in err
    code, err = _run(capsys, "--data", str(good_data), "--json", str(tmp_path))
    assert code == 2 and "is a folder" in err


@pytest.mark.integration
def test_data_download_from_a_local_mirror(capsys, mnist_dir, tmp_path):
    """`looptune data mnist --download --mirror URL` fetches, verifies and lands all four files."""
    import functools
    import http.server
    import threading

    served = tmp_path / "served"
    served.mkdir()
    for name in mnist.NAMES:  # a mirror serves NAME.gz
        src = mnist.files(mnist_dir)[name]
        data = src.read_bytes() if src.suffix == ".gz" else __import__("gzip").compress(src.read_bytes())
        (served / f"{name}.gz").write_bytes(data)
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):  # keep pytest output clean
            pass

    handler = functools.partial(Quiet, directory=str(served))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        dest = tmp_path / "dest"
        code = main(["data", "mnist", "--download", "--data", str(dest), "--mirror",
                     f"http://127.0.0.1:{server.server_address[1]}/"])
    finally:
        server.shutdown()
    out = capsys.readouterr().out
    assert code == 0 and "verified" in out
    assert sorted(p.name for p in dest.iterdir()) == sorted(f"{n}.gz" for n in mnist.NAMES)


def test_bad_set_and_run_options_are_reported_together(capsys, tmp_path):
    code, err = _run(capsys, "--set", "step.precison=bf16", "--set", "optim.lr=fast",
                     "--target-accuracy", "97.5", "--resume", "--repeats", "0", "--data", str(tmp_path))
    assert code == 2
    for needle in ("--set 'step.precison=bf16' is invalid", "step.precision",
                   "'fast' is not a valid float", "target=97.5 for accuracy is invalid",
                   "--checkpoint DIR", "--repeats 0 is invalid"):
        assert needle in err


def test_cuda_graphs_on_cpu_is_refused_before_training(capsys, tmp_path):
    code, err = _run(capsys, "--recipes", "device", "--set", "step.cuda_graphs=true",
                     "--device", "cpu", "--data", str(tmp_path))
    assert code == 2 and "cuda_graphs=True needs a CUDA device" in err


def test_interrupted_run_exits_with_128_plus_signal(monkeypatch, capsys, mnist_dir):
    from looptune.engine.run_state import Interrupted

    def interrupted(**kwargs):
        raise Interrupted(15, "stopped by signal 15 after batch 7; checkpoint saved in X")

    monkeypatch.setattr(bench_cmd, "bench", interrupted)
    code = main(["bench", "mnist", "--recipes", "device", "--data", str(mnist_dir)])
    assert code == 143 and "stopped by signal 15" in capsys.readouterr().err


@pytest.fixture
def no_mnist_anywhere(monkeypatch, tmp_path):
    """No --data, no LOOPTUNE_DATA, an empty user cache."""
    monkeypatch.delenv(mnist.ENV_VAR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    mnist.clear_cache()
    return tmp_path / "cache" / "looptune" / "mnist"


def test_without_data_bench_mnist_downloads_it_verified_and_goes_on(mnist_dir, no_mnist_anywhere,
                                                                   monkeypatch, capsys):
    """issue 34: online, the main job just works: MNIST fetched into the user cache (here from a
    mirror on the loopback address serving the real files), then the run starts."""
    import functools
    import http.server
    import threading

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(mnist_dir))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(mnist, "DEFAULT_MIRRORS", (f"http://127.0.0.1:{server.server_port}/",))
    started = []
    monkeypatch.setattr(bench_cmd, "bench", lambda **kw: started.append(kw) or (_ for _ in ()).throw(
        KeyboardInterrupt))
    try:
        # the run started: stopped there (the CLI's Ctrl-C path: exit 130)
        assert main(["bench", "mnist", "--epochs", "1", "--recipes", "device"]) == 130
    finally:
        server.shutdown()
    err = capsys.readouterr().err
    assert f"downloading it into {no_mnist_anywhere}" in err
    assert f"MNIST downloaded and verified in {no_mnist_anywhere}" in err
    assert sorted(p.name for p in no_mnist_anywhere.glob("*.gz")) == sorted(
        f"{n}.gz" for n in mnist.NAMES)
    assert started and started[0]["data_dir"] is None


def test_offline_without_data_the_error_names_every_fix(no_mnist_anywhere, monkeypatch, capsys):
    monkeypatch.setattr(mnist, "DEFAULT_MIRRORS", ("http://127.0.0.1:9/",))  # nothing listens
    code, err = _run(capsys, "--epochs", "1")
    assert code == 2 and "could not be downloaded" in err
    for fix in ("--data DIR", "LOOPTUNE_DATA=DIR", "looptune data mnist --download"):
        assert fix in err
    assert not list(no_mnist_anywhere.glob("*.gz"))  # nothing partial left


def test_a_wrong_looptune_data_is_an_error_not_a_download(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv(mnist.ENV_VAR, str(tmp_path / "nowhere"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(mnist, "DEFAULT_MIRRORS", ("http://127.0.0.1:9/",))
    mnist.clear_cache()
    code, err = _run(capsys, "--epochs", "1")
    assert code == 2 and "MNIST files not found" in err and "downloading" not in err
