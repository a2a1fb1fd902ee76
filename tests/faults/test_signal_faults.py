"""SIGTERM while DataLoader workers run: the step in progress finishes, a checkpoint is saved,
the workers exit, the process exits 143 (128 + SIGTERM), and no process is left behind."""

import os
import signal
import subprocess
import sys
import time

from looptune.engine import checkpoint as ckpt

sys.path.insert(0, os.path.dirname(__file__))
from faultkit import CHILD, child_env, processes_with


def test_sigterm_with_workers_saves_exits_143_and_leaves_no_process(tmp_path, marker):
    folder = tmp_path / "ckpt"
    proc = subprocess.Popen([sys.executable, str(CHILD), "term", "workers", str(folder),
                             str(tmp_path / "never.pt"), marker], env=child_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "READY"  # inside step 7, workers running
        workers = [p for p in processes_with(marker) if p != proc.pid]
        assert len(workers) == 2, workers  # the two DataLoader workers, alive now
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 143, err
    assert "stopped by signal 15 after batch 7" in err and "--resume" in err
    state, path, skipped = ckpt.latest_checkpoint(folder)
    assert path.name == "ckpt-000000007.pt" and not skipped  # step 7 completed, then saved
    assert state["position"] == 7 and not (tmp_path / "never.pt").exists()
    deadline = time.monotonic() + 10
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_with(marker) == []  # no orphan worker
