"""Faults around checkpoints: a SIGKILL mid-epoch or mid-write, a full disk, a read-only folder,
broken or foreign checkpoints, a resume under another recipe, a malicious pickle."""

import errno
import os
import pickle
import signal
import sys

import pytest
import torch

import looptune
from looptune.engine import checkpoint as ckpt

sys.path.insert(0, os.path.dirname(__file__))
import child_train
from faultkit import run_child


def _in_process(mode, variant, folder, out):
    """plain and resume runs need no fresh process: only the killed one does."""
    child_train.main(mode, variant, str(folder), str(out))


def _same(a_path, b_path):
    a, b = torch.load(a_path, weights_only=True), torch.load(b_path, weights_only=True)
    for name in a["model"]:
        assert torch.equal(a["model"][name], b["model"][name]), name  # bit for bit
    assert a["epoch_loss"] == b["epoch_loss"]  # the resumed epoch's loss too, exactly


@pytest.mark.parametrize("variant", sorted(child_train.VARIANTS))
def test_sigkill_mid_epoch_then_resume_is_bit_identical(tmp_path, variant):
    _in_process("plain", variant, tmp_path / "none", tmp_path / "plain.pt")
    died = run_child("die", variant, tmp_path / "ckpt", tmp_path / "never.pt")
    assert died.returncode == -signal.SIGKILL and not (tmp_path / "never.pt").exists()
    names = sorted(p.name for p in (tmp_path / "ckpt").glob("ckpt-*.pt"))
    assert names[-1] in {"ckpt-000000020.pt", "ckpt-000000010.pt"}, names  # 10: accumulate 2
    _in_process("resume", variant, tmp_path / "ckpt", tmp_path / "resumed.pt")
    _same(tmp_path / "plain.pt", tmp_path / "resumed.pt")


def test_sigkill_while_writing_a_checkpoint_keeps_the_previous_one(tmp_path):
    folder = tmp_path / "ckpt"
    died = run_child("killsave", "device", folder, tmp_path / "never.pt")
    assert died.returncode == -signal.SIGKILL
    assert [p.name for p in folder.glob("ckpt-*.pt")] == ["ckpt-000000005.pt"]
    strays = list(folder.glob(".ckpt-*.tmp"))
    assert len(strays) == 1 and strays[0].stat().st_size > 0  # the half-written file
    state, path, skipped = ckpt.latest_checkpoint(folder)
    assert path.name == "ckpt-000000005.pt" and not skipped  # the temp is never a candidate
    _in_process("resume", "device", folder, tmp_path / "resumed.pt")
    assert not list(folder.glob(".ckpt-*.tmp"))  # the next save removed it
    _in_process("plain", "device", tmp_path / "none", tmp_path / "plain.pt")
    _same(tmp_path / "plain.pt", tmp_path / "resumed.pt")


def _train(folder, **kw):
    return looptune.train(child_train.model(), child_train.data(), recipe=child_train.BASE,
                          loss_fn=torch.nn.functional.cross_entropy, device="cpu",
                          checkpoint_dir=folder, checkpoint_every=5, **kw)


