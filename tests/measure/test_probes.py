import io
import time
import types

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from looptune.measure.probe_hooks import targets_cuda
from looptune.measure.probes import StepProbes, StopScript


def _train(steps_to_stop=None, batch_size=16):
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.randn(128, 4), torch.randint(0, 2, (128,)))
    for x, y in DataLoader(data, batch_size=batch_size):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


def test_one_sample_per_optimizer_step_with_data_wait_and_loader_settings():
    with StepProbes() as probes:
        _train()
    assert probes.steps == 8 and len(probes.samples) == 8
    assert all(s.step_s > 0 and 0 <= s.data_wait_s <= s.step_s for s in probes.samples)
    (info,) = probes.loaders.values()
    assert (info.batch_size, info.num_workers, info.dataset) == (16, 0, "TensorDataset")
    assert info.batch_bytes == 16 * (4 * 4 + 8)


class _Jitter(torch.utils.data.Dataset):
    """A per-sample random transform, as an augmenting Dataset applies one."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.full((4,), float(i)) + torch.randn(4), i % 2


def test_a_random_per_sample_transform_is_detected_without_moving_the_rng():
    def run(dataset):
        torch.manual_seed(0)
        with StepProbes() as probes:
            model = torch.nn.Linear(4, 2)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for x, y in DataLoader(dataset, batch_size=16):
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
        (info,) = probes.loaders.values()
        return info, torch.randn(1)  # the script's random stream after the run

    random_info, after = run(_Jitter())
    assert random_info.random_per_sample is True
    torch.manual_seed(0)  # the same run without probes: the same random stream
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in DataLoader(_Jitter(), batch_size=16):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    assert torch.equal(torch.randn(1), after)
    plain, _ = run(TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,))))
    assert plain.random_per_sample is False


def test_on_step_can_stop_the_loop_and_everything_is_restored():
    seen = []

    def stop(n):
        seen.append(n)
        if n == 3:
            raise StopScript

    with pytest.raises(StopScript):
        with StepProbes(on_step=stop):
            _train()
    assert seen == [1, 2, 3]
    assert "item" not in torch.Tensor.__dict__ and "__next__" in type(iter(DataLoader([1]))).__mro__[1].__dict__
    assert torch.Tensor.__repr__.__name__ == "__repr__" and torch.Tensor.__repr__.__module__ == "torch._tensor"


def test_sync_probe_counts_accelerator_tensors_only_and_not_nested():
    probes = StepProbes()
    calls = []
    probe = probes._sync_probe("item")(lambda t, *a, **k: calls.append(t) or 1.0)
    gpu_like = types.SimpleNamespace(device=torch.device("cuda"))
    probe(gpu_like)
    probe(torch.ones(()))  # a CPU tensor: nothing to wait for
    assert probes._syncs == 1 and len(calls) == 2
    probes._in_data = True  # a read inside the data loader is data wait already
    probe(gpu_like)
    assert probes._syncs == 1


def test_h2d_probe_counts_bytes_and_pageable_memory():
    probes = StepProbes()
    probe = probes._h2d_probe("to")(lambda t, *a, **k: t)
    x = torch.ones(10, dtype=torch.float32)
    probe(x, "cuda", non_blocking=True)
    probe(x, torch.float64)  # a dtype change, not a copy to a GPU
    assert probes._h2d_bytes == 40 and probes._pageable == 40


def test_targets_cuda_parses_to_arguments():
    assert targets_cuda("to", ("cuda:0",), {}) and targets_cuda("cuda", (), {})
    assert not targets_cuda("to", (torch.float16,), {})
    assert targets_cuda("to", (), {"device": "cuda"})


def test_update_probes_go_on_only_for_scripts_without_a_torch_optimizer():
    original = torch.Tensor.add_
    model = torch.nn.Linear(4, 2)
    with StepProbes():
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.randn(3, 4)).sum().backward()
        opt.step()
        assert torch.Tensor.add_ is original  # a torch.optim script: no in-place op is wrapped
    with StepProbes() as probes:
        model(torch.randn(3, 4)).sum().backward()
        assert torch.Tensor.add_ is not original
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-0.1)
        # the first update shows the backward was not a step: counting starts again from it
        assert probes.signal == "parameter update" and probes.steps == 0
        model(torch.randn(3, 4)).sum().backward()
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-0.1)
        assert probes.steps == 1
    assert torch.Tensor.add_ is original  # restored


def test_accumulation_by_hand_restarts_the_count_once_and_then_steps_on_updates():
    """4 backward calls per update: until the first update the probes count backward calls;
    then they drop those samples (the restart hook runs once) and every step is update to
    update, 4 micro-batches each, none cut at a backward."""
    model = torch.nn.Linear(4, 2)
    restarts, steps_seen = [], []
    with StepProbes(on_step=steps_seen.append, on_restart=lambda: restarts.append(1),
                    first_step_timeout_s=0.0) as probes:  # a boundary was seen: no deadline
        for update in range(4):
            for micro in range(4):
                model(torch.randn(3, 4)).sum().backward()
                if update == 0:
                    assert probes.signal == "backward" and probes.steps == micro + 1
            with torch.no_grad():
                for p in model.parameters():
                    p.sub_(0.01 * p.grad)
                    p.grad = None
    assert restarts == [1] and probes.signal == "parameter update"
    assert probes.steps == len(probes.samples) == 3  # updates 2, 3 and 4 end steps 1, 2, 3
    assert steps_seen == [1, 2, 3, 4, 1, 2, 3] and probes.boundaries == 8
    assert probes.gave_up is None


class _Slow(torch.nn.Module):
    """A linear layer whose forward takes at least ``pause`` seconds."""

    def __init__(self, pause: float):
        super().__init__()
        self.fc, self.pause = torch.nn.Linear(4, 2), pause

    def forward(self, x):
        time.sleep(self.pause)
        return self.fc(x)


def test_time_model_spans_forward_to_backward_and_nothing_outside_it():
    import copy

    fwd, outside, evaluation = 0.004, 0.006, 0.008
    model = _Slow(fwd)
    x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
    with StepProbes() as probes:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)  # built inside: optimizer.step ends steps
        for step in range(6):
            if step == 1:  # the model is known from here on (diagnose: after the FLOP step)
                probes.time_model(model)
                assert copy.deepcopy(model)._forward_pre_hooks  # shared, not the probes copied
                saved = io.BytesIO()
                torch.save(model, saved)  # a script's whole-module checkpoint still pickles
                saved.seek(0)
                loaded = torch.load(saved, weights_only=False)
                loaded.pause = 0.0
                loaded(x)  # its copy of the hook does nothing
            with torch.no_grad():  # an evaluation forward: not training work
                model.pause = evaluation
                model(x)
                model.pause = fwd
            opt.zero_grad()
            for _ in range(2):  # two micro-batches per step: both spans, not the pause between
                torch.nn.functional.cross_entropy(model(x), y).backward()
                time.sleep(outside)
            opt.step()
    assert not model._forward_pre_hooks  # removed with the probes
    first, *timed = probes.samples
    assert first.model_s is None and len(timed) == 5
    for s in timed:
        assert s.model_s >= 2 * fwd  # both forwards ...
        assert s.step_s - s.model_s >= 2 * outside + evaluation  # ... and none of the rest


def test_time_model_stops_at_a_restart_and_for_looptunes_own_work():
    model = torch.nn.Linear(4, 2)
    x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
    with StepProbes() as probes:
        probes.time_model(model)
        probes.paused = True  # the replay: its forward and backward are not the script's
        torch.nn.functional.cross_entropy(model(x), y).backward()
        assert probes._model_t0 is None and probes._model == 0.0
        probes.paused = False
        probes._restart()  # the steps so far were micro-batches: the model is captured again
        assert not model._forward_pre_hooks


# --- the step's parts ------------------------------------------------------------------------

class _Sleepy(torch.nn.Module):
    """forward sleeps 15 ms, its backward 25 ms (through an autograd Function)."""

    class _Slow(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            time.sleep(0.025)
            return g

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 2)

    def forward(self, x):
        time.sleep(0.015)
        return self._Slow.apply(self.lin(x))


class _SlowSGD(torch.optim.SGD):
    def step(self, closure=None):
        time.sleep(0.020)
        return super().step(closure)


def _parts_run(steps=4):
    with StepProbes() as probes:  # the optimizer is built inside, as a script's is
        model = _Sleepy()
        opt = _SlowSGD(model.parameters(), lr=0.1)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: time.sleep(0.010) or 1.0)
        scaler = torch.amp.GradScaler("cpu")
        probes.time_model(model)
        for _ in range(steps):
            opt.zero_grad(set_to_none=False)
            loss = model(torch.randn(8, 4)).square().mean()
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(opt)  # calls opt.step inside: charged to "optimizer", not to both
            scaler.update()
            sched.step()
    return probes


def test_each_part_of_the_step_is_timed_where_it_runs_and_only_once():
    probes = _parts_run()
    assert probes.steps == 4 and probes.zero_grad_kept
    ms = 1e3
    for s in probes.samples[1:]:  # the first step starts at the probes' start
        p = {k: v * ms for k, v in s.parts_s.items()}
        assert 15 <= p["forward"] < 15 + 12, p
        assert 25 <= p["backward"] < 25 + 12, p
        assert 20 <= p["optimizer"] < 20 + 12, p  # the step inside GradScaler.step
        assert p["grad_scaler"] < 12, p  # unscale_/step/update without the optimizer's 20 ms
        assert 10 <= p["lr_scheduler"] < 10 + 12, p
        assert p["clip_grad"] < 12 and "zero_grad" in p, p
        # exclusive: the parts never add up to more than the step
        assert sum(s.parts_s.values()) <= s.step_s + 1e-6
    # per step: the loss each backward started from
    losses = probes.losses()
    assert len(losses) == 4 and all(v is not None and v > 0 for v in losses)


def test_set_to_none_zero_grad_is_not_flagged_and_patches_are_restored():
    names = ("clip_grad_norm_", "clip_grad_value_")
    before = [getattr(torch.nn.utils, n) for n in names] + [torch.optim.Optimizer.zero_grad]
    with StepProbes() as probes:
        _train()
    assert not probes.zero_grad_kept and probes.steps == 8
    assert all("optimizer" in s.parts_s for s in probes.samples)
    after = [getattr(torch.nn.utils, n) for n in names] + [torch.optim.Optimizer.zero_grad]
    assert after == before


def test_a_second_optimizer_neither_splits_the_step_nor_is_dropped_from_its_time():
    with StepProbes() as probes:
        g, d = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
        opt_g = torch.optim.SGD(g.parameters(), lr=0.01)
        opt_d = _SlowSGD(d.parameters(), lr=0.01)
        for _ in range(5):  # a GAN's iteration: the discriminator's step, then the generator's
            opt_d.zero_grad()
            d(g(torch.randn(8, 4)).detach()).mean().backward()
            opt_d.step()
            opt_g.zero_grad()
            (-d(g(torch.randn(8, 4)))).mean().backward()
            opt_g.step()
    # the first optimizer to step (D) marks the step; G's step is part of it, both are "optimizer"
    assert probes.steps == 5
    assert all(s.parts_s["optimizer"] >= 0.020 for s in probes.samples[1:])
    assert sum(s.step_s for s in probes.samples[1:]) >= 4 * 0.020


def test_an_optimizer_step_that_raised_does_not_hide_the_steps_after_it():
    class Flaky(torch.optim.SGD):
        calls = 0

        def step(self, closure=None):
            Flaky.calls += 1
            if Flaky.calls == 2:
                raise RuntimeError("planted")
            return super().step(closure)

    with StepProbes() as probes:
        torch.optim.SGD([torch.zeros(1, requires_grad=True)])  # SGD.step is hooked too
        model = torch.nn.Linear(4, 1)
        opt = Flaky(model.parameters(), lr=0.01)
        for _ in range(5):
            model(torch.randn(2, 4)).sum().backward()
            try:
                opt.step()
            except RuntimeError:
                pass
    assert probes.steps == 4
