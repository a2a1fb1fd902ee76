"""`looptune bench mnist --nproc 2` on the real MNIST: 1 process, then 2 ranks, one table."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def test_bench_nproc_2_reports_ranks_and_scaling_efficiency(mnist_dir, tmp_path):
    out = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "looptune", "bench", "mnist", "--epochs", "1",
                           "--recipes", "device", "--data", str(mnist_dir), "--device", "cpu",
                           "--nproc", "2", "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for needle in ("ranks", "scaling", "2 (gloo)", "slowest"):
        assert needle in proc.stdout
    data = json.loads(out.read_text())
    assert data["world_size"] == 2 and data["backend"] == "gloo"
    run = data["runs"][0]
    assert run["samples_per_epoch"] == 60000  # the two ranks' shares together
    assert len(run["extra"]["per_rank"]) == 2
    assert data["single_process"]["device"] > 0
    assert 0 < run["scaling_efficiency"] == pytest.approx(
        run["samples_per_s"] / (2 * data["single_process"]["device"]))
    assert run["test_accuracy"] > 0.9  # the sharded evaluation covers the whole test set


def test_torchrun_runs_the_bench_and_only_rank_0_reports(mnist_dir, tmp_path):
    out = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc_per_node=2", "-m", "looptune", "bench", "mnist", "--epochs",
                           "1", "--recipes", "tensorized", "--data", str(mnist_dir), "--device",
                           "cpu", "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("mnist-mlp, 1 epoch") == 1  # one table: rank 1 prints nothing
    data = json.loads(out.read_text())
    assert data["world_size"] == 2 and data["single_process"] is None
    assert data["runs"][0]["scaling_efficiency"] is None


def test_bad_nproc_exits_2_before_launching(mnist_dir):
    proc = subprocess.run([sys.executable, "-m", "looptune", "bench", "mnist", "--nproc", "0",
                           "--data", str(mnist_dir)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--nproc 0 is invalid" in proc.stderr
