"""Fault case 12: ``looptune diagnose`` on scripts that exit with their own code, fork, spawn
their own workers, delete their DataLoader mid-epoch or never step: one clear report (or error),
the script's exit status kept, no process left behind."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
from faultkit import child_env, processes_with_env

SCRIPTS = Path(__file__).with_name("scripts")


def diagnose(script: str, marker: str, tmp_path: Path, steps: int = 20):
    out = tmp_path / "d.json"
    proc = subprocess.run(
        [sys.executable, "-m", "looptune", "diagnose", "--steps", str(steps), "--warmup", "2",
         "--json", str(out), str(SCRIPTS / script)],
        env={**child_env(), "LOOPTUNE_FAULT_MARKER": marker}, capture_output=True, text=True,
        timeout=180, cwd=tmp_path)
    deadline = time.monotonic() + 10
    while processes_with_env(marker) and time.monotonic() < deadline:
        time.sleep(0.1)  # workers and pools get a moment to finish exiting
    assert processes_with_env(marker) == [], "a process of the script outlived diagnose"
    data = json.loads(out.read_text()) if out.exists() else None
    return proc, data


def test_sys_exit_3_keeps_the_exit_code_and_reports_what_was_measured(marker, tmp_path):
    proc, d = diagnose("exit3.py", marker, tmp_path)
    assert proc.returncode == 3, proc.stderr
    assert "the script ended first (exit 3)" in proc.stdout
    assert d["exit_code"] == 3 and d["stopped"] == "exit 3" and d["steps_measured"] == 9
    assert proc.stdout.count("bottleneck:") == 1


def test_a_forked_child_neither_counts_nor_reports(marker, tmp_path):
    proc, d = diagnose("forks.py", marker, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "parent saw child status 5" in proc.stdout  # the child left with its own status
    assert "trained 31 steps" in proc.stdout  # diagnose's limit did not stop the child
    assert proc.stdout.count("bottleneck:") == 1 and "Traceback" not in proc.stderr
    assert d["steps_measured"] == 20 and d["exit_code"] == 0 and d["stopped"] == "steps"


def test_a_script_spawning_its_own_pool_is_diagnosed_and_leaves_nothing(marker, tmp_path):
    proc, d = diagnose("own_workers.py", marker, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert d["steps_measured"] == 20 and proc.stdout.count("bottleneck:") == 1


def test_a_deleted_dataloader_and_a_new_optimizer_mid_run(marker, tmp_path):
    proc, d = diagnose("delete_loader.py", marker, tmp_path)
    assert proc.returncode == 0, proc.stderr
    # 9 steps on the first optimizer, then the new one's: all 2 + 1 + 20 steps were seen
    assert d["steps_measured"] == 20 and d["stopped"] == "steps"
    assert [ld["num_workers"] for ld in d["loaders"]] in ([0, 2], [2, 0])


def test_a_script_that_never_steps_says_what_it_saw(marker, tmp_path):
    proc, d = diagnose("never_steps.py", marker, tmp_path)
    assert proc.returncode == 2 and d is None
    err = proc.stderr
    assert "never called optimizer.step()" in err and "Traceback" not in err
    assert "drew 32 batch(es) from 1 DataLoader(s)" in err and "ended normally, exit code 0" in err


def test_a_script_failing_before_its_first_step_leads_with_its_own_error(marker, tmp_path):
    # an old script's torch.load of a pickled object, refused by torch >= 2.6 (weights_only)
    script = Path(__file__).parents[1] / "diagnose" / "scripts" / "old_torch_load.py"
    proc, d = diagnose(str(script), marker, tmp_path)
    assert proc.returncode == 1, proc.stderr  # the script's own status, not diagnose's 2
    first = proc.stderr.splitlines()[0]
    assert first.startswith("looptune diagnose: the script raised before its first step: "
                            "_pickle.UnpicklingError: Weights only load failed"), proc.stderr
    assert "never called optimizer.step" not in proc.stderr and "Traceback" not in proc.stderr
    assert "old_torch_load.py:18 in main (raised in torch/serialization.py" in proc.stderr
    assert "known fix:" in proc.stderr and "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1" in proc.stderr
    assert d["kind"] == "diagnosis-failed" and d["exit_code"] == 1 and d["steps_measured"] == 0
    assert d["where"].startswith(f"{script}:18 in main") and "weights_only=False" in d["hint"]
    # the fix it names works: the same script is diagnosed with it
    fixed = subprocess.run(
        [sys.executable, "-m", "looptune", "diagnose", "--steps", "10", "--warmup", "2", str(script)],
        env={**child_env(), "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}, capture_output=True,
        text=True, timeout=180, cwd=tmp_path)
    assert fixed.returncode == 0 and "bottleneck:" in fixed.stdout, fixed.stderr


def test_a_script_exiting_non_zero_before_its_first_step_keeps_its_status(tmp_path):
    script = tmp_path / "early_exit.py"
    script.write_text("import sys\nimport torch\nsys.exit(4)\n")
    out = tmp_path / "d.json"
    proc = subprocess.run([sys.executable, "-m", "looptune", "diagnose", "--json", str(out),
                           str(script)], env=child_env(), capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert proc.returncode == 4, proc.stderr
    assert "the script exited with status 4 before its first step" in proc.stderr
    d = json.loads(out.read_text())
    assert d["error"] is None and d["exit_code"] == 4 and d["where"] is None
