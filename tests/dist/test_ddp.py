"""Data-parallel training on CPU with gloo, 2 processes launched by torchrun (the real launcher).

Tolerance: 2 ranks x batch B must equal 1 process x batch 2B up to float reassociation (DDP
averages the two ranks' mean gradients; one process averages 2B per-sample gradients at once).
Adam divides by sqrt(v), so a near-zero gradient's last-bit differences grow to ~1e-5 in a weight:
weights must agree within atol=5e-5 (5% of one Adam step at lr=1e-3), rtol=1e-4, after 2 epochs;
epoch losses within 1e-4 relative.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(),
                                reason="this torch build has no torch.distributed")

JOB = Path(__file__).with_name("ddp_job.py")


def _torchrun(out: Path, *args: str, nproc: int = 2, timeout: float = 240):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={nproc}", "--max-restarts=0", str(JOB), str(out), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def _single(out: Path, *args: str):
    return subprocess.run([sys.executable, str(JOB), str(out), *args], capture_output=True,
                          text=True, timeout=240)


def _weights(path: Path) -> dict:
    return torch.load(path, map_location="cpu")


@pytest.mark.parametrize("recipe, strategy, accumulate", [
    ("tensorized", "dataloader", 1), ("device", "device", 1), ("tensorized", "prefetch", 1),
    ("seed-baseline", "dataloader", 2)])
def test_two_ranks_equal_one_process_with_the_same_effective_batch(tmp_path, recipe, strategy,
                                                                   accumulate):
    common = ["--recipe", recipe, "--strategy", strategy, "--accumulate", str(accumulate)]
    two = _torchrun(tmp_path / "two", *common, "--batch", "32")
    assert two.returncode == 0, two.stderr[-3000:]
    one = _single(tmp_path / "one", *common, "--batch", "64")
    assert one.returncode == 0, one.stderr[-3000:]
    w0, w1 = _weights(tmp_path / "two" / "rank-0.pt"), _weights(tmp_path / "two" / "rank-1.pt")
    for k in w0:  # DDP: every rank holds bit-identical weights
        assert torch.equal(w0[k], w1[k]), k
    ref = _weights(tmp_path / "one" / "rank-0.pt")
    for k in ref:
        torch.testing.assert_close(w0[k], ref[k], rtol=1e-4, atol=5e-5)
    r2 = json.loads((tmp_path / "two" / "result.json").read_text())
    r1 = json.loads((tmp_path / "one" / "result.json").read_text())
    assert r2["extra"]["world_size"] == 2 and r2["extra"]["backend"] == "gloo"
    assert [r["rank"] for r in r2["extra"]["per_rank"]] == [0, 1]
    assert r2["samples_per_epoch"] == r1["samples_per_epoch"] == 1000
    assert r2["batches_per_epoch"] == r1["batches_per_epoch"]  # 16 steps of 64 in both
    for a, b in zip(r2["epoch_loss"], r1["epoch_loss"]):
        assert a == pytest.approx(b, rel=1e-4)


def test_one_launched_rank_runs_ddp_and_equals_a_plain_process_bit_for_bit(tmp_path):
    one = _torchrun(tmp_path / "ddp1", "--epochs", "1", nproc=1)
    assert one.returncode == 0, one.stderr[-3000:]
    plain = _single(tmp_path / "plain", "--epochs", "1")
    assert plain.returncode == 0, plain.stderr[-3000:]
    result = json.loads((tmp_path / "ddp1" / "result.json").read_text())
    assert result["extra"]["world_size"] == 1 and result["extra"]["backend"] == "gloo"
    assert "world_size" not in json.loads((tmp_path / "plain" / "result.json").read_text())["extra"]
    a, b = _weights(tmp_path / "ddp1" / "rank-0.pt"), _weights(tmp_path / "plain" / "rank-0.pt")
    for k in a:  # DDP with one rank: gradients x 1/1, the same arithmetic
        assert torch.equal(a[k], b[k]), k
