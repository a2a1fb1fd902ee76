"""The launcher's error names the failed rank; DDP's no_sync on accumulation micro-steps;
DDP-specific recipe resolution. In-process parts use a world-size-1 gloo group."""

from __future__ import annotations

import dataclasses
import os
import socket

import pytest
import torch
import torch.distributed as dist

from looptune.dist import context, ddp
from looptune.dist.launch import LaunchFailed, launch, nproc_problem
from looptune.engine.step import Stepper
from looptune.errors import ConfigError
from looptune.presets import get_recipe
from looptune.recipe import StepConfig
from looptune.resolve import resolve


def test_launch_failure_names_every_rank_and_its_reason(tmp_path):
    with pytest.raises(LaunchFailed) as err:
        launch(["bench", "mnist", "--epochs", "0", "--data", str(tmp_path)], nproc=2)
    text = str(err.value)
    assert "rank 0" in text and "rank 1" in text and "exit code 2" in text
    assert "ConfigError" in text and "epochs" in text  # the rank's own error, via the error file
    assert set(err.value.failures) == {0, 1}


def test_launch_failure_carries_the_recorded_exception(tmp_path, monkeypatch):
    (tmp_path / "badmod.py").write_text(
        "class Bad:\n"
        "    def __len__(self):\n        return 10\n"
        "    def __getitem__(self, i):\n        raise RuntimeError('decoder exploded at ' + str(i))\n"
        "def make():\n    return Bad()\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with pytest.raises(LaunchFailed, match="RuntimeError: decoder exploded at 0"):
        launch(["pack", "--dataset", "badmod:make", str(tmp_path / "out")], nproc=1)


def test_nproc_checked_before_launching():
    assert "must be an integer >= 1" in nproc_problem(0)
    with pytest.raises(ConfigError, match="--nproc 0 is invalid"):
        launch(["bench"], nproc=0)


@pytest.fixture
def group(monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for k, v in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(k, v)
    dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_accumulation_micro_steps_skip_the_all_reduce(group):
    model = ddp.wrap(torch.nn.Linear(4, 2), torch.device("cpu"),
                     context.DistContext(world_size=2, backend="gloo"))  # wrap as for 2 ranks
    assert isinstance(model, torch.nn.parallel.DistributedDataParallel)
    calls = []

    def counting_hook(state, bucket):
        calls.append(1)
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    model.register_comm_hook(None, counting_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step = Stepper(model=model, optimizer=opt, scheduler=None,
                   loss_fn=torch.nn.functional.cross_entropy,
                   cfg=StepConfig(accumulate=4), device=torch.device("cpu"))
    x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
    for i in range(8):
        step(x, y)
    assert len(calls) == 2  # one all-reduce per optimizer step, none on the 6 other micro-steps
    assert step.stats.optimizer_steps == 2


def test_a_callers_process_group_is_used_and_left_up(group):
    ctx = context.init(torch.device("cpu"), timeout_s=30)
    assert ctx.enabled and not ctx.owns_group and ctx.backend == "gloo"
    context.shutdown()
    assert dist.is_initialized()  # looptune did not create it, so it does not destroy it


def test_timeouts_must_be_finite_and_bounded():
    for bad in (0, -1, float("inf"), float("nan"), 1e13, True):
        assert "must be a finite number of seconds" in context.timeout_problem(bad)
    assert context.timeout_problem(300) is None


def test_unwrap_and_single_process_wrap_is_the_model():
    m = torch.nn.Linear(2, 2)
    assert ddp.wrap(m, torch.device("cpu"), context.DistContext()) is m
    assert ddp.unwrap(m) is m


def test_cuda_graphs_are_turned_off_with_a_reason_for_several_ranks():
    recipe = get_recipe("device")
    recipe = dataclasses.replace(recipe, step=dataclasses.replace(recipe.step, cuda_graphs=True))
    resolved, decisions = resolve(recipe, "cuda", world_size=2)
    assert resolved.step.cuda_graphs is False
    assert any(d.name == "cuda_graphs" and "DDP" in d.reason for d in decisions)
    resolved, _ = resolve(recipe, "cuda", world_size=1)
    assert resolved.step.cuda_graphs is True


def test_init_without_launcher_variables_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    for k in ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(ConfigError, match="start the job with torchrun"):
        context.init(torch.device("cpu"))
    monkeypatch.setenv("WORLD_SIZE", "x")
    with pytest.raises(ConfigError, match="WORLD_SIZE='x'"):
        context.env_world_size()
    monkeypatch.delenv("WORLD_SIZE")
    assert context.init(torch.device("cpu")).enabled is False
    assert os.environ.get("RANK") is None
