import io
import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from looptune.engine import checkpoint as ckpt
from looptune.engine.checkpoint import (
    FORMAT_VERSION,
    latest_checkpoint,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from looptune.errors import ConfigError, DataError


def _parts():
    """A tiny model, Adam after 2 steps, LambdaLR and a CPU GradScaler, as in the training loop."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda epoch: 0.5 ** epoch)
    scaler = torch.amp.GradScaler("cpu")
    for _ in range(2):
        loss = model(torch.randn(4, 3)).pow(2).mean()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        sched.step()
    return model, opt, sched, scaler


def _state(step=7):
    model, opt, sched, scaler = _parts()
    return {
        "model": model.state_dict(), "optimizer": opt.state_dict(),
        "scheduler": sched.state_dict(), "scaler": scaler.state_dict(), "rng": rng_state(),
        "epoch": 1, "batch_in_epoch": 3, "global_step": step,
        "loss_sum": 1.25, "loss_acc": torch.tensor(0.5, dtype=torch.float64),
        "recipe": {"name": "seed-baseline", "lr": 1e-3, "betas": (0.9, 0.999), "workers": None},
    }


def _assert_same(a, b, where="state"):
    assert type(a) is type(b), f"{where}: {type(a)} != {type(b)}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.device == b.device, where
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for key in a:
            _assert_same(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def _two(tmp_path):
    """Checkpoints at steps 1 and 2 holding {'step': n}; returns their paths."""
    return [save_checkpoint(tmp_path, {"step": n}, step=n) for n in (1, 2)]


def _temps(folder: Path):
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


# ---------------------------------------------------------------------------------- round trip

def test_realistic_state_round_trips_and_restores_into_fresh_objects(tmp_path):
    state = _state()
    path = save_checkpoint(tmp_path / "run", state, step=7)
    assert path == tmp_path / "run" / "ckpt-000000007.pt"
    loaded, found, skipped = latest_checkpoint(tmp_path / "run")
    assert found == path and skipped == []
    _assert_same(state, loaded)
    model, opt, sched, scaler = _parts()  # fresh objects accept the loaded state_dicts
    model.load_state_dict(loaded["model"])
    opt.load_state_dict(loaded["optimizer"])
    sched.load_state_dict(loaded["scheduler"])
    scaler.load_state_dict(loaded["scaler"])
    assert scaler.get_scale() == state["scaler"]["scale"]


def test_payload_loads_with_plain_torch_load_weights_only(tmp_path, monkeypatch):
    seen = {}
    real_load = torch.load

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    save_checkpoint(tmp_path, _state(), step=1)
    latest_checkpoint(tmp_path)
    assert seen["weights_only"] is True and seen["map_location"] == "cpu"


def test_rng_state_round_trip_through_a_checkpoint_restores_every_generator(tmp_path):
    random.gauss(0, 1)  # leaves a cached second normal in both generators' state
    np.random.standard_normal()
    save_checkpoint(tmp_path, {"rng": rng_state()}, step=0)
    expected = (torch.rand(3), random.random(), random.gauss(0, 1), np.random.rand(3),
                np.random.standard_normal())
    torch.rand(100), random.random(), np.random.rand(100)  # move every generator on
    state, _, _ = latest_checkpoint(tmp_path)
    set_rng_state(state["rng"])
    got = (torch.rand(3), random.random(), random.gauss(0, 1), np.random.rand(3),
           np.random.standard_normal())
    assert torch.equal(got[0], expected[0])
    assert got[1:3] == expected[1:3]
    assert np.array_equal(got[3], expected[3]) and got[4] == expected[4]


def test_rng_state_holds_only_plain_types():
    state = rng_state()
    assert state["torch_cpu"].dtype == torch.uint8
    assert isinstance(state["python"]["internal"], list)
    assert all(type(v) is int for v in state["python"]["internal"])
    assert all(type(v) is int for v in state["numpy"]["state"]["key"])
    assert type(state["numpy"]["state"]["pos"]) is int


def test_set_rng_state_rejects_other_dicts_with_the_fix():
    with pytest.raises(ConfigError, match=r"lacks \['numpy'\].*rng_state\(\)"):
        set_rng_state({"torch_cpu": torch.get_rng_state(), "torch_cuda": [], "python": {}})


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only fallback")
def test_cuda_rng_states_on_a_cpu_only_machine_warn_and_the_rest_is_restored():
    state = rng_state()
    expected = torch.rand(2)
    state["torch_cuda"] = [torch.zeros(16, dtype=torch.uint8)]
    with pytest.warns(UserWarning, match="1 CUDA RNG states but CUDA is not available"):
        set_rng_state(state)
    assert torch.equal(torch.rand(2), expected)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensors_and_rng_load_on_cpu_and_restore(tmp_path):
    torch.cuda.init()
    state = {"w": torch.arange(4.0, device="cuda"), "rng": rng_state()}
    assert len(state["rng"]["torch_cuda"]) == torch.cuda.device_count()
    expected = torch.rand(3, device="cuda")
    save_checkpoint(tmp_path, state, step=0)
    loaded, _, _ = latest_checkpoint(tmp_path)  # map_location="cpu"
    assert loaded["w"].device.type == "cpu" and torch.equal(loaded["w"], torch.arange(4.0))
    on_gpu, _, _ = latest_checkpoint(tmp_path, map_location="cuda")
    set_rng_state(on_gpu["rng"])  # RNG tensors moved to CUDA by map_location still restore
    assert torch.equal(torch.rand(3, device="cuda"), expected)


# ------------------------------------------------------------------------------------- pruning

def test_keep_2_prunes_older_checkpoints_newest_kept(tmp_path):
    for step in (10, 20, 30, 40):
        save_checkpoint(tmp_path, {"step": step}, step=step)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-000000030.pt", "ckpt-000000040.pt"]
    save_checkpoint(tmp_path, {"step": 50}, step=50, keep=1)
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt-000000050.pt"]


def test_checkpoints_with_a_higher_step_are_kept_with_a_warning(tmp_path):
    save_checkpoint(tmp_path, {"step": 500}, step=500)
    with pytest.warns(UserWarning, match=r"step above 3.*ckpt-000000500\.pt.*fresh folder"):
        path = save_checkpoint(tmp_path, {"step": 3}, step=3, keep=1)
    assert path.exists() and (tmp_path / "ckpt-000000500.pt").exists()


# ------------------------------------------------------------------------- damage is detected

@pytest.mark.parametrize("cut", ["0", "1", "half", "len-1"])
def test_truncated_newest_is_skipped_with_a_reason_and_the_older_one_used(tmp_path, cut):
    older, newest = _two(tmp_path)
    data = newest.read_bytes()
    length = {"0": 0, "1": 1, "half": len(data) // 2, "len-1": len(data) - 1}[cut]
    newest.write_bytes(data[:length])
    state, path, skipped = latest_checkpoint(tmp_path)
    assert state == {"step": 1} and path == older
    assert [p for p, _ in skipped] == [newest]
    reason = skipped[0][1]
    assert str(newest) in reason and "not loaded" in reason
    assert ("truncated" in reason) or ("frame line" in reason)


@pytest.mark.parametrize("where", [0, 30, 100, "middle", -1])
def test_a_flipped_byte_anywhere_is_detected(tmp_path, where):
    older, newest = _two(tmp_path)
    data = bytearray(newest.read_bytes())
    index = len(data) // 2 if where == "middle" else where
    data[index] ^= 0x01
    newest.write_bytes(bytes(data))
    with pytest.raises(DataError, match="not loaded"):
        load_checkpoint(newest)
    state, path, skipped = latest_checkpoint(tmp_path)
    assert path == older and [p for p, _ in skipped] == [newest]


def test_wrong_version_names_both_versions_and_the_fix(tmp_path, monkeypatch):
    older, _ = _two(tmp_path)
    monkeypatch.setattr(ckpt, "FORMAT_VERSION", 99)
    future = save_checkpoint(tmp_path, {"step": 3}, step=3, keep=3)
    monkeypatch.undo()
    with pytest.raises(DataError) as err:
        load_checkpoint(future)
    message = str(err.value)
    assert "version 99" in message and f"reads version {FORMAT_VERSION}" in message
    assert "looptune release that wrote it" in message and str(future) in message
    state, path, skipped = latest_checkpoint(tmp_path)
    assert state == {"step": 2} and skipped == [(future, message)]
    assert older.exists()


def test_intact_file_with_types_weights_only_refuses_is_skipped(tmp_path):
    _, newest = _two(tmp_path)
    buffer = io.BytesIO()
    torch.save({"a": np.zeros(2)}, buffer)  # written by something other than save_checkpoint
    bad = tmp_path / "ckpt-000000009.pt"
    bad.write_bytes(ckpt._frame(buffer.getvalue(), 9))
    state, path, skipped = latest_checkpoint(tmp_path)
    assert state == {"step": 2} and path == newest
    assert skipped[0][0] == bad and "weights_only" in skipped[0][1]


def test_nothing_valid_or_nothing_there(tmp_path):
    assert latest_checkpoint(tmp_path / "missing") == (None, None, [])
    assert latest_checkpoint(tmp_path) == (None, None, [])
    (tmp_path / "ckpt-000000001.pt").write_bytes(b"")
    state, path, skipped = latest_checkpoint(tmp_path)
    assert (state, path) == (None, None) and len(skipped) == 1


# ------------------------------------------------------------------------------- atomic writes

def test_stray_temp_file_is_ignored_then_cleaned_up_by_the_next_save(tmp_path):
    older, newest = _two(tmp_path)
    stray = tmp_path / ".ckpt-000000003.pt.abc123.tmp"
    stray.write_bytes(newest.read_bytes()[:50])
    state, path, skipped = latest_checkpoint(tmp_path)
    assert path == newest and skipped == []
    save_checkpoint(tmp_path, {"step": 3}, step=3)
    assert not stray.exists() and _temps(tmp_path) == []


@pytest.mark.parametrize("failing", ["replace", "fsync"])
def test_a_failed_write_keeps_the_previous_checkpoint_and_leaves_no_temp(tmp_path, monkeypatch,
                                                                         failing):
    older, newest = _two(tmp_path)
    before = newest.read_bytes()

    def boom(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, failing, boom)
    with pytest.raises(OSError, match="No space left"):
        save_checkpoint(tmp_path, {"step": 3}, step=3)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == [older.name, newest.name]  # no prune
    assert newest.read_bytes() == before
    state, path, _ = latest_checkpoint(tmp_path)
    assert state == {"step": 2} and path == newest


def test_resaving_the_same_step_replaces_it(tmp_path):
    save_checkpoint(tmp_path, {"v": 1}, step=5)
    save_checkpoint(tmp_path, {"v": 2}, step=5)
    assert latest_checkpoint(tmp_path)[0] == {"v": 2}


# ------------------------------------------------------------------------------ bad arguments

def test_bad_arguments_are_all_reported_with_the_fix(tmp_path):
    afile = tmp_path / "notes.txt"
    afile.write_text("x")
    with pytest.raises(ConfigError) as err:
        save_checkpoint(afile, [1], step=-1, keep=0)
    problems = err.value.problems
    assert len(problems) == 4
    assert "is a file, not a folder" in problems[0] and "notes.txt" in problems[0]
    assert "state=list is invalid: must be a dict" in problems[1]
    assert "step=-1 is invalid: must be an int >= 0" in problems[2]
    assert "keep=0 is invalid: must be an int >= 1. Use keep=2" in problems[3]
    with pytest.raises(ConfigError, match="is a file, not a folder"):
        latest_checkpoint(afile)
    with pytest.raises(ConfigError, match=r"step=True is invalid"):
        save_checkpoint(tmp_path, {}, step=True)
    with pytest.raises(ConfigError, match=r"keep=1.5 is invalid"):
        save_checkpoint(tmp_path, {}, step=1, keep=1.5)
    assert _temps(tmp_path) == [] and not list(tmp_path.glob("ckpt-*"))


def test_state_that_could_not_be_resumed_is_refused_before_writing(tmp_path):
    with pytest.raises(ConfigError, match=r"refuses: \[.*numpy.*\].*torch.from_numpy"):
        save_checkpoint(tmp_path, {"a": np.arange(3)}, step=1)
    with pytest.raises(ConfigError, match=r"cannot be saved .*plain data"):
        save_checkpoint(tmp_path, {"f": lambda: 1}, step=1)
    assert list(tmp_path.iterdir()) == []
