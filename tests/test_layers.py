"""The one-way layers and the acyclic packages (pyproject [tool.importlinter], issue 30): checked
on the code as it is, and shown to fail on a copy of the package with an upward import or a
cycle planted in it (lazy imports count)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("importlinter", reason="import-linter is in the [test] extra")

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "pyproject.toml"


def _lint(src: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(src)}  # before the editable install: this copy
    code = ("import sys; from importlinter.cli import lint_imports; "
            f"sys.exit(lint_imports(config_filename={str(CONFIG)!r}, no_cache=True))")
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)


def _copy(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "src" / "looptune", tmp_path / "looptune",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def _plant(src: Path, module: str, line: str) -> None:
    path = src / "looptune" / (module.replace(".", "/") + ".py")
    path.write_text(path.read_text() + f"\n\ndef _planted():\n    {line}\n")


def test_the_package_keeps_its_layers_and_has_no_cycles():
    out = _lint(ROOT / "src")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 kept, 0 broken" in out.stdout


def test_an_upward_lazy_import_breaks_the_layers_contract(tmp_path):
    src = _copy(tmp_path)
    _plant(src, "measure.timing", "from looptune.report import render  # measure -> report")
    out = _lint(src)
    assert out.returncode == 1
    assert "looptune.measure.timing -> looptune.report.render" in out.stdout
    assert "fastpath/dist/data > measure > base BROKEN" in out.stdout  # the layers contract


def test_a_cycle_inside_a_package_breaks_the_acyclic_contract(tmp_path):
    src = _copy(tmp_path)
    _plant(src, "data.order", "from looptune.data import loaders  # loaders imports order")
    out = _lint(src)
    assert out.returncode == 1
    assert "No cycles are allowed in looptune.data" in out.stdout
