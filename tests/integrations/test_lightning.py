"""The Lightning integration: ``looptune diagnose`` on an unchanged Lightning script, and the
DiagnoseCallback inside a Trainer.fit. Skipped when lightning is not installed (the
``looptune[lightning]`` extra); the missing-package error is tested either way."""

import importlib
import importlib.util
import sys
from pathlib import Path

import pytest

import looptune
from loop_checks import loader_vs_step_ms

LOOPS = Path(__file__).parents[1] / "diagnose" / "loops"


def test_missing_lightning_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "lightning", None)  # import lightning -> ImportError
    monkeypatch.setitem(sys.modules, "lightning.pytorch", None)
    monkeypatch.setitem(sys.modules, "lightning.pytorch.callbacks", None)
    monkeypatch.setitem(sys.modules, "pytorch_lightning", None)
    monkeypatch.setitem(sys.modules, "pytorch_lightning.callbacks", None)
    monkeypatch.delitem(sys.modules, "looptune.integrations.lightning", raising=False)
    with pytest.raises(ImportError, match=r"pip install 'looptune\[lightning\]'"):
        importlib.import_module("looptune.integrations.lightning")


def test_diagnose_runs_an_unchanged_lightning_script():
    pytest.importorskip("lightning")
    d = looptune.diagnose(str(LOOPS / "lightning_mnist.py"), ["--max-steps", "100"], steps=15,
                          warmup=3)
    assert d.steps_measured == 15 and sum(d.shares.values()) == pytest.approx(1.0)
    assert d.loaders and d.loaders[0].dataset == "Digits" and d.loaders[0].batch_size == 64
    assert d.shares["data_wait"] > 0.2, d.shares  # 20 rounds of per-sample work per image


def test_callback_diagnoses_inside_trainer_fit_and_training_goes_on(tmp_path):
    pytest.importorskip("lightning")
    spec = importlib.util.spec_from_file_location("lightning_mnist", LOOPS / "lightning_mnist.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # planted: 200 rounds of per-sample work per image. Measured apart, loading a batch takes
    # several times the step (Lightning's own step, without its Trainer around it)
    planted = ["--samples", "8192", "--work", "200"]
    loading, stepping = loader_vs_step_ms(LOOPS / "lightning_mnist.py", planted)
    assert loading > 3 * stepping, (loading, stepping)
    (callback,) = module.main(["--max-steps", "30", "--callback", *planted])
    d = callback.diagnosis
    assert d is not None and d.steps_measured == 20 and d.script == "lightning Trainer.fit"
    assert d.loaders[0].dataset == "Digits"
    assert d.bottleneck == "data_loading", (d.shares, d.evidence)
    assert d.evidence["rule"] == "data_loading" and d.evidence["reason"].startswith(
        f"data_wait is {d.shares['data_wait']:.1%} of the step (>= 30% and the largest phase)")
    assert not callback.active  # the probes came off after 3 + 20 steps
