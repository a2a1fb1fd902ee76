"""FitWatch (the frameworks' callbacks): it takes the probes off once ``steps`` steps were
measured, however many steps came before the measurement (on CUDA a profiler window of 3 steps
follows the FLOP-counted one; simulated here by giving the window a trace)."""

from __future__ import annotations

import pytest
import torch

from looptune.diagnose import window
from looptune.integrations import FitWatch


def _train(fit: FitWatch, steps: int) -> int:
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(
        torch.randn(512, 8), torch.randint(0, 2, (512,))), batch_size=8)
    fit.start([loader])
    done = 0
    for x, y in loader:
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        fit.after_step()
        done += 1
        if done == steps:
            break
    fit.finish()
    return done


@pytest.mark.parametrize("trace_steps", [0, 3])
def test_the_callback_measures_the_steps_asked_for_after_any_profiler_window(monkeypatch,
                                                                            trace_steps):
    monkeypatch.setattr(window.MeasurementWindow, "_trace_steps", lambda self: trace_steps)
    monkeypatch.setattr(window.MeasurementWindow, "_start_trace", lambda self: None)
    monkeypatch.setattr(window.MeasurementWindow, "_stop_trace", lambda self: None)
    fit = FitWatch(warmup=2, steps=10, json_path=None, verbose=False, label="test fit")
    _train(fit, 40)
    assert not fit.active and fit.diagnosis is not None
    assert fit.diagnosis.steps_measured == 10  # before the fix: 7 with a 3-step window
