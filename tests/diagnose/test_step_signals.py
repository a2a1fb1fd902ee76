"""Step boundaries without torch.optim (issue 17): hand-updated loops, a third-party optimizer and
accumulation by hand step on their parameter updates (found through their backward calls); a script that reaches no step in time is
stopped early, saying what it saw; the batch size comes from the model's input when no DataLoader
shows it."""

import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import looptune

SCRIPTS = Path(__file__).parent / "scripts"


def run(name, **kw):
    return looptune.diagnose(str(SCRIPTS / name), [], **{"steps": 20, "warmup": 3, **kw})


def test_a_loop_updating_weights_by_hand_steps_on_its_updates():
    d = run("hand_update.py")
    assert d.step_signal == "parameter update" and d.steps_measured == 20
    assert d.stopped == "steps"
    assert not d.loaders  # it slices its own tensors: the batch comes from the model's input
    assert d.evidence.get("replay_batch") == 20 or "replay" not in str(d.evidence)
    batch = [r for r in d.remedies if r.kind == "batch"]
    assert all(r.action.startswith("batch_size 20 -> 80") for r in batch), batch


def test_a_third_party_optimizer_steps_on_its_updates():
    d = run("other_optimizer.py")  # SignSGD: p.sub_() under no_grad, not a torch.optim optimizer
    assert d.step_signal == "parameter update" and d.steps_measured == 20
    assert d.loaders[0].batch_size == 32


def test_accumulation_by_hand_steps_on_updates_and_a_torch_optimizer_on_its_steps(tmp_path):
    d = run("accumulate_by_hand.py")  # 4 backwards per update: a step is an update
    assert d.step_signal == "parameter update" and d.steps_measured == 20
    # that each measured step holds the 4 micro-batches is checked without a clock: its FLOPs
    # (test_accumulation_by_hand_counts_the_flops_of_a_whole_step) and the probes' own count
    # (tests/measure/test_probes.py). A timed comparison with hand_update.py's step failed on
    # a loaded VM (1.9x where 3-4x is expected) and so cannot tell a right split from a wrong one.
    script = tmp_path / "accumulate.py"
    script.write_text(
        "import torch\n"
        "m = torch.nn.Linear(8, 2); opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "backwards = 0\n"
        "for step in range(100):\n"
        "    for micro in range(4):\n"
        "        m(torch.randn(16, 8)).sum().backward(); backwards += 1\n"
        "    opt.step(); opt.zero_grad()\n"
        "    print('backwards', backwards, flush=True)\n")
    d = looptune.diagnose(str(script), steps=6, warmup=2)
    assert d.step_signal == "optimizer.step" and d.steps_measured == 6


def test_accumulation_by_hand_counts_the_flops_of_a_whole_step():
    """The FLOP-counted step is an update-to-update step of 4 micro-batches, not one backward
    call (as it was before the first update showed the backward calls were micro-batches)."""
    from torch.utils.flop_counter import FlopCounterMode

    from looptune.diagnose.runner import _run_once

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    with FlopCounterMode(display=False) as counter:  # one micro-batch, counted independently
        torch.nn.functional.cross_entropy(model(torch.randn(16, 32)),
                                          torch.randint(0, 4, (16,))).backward()
    run = _run_once(str(SCRIPTS / "accumulate_by_hand.py"), [], module=False, steps=5, warmup=2,
                    seconds=None, trace_dir=None, scale=False)
    assert run.step_signal == "parameter update" and len(run.step_s) == 5
    assert run.measurements.flops_per_step == 4 * counter.get_total_flops()


def test_an_optimizer_that_never_steps_is_still_reported():
    with pytest.raises(looptune.MeasurementError, match="never called optimizer.step"):
        run("no_step.py", steps=5)


def test_a_script_with_no_step_in_time_is_stopped_early_saying_what_it_saw():
    t0 = time.monotonic()
    with pytest.raises(looptune.MeasurementError) as err:
        run("slow_start.py", first_step_timeout=2.0)
    text = str(err.value)
    assert time.monotonic() - t0 < 30  # not the script's minutes
    assert "no step boundary within 2 s" in text and "made 0 backward call(s)" in text
    assert "built 1 torch.optim optimizer(s)" in text and "--first-step-timeout" in text
    assert " batch(es) from " in text


def test_first_step_timeout_is_checked_before_running(tmp_path):
    with pytest.raises(looptune.ConfigError, match="first_step_timeout=-1 is invalid"):
        run("hand_update.py", first_step_timeout=-1)
    proc = subprocess.run([sys.executable, "-m", "looptune", "diagnose", "--first-step-timeout",
                           "nan", str(SCRIPTS / "hand_update.py")], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and "--first-step-timeout nan is invalid" in proc.stderr