def test_disk_full_at_a_save_names_the_folder_and_keeps_the_previous_checkpoint(tmp_path,
                                                                                monkeypatch):
    folder = tmp_path / "ckpt"
    _train(folder, epochs=1)  # 16 steps: ckpt 10 and 15
    before = {p.name: p.read_bytes() for p in folder.glob("ckpt-*.pt")}
    real = os.fdopen

    def full(fd, *a, **k):
        f = real(fd, *a, **k)

        def write(_data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        f.write = write
        return f

    monkeypatch.setattr("looptune._io.os.fdopen", full)
    with pytest.raises(looptune.LooptuneError) as info:
        _train(folder, epochs=2, resume=True)
    text = str(info.value)
    assert str(folder) in text and "No space left on device" in text
    assert "ckpt-000000015.pt" in text and "intact" in text  # what survives, and the fix
    assert {p.name: p.read_bytes() for p in folder.glob("ckpt-*.pt")} == before
    assert not list(folder.glob(".ckpt-*"))


def test_read_only_checkpoint_folder_is_refused_before_training(tmp_path, monkeypatch):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    if os.geteuid() == 0:  # root writes through 0o555: make the probe write fail as EROFS would
        def read_only(*a, **k):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        monkeypatch.setattr("looptune._io.tempfile.mkstemp", read_only)
    else:
        folder.chmod(0o555)
    steps = []

    def loss_fn(o, y):
        steps.append(1)
        return torch.nn.functional.cross_entropy(o, y)

    with pytest.raises(looptune.ConfigError) as info:
        looptune.train(child_train.model(), child_train.data(), recipe=child_train.BASE,
                       loss_fn=loss_fn, device="cpu", epochs=1, checkpoint_dir=folder,
                       checkpoint_every=5)
    folder.chmod(0o755)
    assert not steps  # refused before the first step
    assert str(folder) in str(info.value) and "cannot be written" in str(info.value)


@pytest.mark.parametrize("damage", ["truncated", "flipped", "foreign", "empty"])
def test_a_broken_newest_checkpoint_is_skipped_naming_why(tmp_path, damage):
    folder = tmp_path / "ckpt"
    _train(folder, epochs=1)
    newest = folder / "ckpt-000000015.pt"
    data = newest.read_bytes()
    newest.write_bytes({"truncated": data[: len(data) // 2],
                        "flipped": data[:-100] + bytes([data[-100] ^ 1]) + data[-99:],
                        "foreign": pickle.dumps({"model": "someone else's"}),
                        "empty": b""}[damage])
    with pytest.warns(UserWarning, match="skipped checkpoint .*ckpt-000000015.pt") as seen:
        result = _train(folder, epochs=2, resume=True)
    assert result.resumed_from.endswith("ckpt-000000010.pt")
    assert any(w in str(seen[0].message) for w in ("truncated", "corrupt", "not a looptune",
                                                      "checksum", "header"))


@pytest.mark.parametrize("change, needle", [
    ({"loader": {"batch_size": 16}}, "loader.batch_size is 16 but the checkpoint was written "
                                     "with 32"),
    ({"optim": {"name": "sgd"}}, "optim.name is 'sgd' but the checkpoint was written with 'adam'"),
    ({"step": {"accumulate": 2}}, "step.accumulate is 2"),
    ({"schedule": {"name": "cosine"}}, "schedule.name is 'cosine'"),
])
def test_resume_under_another_recipe_is_refused_naming_the_field(tmp_path, change, needle):
    import dataclasses

    folder = tmp_path / "ckpt"
    _train(folder, epochs=1)
    parts = {"loader": child_train.BASE.loader, "optim": child_train.BASE.optim,
             "step": child_train.BASE.step, "schedule": child_train.BASE.schedule}
    other = dataclasses.replace(child_train.BASE, **{
        k: dataclasses.replace(parts[k], **v) for k, v in change.items()})
    with pytest.raises(looptune.ConfigError) as info:
        looptune.train(child_train.model(), child_train.data(), recipe=other,
                       loss_fn=torch.nn.functional.cross_entropy, device="cpu", epochs=2,
                       checkpoint_dir=folder, resume=True)
    assert needle in str(info.value) and "new --checkpoint folder" in str(info.value)


def test_resume_with_another_model_shape_is_refused_naming_the_tensor(tmp_path):
    folder = tmp_path / "ckpt"
    _train(folder, epochs=1)
    wider = torch.nn.Sequential(torch.nn.Linear(10, 64), torch.nn.ReLU(), torch.nn.Linear(64, 3))
    with pytest.raises(looptune.ConfigError, match=r"0\.weight: \(32, 10\) in the checkpoint, "
                                                   r"\(64, 10\) in the model"):
        looptune.train(wider, child_train.data(), recipe=child_train.BASE,
                       loss_fn=torch.nn.functional.cross_entropy, device="cpu", epochs=2,
                       checkpoint_dir=folder, resume=True)


def test_changed_speed_settings_resume_and_are_recorded(tmp_path):
    import dataclasses

    folder = tmp_path / "ckpt"
    _train(folder, epochs=1)
    faster = dataclasses.replace(child_train.BASE, optim=dataclasses.replace(
        child_train.BASE.optim, lr=5e-3))
    result = looptune.train(child_train.model(), child_train.data(), recipe=faster,
                            loss_fn=torch.nn.functional.cross_entropy, device="cpu", epochs=2,
                            checkpoint_dir=folder, resume=True)
    (change,) = [d for d in result.decisions if d["name"] == "resume_changes"]
    assert change["value"] == ["optim.lr 0.01 -> 0.005"]


class _Payload:
    """Unpickling this creates a file: the proof that a checkpoint's code would have run."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_checkpoints_load_with_weights_only_and_a_malicious_pickle_never_runs(tmp_path):
    folder = tmp_path / "ckpt"
    _train(folder, epochs=1)
    for path in folder.glob("ckpt-*.pt"):  # plain torch.load(weights_only=True) reads ours
        assert "model" in ckpt.load_checkpoint(path)
    evil_flag = tmp_path / "pwned"
    torch.save({"model": _Payload(str(evil_flag))}, folder / "ckpt-000000099.pt")
    with pytest.warns(UserWarning, match="ckpt-000000099.pt"):
        result = _train(folder, epochs=2, resume=True)
    assert not evil_flag.exists()  # refused without executing
    assert result.resumed_from.endswith("ckpt-000000015.pt")
    # framed like ours (valid header and checksum) but carrying the payload: refused as well
    framed = ckpt._frame(pickle.dumps({"model": _Payload(str(evil_flag))}), 100)
    (folder / "ckpt-000000100.pt").write_bytes(framed)
    with pytest.raises(looptune.DataError):
        ckpt.load_checkpoint(folder / "ckpt-000000100.pt")
    assert not evil_flag.exists()


def test_ranks_that_see_different_newest_checkpoints_are_refused(tmp_path):
    """Every rank picks the newest valid checkpoint itself; if the folder looks different to
    another rank (not shared, or a write in flight), they would continue from different steps:
    refused, naming what each rank found."""
    from types import SimpleNamespace

    from looptune.engine.loop import _Training

    folder = tmp_path / "ckpt"
    _train(folder, epochs=1)
    seen = []

    class TwoRanks:  # this rank found the newest file; rank 1 reports an older one
        world_size = 2

        def gather(self, obj):
            seen.append(obj)
            return [obj, "ckpt-000000010.pt"]

    fake = SimpleNamespace(options=SimpleNamespace(checkpoint_dir=folder), device="cpu",
                           ctx=TwoRanks(), decisions=[])
    with pytest.raises(looptune.ConfigError) as err:
        _Training._resume(fake)
    assert seen == ["ckpt-000000015.pt"]
    assert "rank 0: ckpt-000000015.pt, rank 1: ckpt-000000010.pt" in str(err.value)
    assert "shared" in str(err.value)
