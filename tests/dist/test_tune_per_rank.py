"""`looptune tune` launched per rank (torchrun): every rank measures, rank 0 alone reports."""

from __future__ import annotations

import subprocess
import sys


def test_tune_loader_under_torchrun_reports_once(tmp_path):
    (tmp_path / "tinyds.py").write_text(
        "import torch\n"
        "def make():\n"
        "    return torch.utils.data.TensorDataset(torch.randn(2000, 16), "
        "torch.randint(0, 10, (2000,)))\n")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc_per_node=2", "-m", "looptune", "tune", "loader", "--dataset",
                           "tinyds:make", "--budget-s", "5", "--json", "t.json"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("decisions") == 1 and "num_workers" in proc.stdout
    assert (tmp_path / "t.json").exists()
