"""The Hugging Face Trainer integration: ``looptune diagnose`` on an unchanged
``transformers.Trainer`` script, and the TrainerCallback inside ``Trainer.train()``. Skipped when
transformers is not installed (the ``looptune[transformers]`` extra); the missing-package error
is tested either way."""

import importlib
import json
import sys
from pathlib import Path

import pytest

import looptune

LOOPS = Path(__file__).parents[1] / "diagnose" / "loops"


def _fixture():
    pytest.importorskip("transformers")
    spec = importlib.util.spec_from_file_location("hf_trainer", LOOPS / "hf_trainer.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_missing_transformers_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers -> ImportError
    monkeypatch.delitem(sys.modules, "looptune.integrations.transformers", raising=False)
    with pytest.raises(ImportError, match=r"pip install 'looptune\[transformers\]'"):
        importlib.import_module("looptune.integrations.transformers")


def test_diagnose_runs_an_unchanged_trainer_script():
    pytest.importorskip("transformers")
    d = looptune.diagnose(str(LOOPS / "hf_trainer.py"), ["--max-steps", "60"], steps=12,
                          warmup=3)
    assert d.steps_measured == 12 and sum(d.shares.values()) == pytest.approx(1.0)
    (ld,) = d.loaders  # Accelerate's DataLoaderShard, seen once
    assert ld.dataset == "Lines" and ld.batch_size == 16
    assert d.shares["compute"] > 0.5, d.shares  # a tokenizing Dataset is cheap next to GPT-2


def test_callback_diagnoses_inside_trainer_train_and_training_goes_on(tmp_path):
    module = _fixture()
    from looptune.integrations.transformers import DiagnoseCallback

    callback = DiagnoseCallback(warmup=3, steps=10, json_path=tmp_path / "d.json", verbose=False)
    args = module.parse(["--max-steps", "30", "--samples", "1024"])
    trainer = module.trainer(args, str(tmp_path / "out"), module.Lines(1024, 64), [callback])
    trainer.train()
    assert trainer.state.global_step == 30  # training went on after the probes came off
    d = callback.diagnosis
    assert d is not None and d.steps_measured == 10 and d.script == "transformers Trainer.train"
    assert d.loaders[0].dataset == "Lines" and not callback.active
    assert json.loads((tmp_path / "d.json").read_text())["steps_measured"] == 10


def test_a_run_shorter_than_the_window_is_diagnosed_at_its_end(tmp_path):
    module = _fixture()
    from looptune.integrations.transformers import DiagnoseCallback

    callback = DiagnoseCallback(warmup=2, steps=50, verbose=False)
    args = module.parse(["--max-steps", "8", "--samples", "512"])
    module.trainer(args, str(tmp_path), module.Lines(512, 64), [callback]).train()
    d = callback.diagnosis
    assert d is not None and 0 < d.steps_measured < 50 and not callback.active


def test_close_after_a_failed_train_takes_the_probes_off(tmp_path):
    module = _fixture()
    from looptune.integrations.transformers import DiagnoseCallback

    class Broken(module.Lines):
        def __getitem__(self, i):
            if i >= 0:
                raise ValueError(f"bad sample {i}")

    args = module.parse(["--max-steps", "8", "--samples", "64"])
    with pytest.raises(ValueError, match="bad sample"):
        with DiagnoseCallback(warmup=1, steps=3, verbose=False) as callback:
            module.trainer(args, str(tmp_path), Broken(64, 64), [callback]).train()
    assert not callback.active and callback.diagnosis is None
    with looptune.watch(warmup=0) as w:  # nothing left patched: a new watch starts cleanly
        pass
    assert w.diagnosis is None


def test_bad_arguments_are_refused_before_training():
    pytest.importorskip("transformers")
    from looptune.errors import ConfigError
    from looptune.integrations.transformers import DiagnoseCallback

    with pytest.raises(ConfigError, match="steps"):
        DiagnoseCallback(steps=0)
