"""The script's optimizer step replayed per implementation on copies (diagnose.update_replay)."""

from __future__ import annotations

import torch

from looptune.diagnose import update_replay
from looptune.diagnose.update_replay import (current_impl, described_update, impl_kwargs,
                                             measure_update)

CPU = torch.device("cpu")


def _trained(opt_cls=torch.optim.AdamW, **kw):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt = opt_cls(model.parameters(), lr=1e-3, **kw)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(8, 64)).square().mean().backward()
        opt.step()
    return model, opt


def test_every_implementation_is_timed_on_copies_and_the_script_is_untouched(monkeypatch):
    monkeypatch.setattr(update_replay, "MIN_TIME_S", 0.005)
    model, opt = _trained()
    params = [p.detach().clone() for p in model.parameters()]
    grads = [p.grad.clone() for p in model.parameters()]
    state = {k: {n: (v.clone() if torch.is_tensor(v) else v) for n, v in s.items()}
             for k, s in enumerate(opt.state.values())}
    r = measure_update(opt, CPU)
    assert (r.optimizer, r.impl, r.params) == ("AdamW", "for-loop", 4)
    assert r.elements == 64 * 64 + 64 + 64 * 4 + 4
    assert set(r.step_s) == {"for-loop", "foreach", "fused"} and all(t > 0 for t in r.step_s.values())
    assert r.best in r.step_s and r.step_s[r.best] == min(r.step_s.values())
    assert 0 < r.dispatch_s and r.note is None
    # the script's parameters, gradients and optimizer state are as they were
    assert all(torch.equal(a, b) for a, b in zip(params, model.parameters()))
    assert all(torch.equal(a, p.grad) for a, p in zip(grads, model.parameters()))
    for k, s in enumerate(opt.state.values()):
        assert all(torch.equal(v, state[k][n]) if torch.is_tensor(v) else v == state[k][n]
                   for n, v in s.items())
    assert opt.param_groups[0]["foreach"] is None and not opt.param_groups[0]["fused"]


def test_the_implementations_compute_the_same_update():
    # what the remedy promises: the same training. One step from the same state, each way
    results = []
    for impl in update_replay.IMPLS:
        torch.manual_seed(0)
        p = torch.nn.Parameter(torch.randn(300))
        opt = torch.optim.AdamW([p], lr=1e-2, **impl_kwargs(impl))
        for i in range(3):
            p.grad = torch.linspace(-1, 1, 300) * (i + 1)
            opt.step()
        results.append(p.detach())
    assert all(torch.allclose(results[0], r, rtol=1e-6, atol=1e-7) for r in results[1:])


def test_the_current_implementation_follows_the_optimizer_settings():
    assert current_impl(_trained()[1]) == "for-loop"  # CPU tensors: torch's default
    assert current_impl(_trained(foreach=True)[1]) == "foreach"
    assert current_impl(_trained(fused=True)[1]) == "fused"
    d = described_update(_trained(fused=True)[1])
    assert (d.optimizer, d.impl, d.note, d.step_s) == ("AdamW", "fused", "not replayed", {})
    assert described_update(object()) is None and measure_update(None, CPU) is None


def test_what_cannot_be_replayed_says_why(monkeypatch):
    monkeypatch.setattr(update_replay, "MIN_TIME_S", 0.005)
    lbfgs = torch.optim.LBFGS([torch.nn.Parameter(torch.ones(3))])
    r = measure_update(lbfgs, CPU)
    assert r.step_s == {} and "takes no foreach/fused argument" in r.note
    model, opt = _trained()
    opt.zero_grad(set_to_none=True)
    r = measure_update(opt, CPU)
    assert r.step_s == {} and r.note == "no parameter had a gradient at the last step"
    model, opt = _trained()
    monkeypatch.setattr(update_replay, "_free_bytes", lambda device: 1024)
    r = measure_update(opt, CPU)
    assert r.step_s == {} and "would not fit in the free memory" in r.note


def test_an_implementation_that_fails_is_skipped_with_its_reason(monkeypatch):
    monkeypatch.setattr(update_replay, "MIN_TIME_S", 0.005)
    real = update_replay._build

    def build(optimizer, impl, *, tiny=False):
        if impl == "fused" and not tiny:
            raise RuntimeError("fused=True requires all the params to be floating point\nmore")
        return real(optimizer, impl, tiny=tiny)

    monkeypatch.setattr(update_replay, "_build", build)
    r = measure_update(_trained()[1], CPU)
    assert set(r.step_s) == {"for-loop", "foreach"}
    assert r.skipped == {"fused": "RuntimeError: fused=True requires all the params to be "
                                  "floating point"}
