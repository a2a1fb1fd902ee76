"""Every benchmark script runs in its --smoke mode, so none of them rots unseen."""

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.mark.integration
def test_seed_ladder_smoke(mnist_dir, tmp_path):
    out = tmp_path / "ladder.json"
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "seed_ladder.py"), "--smoke",
                           "--data", str(mnist_dir), "--device", "cpu", "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "x vs seed-baseline" in proc.stdout and out.exists()
    for name in ("tensorized", "device"):
        assert f"{name}:" in proc.stdout
