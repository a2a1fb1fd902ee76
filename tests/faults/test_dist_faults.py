"""Fault cases 14 and 15, gloo on CPU under torchrun (the real launcher): a rank killed or hung
ends the job naming the rank and its reason, with no process left; only rank 0 writes
checkpoints; a resume after the failure continues from the last complete checkpoint, bit for bit.

The job is tests/dist/ddp_job.py (the looptune engine, 2 ranks, synthetic MNIST-shaped data).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from faultkit import child_env, processes_with_env

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(),
                                reason="this torch build has no torch.distributed")

JOB = Path(__file__).parents[1] / "dist" / "ddp_job.py"


def torchrun(marker: str, out: Path, *args: str, timeout: float = 240):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "--max-restarts=0", str(JOB), str(out), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env={**child_env(), "LOOPTUNE_FAULT_MARKER": marker})
    deadline = time.monotonic() + 10
    while processes_with_env(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_with_env(marker) == [], "a rank or the agent outlived the job"
    return proc


@pytest.mark.parametrize("mode", ["kill", "hang"])
def test_a_dead_or_hung_rank_stops_the_job_naming_the_rank(tmp_path, marker, mode):
    flag = "--kill-rank" if mode == "kill" else "--hang-rank"
    t0 = time.monotonic()
    proc = torchrun(marker, tmp_path / "x", "--epochs", "50", "--samples", "4000", flag, "1",
                    "--kill-at", "20", "--timeout", "10", timeout=180)
    elapsed = time.monotonic() - t0
    assert proc.returncode != 0
    text = proc.stderr
    if mode == "kill":
        assert "rank      : 1" in text or "rank: 1" in text, text[-3000:]
        assert "SIGKILL" in text
    else:  # rank 0 times out in its collective and fails; the agent stops the hung rank 1
        assert "rank      : 0" in text, text[-3000:]
        assert "timed out" in text.lower() or "timeout" in text.lower(), text[-3000:]
    assert elapsed < 120  # bounded: the 10 s collective timeout + the agent's shutdown
    assert not (tmp_path / "x" / "result.json").exists()  # no result from a failed job


def test_resume_after_a_rank_died_continues_from_the_last_complete_checkpoint(tmp_path, marker):
    ck = tmp_path / "ck"
    full = torchrun(marker, tmp_path / "full", "--epochs", "2")
    assert full.returncode == 0, full.stderr[-3000:]
    # rank 1 dies at its batch 24, after rank 0 wrote checkpoints every 5 optimizer steps
    crashed = torchrun(marker, tmp_path / "a", "--epochs", "2", "--checkpoint", str(ck),
                       "--checkpoint-every", "5", "--kill-rank", "1", "--kill-at", "24")
    assert crashed.returncode != 0 and "SIGKILL" in crashed.stderr
    files = sorted(p.name for p in ck.iterdir())
    assert files and all(name.startswith("ckpt-") and name.endswith(".pt") for name in files)
    last_complete = files[-1]
    # a newer checkpoint whose write never finished (cut short): resume must skip it
    torn = ck / "ckpt-999999999.pt"
    torn.write_bytes((ck / last_complete).read_bytes()[:1000])
    resumed = torchrun(marker, tmp_path / "b", "--epochs", "2", "--checkpoint", str(ck),
                       "--checkpoint-every", "5", "--resume", "--audit")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    result = json.loads((tmp_path / "b" / "result.json").read_text())
    assert Path(result["resumed_from"]).name == last_complete
    assert "skipped checkpoint" in resumed.stderr and torn.name in resumed.stderr
    # only rank 0 wrote checkpoints (an audit hook in each rank saw every write under ck/)
    writes0 = json.loads((tmp_path / "b" / "writes-rank-0.json").read_text())
    writes1 = json.loads((tmp_path / "b" / "writes-rank-1.json").read_text())
    assert writes1 == [], writes1
    assert any(kind == "os.rename" and name.startswith("ckpt-") for kind, name in writes0)
    assert not (tmp_path / "b" / "result-rank-1.json").exists()
    full_w = torch.load(tmp_path / "full" / "rank-0.pt", map_location="cpu")
    for r in (0, 1):  # resumed on both ranks = never interrupted, bit for bit
        w = torch.load(tmp_path / "b" / f"rank-{r}.pt", map_location="cpu")
        for k in full_w:
            assert torch.equal(full_w[k], w[k]), (r, k)
    full_result = json.loads((tmp_path / "full" / "result.json").read_text())
    # the checkpoint (mid-epoch 2) holds the job's partial losses, not rank 0's alone
    assert result["epoch_loss"] == pytest.approx(full_result["epoch_loss"], rel=1e-6)
