"""``looptune diagnose --tensorboard DIR``: the diagnosis lands as TensorBoard scalars and text
(read back with tensorboard's own event reader); a missing package is refused before the run."""

import builtins
from pathlib import Path

import pytest

from looptune.cli.main import main

SCRIPTS = Path(__file__).parents[1] / "diagnose" / "scripts"


def test_diagnose_logs_steps_shares_and_the_verdict_to_tensorboard(tmp_path, capsys):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logs = tmp_path / "tb"
    code = main(["diagnose", "--steps", "8", "--warmup", "2", "--tensorboard", str(logs),
                 str(SCRIPTS / "slow_getitem.py"), "--batch-size", "16"])
    assert code == 0 and f"tensorboard --logdir {logs}" in capsys.readouterr().out
    acc = EventAccumulator(str(logs), size_guidance={"scalars": 0, "tensors": 0}).Reload()
    tags = set(acc.Tags()["scalars"])
    assert len(acc.Scalars("looptune/step_ms")) == 8 and len(acc.Scalars("looptune/data_wait_ms")) == 8
    assert {"looptune/share/data_wait", "looptune/phase_ms/compute"} <= tags
    share = acc.Scalars("looptune/share/data_wait")[0].value
    assert 0.5 < share <= 1.0  # slow_getitem: data loading, as the printed verdict
    (text,) = acc.Tensors("looptune/verdict/text_summary")
    assert b"bottleneck: data_loading" in text.tensor_proto.string_val[0]


def test_missing_tensorboard_is_refused_before_the_script_runs(tmp_path, capsys, monkeypatch):
    real = builtins.__import__

    def no_tensorboard(name, *args, **kwargs):
        if name.startswith(("tensorboard", "torch.utils.tensorboard")):
            raise ImportError(f"No module named {name!r}")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tensorboard)
    ran = tmp_path / "ran"
    script = tmp_path / "s.py"
    script.write_text(f"open({str(ran)!r}, 'w').close()\n")
    code = main(["diagnose", "--tensorboard", str(tmp_path / "tb"), str(script)])
    assert code == 2 and not ran.exists()
    assert "pip install 'looptune[tensorboard]'" in capsys.readouterr().err
