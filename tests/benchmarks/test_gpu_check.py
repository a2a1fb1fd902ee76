"""benchmarks/gpu_check.sh runs every test that only runs on CUDA (issue 29: the CUDA augmentation
test was missing from it, so it never ran anywhere)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CUDA_ONLY = re.compile(r"skipif\(\s*not torch\.cuda\.is_available\(\)")


def _cuda_step_paths() -> list[str]:
    script = (ROOT / "benchmarks" / "gpu_check.sh").read_text()
    (line,) = [ln for ln in script.splitlines() if ln.startswith("step cuda-tests ")]
    return [w for w in line.split() if w.startswith("tests/")]


def _covered(test_file: str, paths: list[str]) -> bool:
    return any(test_file == p or test_file.startswith(p.rstrip("/") + "/") for p in paths)


def test_every_cuda_only_test_file_is_in_the_gpu_check():
    paths = _cuda_step_paths()
    cuda_only = sorted(str(f.relative_to(ROOT)) for f in (ROOT / "tests").rglob("test_*.py")
                       if CUDA_ONLY.search(f.read_text()))
    assert "tests/data/test_augment.py" in cuda_only  # the detector sees the known case
    missing = [f for f in cuda_only if not _covered(f, paths)]
    assert not missing, f"CUDA-only tests that benchmarks/gpu_check.sh never runs: {missing}"
    for p in paths:
        assert (ROOT / p).exists(), f"gpu_check.sh names {p}, which does not exist"


def test_gpu_check_dry_run_lists_its_steps(tmp_path):
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh")], text=True,
                          capture_output=True, env={"GPU_CHECK_DRY": "1", "OUT": str(tmp_path),
                                                    "PATH": "/usr/bin:/bin"}, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "== cuda-tests" in proc.stdout and "tests/data/test_augment.py" in proc.stdout
