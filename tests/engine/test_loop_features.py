"""Time to accuracy, non-finite losses, checkpoints, resume after SIGKILL, SIGTERM."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

import looptune
from looptune.data.loaders import ImageData
from looptune.engine.run_state import Interrupted, NonFiniteLoss
from looptune.recipe import LoaderConfig, OptimConfig, Recipe

DEVICE = Recipe(name="dev", loss_sync="epoch",
                loader=LoaderConfig(strategy="device", decode="tensorized", batch_size=32),
                optim=OptimConfig(lr=1e-2))


def separable(n=512, seed=0) -> ImageData:
    """Labels given by a fixed linear rule: a small MLP learns it to ~100%."""
    x = torch.randn(n, 10, generator=torch.Generator().manual_seed(seed))
    w = torch.randn(10, 3, generator=torch.Generator().manual_seed(123))  # one rule for all splits
    return ImageData(images=x, labels=(x @ w).argmax(dim=1))


def mlp(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))


CE = torch.nn.functional.cross_entropy


def test_time_to_target_is_recorded_and_evaluation_excluded():
    res = looptune.train(mlp(), separable(), recipe=DEVICE, loss_fn=CE, eval_data=separable(256, 1),
                         device="cpu", epochs=4, target_accuracy=0.8, eval_every=8)
    assert res.time_to_target_s is not None and 0 < res.time_to_target_s <= res.wall_s + 1e-9
    assert res.target_accuracy == 0.8
    assert res.wall_s == pytest.approx(sum(res.epoch_s))
    evals = res.evals
    assert [e["batches"] for e in evals] == list(range(8, 65, 8))  # epoch ends coincide: no repeats
    assert res.eval_s == pytest.approx(sum(e["eval_s"] for e in evals))
    first_hit = next(e for e in evals if e["accuracy"] >= 0.8)
    assert res.time_to_target_s == pytest.approx(first_hit["train_s"])
    assert res.test_accuracy == evals[-1]["accuracy"]


def test_unreached_target_is_null():
    res = looptune.train(mlp(), separable(), recipe=DEVICE, loss_fn=CE, eval_data=separable(64, 1),
                         device="cpu", epochs=1, target_accuracy=1.0)
    assert res.time_to_target_s is None or res.evals[-1]["accuracy"] == 1.0


@pytest.mark.parametrize("loss_sync", ["step", "epoch"])
def test_nonfinite_loss_names_epoch_batch_and_samples(loss_sync):
    import dataclasses

    data = separable(256)
    images = data.images.clone()
    images[77] = float("nan")
    recipe = dataclasses.replace(DEVICE, loss_sync=loss_sync)
    with pytest.raises(NonFiniteLoss) as info:
        looptune.train(mlp(), ImageData(images=images, labels=data.labels), recipe=recipe, loss_fn=CE,
                       device="cpu", epochs=2)
    text = str(info.value)
    assert "epoch 0" in text and "77" in text and "Lower the learning rate" in text


def test_sigterm_finishes_the_step_saves_and_raises_143(tmp_path):
    calls = {"n": 0}

    def loss_fn(out, y):
        calls["n"] += 1
        if calls["n"] == 5:
            os.kill(os.getpid(), signal.SIGTERM)  # arrives mid-step; the step still completes
        return CE(out, y)

    with pytest.raises(Interrupted) as info:
        looptune.train(mlp(), separable(), recipe=DEVICE, loss_fn=loss_fn, device="cpu", epochs=3,
                       checkpoint_dir=tmp_path, checkpoint_every=100)
    assert info.value.exit_code == 143 and "--resume" in str(info.value)
    assert calls["n"] == 5  # stopped right after the step in which the signal arrived
    assert [p.name for p in tmp_path.glob("ckpt-*.pt")] == ["ckpt-000000005.pt"]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handlers restored


def test_bad_run_options_are_reported_together(tmp_path):
    with pytest.raises(looptune.ConfigError) as info:
        looptune.train(mlp(), separable(), recipe=DEVICE, loss_fn=CE, epochs=0, eval_every=0,
                       target_accuracy=1.5, resume=True)
    assert len(info.value.problems) == 4
    assert "--checkpoint DIR" in str(info.value)


CHILD = textwrap.dedent("""
    import os, signal, sys, torch
    sys.path.insert(0, {tests!r})
    import looptune
    from test_loop_features import separable, mlp, CE, DEVICE
    import dataclasses
    mode, folder, out = sys.argv[1], sys.argv[2], sys.argv[3]
    recipe = dataclasses.replace(DEVICE, loader=dataclasses.replace(DEVICE.loader, strategy={strategy!r}))
    calls = [0]
    def loss_fn(o, y):
        calls[0] += 1
        if mode == "die" and calls[0] == 23:
            os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, no handler: a hard crash
        return CE(o, y)
    model = mlp()
    looptune.train(model, separable(), recipe=recipe, loss_fn=loss_fn, device="cpu", epochs=3,
                   checkpoint_dir=folder if mode != "plain" else None,
                   checkpoint_every=5 if mode != "plain" else None, resume=mode == "resume")
    torch.save(model.state_dict(), out)
""")


@pytest.mark.parametrize("strategy", ["device", "dataloader"])
def test_sigkill_then_resume_ends_with_identical_weights(tmp_path, strategy):
    script = tmp_path / "child.py"
    tests_dir = os.path.dirname(__file__)
    script.write_text(CHILD.format(tests=tests_dir, strategy=strategy))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}

    def child(mode, out):
        return subprocess.run([sys.executable, str(script), mode, str(tmp_path / "ckpt"), str(out)],
                              env=env, capture_output=True, text=True, timeout=300)

    plain = child("plain", tmp_path / "plain.pt")
    assert plain.returncode == 0, plain.stderr
    died = child("die", tmp_path / "never.pt")
    assert died.returncode == -signal.SIGKILL and not (tmp_path / "never.pt").exists()
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("ckpt-*.pt")) == [
        "ckpt-000000015.pt", "ckpt-000000020.pt"]
    resumed = child("resume", tmp_path / "resumed.pt")
    assert resumed.returncode == 0, resumed.stderr
    a = torch.load(tmp_path / "plain.pt", weights_only=True)
    b = torch.load(tmp_path / "resumed.pt", weights_only=True)
    for name in a:
        assert torch.equal(a[name], b[name]), name  # bit for bit, not just close
